// Slicing bound weights into one rank's shard (model/shard.h).
#include "model/shard.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace dsaserve::model {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows [r0, r1) of the output features: a view (with its scale rows).
Linear column_shard(const Linear& l, int64_t parts, int64_t part, int64_t block_n) {
  if (parts == 1) return l;
  const int64_t n = l.out_features() / parts, r0 = part * n;
  Linear out;
  out.weight = l.weight.slice(0, r0, r0 + n);
  if (l.is_fp8()) out.scale_inv = l.scale_inv.slice(0, r0 / block_n, ceil_div(r0 + n, block_n));
  return out;
}

// Columns [c0, c1) of the input features: a contiguous copy (with its scale columns).
Linear row_shard(const Linear& l, int64_t parts, int64_t part, int64_t block_k) {
  if (parts == 1) return l;
  const int64_t n = l.in_features() / parts, c0 = part * n;
  Linear out;
  out.weight = l.weight.slice(1, c0, c0 + n).contiguous();
  if (l.is_fp8()) out.scale_inv = l.scale_inv.slice(1, c0 / block_k, ceil_div(c0 + n, block_k)).contiguous();
  return out;
}

MlpWeights mlp_shard(const MlpWeights& m, int64_t parts, int64_t part, const ModelConfig& c) {
  return {column_shard(m.gate, parts, part, c.fp8.block_n), column_shard(m.up, parts, part, c.fp8.block_n),
          row_shard(m.down, parts, part, c.fp8.block_k)};
}

// Rows [v0, v0 + n) of the embedding and one zero row after them (the row of the other ranks' tokens).
Tensor embedding_shard(const Tensor& e, int64_t v0, int64_t n) {
  DSA_CHECK(e.device() == Device::cpu, "shard: the embedding is sharded on the host, got {}", e.describe());
  Tensor out = Tensor::zeros({n + 1, e.size(1)}, e.dtype());
  Tensor rows = out.slice(0, 0, n);
  rows.copy_from(e.slice(0, v0, v0 + n));
  return out;
}

LayerWeights layer_shard(const LayerWeights& l, const ModelConfig& c, const Shard& s) {
  LayerWeights out = l;
  AttentionWeights& a = out.attn;
  a.q_b_proj = column_shard(l.attn.q_b_proj, s.attn_tp(), s.attn_tp_rank(), c.fp8.block_n);
  a.kv_b_proj = column_shard(l.attn.kv_b_proj, s.attn_tp(), s.attn_tp_rank(), c.fp8.block_n);
  a.o_proj = row_shard(l.attn.o_proj, s.attn_tp(), s.attn_tp_rank(), c.fp8.block_k);
  if (l.mlp) out.mlp = mlp_shard(*l.mlp, s.dense_tp(), s.dense_tp_rank(), c);
  if (l.moe) {
    MoeWeights& m = *out.moe;
    m.experts.clear();
    const int64_t e0 = s.expert_begin(c), ne = s.local_experts(c);
    for (int64_t e = e0; e < e0 + ne; ++e)
      m.experts.push_back(mlp_shard(l.moe->experts[size_t(e)], s.moe_tp(), s.moe_tp_rank(), c));
    if (l.moe->shared_experts)
      m.shared_experts = mlp_shard(*l.moe->shared_experts, s.moe_tp(), s.moe_tp_rank(), c);
  }
  return out;
}

}  // namespace

