// Dummy weights (--load-format dummy) and config overrides (--json-model-override-args): the dtypes the
// FP8 checkpoints use, deterministic bytes that depend only on (seed, name, element), sane value scales,
// and activations that stay finite and bounded through many layers.
#include "model/dummy_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "core/error.h"
#include "kernels/ops.h"
#include "model/forward_batch.h"
#include "model/model.h"

namespace dsaserve::model {
namespace {

ModelConfig glm53(const std::string& overrides) {
  const auto path = testing::fixtures_dir() / "configs/glm-5.3.json";
  return ModelConfig::load(path, overrides);
}

TEST(ConfigOverrides, TruncationKeepsDenseLayersAndIndexerPattern) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const ModelConfig full = ModelConfig::load(path);
  const ModelConfig c = ModelConfig::load(path, R"({"num_hidden_layers": 8})");
  ASSERT_EQ(c.num_hidden_layers, 8);
  ASSERT_EQ(c.indexer_types.size(), 8u);
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(c.indexer_types[size_t(l)], full.indexer_types[size_t(l)]) << l;
    EXPECT_EQ(c.mlp_layer_types[size_t(l)], l < 3 ? MlpType::dense : MlpType::moe) << l;
  }
  EXPECT_EQ(c.num_full_indexer_layers(), 4);  // full, full, full, shared x3, full, shared
  EXPECT_EQ(c.hidden_size, 6144);
  EXPECT_EQ(c.vocab_size, 154880);
  // Other keys replace the config's; a list given in the overrides is taken as given.
  const ModelConfig d = ModelConfig::load(
      path, R"({"num_hidden_layers": 2, "first_k_dense_replace": 1, "indexer_types": ["full", "shared"]})");
  EXPECT_EQ(d.mlp_layer_types, (std::vector<MlpType>{MlpType::dense, MlpType::moe}));
  EXPECT_EQ(d.indexer_types, (std::vector<IndexerType>{IndexerType::full, IndexerType::shared}));
  // A folder holding config.json and the file itself are the same model.
  EXPECT_EQ(ModelConfig::config_path(path.parent_path()), path.parent_path() / "config.json");
  EXPECT_EQ(ModelConfig::config_path(path), path);
}

TEST(ConfigOverrides, BadOverridesAreClearErrors) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  auto message = [&](const std::string& o) {
    try {
      (void)ModelConfig::load(path, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{num_hidden_layers: 8}").find("--json-model-override-args: not valid JSON"),
            std::string::npos);
  EXPECT_NE(message("[1, 2]").find("expected a JSON object"), std::string::npos);
  // Growing past the per-layer list: the config parser names the list.
  EXPECT_NE(message(R"({"num_hidden_layers": 80})").find("indexer_types"), std::string::npos);
  EXPECT_NE(message(R"({"hidden_size": "wide"})").find("hidden_size"), std::string::npos);
}

// The CPU fill (parallel_for over hash groups) writes exactly core/dummy_fill.h's per-element reference
// (the CUDA kernel follows the same reference): odd lengths, every dtype, offsets and positive scales.
TEST(DummyFill, CpuFillEqualsThePerElementReference) {
  for (const int64_t n : {int64_t(1), int64_t(7), int64_t(1001), int64_t(300007)}) {
    const dummy::FillSpec spec{11, tensor_key("t"), 0x1p-4f, 1.0f, false}, pos{11, 5, 0.03f, 0.0f, true};
    const uint64_t base = dummy::stream_base(spec.seed, spec.key),
                   pbase = dummy::stream_base(pos.seed, pos.key);
    Tensor b = Tensor::empty({n}, DType::bf16), f = Tensor::empty({n}, DType::f32),
           q = Tensor::empty({n}, DType::f8e4m3fn);
    kernels::fill_dummy(b, spec);
    kernels::fill_dummy(f, pos);
    kernels::fill_dummy(q, spec);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      bad += b.data_u16()[i] != dummy::bf16_element(spec, base, uint64_t(i));
      bad += f.data<float>()[i] != dummy::f32_element(pos, pbase, uint64_t(i));
      bad += q.data_u8()[i] != dummy::fp8_element(base, uint64_t(i));
    }
    EXPECT_EQ(bad, 0) << n;
    if (n > 1000) {  // neighbours differ (the group split does not repeat values)
      EXPECT_NE(b.data_u16()[0], b.data_u16()[1]);
      EXPECT_NE(q.data_u8()[0] | (q.data_u8()[1] << 8), q.data_u8()[4] | (q.data_u8()[5] << 8));
    }
  }
}

