#include "model/param_count.h"

namespace dsaserve::model {

int64_t attention_params(const ModelConfig& c) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads;
  return c.q_lora_rank * H + c.q_lora_rank                             // q_a_proj, q_a_layernorm
         + nh * c.qk_head_dim() * c.q_lora_rank                        // q_b_proj
         + (c.kv_lora_rank + c.qk_rope_head_dim) * H + c.kv_lora_rank  // kv_a_proj_with_mqa, kv_a_layernorm
         + nh * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank   // kv_b_proj
         + H * nh * c.v_head_dim;                                      // o_proj
}

int64_t indexer_params(const ModelConfig& c) {
  if (!c.has_indexer()) return 0;
  return c.index_n_heads * c.index_head_dim * c.q_lora_rank  // wq_b
         + c.index_head_dim * c.hidden_size                  // wk
         + 2 * c.index_head_dim                              // k_norm weight + bias
         + c.index_n_heads * c.hidden_size;                  // weights_proj
}

int64_t mlp_params(int64_t hidden, int64_t inter) { return 3 * hidden * inter; }

ParamCount count_params(const ModelConfig& c) {
  const int64_t H = c.hidden_size, L = c.num_hidden_layers, E = c.n_routed_experts;
  ParamCount pc;
  auto add = [&](const std::string& name, int64_t total, int64_t active) {
    pc.groups.push_back({name, total, active});
    pc.total += total;
    pc.active += active;
  };
  int64_t n_dense = 0, n_moe = 0;
  for (MlpType t : c.mlp_layer_types) (t == MlpType::dense ? n_dense : n_moe)++;
  const int64_t n_full = c.num_full_indexer_layers();
  const int64_t expert = mlp_params(H, c.moe_intermediate_size);
  add("embed_tokens", c.vocab_size * H, c.vocab_size * H);
  add("layer_norms", L * 2 * H + H, L * 2 * H + H);
  add("attention", L * attention_params(c), L * attention_params(c));
  add("indexer", n_full * indexer_params(c), n_full * indexer_params(c));
  add("dense_mlp", n_dense * mlp_params(H, c.intermediate_size),
      n_dense * mlp_params(H, c.intermediate_size));
  add("router", n_moe * (E * H + E), n_moe * (E * H + E));
  add("routed_experts", n_moe * E * expert, n_moe * c.num_experts_per_tok * expert);
  const int64_t shared = mlp_params(H, c.moe_intermediate_size * c.n_shared_experts);
  add("shared_experts", n_moe * shared, n_moe * shared);
  const int64_t head = c.tie_word_embeddings ? 0 : c.vocab_size * H;
  add("lm_head", head, head);
  // MTP layer: enorm, hnorm, eh_proj, one MoE decoder layer with a full indexer, shared_head.norm.
  const int64_t mtp_layer =
      2 * H + attention_params(c) + indexer_params(c) + (E * H + E) + E * expert + shared;
  pc.mtp_total = c.num_nextn_predict_layers * (2 * H + 2 * H * H + mtp_layer + H);
  return pc;
}

}  // namespace dsaserve::model