void Shard::validate(const ModelConfig& c) const {
  layout.validate();
  DSA_CHECK(rank >= 0 && rank < layout.tp, "shard: rank {} of {} ranks", rank, layout.tp);
  const int64_t bn = c.fp8.enabled ? c.fp8.block_n : 1, bk = c.fp8.enabled ? c.fp8.block_k : 1;
  auto split = [&](const char* what, int64_t size, int64_t parts, int64_t block, const char* flag) {
    DSA_CHECK(size % parts == 0 && (size / parts) % block == 0, "{} {} does not split {} ways{} ({})", what,
              size, parts,
              block > 1 ? fmt::format(" into multiples of the FP8 block {}", block) : std::string(), flag);
  };
  const int64_t atp = attn_tp();
  split("num_attention_heads", c.num_attention_heads, atp, 1, "attention TP = --tp / --attn-dp-size");
  split("q_b_proj rows", c.num_attention_heads * c.qk_head_dim(), atp, bn, "attention TP");
  split("kv_b_proj rows", c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), atp, bn,
        "attention TP");
  split("o_proj columns", c.num_attention_heads * c.v_head_dim, atp, bk, "attention TP");
  split("vocab_size", c.vocab_size, atp, 1,
        "the vocabulary-parallel embedding and LM head over attention TP");
  split("intermediate_size", c.intermediate_size, dense_tp(), std::max(bn, bk), "dense TP");
  split("moe_intermediate_size", c.moe_intermediate_size, moe_tp(), std::max(bn, bk),
        "MoE TP = --tp / --ep-size");
  if (c.n_shared_experts > 0)
    split("shared expert intermediate size", c.moe_intermediate_size * c.n_shared_experts, moe_tp(),
          std::max(bn, bk), "MoE TP");
  if (c.n_routed_experts > 0) split("n_routed_experts", c.n_routed_experts, layout.ep_size, 1, "--ep-size");
}

int64_t RowSplit::world_rows() const {
  if (equal) return int64_t(rank_rows.size()) * block;
  int64_t n = 0;
  for (int64_t r : rank_rows) n += r;
  return n;
}

RowSplit RowSplit::make(const Shard& s, std::vector<int64_t> dp_tokens, bool equal) {
  const int64_t dp = s.layout.attn_dp_size, atp = s.attn_tp();
  DSA_CHECK(int64_t(dp_tokens.size()) == dp, "forward: {} DP token counts for --attn-dp-size {}",
            dp_tokens.size(), dp);
  RowSplit p;
  p.equal = equal;
  for (int64_t d = 0; d < dp; ++d) {
    const int64_t T = dp_tokens[size_t(d)], base = T / atp, extra = T % atp;
    DSA_CHECK(T >= 0, "forward: DP group {} has {} tokens", d, T);
    int64_t row = 0;
    for (int64_t a = 0; a < atp; ++a) {
      const int64_t n = base + (a < extra ? 1 : 0);
      p.rank_rows.push_back(n);
      p.block = std::max(p.block, n);
      if (d == s.layout.attn_dp_rank(s.rank)) {
        p.attn_rows.push_back(n);
        if (a == s.attn_tp_rank()) {
          p.begin = row;
          p.end = row + n;
        }
      }
      row += n;
    }
  }
  p.dp_tokens = std::move(dp_tokens);
  return p;
}

ModelWeights shard_weights(const ModelWeights& w, const ModelConfig& c, const Shard& s) {
  if (s.whole()) return w;
  s.validate(c);
  ModelWeights out = w;
  const int64_t v0 = s.vocab_begin(c), nv = s.vocab_rows(c);
  out.embed_tokens = embedding_shard(w.embed_tokens, v0, nv);
  out.lm_head = column_shard(w.lm_head, s.attn_tp(), s.attn_tp_rank(), c.fp8.block_n);
  for (size_t l = 0; l < w.layers.size(); ++l) out.layers[l] = layer_shard(w.layers[l], c, s);
  for (size_t k = 0; k < w.mtp.size(); ++k) {
    MtpWeights& m = out.mtp[k];
    m.layer = layer_shard(w.mtp[k].layer, c, s);
    if (w.mtp[k].embed_tokens.defined()) m.embed_tokens = embedding_shard(w.mtp[k].embed_tokens, v0, nv);
    if (w.mtp[k].shared_head)
      m.shared_head = column_shard(*w.mtp[k].shared_head, s.attn_tp(), s.attn_tp_rank(), c.fp8.block_n);
  }
  return out;
}

}  // namespace dsaserve::model
