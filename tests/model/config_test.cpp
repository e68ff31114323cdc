#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/fixtures.h"
#include "io/safetensors.h"
#include "model/param_count.h"
#include "model/weights.h"

namespace dsaserve::model {
namespace {

using nlohmann::json;

TEST(ModelConfig, Glm53CountsAndLayers) {
  DSA_FIXTURE_PATH(p, "configs/glm-5.3.json");
  const ModelConfig c = ModelConfig::from_file(p);
  EXPECT_EQ(c.num_full_indexer_layers(), 21);
  EXPECT_EQ(c.kv_cache_dim() * c.num_hidden_layers, 44928);
  EXPECT_EQ(c.mlp_layer_types[2], MlpType::dense);
  EXPECT_EQ(c.mlp_layer_types[3], MlpType::moe);
  EXPECT_EQ(c.indexer_source_layer(5), 2);
  EXPECT_TRUE(c.fp8.enabled);
  const ParamCount pc = count_params(c);
  EXPECT_NEAR(double(pc.total) / 743e9, 1.0, 0.01) << pc.total;
  EXPECT_NEAR(double(pc.active) / 41e9, 1.0, 0.01) << pc.active;
  std::cout << "glm-5.3: total " << pc.total << " active " << pc.active << "\n";
}

TEST(ModelConfig, DeepSeekV32CountsAndYarn) {
  DSA_FIXTURE_PATH(p, "configs/deepseek-v3.2.json");
  const ModelConfig c = ModelConfig::from_file(p);
  EXPECT_EQ(c.num_full_indexer_layers(), 61);  // no pattern: every layer runs the indexer
  EXPECT_FALSE(c.indexer_rope_interleaved);
  EXPECT_EQ(c.rope.type, "yarn");
  EXPECT_EQ(c.rope.factor, 40);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c.attention_scale(), std::pow(192.0, -0.5) * m * m, 1e-12);
  const ParamCount pc = count_params(c);
  EXPECT_NEAR(double(pc.total) / 672e9, 1.0, 0.01) << pc.total;
  // The "~38B" is rounded: the exact count of every active weight is 38.40B (1.1% above 38).
  EXPECT_NEAR(double(pc.active) / 38.4e9, 1.0, 0.01) << pc.active;
}

TEST(ModelConfig, DerivesIndexerTypesAndDefaults) {
  json j = {{"model_type", "glm_moe_dsa"},
            {"num_hidden_layers", 8},
            {"index_topk_freq", 4},
            {"index_skip_topk_offset", 2}};
  ModelConfig c = ModelConfig::from_json(j);
  // full where max(i - offset + 1, 0) % freq == 0
  const std::vector<IndexerType> want = {IndexerType::full,   IndexerType::full,   IndexerType::shared,
                                         IndexerType::shared, IndexerType::shared, IndexerType::full,
                                         IndexerType::shared, IndexerType::shared};
  EXPECT_EQ(c.indexer_types, want);
  EXPECT_EQ(c.hidden_size, 6144);  // transformers default
  EXPECT_EQ(c.mlp_layer_types[2], MlpType::dense);
  j["index_topk_pattern"] = "FSFSFSFS";
  c = ModelConfig::from_json(j);
  EXPECT_EQ(c.indexer_types[1], IndexerType::shared);
  json v3 = {{"model_type", "deepseek_v3"}, {"num_hidden_layers", 4}};
  c = ModelConfig::from_json(v3);
  EXPECT_FALSE(c.has_indexer());
  EXPECT_EQ(c.indexer_source_layer(2), -1);
}

TEST(ModelConfig, BadValuesNameTheKey) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"model_type", "llama"}}, "model_type"},
      {{{"hidden_size", 8}}, "model_type"},
      {{{"model_type", "glm_moe_dsa"}, {"hidden_size", "big"}}, "hidden_size"},
      {{{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 0}}, "num_hidden_layers"},
      {{{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 2}, {"indexer_types", {"full"}}},
       "indexer_types"},
      {{{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 2}, {"indexer_types", {"shared", "full"}}},
       "indexer_types[0]"},
      {{{"model_type", "glm_moe_dsa"}, {"num_hidden_layers", 1}, {"mlp_layer_types", {"moe"}}},
       "mlp_layer_types[0]"},
      {{{"model_type", "glm_moe_dsa"}, {"n_group", 3}}, "n_group"},
      {{{"model_type", "glm_moe_dsa"}, {"num_experts_per_tok", 300}}, "num_experts_per_tok"},
      {{{"model_type", "glm_moe_dsa"}, {"quantization_config", {{"quant_method", "awq"}}}}, "quant_method"},
      {{{"model_type", "glm_moe_dsa"}, {"rope_parameters", {{"rope_type", "llama3"}, {"rope_theta", 1.0}}}},
       "rope_type"},
      {{{"model_type", "deepseek_v32"}, {"index_head_dim", 32}}, "index_head_dim"},
      {{{"model_type", "glm_moe_dsa"}, {"qk_rope_head_dim", 63}}, "qk_rope_head_dim"},
  };
  for (const auto& [j, key] : cases) {
    try {
      ModelConfig::from_json(j, "cfg.json");
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cfg.json"), std::string::npos) << e.what();
    }
  }
}

