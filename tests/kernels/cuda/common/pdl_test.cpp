// Programmatic dependent launch (KernelOptions::pdl, --pdl; kernels/cuda/common/pdl.cuh): the same kernels
// on the same inputs give the same bits whether they are launched the ordinary way or as programmatic
// dependents of the kernel before them, eagerly and inside captured CUDA graphs (where the attribute becomes
// a programmatic edge). A kernel that read or wrote before its griddepcontrol.wait what the kernel before
// it writes or reads would show here as differing bits (or differing from run to run).
//   - CudaPdlOpTable.OnAndOffBitIdentical: every case of the operator table (tests/kernels/op_table.h: each
//     Backend operator at GLM-5.3 shapes, ragged token counts; one test per case) on a backend with pdl off
//     and one with pdl on.
//   - CudaPdl.Realdims{,Fp8}DecodeOnAndOffBitIdentical: the realdims fixtures' prefill, then decode steps
//     eager and replayed through the CUDA-graph runner, with pdl off and on: every logit bit-equal (bf16 and
//     FP8 KV; batches 1, 3 and 8; contexts on both sides of the indexer's top-k, so the indexer's score and
//     select kernels run; FP8 weights: the small-T FP8 GEMM and the grouped FP8 experts).
// Prints "RESULT pdl ..." lines.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "graph_requests.h"
#include "kernels/cuda/backend.h"
#include "kernels/kernel_options.h"
#include "kernels/op_table.h"
#include "kernels/tensor_compare.h"
#include "model/model.h"
#include "runtime/engine/cuda_graph_runner.h"
#include "runtime/engine/device.h"

