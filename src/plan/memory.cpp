// What one GPU holds: weights by group (sharded or replicated), KV and indexer cache per token, and how
// many tokens and requests fit at --mem-fraction-static.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/param_count.h"
#include "plan/cost.h"

namespace dsaserve::plan {

using detail::ceil_div;
using detail::linear_bytes;
using model::ModelConfig;

namespace {

struct GroupAdder {
  MemoryPlan& m;
  void operator()(std::string name, int64_t params, int64_t shards, std::string over, double bytes_per_gpu) {
    if (params == 0) return;
    m.weights.push_back({std::move(name), params, shards, shards > 1 ? std::move(over) : "", bytes_per_gpu});
  }
};

// The groups of `n_layers` decoder layers (n_full with an indexer, n_dense dense, n_moe MoE), names prefixed.
void add_layer_groups(GroupAdder& add, const ModelConfig& c, const Deployment& d, const std::string& prefix,
                      int64_t n_layers, int64_t n_full, int64_t n_dense, int64_t n_moe) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, atp = d.attn_tp();
  const int64_t qr = c.q_lora_rank, kr = c.kv_lora_rank, dr = c.qk_rope_head_dim, qkd = c.qk_head_dim();
  const int64_t nhl = nh / atp;
  const std::string attn_over = "attn_tp";
  add(prefix + "layer_norms", n_layers * 2 * H, 1, "", double(n_layers) * 2 * H * 2);
  add(prefix + "attention.qkv_a_proj", n_layers * (qr + kr + dr) * H, 1, "",
      double(n_layers) * (linear_bytes(c, qr, H) + linear_bytes(c, kr + dr, H)));
  add(prefix + "attention.qkv_a_norms", n_layers * (qr + kr), 1, "", double(n_layers) * (qr + kr) * 2);
  add(prefix + "attention.q_b_proj", n_layers * nh * qkd * qr, atp, attn_over,
      double(n_layers) * linear_bytes(c, nhl * qkd, qr));
  add(prefix + "attention.kv_b_proj", n_layers * nh * (c.qk_nope_head_dim + c.v_head_dim) * kr, atp,
      attn_over, double(n_layers) * linear_bytes(c, nhl * (c.qk_nope_head_dim + c.v_head_dim), kr));
  add(prefix + "attention.o_proj", n_layers * H * nh * c.v_head_dim, atp, attn_over,
      double(n_layers) * linear_bytes(c, H, nhl * c.v_head_dim));
  if (c.has_indexer()) {
    const int64_t ih = c.index_n_heads, id = c.index_head_dim;
    const double bytes = linear_bytes(c, ih * id, qr) + linear_bytes(c, id, H, false) + 2.0 * 2 * id +
                         linear_bytes(c, ih, H, false);
    add(prefix + "indexer", n_full * model::indexer_params(c), 1, "", double(n_full) * bytes);
  }
  const int64_t dtp = d.dense_tp(), Id = c.intermediate_size / dtp;
  add(prefix + "dense_mlp", n_dense * model::mlp_params(H, c.intermediate_size), dtp, "dense_tp",
      double(n_dense) * (2 * linear_bytes(c, Id, H) + linear_bytes(c, H, Id)));
  const int64_t E = c.n_routed_experts, mtp = d.moe_tp();
  add(prefix + "router", n_moe * (E * H + E), 1, "",
      double(n_moe) * (linear_bytes(c, E, H, false) + 4.0 * E));
  const int64_t Iml = c.moe_intermediate_size / mtp, El = E / d.ep_size;
  add(prefix + "routed_experts", n_moe * E * model::mlp_params(H, c.moe_intermediate_size), d.tp,
      d.moe_tp() > 1 ? "ep x moe_tp" : "ep",
      double(n_moe) * double(El) * (2 * linear_bytes(c, Iml, H) + linear_bytes(c, H, Iml)));
  const int64_t Is = c.moe_intermediate_size * c.n_shared_experts, Isl = Is / mtp;
  add(prefix + "shared_experts", n_moe * model::mlp_params(H, Is), mtp, "moe_tp",
      double(n_moe) * (2 * linear_bytes(c, Isl, H) + linear_bytes(c, H, Isl)));
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& c, const Deployment& d, const Hardware& hw) {
  MemoryPlan m;
  GroupAdder add{m};
  const int64_t H = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers, atp = d.attn_tp();
  int64_t n_dense = 0, n_moe = 0;
  for (model::MlpType t : c.mlp_layer_types) (t == model::MlpType::dense ? n_dense : n_moe)++;
  const int64_t n_full = c.num_full_indexer_layers();
  const double vocab_rows = double(ceil_div(V, atp));
  add("embed_tokens", V * H, atp, "attn_tp (vocab)", vocab_rows * H * 2);
  if (!c.tie_word_embeddings) add("lm_head", V * H, atp, "attn_tp (vocab)", vocab_rows * H * 2);
  add("final_norm", H, 1, "", double(H) * 2);
  add_layer_groups(add, c, d, "", L, n_full, n_dense, n_moe);
  const bool spec = d.speculative_num_draft_tokens > 0;
  if (spec) {
    // The MTP layer (one; SGLang loads num_nextn_predict_layers = 1): enorm, hnorm, shared_head.norm,
    // eh_proj (bf16) and one MoE decoder layer with a full indexer. embed_tokens / lm_head are shared.
    add("mtp.norms", 3 * H, 1, "", 3.0 * H * 2);
    add("mtp.eh_proj", 2 * H * H, 1, "", linear_bytes(c, H, 2 * H, false));
    add_layer_groups(add, c, d, "mtp.", 1, c.has_indexer() ? 1 : 0, 0, 1);
  }

  // Cross-check against the model's own parameter accounting.
  int64_t params = 0;
  for (const WeightGroup& g : m.weights) params += g.params;
  const model::ParamCount pc = model::count_params(c);
  const int64_t expected =
      pc.total + (spec ? pc.mtp_total / std::max<int64_t>(1, c.num_nextn_predict_layers) : 0);
  DSA_CHECK(params == expected, "plan: internal error: weight groups hold {} parameters, count_params {}",
            params, expected);

  for (const WeightGroup& g : m.weights) {
    (g.shards > 1 ? m.weights_sharded_bytes : m.weights_replicated_bytes) += g.bytes_per_gpu;
    if (g.name == "routed_experts" || g.name == "mtp.routed_experts")
      m.routed_expert_bytes += g.bytes_per_gpu;
  }
  m.weights_bytes = m.weights_sharded_bytes + m.weights_replicated_bytes;

  m.kv_values_per_token = c.kv_cache_dim() * L;
  m.kv_bytes_per_token_layer = detail::kv_bytes_per_token_layer(c, d.kv_cache_dtype);
  m.kv_bytes_per_token = m.kv_bytes_per_token_layer * double(L);
  m.indexer_bytes_per_token = detail::indexer_bytes_per_token_layer(c) * double(n_full);
  m.mtp_bytes_per_token = spec ? m.kv_bytes_per_token_layer + detail::indexer_bytes_per_token_layer(c) : 0.0;
  m.cache_bytes_per_token = m.kv_bytes_per_token + m.indexer_bytes_per_token + m.mtp_bytes_per_token;

  constexpr int64_t kPage = 64;  // FlashMLA's page size
  m.budget_bytes = hw.memory_bytes * d.mem_fraction_static;
  m.kv_pool_bytes = m.budget_bytes - m.weights_bytes;
  if (m.kv_pool_bytes > 0) {
    m.kv_tokens_fit = int64_t(std::floor(m.kv_pool_bytes / m.cache_bytes_per_token / double(kPage))) * kPage;
  }
  const int64_t per_request = ceil_div(d.context + d.speculative_num_draft_tokens, kPage) * kPage;
  m.max_requests_per_dp_group = m.kv_tokens_fit / per_request;
  m.max_requests = m.max_requests_per_dp_group * d.attn_dp_size;
  m.batch_fits = d.batch <= m.max_requests;
  m.expert_read_floor_s = m.routed_expert_bytes / hw.hbm_bytes_per_s;
  m.weight_read_floor_s = m.weights_bytes / hw.hbm_bytes_per_s;
  return m;
}

}  // namespace dsaserve::plan
