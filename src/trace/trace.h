#pragma once
// Spans of what actually ran, written as Chrome trace JSON (chrome://tracing, Perfetto).
//
// A Recorder collects complete ("X") events: name, category, start and duration in microseconds, the
// thread, and args (layer, layer kind, shapes, FLOPs, bytes). Tracing is off unless a recorder is
// installed with set_active(); a Scope then costs one relaxed atomic load and a branch.
//
// Categories used by the model: "layer" (one decoder layer), "op" (a step of the layer named like the
// plan's op records, docs/plan.md; fused kernels join names with '+', e.g.
// "experts_gate_up+experts_act+experts_down"), "kernel" (one call of kernels/ops.h). Op spans carry
// the thread's Context (step, pass, layer, kind), so their key "step/pass/kind/op" is the plan's key.
//
// Device timing: in a pass that runs on the CUDA device (PassScope's `device`), op spans are timed with
// a pair of CUDA events on the operators' stream (device_timer.h) instead of the wall clock. Such a span
// is pending until its end event completed: passes poll without blocking, and events(), summary(),
// to_json(), write() and flush() wait for the rest. Resolved spans carry args "timer": "cuda_event",
// "cpu_ts_us" and "cpu_dur_us" (when the host issued the op) and sit on their own track (tid + 65536).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsaserve::trace {

namespace device {
struct Mark;
}

// Track offset of device-timed spans (chrome://tracing draws them apart from the host's spans).
constexpr uint32_t kDeviceTrack = 65536;

struct Event {
  std::string name, cat;
  int64_t ts_us = 0, dur_us = 0;  // since the recorder's start; microseconds (fractions dropped)
  double ts_exact_us = 0, dur_exact_us = 0;
  uint32_t tid = 0;
  nlohmann::json args;  // an object once recorded (null until then: no allocation while tracing is off)
};

// One summary row: every op span with this key ("step/pass/kind/op" for ops, "kernel/<name>" for kernels).
struct SummaryRow {
  std::string key;
  int64_t count = 0;
  double total_us = 0;
};

class Recorder {
 public:
  Recorder();
  ~Recorder();  // waits for pending device-timed spans, then returns their events
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  // Microseconds since this recorder was created.
  double now_us() const;
  void add(Event e);  // thread-safe
  // A device-timed span (trace/device_timer.h): kept pending, with its wall-clock times, until resolved.
  void add_device(Event e, device::Mark* m);
  // Resolves the pending device-timed spans whose end events have completed; with `wait`, all of them
  // (blocking on their events). Spans whose events failed keep their wall-clock times and say why.
  void resolve_device(bool wait) const;
  std::vector<Event> events() const;
  // Per key, in order of first appearance: op spans keyed step/pass/kind/op (their parts from args),
  // kernel spans "kernel/<name>", layer spans "layer/<kind>".
  std::vector<SummaryRow> summary() const;
  // {"traceEvents": [...], "displayTimeUnit": "ms", "summary": [{key, count, total_us}],
  //  "dropped_events": n}.
  nlohmann::json to_json() const;
  // Writes dir/trace-<pid>-<n>.json (n counts this process's writes from 0) and returns its path.
  // Creates dir; throws dsaserve::Error when it cannot be written.
  std::filesystem::path write(const std::filesystem::path& dir) const;
  // Like write(), then forgets the events written (a long-running server writes its trace in pieces:
  // each file holds the events since the previous flush). The dropped count restarts too.
  std::filesystem::path flush(const std::filesystem::path& dir);

  // Adds fields to every JSON this recorder produces (to_json, write, flush) from the events it holds
  // (e.g. plan/trace_summary.h: measured vs planned time per op). Exceptions it throws propagate.
  using Annotator = std::function<void(const std::vector<Event>& events, nlohmann::json& out)>;
  void set_annotator(Annotator a);

  // Bounded memory: at most `n` events are kept between flushes (0: no limit, the default); later
  // events are dropped and counted ("dropped_events" in the JSON).
  void set_max_events(size_t n);
  int64_t dropped() const;

