// issue 9: op spans of a CUDA forward are timed with CUDA events (trace/device_timer.h). The realdims
// fixture runs a traced prefill (past index_topk, so the indexer selects) and one decode step on the GPU:
// every op span is device-timed with a positive duration, the ops are the CPU forward's ops of the same
// batch in the same order (one span per op), and their GPU time sums to no more than the pass's wall time
// (launch to the logits on the host). Prints "RESULT" lines with the per-op GPU times.
#include "trace/trace.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "model/model.h"
#include "runtime/engine/device.h"

namespace dsaserve::model {
namespace {

constexpr int64_t kPrompt = 80, kPageSize = 64;  // more tokens than realdims' index_topk (32)

struct PassRun {
  std::vector<trace::Event> ops;  // op spans, in issue order
  double wall_us = 0;             // forward call to its logits on the host
};

// A prefill of kPrompt tokens then one decode step, each traced with its own recorder.
std::vector<PassRun> run(const Model& m) {
  const int64_t V = m.config().vocab_size, pages = (kPrompt + 1 + kPageSize - 1) / kPageSize;
  std::vector<int32_t> ids;
  for (int64_t i = 0; i <= kPrompt; ++i) ids.push_back(int32_t(1 + (i * 7) % (V - 1)));
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  KvCache cache = m.make_cache(pages, kPageSize);
  std::vector<PassRun> out;
  for (int pass = 0; pass < 2; ++pass) {
    ForwardBatch b;
    b.page_size = kPageSize;
    if (pass == 0) {
      b.add_request(std::span<const int32_t>(ids).first(size_t(kPrompt)), 0, table);
    } else {
      b.add_request(std::span<const int32_t>(ids).subspan(size_t(kPrompt), 1), kPrompt, table);
    }
    ForwardOptions fo;
    fo.all_logits = false;  // the last token's logits, as the engine asks
    trace::Recorder rec;
    trace::set_active(&rec);
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor logits = m.forward(b, cache, fo).logits.to(Device::cpu);  // waits for the GPU
    const auto t1 = std::chrono::steady_clock::now();
    trace::set_active(nullptr);
    EXPECT_EQ(logits.size(0), 1);
    PassRun r;
    r.wall_us = std::chrono::duration<double, std::micro>(t1 - t0).count();
    for (trace::Event& e : rec.events()) {
      if (e.cat == "op") r.ops.push_back(std::move(e));
    }
    // Issue order: the host's start (device-timed spans keep it as cpu_ts_us).
    auto host_ts = [](const trace::Event& e) {
      return e.args.contains("cpu_ts_us") ? e.args["cpu_ts_us"].get<double>() : e.ts_exact_us;
    };
    std::stable_sort(r.ops.begin(), r.ops.end(),
                     [&](const trace::Event& x, const trace::Event& y) { return host_ts(x) < host_ts(y); });
    out.push_back(std::move(r));
  }
  return out;
}

TEST(CudaTrace, RealdimsOpSpansTimedWithCudaEvents) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const auto cpu_model = Model::load(dir, false);
  const auto gpu_model = runtime::model_on_device(cpu_model, Device::cuda);
  const Model& gpu = *gpu_model;

  run(gpu);  // warm-up: module loads and GEMM heuristics out of the timed passes
  const std::vector<PassRun> want = run(*cpu_model), got = run(gpu);
  ASSERT_EQ(got.size(), 2u);
  for (size_t p = 0; p < got.size(); ++p) {
    const char* step = p == 0 ? "prefill" : "decode";
    SCOPED_TRACE(step);
    const PassRun& g = got[p];
    std::vector<std::string> names, want_names;
    for (const auto& e : g.ops) names.push_back(e.name);
    for (const auto& e : want[p].ops) want_names.push_back(e.name);
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names, want_names) << "one device span per op of the CPU forward, in the same order";
    double sum_us = 0;
    std::map<std::string, double> per_op;
    for (const trace::Event& e : g.ops) {
      EXPECT_EQ(e.args.value("timer", std::string()), "cuda_event") << e.name;
      EXPECT_EQ(e.args.value("step", std::string()), step) << e.name;
      EXPECT_GE(e.tid, trace::kDeviceTrack) << e.name;
      EXPECT_GT(e.dur_exact_us, 0.0) << e.name << " layer " << e.args.value("layer", int64_t(-1));
      sum_us += e.dur_exact_us;
      per_op[e.name] += e.dur_exact_us;
    }
    EXPECT_LE(sum_us, g.wall_us) << "GPU op time beyond the pass's wall time";
    fmt::print("RESULT cuda_trace realdims {}: {} op spans, GPU sum {:.1f} us, wall {:.1f} us\n", step,
               g.ops.size(), sum_us, g.wall_us);
    for (const auto& [name, us] : per_op)
      fmt::print("RESULT cuda_trace realdims {} {}: {:.1f} us\n", step, name, us);
  }
}

}  // namespace
}  // namespace dsaserve::model