TEST(DummyWeights, DtypesFollowTheFp8Checkpoints) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const ModelConfig c = glm53(R"({"num_hidden_layers": 4})");
  std::map<std::string, DummyTensor> by;
  for (const DummyTensor& t : dummy_tensors(c)) by[t.name] = t;
  auto dtype = [&](const std::string& n) {
    EXPECT_TRUE(by.count(n)) << n;
    return by.count(n) ? by[n].dtype : DType::u8;
  };
  for (const char* n : {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "indexer.wq_b"})
    EXPECT_EQ(dtype(fmt::format("model.layers.0.self_attn.{}.weight", n)), DType::f8e4m3fn) << n;
  EXPECT_EQ(dtype("model.layers.0.mlp.gate_proj.weight"), DType::f8e4m3fn);
  EXPECT_EQ(dtype("model.layers.3.mlp.experts.255.down_proj.weight"), DType::f8e4m3fn);
  EXPECT_EQ(dtype("model.layers.3.mlp.shared_experts.up_proj.weight"), DType::f8e4m3fn);
  EXPECT_EQ(dtype("model.layers.0.self_attn.indexer.wk.weight"), DType::bf16);
  EXPECT_EQ(dtype("model.layers.0.self_attn.indexer.weights_proj.weight"), DType::bf16);
  EXPECT_EQ(dtype("model.layers.3.mlp.gate.weight"), DType::bf16);
  EXPECT_EQ(dtype("model.layers.3.mlp.gate.e_score_correction_bias"), DType::f32);
  EXPECT_EQ(dtype("model.embed_tokens.weight"), DType::bf16);
  EXPECT_EQ(dtype("lm_head.weight"), DType::bf16);
  EXPECT_EQ(dtype("model.norm.weight"), DType::bf16);
  const DummyTensor& s = by["model.layers.0.self_attn.q_b_proj.weight_scale_inv"];
  EXPECT_EQ(s.dtype, DType::f32);
  EXPECT_EQ(s.shape, (Shape{64 * 256 / 128, 2048 / 128}));
  EXPECT_EQ(by["model.layers.0.self_attn.kv_a_proj_with_mqa.weight_scale_inv"].shape, (Shape{5, 48}));
  EXPECT_FALSE(by.count("model.layers.3.self_attn.indexer.wk.weight"));  // a shared layer: no indexer
  EXPECT_FALSE(by.count("model.layers.4.enorm.weight"));                 // no MTP unless asked
  // The MTP layer: a MoE layer with its own indexer, the target's embeddings and head.
  std::map<std::string, DummyTensor> mtp;
  for (const DummyTensor& t : dummy_tensors(c, 0, true)) mtp[t.name] = t;
  EXPECT_TRUE(mtp.count("model.layers.4.eh_proj.weight"));
  EXPECT_EQ(mtp["model.layers.4.eh_proj.weight"].dtype, DType::bf16);
  EXPECT_TRUE(mtp.count("model.layers.4.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(mtp.count("model.layers.4.self_attn.indexer.wq_b.weight"));
  EXPECT_FALSE(mtp.count("model.layers.4.embed_tokens.weight"));
  // Without quantization_config: bf16 linears, no scales.
  const ModelConfig b = glm53(R"({"num_hidden_layers": 1, "quantization_config": null})");
  for (const DummyTensor& t : dummy_tensors(b)) {
    EXPECT_NE(t.dtype, DType::f8e4m3fn) << t.name;
    EXPECT_EQ(t.name.find("scale_inv"), std::string::npos) << t.name;
  }
}

// Bytes of every layer of the 8-layer GLM-5.3 slice (FP8): the dense layers, the MoE layers, the
// embeddings and head; what `inspect --load-format dummy` and the memory split report.
TEST(DummyWeights, EightLayerSliceSize) {
  DSA_FIXTURE_PATH(path, "configs/glm-5.3.json");
  const ModelConfig c = glm53(R"({"num_hidden_layers": 8})");
  const double gib = double(dummy_weight_bytes(c)) / double(int64_t(1) << 30);
  // 5 MoE layers x 256 experts x 3 x 6144 x 2048 FP8 = 45 GiB, + 2 x 1.77 GiB bf16 vocab, + the rest.
  EXPECT_GT(gib, 50.0);
  EXPECT_LT(gib, 56.0);
  std::printf("RESULT dummy glm-5.3 x8 layers: %.2f GiB of weights\n", gib);
}

TEST(DummyWeights, DeterministicPerNameAndScaled) {
  DSA_FIXTURE_PATH(tiny, "models/tiny");
  const ModelConfig c = ModelConfig::load(tiny);
  const ModelWeights a = make_dummy_weights(c, Device::cpu, 7);
  const ModelWeights b = make_dummy_weights(c, Device::cpu, 7);
  const ModelWeights other = make_dummy_weights(c, Device::cpu, 8);
  auto same = [](const Tensor& x, const Tensor& y) {
    return x.nbytes() == y.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0;
  };
  EXPECT_TRUE(same(a.layers[1].attn.q_b_proj.weight, b.layers[1].attn.q_b_proj.weight));
  EXPECT_FALSE(same(a.layers[1].attn.q_b_proj.weight, other.layers[1].attn.q_b_proj.weight));
  EXPECT_FALSE(same(a.layers[1].moe->experts[0].gate.weight, a.layers[1].moe->experts[1].gate.weight));
  // Truncating layers leaves the others' bytes unchanged.
  const ModelConfig c2 = ModelConfig::load(tiny, R"({"num_hidden_layers": 2})");
  const ModelWeights t = make_dummy_weights(c2, Device::cpu, 7);
  ASSERT_EQ(t.layers.size(), 2u);
  EXPECT_TRUE(same(t.layers[1].moe->experts[2].down.weight, a.layers[1].moe->experts[2].down.weight));
  EXPECT_TRUE(same(t.lm_head.weight, a.lm_head.weight));
  // Scales: linears uniform of std 1/sqrt(in); norms 1 +- 1/16.
  auto stats = [](const Tensor& w) {
    const Tensor f = w.to(DType::f32);
    double s = 0, s2 = 0;
    const float* p = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) s += p[i], s2 += double(p[i]) * p[i];
    return std::pair{s / double(f.numel()), std::sqrt(s2 / double(f.numel()))};
  };
  const auto [m, rms] = stats(a.embed_tokens);
  EXPECT_NEAR(m, 0.0, 0.02);
  EXPECT_NEAR(rms, 1.0 / std::sqrt(3.0), 0.02);
  const Tensor& wq = a.layers[0].attn.q_b_proj.weight;  // bf16 [nh * dq, q_lora]
  EXPECT_NEAR(stats(wq).second, 1.0 / std::sqrt(double(wq.size(1))), 0.05 / std::sqrt(double(wq.size(1))));
  const auto [nm, nrms] = stats(a.norm);
  EXPECT_NEAR(nm, 1.0, 0.02);
  (void)nrms;
}