 private:
  nlohmann::json events_json(const std::vector<Event>& events, int64_t dropped) const;
  static std::vector<SummaryRow> summarize(std::vector<Event> events);
  static std::filesystem::path write_json(const std::filesystem::path& dir, const nlohmann::json& j);

  std::chrono::steady_clock::time_point t0_;
  mutable std::mutex mu_;
  // Mutable: resolving device-timed spans (from const readers) moves them from pending_ to events_.
  mutable std::vector<Event> events_;
  mutable std::vector<std::pair<Event, device::Mark*>> pending_;  // device-timed spans not yet resolved
  size_t max_events_ = 0;
  Annotator annotator_;
  mutable int64_t dropped_ = 0;
};

// The installed recorder, or null (tracing off). The recorder must outlive its installation.
Recorder* active();
void set_active(Recorder* r);

// Where this thread is in the model: set by the forward pass, read by op spans.
struct Context {
  const char* step = "";  // "prefill" | "decode"
  const char* pass = "";  // the plan's pass name: "prefill", "decode", "prefill_draft_extend", "draft"
  int64_t layer = -1;
  std::string kind;      // the plan's layer kind: "dense.full", "moe.shared", "mtp", "head", "tail"
  bool device = false;   // the pass runs on the CUDA device: op spans are timed with CUDA events
  int64_t pass_id = -1;  // the enclosing PassScope's id (unique in the process); op spans carry it
};
Context& context();

// A span from construction to destruction, recorded only when a recorder is active at construction.
class Scope {
 public:
  Scope(const char* name, const char* cat) {
    if (Recorder* r = active()) begin(r, name, cat);
  }
  ~Scope() {
    if (rec_ != nullptr) end();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  bool on() const { return rec_ != nullptr; }
  // Extra args (no effect when off).
  template <class V>
  Scope& arg(const char* key, V&& v) {
    if (rec_ != nullptr) ev_.args[key] = std::forward<V>(v);
    return *this;
  }

 protected:
  // Times this span with CUDA events from now on (no effect when off or built without CUDA).
  void time_on_device();

 private:
  void begin(Recorder* r, const char* name, const char* cat);
  void end();
  Recorder* rec_ = nullptr;
  device::Mark* mark_ = nullptr;
  Event ev_;
};

// An "op" span carrying the thread's context (step, pass, layer, kind, pass_id); timed on the device in a
// device pass. The forward also records the op's "shape" in the plan's notation (a fused span: one per
// part, in an array).
class OpScope : public Scope {
 public:
  explicit OpScope(const char* name);
};

// A "collective" span: one all-reduce, all-gather, reduce-scatter, EP dispatch/combine or broadcast of a
// multi-rank run, named like the plan's collective records (plan.h Collective: "attn_tp_all_reduce",
// "ep_dispatch", ...), with its group ("attn_tp", "world", "ep"), group size and message bytes per rank,
// and the thread's context. Summary key "collective/step/pass/kind/name". (One process runs none.)
class CollectiveScope : public Scope {
 public:
  CollectiveScope(const char* name, const char* group, int64_t group_size, double bytes);
};

// Sets context().layer/kind for its lifetime and records a "layer" span.
class LayerScope {
 public:
  LayerScope(int64_t layer, std::string kind);
  ~LayerScope();
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  Scope span_;
  int64_t prev_layer_;
  std::string prev_kind_;
};

// Sets context().step/pass/device for its lifetime. Also resolves the device-timed spans that completed.
class PassScope {
 public:
  PassScope(const char* step, const char* pass, bool device = false);
  ~PassScope();
  bool on() const { return span_.on(); }
  // Extra args of the pass span (the forward records its batch: "requests" [[new, cached], ...]).
  template <class V>
  PassScope& arg(const char* key, V&& v) {
    span_.arg(key, std::forward<V>(v));
    return *this;
  }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  Scope span_;
  const char* prev_step_;
  const char* prev_pass_;
  bool prev_device_;
  int64_t prev_pass_id_;
};

}  // namespace dsaserve::trace
