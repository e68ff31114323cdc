#include "model/config.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace dsaserve::model {

using nlohmann::json;

namespace {

// transformers 5.17 defaults for the keys a config may omit.
const json& defaults_for(const std::string& model_type) {
  static const json glm = {{"vocab_size", 154880},
                           {"hidden_size", 6144},
                           {"intermediate_size", 12288},
                           {"moe_intermediate_size", 2048},
                           {"num_hidden_layers", 78},
                           {"num_attention_heads", 64},
                           {"n_shared_experts", 1},
                           {"n_routed_experts", 256},
                           {"routed_scaling_factor", 2.5},
                           {"kv_lora_rank", 512},
                           {"q_lora_rank", 2048},
                           {"qk_rope_head_dim", 64},
                           {"v_head_dim", 256},
                           {"qk_nope_head_dim", 192},
                           {"n_group", 1},
                           {"topk_group", 1},
                           {"num_experts_per_tok", 8},
                           {"norm_topk_prob", true},
                           {"max_position_embeddings", 202752},
                           {"rms_norm_eps", 1e-5},
                           {"tie_word_embeddings", false},
                           {"index_topk", 2048},
                           {"index_head_dim", 128},
                           {"index_n_heads", 32},
                           {"first_k_dense_replace", 3},
                           {"bos_token_id", 0},
                           {"eos_token_id", 1},
                           {"num_nextn_predict_layers", 0},
                           {"rope_theta", 10000.0}};
  static const json dsv3 = {{"vocab_size", 129280},
                            {"hidden_size", 7168},
                            {"intermediate_size", 18432},
                            {"moe_intermediate_size", 2048},
                            {"num_hidden_layers", 61},
                            {"num_attention_heads", 128},
                            {"n_shared_experts", 1},
                            {"n_routed_experts", 256},
                            {"routed_scaling_factor", 2.5},
                            {"kv_lora_rank", 512},
                            {"q_lora_rank", 1536},
                            {"qk_rope_head_dim", 64},
                            {"v_head_dim", 128},
                            {"qk_nope_head_dim", 128},
                            {"n_group", 8},
                            {"topk_group", 4},
                            {"num_experts_per_tok", 8},
                            {"norm_topk_prob", true},
                            {"max_position_embeddings", 4096},
                            {"rms_norm_eps", 1e-6},
                            {"tie_word_embeddings", false},
                            {"first_k_dense_replace", 3},
                            {"bos_token_id", 0},
                            {"eos_token_id", 1},
                            {"num_nextn_predict_layers", 0},
                            {"rope_theta", 10000.0}};
  static const json dsv32 = [] {
    json j = dsv3;
    j["index_topk"] = 2048;
    j["index_head_dim"] = 128;
    j["index_n_heads"] = 64;
    return j;
  }();
  if (model_type == "glm_moe_dsa") return glm;
  if (model_type == "deepseek_v32") return dsv32;
  return dsv3;
}

class Reader {
 public:
  Reader(const json& j, const json& defaults, std::string origin)
      : j_(j), d_(defaults), origin_(std::move(origin)) {}

