#include "server/builtin.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/error.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "server/builtin_config.h"

namespace dsaserve::server {

bool is_builtin_model(const std::string& p) { return p == "builtin" || p == "builtin:demo"; }

namespace {

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

enum class Init { uniform, ones, zeros };

class WeightWriter {
 public:
  explicit WeightWriter(uint64_t seed) : seed_(seed) {}

  // A bf16 tensor; uniform values have variance 1 / fan_in (the last dimension) times `gain`.
  void add(const std::string& name, const Shape& shape, Init init = Init::uniform, double gain = 1.0) {
    Tensor t = Tensor::empty(shape, DType::bf16);
    uint16_t* p = t.data_u16();
    const double a = std::sqrt(3.0 * gain / double(shape.back()));
    uint64_t state = hash_name(name, seed_);
    for (int64_t i = 0; i < t.numel(); ++i) {
      float v = init == Init::ones ? 1.0f : 0.0f;
      if (init == Init::uniform) v = float((double(splitmix64(state) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * a);
      p[i] = f32_to_bf16(v);
    }
    tensors_.emplace_back(name, std::move(t));
  }
  void add_f32_zeros(const std::string& name, const Shape& shape) {
    tensors_.emplace_back(name, Tensor::zeros(shape, DType::f32));
  }
  void mlp(const std::string& p, int64_t h, int64_t inter) {
    add(p + ".gate_proj.weight", {inter, h});
    add(p + ".up_proj.weight", {inter, h});
    add(p + ".down_proj.weight", {h, inter});
  }
  void layer(const model::ModelConfig& c, int64_t idx, bool indexer, bool moe) {
    const int64_t H = c.hidden_size, nh = c.num_attention_heads;
    const std::string p = fmt::format("model.layers.{}", idx);
    add(p + ".input_layernorm.weight", {H}, Init::ones);
    add(p + ".post_attention_layernorm.weight", {H}, Init::ones);
    const std::string a = p + ".self_attn";
    add(a + ".q_a_proj.weight", {c.q_lora_rank, H});
    add(a + ".q_a_layernorm.weight", {c.q_lora_rank}, Init::ones);
    add(a + ".q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank});
    add(a + ".kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, H});
    add(a + ".kv_a_layernorm.weight", {c.kv_lora_rank}, Init::ones);
    add(a + ".kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
    add(a + ".o_proj.weight", {H, nh * c.v_head_dim});
    if (indexer) {
      const std::string i = a + ".indexer";
      add(i + ".wq_b.weight", {c.index_n_heads * c.index_head_dim, c.q_lora_rank});
      add(i + ".wk.weight", {c.index_head_dim, H});
      add(i + ".k_norm.weight", {c.index_head_dim}, Init::ones);
      add(i + ".k_norm.bias", {c.index_head_dim}, Init::zeros);
      add(i + ".weights_proj.weight", {c.index_n_heads, H});
    }
    if (!moe) {
      mlp(p + ".mlp", H, c.intermediate_size);
      return;
    }
    add(p + ".mlp.gate.weight", {c.n_routed_experts, H});
    add_f32_zeros(p + ".mlp.gate.e_score_correction_bias", {c.n_routed_experts});
    for (int64_t e = 0; e < c.n_routed_experts; ++e)
      mlp(fmt::format("{}.mlp.experts.{}", p, e), H, c.moe_intermediate_size);
    if (c.n_shared_experts > 0)
      mlp(p + ".mlp.shared_experts", H, c.moe_intermediate_size * c.n_shared_experts);
  }
  const std::vector<std::pair<std::string, Tensor>>& tensors() const { return tensors_; }

 private:
  uint64_t seed_;
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

// GPT-2's byte -> printable character mapping (ByteLevel), as UTF-8 strings.
std::vector<std::string> byte_level_alphabet() {
  std::vector<std::string> out(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
    std::string s;
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else {
      s.push_back(char(0xC0 | (cp >> 6)));
      s.push_back(char(0x80 | (cp & 0x3F)));
    }
    out[size_t(b)] = s;
  }
  return out;
}

constexpr const char* kSpecials[] = {"<|begin|>",     "<|endoftext|>", "<|system|>", "<|user|>",
                                     "<|assistant|>", "<|tool|>",      "<think>",    "</think>"};
constexpr int kNumSpecials = 8;
constexpr int kVocab = 512;

}  // namespace

std::string builtin_config_json() { return kBuiltinConfigJson; }

std::shared_ptr<model::Model> make_builtin_model(const std::filesystem::path& dir, uint64_t seed) {
  std::filesystem::create_directories(dir);
  const std::string cfg_text = builtin_config_json();
  {
    std::ofstream f(dir / "config.json");
    f << cfg_text;
    DSA_CHECK(f.good(), "cannot write {}", (dir / "config.json").string());
  }
  const model::ModelConfig c =
      model::ModelConfig::from_json(nlohmann::json::parse(cfg_text), "builtin config");
  WeightWriter w(seed);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  w.add("model.embed_tokens.weight", {V, H}, Init::uniform, double(H));  // unit-variance embeddings
  w.add("model.norm.weight", {H}, Init::ones);
  w.add("lm_head.weight", {V, H}, Init::uniform, 4.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    w.layer(c, l, c.indexer_types[size_t(l)] == model::IndexerType::full,
            c.mlp_layer_types[size_t(l)] == model::MlpType::moe);
  }
  for (int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    const int64_t idx = c.num_hidden_layers + k;
    const std::string p = fmt::format("model.layers.{}", idx);
    w.add(p + ".enorm.weight", {H}, Init::ones);
    w.add(p + ".hnorm.weight", {H}, Init::ones);
    w.add(p + ".eh_proj.weight", {H, 2 * H});
    w.layer(c, idx, c.has_indexer(), true);
    w.add(p + ".shared_head.norm.weight", {H}, Init::ones);
  }
  io::write_safetensors(dir / "model.safetensors", w.tensors());
  return model::Model::load(dir, /*with_mtp=*/true);
}

std::string builtin_tokenizer_json() {
  using nlohmann::ordered_json;
  const std::vector<std::string> alphabet = byte_level_alphabet();
  ordered_json added = ordered_json::array();
  for (int i = 0; i < kNumSpecials; ++i) {
    added.push_back({{"id", i},
                     {"content", kSpecials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  ordered_json vocab = ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet[size_t(b)]] = kNumSpecials + b;
  // Merges: pairs of frequent English characters, in order, until the vocabulary has 512 ids.
  const std::string common = " etaoinsrhldcumfgpwybvk";
  ordered_json merges = ordered_json::array();
  int next = kNumSpecials + 256;
  for (char x : common) {
    for (char y : common) {
      if (next >= kVocab) break;
      if (y == ' ') continue;  // the GPT-2 split keeps spaces at the start of words
      const std::string a = alphabet[size_t(uint8_t(x))], b = alphabet[size_t(uint8_t(y))];
      vocab[a + b] = next++;
      merges.push_back(a + " " + b);
    }
  }
  DSA_CHECK(next == kVocab, "builtin tokenizer: {} ids", next);
  ordered_json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump();
}

tokenizer::Tokenizer make_builtin_tokenizer() {
  return tokenizer::Tokenizer::from_json(builtin_tokenizer_json(), "builtin:bytes");
}

std::string builtin_chat_template() {
  return "{{- bos_token -}}"
         "{%- for message in messages -%}"
         "{%- if message['role'] in ['system', 'user', 'assistant', 'tool'] -%}"
         "<|{{ message['role'] }}|>"
         "{%- else -%}"
         "<|system|>"
         "{%- endif -%}"
         "{{ message['content'] if message['content'] is string else '' }}"
         "{%- endfor -%}"
         "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}";
}

}  // namespace dsaserve::server
