// The engine thread's own CPU time per decode step (issue 6), without a model: the real Scheduler,
// KvPool and RadixCache driven in the engine's overlap order, with a fixed [requests, vocab] block of
// logits standing in for each step's forward (a model-free step: the forward's result is the only thing
// replaced). Per step, in the order Engine::step runs them:
//   schedule     Scheduler::schedule (the next step's batch: pages, retraction checks)
//   build        Scheduler::build_forward (the ForwardBatch: input ids, positions, cache slots, page tables)
//   sample       the step in flight's tokens: Scheduler::sample_rows (the CPU sampler over each row)
//   stop/output  Scheduler::process with the sampled rows (stop rules, StepOutputs, finished requests)
//   resolve      Scheduler::prune / resolve (future input ids of the next batch)
//   commit       Scheduler::commit
//   publish      the outputs moved into a mutex-guarded deque (Engine::publish)
// Engine::stats().schedule_seconds (sched_ms/step in bench/serve_bench.py) covers schedule + build +
// sample + stop/output + resolve; commit and publish are outside it (they are listed for completeness).
//
// scheduler_bench [--requests 64,256,1024] [--vocab 512,154880] [--steps N] [--prompt P] [--threads T]
//                 [--modes greedy,temp]
// greedy: temperature 0; temp: temperature 1 (no top-k / top-p), seeded. Requests never finish during
// the timed steps (ignore_eos, a large max_tokens), so every timed step is a decode of all of them.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "runtime/scheduler/scheduler.h"

namespace {

using namespace dsaserve;
using namespace dsaserve::runtime;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

struct Phases {
  double schedule = 0, build = 0, sample = 0, output = 0, resolve = 0, commit = 0, publish = 0;
  double engine_sched() const { return schedule + build + sample + output + resolve; }
};

void run(int64_t n, int64_t vocab, bool greedy, int64_t steps, int64_t prompt, double gpu_step_ms) {
  const int64_t ps = 64, warm = 3;
  const int64_t pages = n * ((prompt + steps + warm + 8 + ps - 1) / ps + 1) + 16;
  model::KvCache kc;
  kc.num_pages = pages;
  kc.page_size = ps;
  KvPool pool(std::move(kc));
  RadixCache cache(pool, true);
  SchedulerConfig cfg;
  cfg.max_running_requests = n;
  cfg.max_prefill_tokens = n * prompt + 1;
  cfg.chunked_prefill_size = 0;
  cfg.eos_token_ids = {1};
  Scheduler sched(cfg, pool, cache);

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(2, int32_t(vocab - 1));
  std::vector<StepOutput> out;
  for (int64_t i = 0; i < n; ++i) {
    auto r = std::make_unique<Request>();
    r->id = uint64_t(i);
    r->tokens.resize(size_t(prompt));
    for (int32_t& t : r->tokens) t = tok(rng);
    r->params.temperature = greedy ? 0.0f : 1.0f;
    r->params.seed = uint64_t(i);
    r->params.max_new_tokens = steps + warm + 8;
    r->params.ignore_eos = true;
    r->sampler = SamplerState(*r->params.seed, r->tokens, uses_token_history(r->params));  // as the engine
    sched.add(std::move(r), out);
  }
  // The model-free step's logits: the same [n, vocab] block every step.
  std::vector<float> logits(size_t(n * vocab));
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (float& x : logits) x = nd(rng);

  std::mutex out_mu;
  std::deque<StepOutput> published;
  std::vector<SampleResult> results;
  std::vector<SampleRow> rows;
  ScheduleBatch in_flight;
  Phases ph;
  int64_t timed = 0, decode_items = 0;
  for (int64_t step = 0; step < steps + warm + 1; ++step) {
    const bool time_it = step > warm;
    Phases p;
    auto t = Clock::now();
    ScheduleBatch batch = sched.schedule(out);
    p.schedule = us_since(t);
    t = Clock::now();
    model::ForwardBatch fb;
    if (!batch.empty()) fb = sched.build_forward(batch);
    p.build = us_since(t);
    if (!in_flight.empty()) {
      const std::span<const float> lg(logits.data(), in_flight.items.size() * size_t(vocab));
      t = Clock::now();
      sched.sample_rows(in_flight, lg, vocab, results, rows);
      p.sample = us_since(t);
      t = Clock::now();
      sched.process(in_flight, rows, out);
      p.output = us_since(t);
      t = Clock::now();
      if (sched.prune(batch)) {
        fb = batch.empty() ? model::ForwardBatch() : sched.build_forward(batch);
      } else if (!batch.empty()) {
        sched.resolve(batch, fb);
      }
      p.resolve = us_since(t);
    }
    t = Clock::now();
    if (!batch.empty()) sched.commit(batch);
    p.commit = us_since(t);
    t = Clock::now();
    {
      std::lock_guard<std::mutex> lk(out_mu);
      for (auto& o : out) published.push_back(std::move(o));
    }
    out.clear();
    published.clear();  // the consumer's side, not timed work of the engine
    p.publish = us_since(t);
    in_flight = std::move(batch);
    if (time_it) {
      ph.schedule += p.schedule;
      ph.build += p.build;
      ph.sample += p.sample;
      ph.output += p.output;
      ph.resolve += p.resolve;
      ph.commit += p.commit;
      ph.publish += p.publish;
      decode_items += in_flight.num_decode;
      ++timed;
    }
  }
  if (decode_items != timed * n)
    fmt::print("  warning: {} decode items over {} steps (expected {} per step)\n", decode_items, timed, n);
  const double k = 1.0 / double(timed);
  auto row = [&](const char* name, double us) {
    fmt::print("  {:<12} {:10.1f} us/step {:8.3f} us/request {:7.2f}% of {:.1f} ms\n", name, us * k,
               us * k / double(n), 100.0 * us * k / (gpu_step_ms * 1e3), gpu_step_ms);
  };
  fmt::print("requests {} vocab {} {} ({} timed steps, prompt {}, {} threads)\n", n, vocab,
             greedy ? "greedy" : "temperature 1", timed, prompt, num_threads());
  row("schedule", ph.schedule);
  row("build", ph.build);
  row("sample", ph.sample);
  row("stop/output", ph.output);
  row("resolve", ph.resolve);
  row("commit", ph.commit);
  row("publish", ph.publish);
  row("sched_s", ph.engine_sched());
  row("  w/o sample", ph.engine_sched() - ph.sample);
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