TEST(DummyWeights, Fp8ValuesHaveTheLinearScaleAndNoNan) {
  DSA_FIXTURE_PATH(rd, "models/realdims_fp8");
  const ModelConfig c = ModelConfig::load(rd);
  const ModelWeights w = make_dummy_weights(c, Device::cpu, 1);
  const Linear& l = w.layers[0].attn.o_proj;  // [256, 1024] FP8
  ASSERT_TRUE(l.is_fp8());
  const uint8_t* codes = static_cast<const uint8_t*>(l.weight.raw_data());
  const float* sc = l.scale_inv.data<float>();
  double s2 = 0;
  const int64_t out = l.out_features(), in = l.in_features();
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t k = 0; k < in; ++k) {
      const uint8_t code = codes[r * in + k];
      ASSERT_NE(code & 0x7f, 0x7f) << "NaN code";
      const double v = double(f8e4m3fn_to_f32(code)) * sc[(r / 128) * l.scale_inv.size(1) + k / 128];
      s2 += v * v;
    }
  }
  EXPECT_NEAR(std::sqrt(s2 / double(out * in)), 1.0 / std::sqrt(double(in)), 0.1 / std::sqrt(double(in)));
}

// Through many layers (realdims' geometry, 24 layers): the hidden states' RMS stays bounded, the logits
// finite; FP8 and bf16 weights.
TEST(DummyWeights, ActivationsStayBoundedThroughManyLayers) {
  DSA_FIXTURE_PATH(rd, "models/realdims_fp8");
  for (const char* q : {"", ", \"quantization_config\": null"}) {
    std::vector<std::string> types;
    for (int l = 0; l < 24; ++l) types.push_back(l % 4 == 0 ? "\"full\"" : "\"shared\"");
    const ModelConfig c = ModelConfig::load(
        rd, fmt::format(R"({{"num_hidden_layers": 24, "indexer_types": [{}], "mlp_layer_types": null{}}})",
                        fmt::join(types, ","), q));
    const auto m = make_dummy_model(c, Device::cpu, 3);
    KvCache cache = m->make_cache(4, 64);
    std::vector<int32_t> ids(48), table{0, 1, 2, 3};
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 5) % size_t(c.vocab_size));
    ForwardBatch b;
    b.page_size = 64;
    b.add_request(ids, 0, table);
    ForwardOptions fo;
    fo.keep_hidden = true;
    const ForwardOutput o = m->forward(b, cache, fo);
    const float* lg = o.logits.data<float>();
    double lmax = 0;
    for (int64_t i = 0; i < o.logits.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(lg[i])) << i;
      lmax = std::max(lmax, double(std::fabs(lg[i])));
    }
    // The final hidden state is normed (RMS ~1 times the norm weight); the logits of std ~1 weights.
    const float* h = o.hidden.data<float>();
    double h2 = 0;
    for (int64_t i = 0; i < o.hidden.numel(); ++i) h2 += double(h[i]) * h[i];
    const double hrms = std::sqrt(h2 / double(o.hidden.numel()));
    EXPECT_GT(hrms, 0.5);
    EXPECT_LT(hrms, 2.0);
    EXPECT_GT(lmax, 0.1);
    EXPECT_LT(lmax, 50.0);
    std::printf("RESULT dummy 24 layers%s: final hidden RMS %.3f, max |logit| %.2f\n",
                q[0] ? " bf16" : " fp8", hrms, lmax);
  }
}

}  // namespace
}  // namespace dsaserve::model