TEST(ModelWeights, AllFixtureModelsBindCompletely) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const ModelConfig c = ModelConfig::from_file(models / name / "config.json");
    const io::Checkpoint ckpt = io::Checkpoint::open(models / name);
    const ModelWeights w = ModelWeights::bind(c, ckpt);
    ASSERT_EQ(int64_t(w.layers.size()), c.num_hidden_layers) << name;
    ASSERT_EQ(w.mtp.size(), 1u) << name;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const auto& L = w.layers[size_t(l)];
      EXPECT_EQ(L.attn.indexer.has_value(), c.indexer_types[size_t(l)] == IndexerType::full) << name << l;
      EXPECT_EQ(L.moe.has_value(), c.mlp_layer_types[size_t(l)] == MlpType::moe) << name << l;
    }
    EXPECT_TRUE(w.mtp[0].layer.attn.indexer.has_value());
    // to(cpu) keeps every tensor; bytes() counts each distinct tensor once (checkpoint bytes).
    int64_t ckpt_bytes = 0;
    for (const auto& n : ckpt.names()) ckpt_bytes += int64_t(ckpt.info(n).data_end - ckpt.info(n).data_begin);
    EXPECT_EQ(w.bytes(), ckpt_bytes) << name;
    EXPECT_EQ(w.to(Device::cpu).bytes(), ckpt_bytes) << name;
    EXPECT_EQ(w.layers[1].attn.kv_b_proj.is_fp8(), std::string(name) == "realdims_fp8");
    // Binding without the MTP layer ignores its tensors.
    EXPECT_TRUE(ModelWeights::bind(c, ckpt, false).mtp.empty());
  }
}

// The accounting from the config equals the element count of the real checkpoints' tensors.
TEST(ParamCount, EqualsCheckpointElementCounts) {
  DSA_FIXTURE_PATH(models, "models");
  for (const char* name : {"tiny", "realdims", "realdims_fp8"}) {
    const ModelConfig c = ModelConfig::from_file(models / name / "config.json");
    const io::Checkpoint ckpt = io::Checkpoint::open(models / name);
    int64_t main = 0, mtp = 0;
    for (const auto& n : ckpt.names()) {
      if (n.find("weight_scale_inv") != std::string::npos) continue;
      const int64_t numel = shape_numel(ckpt.info(n).shape);
      const std::string mtp_prefix = fmt::format("model.layers.{}.", c.num_hidden_layers);
      if (n.rfind(mtp_prefix, 0) == 0) {
        if (n.find("embed_tokens") == std::string::npos && n.find("shared_head.head") == std::string::npos)
          mtp += numel;
      } else {
        main += numel;
      }
    }
    const ParamCount pc = count_params(c);
    EXPECT_EQ(pc.total, main) << name;
    EXPECT_EQ(pc.mtp_total, mtp) << name;
  }
}

TEST(ModelWeights, ReportsMissingAndUnexpectedByName) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const ModelConfig c = ModelConfig::from_file(dir / "config.json");
  const io::Checkpoint ckpt = io::Checkpoint::open(dir);
  std::vector<std::pair<std::string, Tensor>> kept;
  for (const auto& n : ckpt.names()) {
    if (n == "model.layers.2.self_attn.indexer.wk.weight") continue;
    kept.emplace_back(n == "model.norm.weight" ? "model.norm.weight_typo" : n, ckpt.get(n));
  }
  const auto tmp =
      std::filesystem::temp_directory_path() / fmt::format("dsaserve_bind_{}.safetensors", ::getpid());
  io::write_safetensors(tmp, kept);
  try {
    ModelWeights::bind(c, io::Checkpoint::open(tmp));
    ADD_FAILURE() << "bound an incomplete checkpoint";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("missing tensors: model.norm.weight, model.layers.2.self_attn.indexer.wk.weight"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("unexpected tensors: model.norm.weight_typo"), std::string::npos) << msg;
  }
  std::filesystem::remove(tmp);
}

}  // namespace
}  // namespace dsaserve::model