namespace dsaserve {
namespace {

using kernels::KernelOptions;
using model::ForwardBatch;
using model::KvCache;
using model::KvCacheDtype;
using model::Model;

KernelOptions with_pdl(bool on) {
  KernelOptions o;
  o.pdl = on;
  return o;
}

// The outputs of one device run on the host (they may be views of memory the next run reuses).
std::vector<Tensor> on_host(const std::vector<Tensor>& ts) {
  std::vector<Tensor> h;
  h.reserve(ts.size());
  for (const Tensor& t : ts) h.push_back(kernels::testing::host(t).contiguous());
  return h;
}

class CudaPdlOpTable : public kernels::cuda::testing::GpuTest,
                       public ::testing::WithParamInterface<kernels::testing::OpCase> {};

TEST_P(CudaPdlOpTable, OnAndOffBitIdentical) {
  const kernels::testing::OpCase& c = GetParam();
  const std::shared_ptr<kernels::Backend> off = kernels::cuda::make_backend(with_pdl(false)),
                                          on = kernels::cuda::make_backend(with_pdl(true));
  kernels::Backend& ref = kernels::backend(Device::cpu);
  for (int64_t T : c.tokens) {
    SCOPED_TRACE(fmt::format("{} / {} T={}", c.op, c.variant, T));
    // Each make() draws the same inputs (seeded); device() runs the operator once on them.
    const std::vector<Tensor> a = on_host(c.make(*off, ref, T).device());
    const std::vector<Tensor> b = on_host(c.make(*on, ref, T).device());
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      // Every operator of the table gives the same bits run after run (none varied between ordinary runs
      // on the H100, 2026-12-06), so any difference is the launches'.
      const double d = kernels::testing::byte_mismatch(b[i], a[i]);
      fmt::print("RESULT pdl op={:<22} case={:<44} T={:<5} out={} bytes_differ={:.3g}\n", c.op, c.variant, T,
                 i, d);
      EXPECT_EQ(d, 0.0) << "output " << i << " differs with programmatic launches";
    }
  }
}

std::string case_name(const ::testing::TestParamInfo<kernels::testing::OpCase>& info) {
  std::string s = fmt::format("{}_{}_{}", info.index, info.param.op, info.param.variant);
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(CudaPdl, CudaPdlOpTable, ::testing::ValuesIn(kernels::testing::op_table()),
                         case_name);

// ---- realdims prefill + decode steps, eager and through CUDA graphs ----

constexpr int64_t kPs = 64, kPagesPerReq = 3;  // up to 192 tokens per request

// The logits (on the host) of: the prefill of `lens` tokens per request (last-token rows), then `steps`
// decode steps eager, then `steps` more through the graph runner (captured on first use), each step
// decoding testing::graph_token(r, position) at the next position of every request.
std::vector<Tensor> run_steps(const Model& m, KvCacheDtype kv, const std::vector<int64_t>& lens, int steps) {
  const int64_t B = int64_t(lens.size()), V = m.config().vocab_size;
  const auto tables = testing::interleaved_page_tables(B, kPagesPerReq);
  KvCache cache = KvCache::create(m.config(), B * kPagesPerReq + 1, kPs, false, Device::cuda, kv);
  model::ForwardOptions fo;
  fo.all_logits = false;
  std::vector<Tensor> out;
  {
    ForwardBatch b;
    b.page_size = kPs;
    for (int64_t r = 0; r < B; ++r) {
      std::vector<int32_t> ids;
      for (int64_t p = 0; p < lens[size_t(r)]; ++p) ids.push_back(testing::graph_token(r, p, V));
      b.add_request(ids, 0, tables[size_t(r)]);
    }
    out.push_back(m.forward(b, cache, fo).logits.to(Device::cpu));
  }
  runtime::CudaGraphRunner runner(m, cache, int32_t(B * kPagesPerReq), 8, fo, false);
  EXPECT_TRUE(runner.enabled());
  std::vector<int64_t> pos = lens;
  for (int s = 0; s < 2 * steps; ++s) {
    ForwardBatch b;
    b.page_size = kPs;
    std::vector<int32_t> next(static_cast<size_t>(B));
    for (int64_t r = 0; r < B; ++r) {
      next[size_t(r)] = testing::graph_token(r, pos[size_t(r)], V);
      b.add_request(std::span<const int32_t>(&next[size_t(r)], 1), pos[size_t(r)], tables[size_t(r)], true);
      ++pos[size_t(r)];
    }
    if (s < steps) {
      out.push_back(m.forward(b, cache, fo).logits.to(Device::cpu));
    } else {
      std::optional<Tensor> g = runner.run(b);
      EXPECT_TRUE(g.has_value()) << "step " << s << " did not replay a graph";
      out.push_back(g ? g->to(Device::cpu) : Tensor());
    }
  }
  return out;
}

void decode_on_and_off(const char* fixture) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, std::string("models/") + fixture);
  const std::shared_ptr<Model> loaded = Model::load(dir, false);
  const std::shared_ptr<Model> off = runtime::model_on_device(loaded, Device::cuda, with_pdl(false));
  const std::shared_ptr<Model> on = runtime::model_on_device(off, Device::cuda, with_pdl(true));
  ASSERT_EQ(on->weights().embed_tokens.raw_data(), off->weights().embed_tokens.raw_data())
      << "the pdl model shares the weights";
  const int64_t topk = on->config().index_topk;
  // Contexts below and above the indexer's top-k (realdims: 32); each decodes 4 eager + 4 graph steps.
  const std::vector<std::vector<int64_t>> cases = {
      {topk - 2}, {5, topk + 3, 2 * topk + 7}, {1, 9, topk - 1, topk, topk + 1, 50, 77, 100}};
  for (KvCacheDtype kv : {KvCacheDtype::bf16, KvCacheDtype::fp8_e4m3}) {
    for (const std::vector<int64_t>& lens : cases) {
      SCOPED_TRACE(
          fmt::format("{} kv {} B {}", fixture, kv == KvCacheDtype::bf16 ? "bf16" : "fp8", lens.size()));
      const std::vector<Tensor> a = run_steps(*off, kv, lens, 4), b = run_steps(*on, kv, lens, 4);
      ASSERT_EQ(a.size(), b.size());
      double worst = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(a[i].defined() && b[i].defined());
        const double d = kernels::testing::byte_mismatch(b[i], a[i]);
        worst = std::max(worst, d);
        EXPECT_EQ(d, 0.0) << (i == 0   ? "prefill"
                              : i <= 4 ? "eager decode step "
                                       : "graph decode step ")
                          << (i == 0 ? 0 : (i - 1) % 4) << ": " << d
                          << " of the logits' bytes differ with pdl on";
      }
      fmt::print("RESULT pdl {} kv={} B={} prefill + 4 eager + 4 graph steps: logits bytes_differ={:.3g}\n",
                 fixture, kv == KvCacheDtype::bf16 ? "bf16" : "fp8", lens.size(), worst);
    }
  }
}

TEST(CudaPdl, RealdimsDecodeOnAndOffBitIdentical) { decode_on_and_off("realdims"); }
TEST(CudaPdl, RealdimsFp8DecodeOnAndOffBitIdentical) { decode_on_and_off("realdims_fp8"); }

}  // namespace
}  // namespace dsaserve
