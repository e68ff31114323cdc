// The step plan (model/step_plan.h) on the GPU, realdims with the sm_90a kernels (bf16 and FP8 latent
// caches): the plan carries the kernels' launch plans; a verify step (decoding requests with 3 new tokens
// each over cached prefixes on both sides of index_topk) gives the same logits as the same tokens run as
// prefill chunks, bit for bit, and the CPU reference's within the decode tolerance; a mixed step whose
// absorbed requests attend per request over the plan's rows matches the all-absorbed step. Prints
// "RESULT step_plan ..." lines.
#include "model/step_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "model/model.h"
#include "runtime/engine/device.h"

namespace dsaserve::model {
namespace {

// Median over rows of max|a - b| / max|b|.
double median_row_rel(const Tensor& ours, const Tensor& ref) {
  const std::vector<float> a = ours.to_f32_vector(), b = ref.to_f32_vector();
  const int64_t R = ref.size(0), V = ref.size(1);
  std::vector<double> errs;
  for (int64_t i = 0; i < R; ++i) {
    double num = 0, den = 0;
    for (int64_t c = 0; c < V; ++c) {
      const double x = a[size_t(i * V + c)], y = b[size_t(i * V + c)];
      num = std::max(num, std::isfinite(x) ? std::fabs(x - y) : INFINITY);
      den = std::max(den, std::fabs(y));
    }
    errs.push_back(den > 0 ? num / den : num);
  }
  std::nth_element(errs.begin(), errs.begin() + R / 2, errs.end());
  return errs[size_t(R / 2)];
}

struct Requests {
  std::vector<int64_t> cached;  // per request
  std::vector<std::vector<int32_t>> pages;
  int64_t num_pages = 0, ps = 64;
  int32_t token(int64_t r, int64_t p, int64_t V) const { return int32_t((r * 7919 + p * 104729 + 13) % V); }
  ForwardBatch prefix(int64_t V) const {
    ForwardBatch b;
    b.page_size = ps;
    for (size_t r = 0; r < cached.size(); ++r) {
      std::vector<int32_t> ids;
      for (int64_t p = 0; p < cached[r]; ++p) ids.push_back(token(int64_t(r), p, V));
      b.add_request(ids, 0, pages[r], false);
    }
    return b;
  }
  // n[r] new tokens after the prefix; decoding[r] as given.
  ForwardBatch step(int64_t V, const std::vector<int64_t>& n, const std::vector<bool>& decoding) const {
    ForwardBatch b;
    b.page_size = ps;
    for (size_t r = 0; r < cached.size(); ++r) {
      std::vector<int32_t> ids;
      for (int64_t p = cached[r]; p < cached[r] + n[r]; ++p) ids.push_back(token(int64_t(r), p, V));
      b.add_request(ids, cached[r], pages[r], bool(decoding[r]));
    }
    return b;
  }
};

Requests make_requests(std::vector<int64_t> cached, int64_t extra) {
  Requests s;
  s.cached = std::move(cached);
  int32_t next = 0;
  for (int64_t c : s.cached) {
    const int64_t n = (c + extra + s.ps - 1) / s.ps;
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back(next++);
    s.pages.push_back(std::move(p));
  }
  s.num_pages = next;
  return s;
}

TEST(CudaStepPlan, VerifyStepEqualsPrefillChunksAndTheCpu) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const auto cpu_model = Model::load(dir, false);
  const auto gpu_model = runtime::model_on_device(cpu_model, Device::cuda);
  const ModelConfig& c = gpu_model->config();
  const int64_t V = c.vocab_size, topk = c.index_topk;
  // Prefixes on both sides of index_topk (and across a page boundary).
  const Requests s = make_requests({5, topk - 2, topk + 40, 130}, 3);
  const std::vector<int64_t> three(s.cached.size(), 3);
  const ForwardBatch verify = s.step(V, three, std::vector<bool>(s.cached.size(), true));
  const ForwardBatch chunks = s.step(V, three, std::vector<bool>(s.cached.size(), false));
  // The CPU reference.
  KvCache cpu_cache = cpu_model->make_cache(s.num_pages, s.ps);
  (void)cpu_model->forward(s.prefix(V), cpu_cache, ForwardOptions{});
  const Tensor ref = cpu_model->forward(chunks, cpu_cache, ForwardOptions{}).logits;
  for (KvCacheDtype kv : {KvCacheDtype::bf16, KvCacheDtype::fp8_e4m3}) {
    KvCache a = KvCache::create(c, s.num_pages, s.ps, false, Device::cuda, kv);
    KvCache b = KvCache::create(c, s.num_pages, s.ps, false, Device::cuda, kv);
    ForwardOptions fo;
    fo.all_logits = false;
    (void)gpu_model->forward(s.prefix(V), a, fo);
    (void)gpu_model->forward(s.prefix(V), b, fo);
    const StepPlan plan = gpu_model->plan_step(verify, fo);
    EXPECT_EQ(plan.kind, StepKind::verify);
    EXPECT_TRUE(plan.mla.planned) << "the CUDA backend plans the MLA decode kernel once per step";
    EXPECT_EQ(plan.mla.rows, plan.num_tokens());
    EXPECT_EQ(plan.indexer.planned, plan.runs_indexer);
    fo.plan = &plan;
    const Tensor v = gpu_model->forward(verify, a, fo).logits.to(Device::cpu);
    const Tensor ch = gpu_model->forward(chunks, b, ForwardOptions{}).logits.to(Device::cpu);
    ASSERT_EQ(v.size(0), ch.size(0));
    const std::vector<float> x = v.to_f32_vector(), y = ch.to_f32_vector();
    int64_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += x[i] != y[i];
    const double med = median_row_rel(v, ref);
    fmt::print(
        "RESULT step_plan verify realdims kv={} rows={} differ_from_chunks={} vs_cpu_median_rel={:.3g}\n",
        kv == KvCacheDtype::bf16 ? "bf16" : "fp8", v.size(0), differ, med);
    EXPECT_EQ(differ, 0) << "the same kernels over the same rows";
    EXPECT_LE(med, kv == KvCacheDtype::fp8_e4m3 ? 1e-1 : 2e-2);
  }
}

TEST(CudaStepPlan, MixedFormsMatchTheAbsorbedForm) {
  DSA_SKIP_WITHOUT_GPU();
  DSA_FIXTURE_PATH(dir, "models/realdims");
  const auto gpu_model = runtime::model_on_device(Model::load(dir, false), Device::cuda);
  const ModelConfig& c = gpu_model->config();
  const int64_t V = c.vocab_size;
  const Requests s = make_requests({40, 3, c.index_topk + 20}, 16);
  const ForwardBatch b = s.step(V, {1, 16, 2}, {true, false, false});
  Tensor out[2];
  for (int form = 0; form < 2; ++form) {
    KvCache cache = KvCache::create(c, s.num_pages, s.ps, false, Device::cuda, KvCacheDtype::bf16);
    ForwardOptions o;
    o.all_logits = false;
    (void)gpu_model->forward(s.prefix(V), cache, o);
    o.mha_min_tokens = form == 0 ? 4 : 256;  // form 0: the 16-token chunk takes MHA
    o.form_rule.wide = o.form_rule.narrow = AttentionFormRates{};
    const StepPlan plan = gpu_model->plan_step(b, o);
    EXPECT_EQ(plan.absorbed.size(), form == 0 ? 2u : 3u);
    EXPECT_EQ(plan.mla_request.size(), form == 0 ? 2u : 0u);
    o.plan = &plan;
    out[form] = gpu_model->forward(b, cache, o).logits.to(Device::cpu);
  }
  const double med = median_row_rel(out[0], out[1]);
  fmt::print("RESULT step_plan mixed forms realdims bf16 median_rel_vs_absorbed={:.3g}\n", med);
  EXPECT_LE(med, 2e-2);
}

}  // namespace
}  // namespace dsaserve::model