  const json* find(const std::string& key) const {
    if (j_.contains(key) && !j_[key].is_null()) return &j_[key];
    if (d_.contains(key)) return &d_[key];
    return nullptr;
  }
  int64_t i64(const std::string& key, int64_t min_value = 1) const {
    const json* v = find(key);
    DSA_CHECK(v != nullptr, "{}: missing key '{}'", origin_, key);
    DSA_CHECK(v->is_number_integer(), "{}: key '{}' must be an integer, got {}", origin_, key, v->dump());
    const int64_t x = v->get<int64_t>();
    DSA_CHECK(x >= min_value, "{}: key '{}' must be >= {}, got {}", origin_, key, min_value, x);
    return x;
  }
  double f64(const std::string& key) const {
    const json* v = find(key);
    DSA_CHECK(v != nullptr, "{}: missing key '{}'", origin_, key);
    DSA_CHECK(v->is_number(), "{}: key '{}' must be a number, got {}", origin_, key, v->dump());
    return v->get<double>();
  }
  bool boolean(const std::string& key) const {
    const json* v = find(key);
    DSA_CHECK(v != nullptr, "{}: missing key '{}'", origin_, key);
    DSA_CHECK(v->is_boolean(), "{}: key '{}' must be true or false, got {}", origin_, key, v->dump());
    return v->get<bool>();
  }
  std::optional<int64_t> opt_token(const std::string& key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_array()) {  // eos_token_id may be a list: the first is the primary one
      if (v->empty()) return std::nullopt;
      DSA_CHECK((*v)[0].is_number_integer(), "{}: key '{}' must hold integers", origin_, key);
      return (*v)[0].get<int64_t>();
    }
    DSA_CHECK(v->is_number_integer(), "{}: key '{}' must be an integer or null", origin_, key);
    return v->get<int64_t>();
  }
  const std::string& origin() const { return origin_; }

 private:
  const json& j_;
  const json& d_;
  std::string origin_;
};

RopeConfig parse_rope(const json& j, const Reader& r) {
  RopeConfig rope;
  // transformers 5 spelling: rope_parameters {rope_type, rope_theta, ...}; DeepSeek spelling: top-level
  // rope_theta plus rope_scaling {type | rope_type, factor, ...}.
  json p = json::object();
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    DSA_CHECK(j["rope_parameters"].is_object(), "{}: key 'rope_parameters' must be an object", r.origin());
    p = j["rope_parameters"];
  } else if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    DSA_CHECK(j["rope_scaling"].is_object(), "{}: key 'rope_scaling' must be an object", r.origin());
    p = j["rope_scaling"];
  }
  const std::string key = p.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (p.contains("rope_theta")) {
    DSA_CHECK(p["rope_theta"].is_number(), "{}: key 'rope_parameters.rope_theta' must be a number",
              r.origin());
    rope.theta = p["rope_theta"].get<double>();
  } else {
    rope.theta = r.f64("rope_theta");
  }
  DSA_CHECK(rope.theta > 0, "{}: key 'rope_theta' must be positive", r.origin());
  std::string type = "default";
  if (p.contains("rope_type"))
    type = p["rope_type"].get<std::string>();
  else if (p.contains("type"))
    type = p["type"].get<std::string>();
  DSA_CHECK(type == "default" || type == "yarn", "{}: key '{}.rope_type': unsupported '{}' (default or yarn)",
            r.origin(), key, type);
  rope.type = type;
  if (type == "yarn") {
    auto num = [&](const char* k, double def) {
      if (!p.contains(k) || p[k].is_null()) return def;
      DSA_CHECK(p[k].is_number(), "{}: key 'rope {}' must be a number", r.origin(), k);
      return p[k].get<double>();
    };
    rope.factor = num("factor", 1.0);
    DSA_CHECK(rope.factor >= 1.0, "{}: key 'rope factor' must be >= 1", r.origin());
    rope.original_max_position_embeddings =
        int64_t(num("original_max_position_embeddings", double(r.i64("max_position_embeddings"))));
    rope.beta_fast = num("beta_fast", 32.0);
    rope.beta_slow = num("beta_slow", 1.0);
    rope.mscale = num("mscale", 1.0);
    rope.mscale_all_dim = num("mscale_all_dim", 0.0);
  }
  return rope;
}

}  // namespace

double RopeConfig::attention_scale_factor() const {
  if (type != "yarn" || mscale_all_dim == 0.0 || factor <= 1.0) return 1.0;
  const double m = 0.1 * mscale_all_dim * std::log(factor) + 1.0;
  return m * m;
}

int64_t ModelConfig::num_full_indexer_layers() const {
  int64_t n = 0;
  for (IndexerType t : indexer_types) n += t == IndexerType::full;
  return n;
}

