// GPU: the CUDA dummy-weight fill (--load-format dummy) writes exactly the CPU's bytes, tensor by tensor
// at GLM-5.3's widths and for a whole model; the indexer's row split (the score budget) selects exactly
// what one launch selects.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <span>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "indexer_test_util.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/ops.h"
#include "model/dummy_weights.h"

namespace dsaserve::kernels::cuda {
namespace {

using testing::GpuTest;
class CudaDummy : public GpuTest {};

bool same_bytes(const Tensor& cpu, const Tensor& gpu, int64_t* first_diff) {
  const Tensor g = gpu.to(Device::cpu);
  const auto* a = static_cast<const uint8_t*>(cpu.raw_data());
  const auto* b = static_cast<const uint8_t*>(g.raw_data());
  if (cpu.nbytes() != g.nbytes()) return false;
  for (size_t i = 0; i < cpu.nbytes(); ++i) {
    if (a[i] != b[i]) {
      *first_diff = int64_t(i);
      return false;
    }
  }
  return true;
}

TEST_F(CudaDummy, FillGivesTheCpuBytesAtGlm53Widths) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const model::ModelConfig c = model::ModelConfig::load(path, R"({"num_hidden_layers": 4})");
  std::map<std::string, model::DummyTensor> by;
  for (const model::DummyTensor& t : model::dummy_tensors(c, 1234)) by[t.name] = t;
  for (const char* name :
       {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
        "model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.q_b_proj.weight_scale_inv",
        "model.layers.0.self_attn.indexer.wk.weight", "model.layers.0.self_attn.indexer.k_norm.bias",
        "model.layers.0.mlp.down_proj.weight", "model.layers.3.mlp.experts.200.gate_proj.weight",
        "model.layers.3.mlp.gate.weight", "model.layers.3.mlp.gate.e_score_correction_bias"}) {
    ASSERT_TRUE(by.count(name)) << name;
    const model::DummyTensor& d = by[name];
    Tensor cpu = Tensor::empty(d.shape, d.dtype), gpu = Tensor::empty(d.shape, d.dtype, Device::cuda);
    fill_dummy(cpu, d.fill);
    fill_dummy(gpu, d.fill);
    int64_t diff = -1;
    const bool ok = same_bytes(cpu, gpu, &diff);
    std::printf("RESULT dummy fill %s %s: %s\n", name, cpu.describe().c_str(),
                ok ? "identical" : fmt::format("differs at byte {}", diff).c_str());
    EXPECT_TRUE(ok) << name << " differs at byte " << diff;
  }
}

TEST_F(CudaDummy, WholeModelOnTheGpuEqualsTheCpu) {
  DSA_FIXTURE_PATH(rd, "models/realdims_fp8");
  const model::ModelConfig c = model::ModelConfig::load(rd);
  const std::vector<model::DummyTensor> names = model::dummy_tensors(c, 5, true);
  const model::ModelWeights a = model::make_dummy_weights(c, Device::cpu, 5, true);
  const model::ModelWeights b = model::make_dummy_weights(c, Device::cuda, 5, true);
  int64_t checked = 0, bad = 0;
  auto cmp = [&](const Tensor& x, const Tensor& y) {
    if (!x.defined()) return;
    int64_t diff = -1;
    bad += same_bytes(x, y, &diff) ? 0 : 1;
    ++checked;
  };
  cmp(a.embed_tokens, b.embed_tokens);
  cmp(a.lm_head.weight, b.lm_head.weight);
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const auto &x = a.layers[l].attn, &y = b.layers[l].attn;
    cmp(x.q_b_proj.weight, y.q_b_proj.weight);
    cmp(x.q_b_proj.scale_inv, y.q_b_proj.scale_inv);
    cmp(x.kv_b_proj.weight, y.kv_b_proj.weight);
    cmp(a.layers[l].input_layernorm, b.layers[l].input_layernorm);
    if (a.layers[l].moe) {
      for (size_t e = 0; e < a.layers[l].moe->experts.size(); ++e) {
        cmp(a.layers[l].moe->experts[e].up.weight, b.layers[l].moe->experts[e].up.weight);
        cmp(a.layers[l].moe->experts[e].up.scale_inv, b.layers[l].moe->experts[e].up.scale_inv);
      }
      cmp(a.layers[l].moe->e_score_correction_bias, b.layers[l].moe->e_score_correction_bias);
    }
  }
  cmp(a.mtp[0].eh_proj.weight, b.mtp[0].eh_proj.weight);
  std::printf(
      "RESULT dummy realdims_fp8 on the GPU vs the CPU: %lld tensors compared, %lld differ (%zu in all)\n",
      (long long)checked, (long long)bad, names.size());
  EXPECT_EQ(bad, 0);
  EXPECT_GT(checked, 50);
}

// Rows split into blocks by the score budget (here a few rows' worth) select exactly what one launch
// selects: packed (host lengths) and dense (graph replays) layouts.
TEST_F(CudaDummy, IndexerRowSplitSelectsTheSame) {
  using namespace test_util;
  Rng r(77);
  const int64_t ih = 32, topk = 256, B = 96, max_len = 6000;
  const Paging pg = make_paging({max_len}, r);
  const Tensor keys = rand_bf16_values({pg.num_pages * kPage, kIndexerDim}, r, 1.0f);
  const Tensor q = rand_bf16_values({B, ih, kIndexerDim}, r, 1.0f);
  const Tensor w = rand_bf16_values({B, ih}, r, 1.0f);
  std::vector<int32_t> len(static_cast<size_t>(B)), seq(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b)
    len[size_t(b)] = b % 7 == 0 ? int32_t(r.below(topk) + 1) : int32_t(r.below(max_len) + 1);
  const double scale = 1.0 / std::sqrt(128.0), ws = 1.0 / std::sqrt(double(ih));
  const Tensor qg = q.to(Device::cuda), wg = w.to(Device::cuda), cache = bf16_copy(keys).to(Device::cuda),
               pt = pg.table_gpu(), lg = gpu_i32(len, {B}), sg = gpu_i32(seq, {B});
  for (bool packed : {true, false}) {
    const std::span<const int32_t> host = packed ? std::span<const int32_t>(len) : std::span<const int32_t>();
    const Tensor whole =
        indexer_topk_rows(qg, wg, cache, pt, kPage, sg, lg, max_len, topk, scale, ws, nullptr, host)
            .to(Device::cpu);
    const Tensor split = indexer_topk_rows(qg, wg, cache, pt, kPage, sg, lg, max_len, topk, scale, ws,
                                           nullptr, host, int64_t(3) * max_len * 4)
                             .to(Device::cpu);
    const bool same = std::memcmp(whole.raw_data(), split.raw_data(), whole.nbytes()) == 0;
    std::printf("RESULT indexer row split (%s, %lld rows, blocks of <= 3 rows' scores): %s\n",
                packed ? "packed" : "dense", (long long)B, same ? "identical" : "DIFFERENT");
    EXPECT_TRUE(same) << (packed ? "packed" : "dense");
  }
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
