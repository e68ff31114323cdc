#include "trace/trace.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "core/error.h"
#include "trace/device_timer.h"

namespace dsaserve::trace {

namespace {
std::atomic<Recorder*> g_active{nullptr};
std::atomic<int> g_writes{0};

uint32_t thread_index() {
  static std::atomic<uint32_t> next{0};
  thread_local const uint32_t id = next.fetch_add(1);
  return id;
}

std::string arg_str(const nlohmann::json& args, const char* key) {
  auto it = args.find(key);
  return it != args.end() && it->is_string() ? it->get<std::string>() : std::string();
}
}  // namespace

Recorder* active() { return g_active.load(std::memory_order_relaxed); }
void set_active(Recorder* r) { g_active.store(r, std::memory_order_release); }

Context& context() {
  thread_local Context c;
  return c;
}

Recorder::Recorder() : t0_(std::chrono::steady_clock::now()) {}

Recorder::~Recorder() { resolve_device(true); }

double Recorder::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0_).count();
}

void Recorder::add(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (max_events_ != 0 && events_.size() >= max_events_) {
    dropped_ += 1;
    return;
  }
  events_.push_back(std::move(e));
}

void Recorder::add_device(Event e, device::Mark* m) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.emplace_back(std::move(e), m);
}

void Recorder::resolve_device(bool wait) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.empty()) return;
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    auto& [e, m] = pending_[i];
    if (!wait && !device::ready(m)) {  // spans complete in order on one stream, but keep scanning
      if (kept != i) pending_[kept] = std::move(pending_[i]);
      ++kept;
      continue;
    }
    double ts = 0, dur = 0;
    std::string why;
    if (device::times(m, &ts, &dur, &why)) {
      e.args["timer"] = "cuda_event";
      e.args["cpu_ts_us"] = e.ts_exact_us;
      e.args["cpu_dur_us"] = e.dur_exact_us;
      e.ts_exact_us = ts;
      e.dur_exact_us = dur;
      e.ts_us = int64_t(ts);
      e.dur_us = int64_t(dur);
      e.tid += kDeviceTrack;
    } else {
      e.args["timer"] = "wall_clock (cuda event: " + why + ")";
    }
    device::release(m);
    if (max_events_ != 0 && events_.size() >= max_events_) {
      dropped_ += 1;
    } else {
      events_.push_back(std::move(e));
    }
  }
  pending_.resize(kept);
}

void Recorder::set_max_events(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  max_events_ = n;
}

int64_t Recorder::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

std::vector<Event> Recorder::events() const {
  resolve_device(true);
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

std::vector<SummaryRow> Recorder::summary() const { return summarize(events()); }

std::vector<SummaryRow> Recorder::summarize(std::vector<Event> ev) {
  std::vector<SummaryRow> rows;
  std::map<std::string, size_t> at;
  auto add_row = [&](const std::string& key, double us) {
    auto [it, fresh] = at.emplace(key, rows.size());
    if (fresh) rows.push_back({key, 0, 0});
    rows[it->second].count += 1;
    rows[it->second].total_us += us;
  };
  // Events are added at their end; order by start so that rows appear in execution order.
  std::stable_sort(ev.begin(), ev.end(),
                   [](const Event& a, const Event& b) { return a.ts_exact_us < b.ts_exact_us; });
  for (const Event& e : ev) {
    if (e.cat == "op") {
      add_row(arg_str(e.args, "step") + "/" + arg_str(e.args, "pass") + "/" + arg_str(e.args, "kind") + "/" +
                  e.name,
              e.dur_exact_us);
    } else if (e.cat == "collective") {
      add_row("collective/" + arg_str(e.args, "step") + "/" + arg_str(e.args, "pass") + "/" +
                  arg_str(e.args, "kind") + "/" + e.name,
              e.dur_exact_us);
    } else if (e.cat == "kernel") {
      add_row("kernel/" + e.name, e.dur_exact_us);
    } else if (e.cat == "layer") {
      add_row("layer/" + arg_str(e.args, "kind"), e.dur_exact_us);
    }
  }
  return rows;
}

nlohmann::json Recorder::to_json() const {
  resolve_device(true);
  std::vector<Event> ev;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ev = events_;
    dropped = dropped_;
  }
  return events_json(ev, dropped);
}

void Recorder::set_annotator(Annotator a) {
  std::lock_guard<std::mutex> lock(mu_);
  annotator_ = std::move(a);
}

