// The engine thread's own CPU time per decode step (issue 6), without a model: the real Engine loop
// (Engine::step on this thread, overlap scheduling on) over an injected runner whose forward returns a
// fixed [requests, vocab] block of logits (a model-free step: the forward's result is the only thing
// replaced). Two runs per case:
//   untraced       EngineStats: sched_s (schedule + build + sample + stop/output + resolve, what
//                  bench/serve_bench.py reports as sched_ms/step) and busy_s (the whole step) per step
//   traced         the engine's trace spans per step (trace/trace.h), phase by phase:
//     schedule     Scheduler::schedule (the next step's batch: pages, retraction checks)
//     build        Scheduler::build_forward (the ForwardBatch: input ids, positions, cache slots, page
//     tables) sample       the step in flight's tokens: the CPU sampler over each row, stop rules,
//     StepOutputs resolve      Scheduler::prune / resolve (future input ids of the next batch) launch
//     Scheduler::commit and the runner's launch post         stats and publishing the outputs
//     (Engine::publish)
//   The traced figures include the spans' own cost (their args list the batch's request ids).
//
// scheduler_bench [--requests 64,256,1024] [--vocab 512,154880] [--steps N] [--prompt P] [--threads T]
//                 [--modes greedy,temp]
// greedy: temperature 0; temp: temperature 1 (no top-k / top-p), seeded. Requests never finish during
// the timed steps (ignore_eos, a large max_tokens), so every timed step is a decode of all of them.
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "runtime/engine/engine.h"
#include "trace/trace.h"

namespace {

using namespace dsaserve;
using namespace dsaserve::runtime;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

// The model-free runner: every step's logits are the first R rows of one fixed block.
class FixedLogitsRunner final : public ModelRunner {
 public:
  FixedLogitsRunner(std::vector<float>& block, int64_t vocab) : block_(block), vocab_(vocab) {}
  void launch(model::ForwardBatch fb) override {
    rows_ = fb.num_requests();
    DSA_CHECK(rows_ * vocab_ <= int64_t(block_.size()) && fb.extra_logit_rows.empty(),
              "scheduler_bench: {} rows", rows_);
  }
  Tensor wait() override { return Tensor::from_blob(block_.data(), {rows_, vocab_}, DType::f32, nullptr); }

