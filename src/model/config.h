#pragma once
// ModelConfig: a Hugging Face config.json of glm_moe_dsa, deepseek_v32 or deepseek_v3, with the
// defaults and derivations of transformers 5.17 (see ../shared/docs/MODEL.md).
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dsaserve::model {

enum class IndexerType : uint8_t { none, full, shared };  // none: no indexer anywhere (deepseek_v3)
enum class MlpType : uint8_t { dense, moe };

struct RopeConfig {
  std::string type = "default";  // "default" | "yarn"
  double theta = 10000.0;
  // yarn
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  // Attention softmax scale multiplier: mscale^2 with mscale = 0.1 * mscale_all_dim * ln(factor) + 1
  // for yarn (when mscale_all_dim != 0 and factor > 1), else 1.
  double attention_scale_factor() const;
};

struct Fp8Config {
  bool enabled = false;
  int64_t block_n = 128;  // weight_block_size[0]: output rows per scale
  int64_t block_k = 128;  // weight_block_size[1]: input columns per scale
};

struct ModelConfig {
  std::string model_type;  // glm_moe_dsa | deepseek_v32 | deepseek_v3
  std::string architecture;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q compression (q_proj directly); all supported models set it
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_shared_experts = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  int64_t first_k_dense_replace = 0;
  double rms_norm_eps = 1e-6;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  std::optional<int64_t> bos_token_id, eos_token_id;

  // DSA indexer (absent for deepseek_v3: index_n_heads == 0).
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  bool indexer_rope_interleaved = true;  // glm_moe_dsa: interleaved; deepseek_v32: not (MODEL.md step 7)
  double indexer_norm_eps = 1e-6;

  RopeConfig rope;
  Fp8Config fp8;

  std::vector<IndexerType> indexer_types;  // [num_hidden_layers]
  std::vector<MlpType> mlp_layer_types;    // [num_hidden_layers]

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t kv_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // 576 for GLM-5.x
  bool has_indexer() const { return index_n_heads > 0; }
  int64_t num_full_indexer_layers() const;
  // Softmax scale of the main attention: qk_head_dim^-0.5 * rope.attention_scale_factor().
  double attention_scale() const;
  // The layer whose top-k selection layer `l` uses (l itself for full layers); -1 without an indexer.
  int64_t indexer_source_layer(int64_t l) const;

  // Parses and validates; throws dsaserve::Error naming the key at fault.
  static ModelConfig from_json(const nlohmann::json& j, const std::string& origin = "config.json");
  static ModelConfig from_file(const std::filesystem::path& path);
  // from_file(config_path(model)) with apply_overrides(overrides_json) (empty: none).
  static ModelConfig load(const std::filesystem::path& model, const std::string& overrides_json = "");

  // `model` itself when it is a file, else model/config.json.
  static std::filesystem::path config_path(const std::filesystem::path& model);
  // --json-model-override-args (SGLang's flag): the keys of `overrides_json` (a JSON object) replace the
  // config's top-level keys, as SGLang's config.update() does. When num_hidden_layers changes, the
  // per-layer lists the overrides leave alone (indexer_types, index_topk_pattern, mlp_layer_types,
  // layer_types) keep their first num_hidden_layers entries, so a truncated model keeps its
  // first_k_dense_replace dense layers and its indexer pattern; a list that is too short stays as it is
  // (from_json then names it). Throws naming the flag on bad JSON or a non-object.
  static nlohmann::json apply_overrides(nlohmann::json config, const std::string& overrides_json);
};

}  // namespace dsaserve::model