nlohmann::json Recorder::events_json(const std::vector<Event>& events, int64_t dropped) const {
  nlohmann::json evs = nlohmann::json::array();
  const int pid = int(::getpid());
  for (const Event& e : events) {
    evs.push_back({{"name", e.name},
                   {"cat", e.cat},
                   {"ph", "X"},
                   {"ts", e.ts_exact_us},
                   {"dur", e.dur_exact_us},
                   {"pid", pid},
                   {"tid", e.tid},
                   {"args", e.args}});
  }
  nlohmann::json sum = nlohmann::json::array();
  for (const SummaryRow& r : summarize(events))
    sum.push_back({{"key", r.key}, {"count", r.count}, {"total_us", r.total_us}});
  nlohmann::json out = {
      {"traceEvents", evs}, {"displayTimeUnit", "ms"}, {"summary", sum}, {"dropped_events", dropped}};
  Annotator annotate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    annotate = annotator_;
  }
  if (annotate) annotate(events, out);
  return out;
}

std::filesystem::path Recorder::write(const std::filesystem::path& dir) const {
  return write_json(dir, to_json());
}

std::filesystem::path Recorder::flush(const std::filesystem::path& dir) {
  resolve_device(true);
  std::vector<Event> ev;
  int64_t dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ev.swap(events_);
    dropped = dropped_;
    dropped_ = 0;
  }
  return write_json(dir, events_json(ev, dropped));
}

std::filesystem::path Recorder::write_json(const std::filesystem::path& dir, const nlohmann::json& j) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DSA_CHECK(!ec, "trace: cannot create directory {}: {}", dir.string(), ec.message());
  const int n = g_writes.fetch_add(1);
  const std::filesystem::path path =
      dir / ("trace-" + std::to_string(::getpid()) + "-" + std::to_string(n) + ".json");
  std::ofstream f(path);
  DSA_CHECK(f.good(), "trace: cannot write {}", path.string());
  f << j.dump() << '\n';
  f.close();
  DSA_CHECK(f.good(), "trace: error writing {}", path.string());
  return path;
}

void Scope::begin(Recorder* r, const char* name, const char* cat) {
  rec_ = r;
  ev_.args = nlohmann::json::object();
  ev_.name = name;
  ev_.cat = cat;
  ev_.tid = thread_index();
  ev_.ts_exact_us = r->now_us();
}

void Scope::end() {
  if (mark_ != nullptr) device::end(mark_);
  ev_.dur_exact_us = rec_->now_us() - ev_.ts_exact_us;
  ev_.ts_us = int64_t(ev_.ts_exact_us);
  ev_.dur_us = int64_t(ev_.dur_exact_us);
  if (mark_ != nullptr) {
    rec_->add_device(std::move(ev_), mark_);
  } else {
    rec_->add(std::move(ev_));
  }
}

void Scope::time_on_device() {
  if (rec_ == nullptr || mark_ != nullptr || !device::available()) return;
  std::string why;
  mark_ = device::begin(rec_->now_us(), &why);
  if (mark_ == nullptr) ev_.args["timer"] = "wall_clock (cuda event: " + why + ")";
}

OpScope::OpScope(const char* name) : Scope(name, "op") {
  if (on()) {
    const Context& c = context();
    arg("step", c.step)
        .arg("pass", c.pass)
        .arg("layer", c.layer)
        .arg("kind", c.kind)
        .arg("pass_id", c.pass_id);
    if (c.device) time_on_device();
  }
}

CollectiveScope::CollectiveScope(const char* name, const char* group, int64_t group_size, double bytes)
    : Scope(name, "collective") {
  if (on()) {
    const Context& c = context();
    arg("group", group).arg("group_size", group_size).arg("bytes", bytes);
    arg("step", c.step)
        .arg("pass", c.pass)
        .arg("layer", c.layer)
        .arg("kind", c.kind)
        .arg("pass_id", c.pass_id);
  }
}

LayerScope::LayerScope(int64_t layer, std::string kind) : span_("layer", "layer") {
  Context& c = context();
  prev_layer_ = c.layer;
  prev_kind_ = c.kind;
  if (span_.on()) {
    c.layer = layer;
    c.kind = std::move(kind);
    span_.arg("layer", layer).arg("kind", c.kind).arg("step", c.step).arg("pass", c.pass);
  }
}

LayerScope::~LayerScope() {
  if (span_.on()) {
    Context& c = context();
    c.layer = prev_layer_;
    c.kind = std::move(prev_kind_);
  }
}

PassScope::PassScope(const char* step, const char* pass, bool device) : span_(pass, "pass") {
  Context& c = context();
  prev_step_ = c.step;
  prev_pass_ = c.pass;
  prev_device_ = c.device;
  prev_pass_id_ = c.pass_id;
  c.step = step;
  c.pass = pass;
  c.device = device;
  span_.arg("step", step);
  if (span_.on()) {
    static std::atomic<int64_t> next_id{0};
    c.pass_id = next_id.fetch_add(1);
    span_.arg("pass_id", c.pass_id);
    span_.arg("device", device);
    if (Recorder* r = active()) r->resolve_device(false);  // earlier passes' spans that completed
  }
}

PassScope::~PassScope() {
  Context& c = context();
  c.step = prev_step_;
  c.pass = prev_pass_;
  c.device = prev_device_;
  c.pass_id = prev_pass_id_;
}

}  // namespace dsaserve::trace