 private:
  std::vector<float>& block_;
  int64_t vocab_;
  int64_t rows_ = 0;
};

struct Result {
  double sched_us = 0, busy_us = 0;  // per timed step
  std::map<std::string, double> phase_us;
  int64_t timed = 0, decode_steps = 0;
};

Result run_engine(int64_t n, int64_t vocab, bool greedy, int64_t steps, int64_t prompt, bool traced) {
  const int64_t ps = 64, warm = 3;
  model::KvCache kc;
  kc.num_pages = n * ((prompt + steps + warm + 8 + ps - 1) / ps + 1) + 16;
  kc.page_size = ps;
  EngineConfig cfg;
  cfg.scheduler.max_running_requests = n;
  cfg.scheduler.max_prefill_tokens = n * prompt + 1;
  cfg.scheduler.chunked_prefill_size = 0;
  cfg.scheduler.eos_token_ids = {1};
  // The model-free step's logits: the same [n, vocab] block every step.
  std::mt19937 rng(7);
  std::vector<float> logits(size_t(n * vocab));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (float& x : logits) x = nd(rng);
  Engine engine(
      ModelShape{vocab, 0}, std::move(kc),
      [&](model::KvCache&) { return std::make_unique<FixedLogitsRunner>(logits, vocab); }, cfg);
  std::uniform_int_distribution<int32_t> tok(2, int32_t(vocab - 1));
  for (int64_t i = 0; i < n; ++i) {
    GenerateRequest g;
    g.id = uint64_t(i);
    g.prompt.resize(size_t(prompt));
    for (int32_t& t : g.prompt) t = tok(rng);
    g.params.temperature = greedy ? 0.0f : 1.0f;
    g.params.seed = uint64_t(i);
    g.params.max_new_tokens = steps + warm + 8;
    g.params.ignore_eos = true;
    engine.submit(std::move(g));
  }
  trace::Recorder rec;
  std::vector<StepOutput> out;
  // The prefill and warm-up steps, untimed.
  for (int64_t s = 0; s <= warm; ++s) {
    engine.step();
    engine.wait_outputs(out, std::chrono::milliseconds(0));
    out.clear();
  }
  if (traced) trace::set_active(&rec);
  const double t0 = rec.now_us();
  const EngineStats before = engine.stats();
  Result res;
  for (int64_t s = 0; s < steps; ++s) {
    engine.step();
    engine.wait_outputs(out, std::chrono::milliseconds(0));  // the consumer's side
    res.decode_steps += engine.stats().last_batch_size == n ? 1 : 0;
    out.clear();
  }
  trace::set_active(nullptr);
  const EngineStats after = engine.stats();
  res.timed = after.steps - before.steps;
  const double k = 1e6 / double(std::max<int64_t>(1, res.timed));
  res.sched_us = (after.schedule_seconds - before.schedule_seconds) * k;
  res.busy_us = (after.busy_seconds - before.busy_seconds) * k;
  for (const trace::Event& e : rec.events()) {
    if (e.cat != "engine" || e.ts_exact_us < t0) continue;
    std::string name = e.name;
    if (name == "build_batch" && e.args.is_object() && e.args.contains("resolve")) name = "resolve";
    if (name == "postprocess") name = "post";
    res.phase_us[name] += e.dur_exact_us / double(std::max<int64_t>(1, res.timed));
  }
  return res;
}

void run(int64_t n, int64_t vocab, bool greedy, int64_t steps, int64_t prompt, double gpu_step_ms) {
  const Result plain = run_engine(n, vocab, greedy, steps, prompt, false);
  const Result traced = run_engine(n, vocab, greedy, steps, prompt, true);
  if (plain.decode_steps != steps)
    fmt::print("  warning: {} of {} timed steps decoded all {} requests\n", plain.decode_steps, steps, n);
  auto row = [&](const char* name, double us) {
    fmt::print("  {:<12} {:10.1f} us/step {:8.3f} us/request {:7.2f}% of {:.1f} ms\n", name, us,
               us / double(n), 100.0 * us / (gpu_step_ms * 1e3), gpu_step_ms);
  };
  fmt::print("requests {} vocab {} {} ({} timed steps, prompt {}, {} threads)\n", n, vocab,
             greedy ? "greedy" : "temperature 1", plain.timed, prompt, num_threads());
  row("sched_s", plain.sched_us);
  row("busy_s", plain.busy_us);
  fmt::print("  traced (spans included):\n");
  for (const char* phase : {"schedule", "build_batch", "sample", "resolve", "launch", "post", "step"}) {
    auto it = traced.phase_us.find(phase);
    row(phase, it == traced.phase_us.end() ? 0.0 : it->second);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> requests = {64, 256, 1024}, vocabs = {512, 154880};
  std::string modes = "greedy,temp";
  int64_t steps = 50, prompt = 256;
  // The GPU step the shares are stated against: the H200 realdims step at batch 64 (7.6 ms); pass
  // --gpu-step-ms for another estimate.
  double gpu_step_ms = 7.6;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--requests") {
      requests = parse_list(v);
    } else if (a == "--vocab") {
      vocabs = parse_list(v);
    } else if (a == "--steps") {
      steps = std::stoll(v);
    } else if (a == "--prompt") {
      prompt = std::stoll(v);
    } else if (a == "--threads") {
      set_num_threads(std::stoi(v));
    } else if (a == "--modes") {
      modes = v;
    } else if (a == "--gpu-step-ms") {
      gpu_step_ms = std::stod(v);
    } else {
      fmt::print(stderr, "unknown flag {}\n", a);
      return 2;
    }
  }
  for (int64_t vocab : vocabs) {
    for (int64_t n : requests) {
      if (modes.find("greedy") != std::string::npos) run(n, vocab, true, steps, prompt, gpu_step_ms);
      if (modes.find("temp") != std::string::npos) run(n, vocab, false, steps, prompt, gpu_step_ms);
    }
  }
  return 0;
}