double ModelConfig::attention_scale() const {
  return std::pow(double(qk_head_dim()), -0.5) * rope.attention_scale_factor();
}

int64_t ModelConfig::indexer_source_layer(int64_t l) const {
  if (!has_indexer() || l >= num_hidden_layers) return has_indexer() ? l : -1;  // MTP layers are full
  for (int64_t i = l; i >= 0; --i) {
    if (indexer_types[size_t(i)] == IndexerType::full) return i;
  }
  return -1;
}

ModelConfig ModelConfig::from_json(const json& j, const std::string& origin) {
  DSA_CHECK(j.is_object(), "{}: not a JSON object", origin);
  ModelConfig c;
  DSA_CHECK(j.contains("model_type") && j["model_type"].is_string(), "{}: missing key 'model_type'", origin);
  c.model_type = j["model_type"].get<std::string>();
  DSA_CHECK(c.model_type == "glm_moe_dsa" || c.model_type == "deepseek_v32" || c.model_type == "deepseek_v3",
            "{}: key 'model_type': unsupported '{}' (glm_moe_dsa, deepseek_v32 or deepseek_v3)", origin,
            c.model_type);
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    c.architecture = j["architectures"][0].get<std::string>();
  }
  const Reader r(j, defaults_for(c.model_type), origin);
  c.vocab_size = r.i64("vocab_size");
  c.hidden_size = r.i64("hidden_size");
  c.intermediate_size = r.i64("intermediate_size");
  c.moe_intermediate_size = r.i64("moe_intermediate_size");
  c.num_hidden_layers = r.i64("num_hidden_layers");
  c.num_attention_heads = r.i64("num_attention_heads");
  c.q_lora_rank = r.i64("q_lora_rank");
  c.kv_lora_rank = r.i64("kv_lora_rank");
  c.qk_nope_head_dim = r.i64("qk_nope_head_dim");
  c.qk_rope_head_dim = r.i64("qk_rope_head_dim");
  DSA_CHECK(c.qk_rope_head_dim % 2 == 0, "{}: key 'qk_rope_head_dim' must be even, got {}", origin,
            c.qk_rope_head_dim);
  c.v_head_dim = r.i64("v_head_dim");
  c.n_routed_experts = r.i64("n_routed_experts");
  c.num_experts_per_tok = r.i64("num_experts_per_tok");
  DSA_CHECK(c.num_experts_per_tok <= c.n_routed_experts,
            "{}: key 'num_experts_per_tok' ({}) exceeds n_routed_experts ({})", origin, c.num_experts_per_tok,
            c.n_routed_experts);
  c.n_shared_experts = r.i64("n_shared_experts", 0);
  c.n_group = r.i64("n_group");
  c.topk_group = r.i64("topk_group");
  DSA_CHECK(c.n_routed_experts % c.n_group == 0, "{}: key 'n_group' ({}) must divide n_routed_experts ({})",
            origin, c.n_group, c.n_routed_experts);
  DSA_CHECK(c.topk_group <= c.n_group, "{}: key 'topk_group' ({}) exceeds n_group ({})", origin, c.topk_group,
            c.n_group);
  DSA_CHECK(c.num_experts_per_tok <= c.topk_group * (c.n_routed_experts / c.n_group),
            "{}: key 'num_experts_per_tok' ({}) exceeds the experts in topk_group groups", origin,
            c.num_experts_per_tok);
  c.norm_topk_prob = r.boolean("norm_topk_prob");
  c.routed_scaling_factor = r.f64("routed_scaling_factor");
  c.first_k_dense_replace = r.i64("first_k_dense_replace", 0);
  c.rms_norm_eps = r.f64("rms_norm_eps");
  DSA_CHECK(c.rms_norm_eps > 0, "{}: key 'rms_norm_eps' must be positive", origin);
  c.max_position_embeddings = r.i64("max_position_embeddings");
  c.tie_word_embeddings = r.boolean("tie_word_embeddings");
  c.num_nextn_predict_layers = r.i64("num_nextn_predict_layers", 0);
  c.bos_token_id = r.opt_token("bos_token_id");
  c.eos_token_id = r.opt_token("eos_token_id");
  if (const json* a = r.find("scoring_func"); a != nullptr) {
    DSA_CHECK(a->is_string() && a->get<std::string>() == "sigmoid",
              "{}: key 'scoring_func': only 'sigmoid' is supported", origin);
  }
  if (const json* a = r.find("topk_method"); a != nullptr) {
    DSA_CHECK(a->is_string() && a->get<std::string>() == "noaux_tc",
              "{}: key 'topk_method': only 'noaux_tc' is supported", origin);
  }
  if (const json* a = r.find("hidden_act"); a != nullptr) {
    DSA_CHECK(a->is_string() && a->get<std::string>() == "silu",
              "{}: key 'hidden_act': only 'silu' is supported", origin);
  }

  c.rope = parse_rope(j, r);
  const int64_t L = c.num_hidden_layers;

  // Indexer: glm_moe_dsa and deepseek_v32 have one; deepseek_v3 does not.
  if (c.model_type != "deepseek_v3") {
    c.index_n_heads = r.i64("index_n_heads");
    c.index_head_dim = r.i64("index_head_dim");
    c.index_topk = r.i64("index_topk");
    DSA_CHECK(c.index_head_dim > c.qk_rope_head_dim,
              "{}: key 'index_head_dim' ({}) must exceed qk_rope_head_dim ({})", origin, c.index_head_dim,
              c.qk_rope_head_dim);
    c.indexer_rope_interleaved = c.model_type == "glm_moe_dsa";
    if (const json* t = r.find("indexer_types"); t != nullptr) {
      DSA_CHECK(t->is_array() && int64_t(t->size()) == L,
                "{}: key 'indexer_types' must be a list of num_hidden_layers ({}) entries", origin, L);
      for (size_t i = 0; i < t->size(); ++i) {
        const json& v = (*t)[i];
        DSA_CHECK(v.is_string() && (v == "full" || v == "shared"),
                  "{}: key 'indexer_types[{}]' must be \"full\" or \"shared\", got {}", origin, i, v.dump());
        c.indexer_types.push_back(v == "full" ? IndexerType::full : IndexerType::shared);
      }
    } else if (const json* pat = r.find("index_topk_pattern"); pat != nullptr) {
      std::vector<std::string> names;
      if (pat->is_string()) {
        for (char ch : pat->get<std::string>()) {
          DSA_CHECK(ch == 'F' || ch == 'S', "{}: key 'index_topk_pattern' may hold only F and S", origin);
          names.push_back(ch == 'F' ? "full" : "shared");
        }
      } else {
        DSA_CHECK(pat->is_array(), "{}: key 'index_topk_pattern' must be a string or a list", origin);
        for (const json& v : *pat) {
          DSA_CHECK(v.is_string() && (v == "full" || v == "shared"),
                    "{}: key 'index_topk_pattern' entries must be \"full\" or \"shared\"", origin);
          names.push_back(v.get<std::string>());
        }
      }
      DSA_CHECK(int64_t(names.size()) == L, "{}: key 'index_topk_pattern' has {} entries for {} layers",
                origin, names.size(), L);
      for (const auto& n : names)
        c.indexer_types.push_back(n == "full" ? IndexerType::full : IndexerType::shared);
    } else {
      const int64_t freq = r.find("index_topk_freq") ? std::max<int64_t>(r.i64("index_topk_freq", 0), 1) : 1;
      const int64_t offset = r.find("index_skip_topk_offset") ? r.i64("index_skip_topk_offset", 0) : 2;
      for (int64_t i = 0; i < L; ++i) {
        c.indexer_types.push_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? IndexerType::full
                                                                                   : IndexerType::shared);
      }
    }
    DSA_CHECK(L == 0 || c.indexer_types[0] == IndexerType::full,
              "{}: key 'indexer_types[0]' must be \"full\": a shared layer needs an earlier full one",
              origin);
  } else {
    c.indexer_types.assign(size_t(L), IndexerType::none);
  }

  if (const json* m = r.find("mlp_layer_types"); m != nullptr) {
    DSA_CHECK(m->is_array() && int64_t(m->size()) == L,
              "{}: key 'mlp_layer_types' must be a list of num_hidden_layers ({}) entries", origin, L);
    for (size_t i = 0; i < m->size(); ++i) {
      const json& v = (*m)[i];
      DSA_CHECK(v.is_string() && (v == "dense" || v == "sparse"),
                "{}: key 'mlp_layer_types[{}]' must be \"dense\" or \"sparse\", got {}", origin, i, v.dump());
      c.mlp_layer_types.push_back(v == "dense" ? MlpType::dense : MlpType::moe);
    }
  } else {
    const int64_t n_dense = std::min(c.first_k_dense_replace, L);
    for (int64_t i = 0; i < L; ++i) c.mlp_layer_types.push_back(i < n_dense ? MlpType::dense : MlpType::moe);
  }

  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    DSA_CHECK(q.is_object(), "{}: key 'quantization_config' must be an object", origin);
    DSA_CHECK(q.contains("quant_method") && q["quant_method"] == "fp8",
              "{}: key 'quantization_config.quant_method': only \"fp8\" is supported", origin);
    if (q.contains("fmt")) {
      DSA_CHECK(q["fmt"] == "e4m3", "{}: key 'quantization_config.fmt': only \"e4m3\" is supported", origin);
    }
    c.fp8.enabled = true;
    if (q.contains("weight_block_size")) {
      const json& b = q["weight_block_size"];
      DSA_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                    b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
                "{}: key 'quantization_config.weight_block_size' must be [n, k] positive integers", origin);
      c.fp8.block_n = b[0].get<int64_t>();
      c.fp8.block_k = b[1].get<int64_t>();
    }
  }
  return c;
}

namespace {

json read_config_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  DSA_CHECK(in.good(), "{}: cannot open", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

ModelConfig ModelConfig::from_file(const std::filesystem::path& path) {
  return from_json(read_config_json(path), path.string());
}

std::filesystem::path ModelConfig::config_path(const std::filesystem::path& model) {
  return std::filesystem::is_directory(model) ? model / "config.json" : model;
}

json ModelConfig::apply_overrides(json config, const std::string& overrides_json) {
  if (overrides_json.empty()) return config;
  json o;
  try {
    o = json::parse(overrides_json);
  } catch (const json::exception& e) {
    fail("--json-model-override-args: not valid JSON: {}", e.what());
  }
  DSA_CHECK(o.is_object(), "--json-model-override-args: expected a JSON object, got {}", o.dump());
  DSA_CHECK(config.is_object(), "--json-model-override-args: the config is not a JSON object");
  for (auto it = o.begin(); it != o.end(); ++it) config[it.key()] = it.value();
  if (o.contains("num_hidden_layers") && o["num_hidden_layers"].is_number_integer()) {
    const int64_t L = o["num_hidden_layers"].get<int64_t>();
    for (const char* key : {"indexer_types", "index_topk_pattern", "mlp_layer_types", "layer_types"}) {
      if (o.contains(key) || !config.contains(key) || L < 0) continue;
      json& v = config[key];
      if (v.is_array() && int64_t(v.size()) > L) v.erase(v.begin() + L, v.end());
      if (v.is_string() && int64_t(v.get<std::string>().size()) > L)
        v = v.get<std::string>().substr(0, size_t(L));
    }
  }
  return config;
}

ModelConfig ModelConfig::load(const std::filesystem::path& model, const std::string& overrides_json) {
  const std::filesystem::path path = config_path(model);
  if (overrides_json.empty()) return from_file(path);
  return from_json(apply_overrides(read_config_json(path), overrides_json),
                   path.string() + " with --json-model-override-args");
}

}  // namespace dsaserve::model
