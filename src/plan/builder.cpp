// The operator chain of one layer kind on one rank, and its collectives, following the layout:
// attention TP (heads split over attn_tp) or DP attention (replicated, requests split over attn_dp),
// MoE as TP (experts split by intermediate) or EP (experts split by count), DeepEP or gather/reduce.
#include "plan/builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "plan/cost.h"

namespace dsaserve::plan::detail {

namespace {
constexpr double kAct = 2.0;  // activations are bf16
constexpr double kNormFlops = 4.0, kActFlops = 4.0, kRopeFlops = 4.0;

std::string n(double v) { return fmt::format("{}", int64_t(std::llround(v))); }
}  // namespace

Op Builder::op(std::string name, OpKind kind, Precision prec, std::string shape, double flops, double weight,
               double act_read, double act_write, double kv_read, double kv_write) const {
  Op o;
  o.name = std::move(name);
  o.kind = kind;
  o.precision = prec;
  o.shape = std::move(shape);
  o.flops = flops;
  o.weight_bytes = weight;
  o.act_read_bytes = act_read;
  o.act_write_bytes = act_write;
  o.kv_read_bytes = kv_read;
  o.kv_write_bytes = kv_write;
  const double peak = prec == Precision::fp8 ? hw_.fp8_flops_per_s : hw_.bf16_flops_per_s;
  o.compute_s = flops / peak;
  o.memory_s = o.bytes() / hw_.hbm_bytes_per_s;
  return o;
}

Collective Builder::coll(std::string name, CollKind kind, std::string group, int64_t group_size,
                         std::string after, double count, double bytes, double scale_bytes,
                         double meta_bytes) const {
  Collective col;
  col.name = std::move(name);
  col.kind = kind;
  col.group = std::move(group);
  col.group_size = group_size;
  col.after = std::move(after);
  col.count = int64_t(std::llround(count));
  col.bytes = bytes;
  col.scale_bytes = scale_bytes;
  col.meta_bytes = meta_bytes;
  const double g = double(group_size), frac = (g - 1) / g;
  switch (kind) {
    case CollKind::all_reduce: col.wire_bytes = 2 * frac * bytes; break;
    case CollKind::all_gather:
    case CollKind::reduce_scatter: col.wire_bytes = frac * bytes; break;
    case CollKind::dispatch:
    case CollKind::combine: col.wire_bytes = frac * (bytes + scale_bytes + meta_bytes); break;
    case CollKind::broadcast: col.wire_bytes = bytes; break;
  }
  col.time_s = hw_.collective_latency_s + col.wire_bytes / hw_.interconnect_bytes_per_s;
  return col;
}

void Builder::head(Pass& pass, const PassTokens& p) const {
  const double H = double(c_.hidden_size), T = p.tokens;
  pass.head_ops.push_back(op("embed_tokens", OpKind::embedding, Precision::none,
                             fmt::format("[{}] -> [{}, {}]", p.tokens_shape, p.tokens_shape, c_.hidden_size),
                             0, T * H * kAct, T * 4, T * H * kAct));
  if (d_.attn_tp() > 1) {
    pass.head_collectives.push_back(coll("embed_all_reduce", CollKind::all_reduce, "attn_tp", d_.attn_tp(),
                                         "embed_tokens", p.occurrences, T / p.occurrences * H * kAct));
  }
}

void Builder::tail(Pass& pass, const PassTokens& p) const {
  const double H = double(c_.hidden_size), V = double(c_.vocab_size), Tl = p.logit_tokens;
  const double Tn = p.norm_tokens >= 0 ? p.norm_tokens : Tl;
  const int64_t atp = d_.attn_tp();
  const double Vl = double(ceil_div(c_.vocab_size, atp));
  const int64_t tl = int64_t(std::llround(Tl));
  pass.tail_ops.push_back(op(pass.mtp ? "shared_head_norm" : "final_norm", OpKind::norm, Precision::none,
                             fmt::format("[{}, {}]", int64_t(std::llround(Tn)), c_.hidden_size),
                             kNormFlops * Tn * H, H * kAct, Tn * H * kAct, Tn * H * kAct));
  pass.tail_ops.push_back(
      op("lm_head", OpKind::gemm, Precision::bf16,
         fmt::format("[{}, {}] x [{}, {}]^T", tl, c_.hidden_size, int64_t(Vl), c_.hidden_size),
         2 * Tl * H * Vl, Vl * H * 2, Tl * H * kAct, Tl * Vl * kAct));
  if (atp > 1) {
    pass.tail_collectives.push_back(
        coll("lm_head_all_gather", CollKind::all_gather, "attn_tp", atp, "lm_head", 1, Tl * V * kAct));
  }
  pass.tail_ops.push_back(op("sampling", OpKind::elementwise, Precision::none,
                             fmt::format("[{}, {}]", tl, int64_t(V)), 5 * Tl * V, 0, Tl * V * kAct, Tl * 8));
}

LayerKindPlan Builder::layer(const std::string& name, bool dense, bool full_indexer, bool mtp,
                             const PassTokens& p) const {
  LayerKindPlan lp;
  lp.name = name;
  const double H = double(c_.hidden_size), T = p.tokens, occ = p.occurrences;
  const std::string th = fmt::format("[{}, {}]", p.tokens_shape, c_.hidden_size);
  if (mtp) {
    lp.ops.push_back(op("mtp_enorm", OpKind::norm, Precision::none, th, kNormFlops * T * H, H * kAct * occ,
                        T * H * kAct, T * H * kAct));
    lp.ops.push_back(op("mtp_hnorm", OpKind::norm, Precision::none, th, kNormFlops * T * H, H * kAct * occ,
                        T * H * kAct, T * H * kAct));
    lp.ops.push_back(op("mtp_eh_proj", OpKind::gemm, Precision::bf16,
                        fmt::format("[{}, {}] x [{}, {}]^T", p.tokens_shape, 2 * c_.hidden_size,
                                    c_.hidden_size, 2 * c_.hidden_size),
                        2 * T * 2 * H * H, linear_bytes(c_, c_.hidden_size, 2 * c_.hidden_size, false) * occ,
                        T * 2 * H * kAct, T * H * kAct));
  }
  lp.ops.push_back(op("input_layernorm", OpKind::norm, Precision::none, th, kNormFlops * T * H,
                      H * kAct * occ, 2 * T * H * kAct, 2 * T * H * kAct));
  attention(lp, full_indexer, p);
  if (dense) {
    dense_mlp(lp, p);
  } else {
    moe(lp, p);
  }
  return lp;
}

void Builder::attention(LayerKindPlan& lp, bool full_indexer, const PassTokens& p) const {
  const int64_t atp = d_.attn_tp();
  const double H = double(c_.hidden_size), T = p.tokens, occ = p.occurrences;
  const double qr = double(c_.q_lora_rank), kr = double(c_.kv_lora_rank), dr = double(c_.qk_rope_head_dim);
  const double dn = double(c_.qk_nope_head_dim), dv = double(c_.v_head_dim), qkd = double(c_.qk_head_dim());
  const double nhl = double(c_.num_attention_heads / atp);
  const int64_t ts = p.tokens_shape, nhl_i = c_.num_attention_heads / atp;
  const double kvb = kv_bytes_per_token_layer(c_, d_.kv_cache_dtype);
  auto& ops = lp.ops;

  // Fused q_a_proj + kv_a_proj_with_mqa (ReplicatedLinear: every rank holds all of it).
  const double a_out = qr + kr + dr;
  ops.push_back(op("qkv_a_proj", OpKind::gemm, c_.fp8.enabled ? Precision::fp8 : Precision::bf16,
                   fmt::format("[{}, {}] x [{}, {}]^T", ts, c_.hidden_size, int64_t(a_out), c_.hidden_size),
                   2 * T * H * a_out,
                   (linear_bytes(c_, c_.q_lora_rank, c_.hidden_size) +
                    linear_bytes(c_, c_.kv_lora_rank + c_.qk_rope_head_dim, c_.hidden_size)) *
                       occ,
                   T * H * kAct, T * a_out * kAct));
  ops.push_back(op("q_a_layernorm", OpKind::norm, Precision::none,
                   fmt::format("[{}, {}]", ts, c_.q_lora_rank), kNormFlops * T * qr, qr * kAct * occ,
                   T * qr * kAct, T * qr * kAct));
  ops.push_back(op("kv_a_layernorm", OpKind::norm, Precision::none,
                   fmt::format("[{}, {}]", ts, c_.kv_lora_rank), kNormFlops * T * kr, kr * kAct * occ,
                   T * kr * kAct, T * kr * kAct));
  ops.push_back(op("kv_cache_write", OpKind::cache_write, Precision::none,
                   fmt::format("[{}, {}] -> {} B/token", ts, c_.kv_cache_dim(), int64_t(kvb)),
                   kRopeFlops * T * dr, 0, T * (kr + dr) * kAct, 0, 0, T * kvb));

  const bool dsa = c_.has_indexer();
  if (full_indexer) {
    const double ih = double(c_.index_n_heads), id = double(c_.index_head_dim),
                 ixb = indexer_bytes_per_token_layer(c_);
    const int64_t ih_i = c_.index_n_heads, id_i = c_.index_head_dim;
    ops.push_back(op("indexer_wq_b", OpKind::gemm, c_.fp8.enabled ? Precision::fp8 : Precision::bf16,
                     fmt::format("[{}, {}] x [{}, {}]^T", ts, c_.q_lora_rank, ih_i * id_i, c_.q_lora_rank),
                     2 * T * qr * ih * id, linear_bytes(c_, ih_i * id_i, c_.q_lora_rank) * occ, T * qr * kAct,
                     T * ih * id * kAct));
    ops.push_back(op("indexer_wk_weights_proj", OpKind::gemm, Precision::bf16,
                     fmt::format("[{}, {}] x [{}, {}]^T", ts, c_.hidden_size, id_i + ih_i, c_.hidden_size),
                     2 * T * H * (id + ih), linear_bytes(c_, id_i + ih_i, c_.hidden_size, false) * occ,
                     T * H * kAct, T * (id + ih) * kAct));
    ops.push_back(
        op("indexer_k_cache_write", OpKind::cache_write, Precision::none,
           fmt::format("[{}, {}] q + [{}, {}] k -> {} B/token", ts, ih_i * id_i, ts, id_i, int64_t(ixb)),
           kNormFlops * T * id + kRopeFlops * T * (ih + 1) * dr, 2 * id * kAct * occ,
           T * (ih * id + id) * kAct, T * ih * id, 0, T * ixb));
    // Scores: per query and key, ih dot products of id (FP8), relu, weighted sum over heads.
    ops.push_back(op("indexer_logits", OpKind::indexer, Precision::fp8,
                     fmt::format("{} q x [{}, {}] . {} keys", ts, ih_i, id_i, p.context_shape),
                     2 * ih * id * p.indexer_keys + 3 * ih * p.indexer_keys, 0, T * (ih * id + ih * 4),
                     p.indexer_keys * 4, p.indexer_kv_tokens * ixb, 0));
    ops.push_back(op("indexer_topk", OpKind::topk, Precision::none,
                     fmt::format("[{}, {}] -> top-{}", ts, p.context_shape, c_.index_topk), p.indexer_keys, 0,
                     p.indexer_keys * 4, T * double(c_.index_topk) * 4));
    if (atp > 1 && d_.dsa_topk_broadcast) {
      lp.collectives.push_back(coll("indexer_topk_broadcast", CollKind::broadcast, "attn_tp", atp,
                                    "indexer_topk", occ, T / occ * double(c_.index_topk) * 4));
    }
  }
  ops.push_back(
      op("q_b_proj", OpKind::gemm, c_.fp8.enabled ? Precision::fp8 : Precision::bf16,
         fmt::format("[{}, {}] x [{}, {}]^T", ts, c_.q_lora_rank, nhl_i * c_.qk_head_dim(), c_.q_lora_rank),
         2 * T * qr * nhl * qkd, linear_bytes(c_, nhl_i * c_.qk_head_dim(), c_.q_lora_rank) * occ,
         T * qr * kAct, T * nhl * qkd * kAct));
  const double wkv_bytes = linear_bytes(c_, nhl_i * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank);
  const double wuk_bytes = wkv_bytes * dn / (dn + dv), wuv_bytes = wkv_bytes * dv / (dn + dv);
  const bool absorbed = !p.mha_form;
  if (absorbed) {
    // MQA form: q_nope -> latent space, attention on the 576-value latent, latent -> v.
    ops.push_back(op("q_nope_absorb", OpKind::bmm, Precision::bf16,
                     fmt::format("{} x [{}, {}] x [{}, {}]", nhl_i, ts, c_.qk_nope_head_dim,
                                 c_.qk_nope_head_dim, c_.kv_lora_rank),
                     2 * T * nhl * dn * kr, wuk_bytes * occ, T * nhl * dn * kAct, T * nhl * kr * kAct));
    ops.push_back(op("q_rope", OpKind::elementwise, Precision::none,
                     fmt::format("[{}, {}, {}]", ts, nhl_i, c_.qk_rope_head_dim), kRopeFlops * T * nhl * dr,
                     0, T * nhl * dr * kAct, T * nhl * dr * kAct));
    ops.push_back(
        op(dsa ? "sparse_mla" : "mla", OpKind::attention, Precision::bf16,
           fmt::format("{} q x {} heads x [{} + {}] . {} keys", ts, nhl_i, c_.kv_lora_rank,
                       c_.qk_rope_head_dim, dsa ? std::min(c_.index_topk, p.context_shape) : p.context_shape),
           2 * nhl * p.attn_keys * (kr + dr) + 2 * nhl * p.attn_keys * kr, 0,
           T * nhl * (kr + dr) * kAct + (dsa ? T * double(c_.index_topk) * 4 : 0), T * nhl * kr * kAct,
           p.attn_kv_tokens * kvb, 0));
    ops.push_back(op(
        "v_up_absorb", OpKind::bmm, Precision::bf16,
        fmt::format("{} x [{}, {}] x [{}, {}]", nhl_i, ts, c_.kv_lora_rank, c_.kv_lora_rank, c_.v_head_dim),
        2 * T * nhl * kr * dv, wuv_bytes * occ, T * nhl * kr * kAct, T * nhl * dv * kAct));
  } else {
    // MHA form (a prefill the form rule gives it): expand the latent of every key, causal attention.
    const double E = p.expand_tokens;
    ops.push_back(op("kv_b_proj", OpKind::gemm, c_.fp8.enabled ? Precision::fp8 : Precision::bf16,
                     fmt::format("[{}, {}] x [{}, {}]^T", n(E / occ), c_.kv_lora_rank,
                                 nhl_i * (c_.qk_nope_head_dim + c_.v_head_dim), c_.kv_lora_rank),
                     2 * E * kr * nhl * (dn + dv), wkv_bytes * occ, 0, E * nhl * (dn + dv) * kAct, E * kvb,
                     0));
    ops.push_back(op("q_rope", OpKind::elementwise, Precision::none,
                     fmt::format("[{}, {}, {}]", ts, nhl_i, c_.qk_rope_head_dim), kRopeFlops * T * nhl * dr,
                     0, T * nhl * dr * kAct, T * nhl * dr * kAct));
    ops.push_back(op("mha", OpKind::attention, Precision::bf16,
                     fmt::format("{} q x {} heads x [{}] . causal keys", ts, nhl_i, c_.qk_head_dim()),
                     2 * nhl * p.attn_keys * qkd + 2 * nhl * p.attn_keys * dv, 0,
                     T * nhl * qkd * kAct + E * (nhl * (dn + dv) + dr) * kAct, T * nhl * dv * kAct));
  }
  ops.push_back(op(
      "o_proj", OpKind::gemm, c_.fp8.enabled ? Precision::fp8 : Precision::bf16,
      fmt::format("[{}, {}] x [{}, {}]^T", ts, nhl_i * c_.v_head_dim, c_.hidden_size, nhl_i * c_.v_head_dim),
      2 * T * nhl * dv * H, linear_bytes(c_, c_.hidden_size, nhl_i * c_.v_head_dim) * occ,
      T * nhl * dv * kAct, T * H * kAct));
}

void Builder::dense_mlp(LayerKindPlan& lp, const PassTokens& p) const {
  const int64_t atp = d_.attn_tp(), adp = d_.attn_dp_size, dtp = d_.dense_tp(), tp = d_.tp;
  const double H = double(c_.hidden_size), occ = p.occurrences;
  const double T = p.tokens, Tg = p.tokens_global;
  const bool gathered = adp > 1 && dtp > 1;
  // Attention DP under attention TP (the scattered mode, SGLang's LayerCommunicator): o_proj's partial
  // sums are reduce-scattered to each rank's rows and all-gathered back at the layer boundary.
  const bool scattered = adp > 1 && atp > 1;
  if (atp > 1) {
    lp.collectives.push_back(scattered ? coll("attn_tp_reduce_scatter", CollKind::reduce_scatter, "attn_tp",
                                              atp, "o_proj", occ, T / occ * H * kAct)
                                       : coll("attn_tp_all_reduce", CollKind::all_reduce, "attn_tp", atp,
                                              "o_proj", occ, T / occ * H * kAct));
  }
  lp.ops.push_back(op("post_attention_layernorm", OpKind::norm, Precision::none,
                      fmt::format("[{}, {}]", p.tokens_shape, c_.hidden_size), kNormFlops * T * H,
                      H * kAct * occ, 2 * T * H * kAct, 2 * T * H * kAct));
  if (gathered) {
    lp.collectives.push_back(coll("dp_all_gather", CollKind::all_gather, "world", tp,
                                  "post_attention_layernorm", occ, p.gather_tokens / occ * H * kAct));
  }
  const double Tm = gathered ? Tg : T;
  const int64_t tm = gathered ? p.tokens_global_shape : p.tokens_shape;
  const int64_t Il = c_.intermediate_size / dtp;
  const Precision pr = c_.fp8.enabled ? Precision::fp8 : Precision::bf16;
  lp.ops.push_back(op("mlp_gate_up", OpKind::gemm, pr,
                      fmt::format("[{}, {}] x [{}, {}]^T", tm, c_.hidden_size, 2 * Il, c_.hidden_size),
                      2 * Tm * H * 2 * double(Il), 2 * linear_bytes(c_, Il, c_.hidden_size) * occ,
                      Tm * H * kAct, Tm * 2 * double(Il) * kAct));
  lp.ops.push_back(op("mlp_act", OpKind::elementwise, Precision::none, fmt::format("[{}, {}]", tm, Il),
                      kActFlops * Tm * double(Il), 0, Tm * 2 * double(Il) * kAct, Tm * double(Il) * kAct));
  lp.ops.push_back(op("mlp_down", OpKind::gemm, pr,
                      fmt::format("[{}, {}] x [{}, {}]^T", tm, Il, c_.hidden_size, Il),
                      2 * Tm * double(Il) * H, linear_bytes(c_, c_.hidden_size, Il) * occ,
                      Tm * double(Il) * kAct, Tm * H * kAct));
  if (gathered) {
    lp.collectives.push_back(coll("dp_reduce_scatter", CollKind::reduce_scatter, "world", tp, "mlp_down", occ,
                                  p.gather_tokens / occ * H * kAct));
  } else if (dtp > 1) {
    lp.collectives.push_back(
        coll("tp_all_reduce", CollKind::all_reduce, "world", tp, "mlp_down", occ, T / occ * H * kAct));
  }
  if (scattered) {
    lp.collectives.push_back(coll("attn_tp_all_gather", CollKind::all_gather, "attn_tp", atp, "mlp_down", occ,
                                  T / occ * H * kAct));
  }
}

void Builder::moe(LayerKindPlan& lp, const PassTokens& p) const {
  const int64_t atp = d_.attn_tp(), adp = d_.attn_dp_size, tp = d_.tp, ep = d_.ep_size, mtp = d_.moe_tp();
  const double H = double(c_.hidden_size), occ = p.occurrences, T = p.tokens, Tg = p.tokens_global;
  const double E = double(c_.n_routed_experts), k = double(c_.num_experts_per_tok);
  const bool deepep = d_.moe_a2a_backend == A2aBackend::deepep;
  const bool gathered = adp > 1;
  const Precision pr = c_.fp8.enabled ? Precision::fp8 : Precision::bf16;
  // TP attention + DeepEP, or attention DP under attention TP (the scattered mode): the o_proj all-reduce
  // becomes a reduce-scatter (each rank dispatches, or DP-gathers, its slice) and an all-gather at the
  // layer boundary, the same bytes as the article's all-reduce.
  const bool split_reduce = atp > 1 && (deepep || adp > 1);
  // DP attention + DeepEP: the article bills the DP gather / scatter around the MoE too; DeepEP dispatches
  // each rank's own rows (SGLang's scattered MLP mode), so they are kept in its count only (runs = false).
  auto dp_gather = [&](const char* name, CollKind kind, const char* after) {
    Collective c = coll(name, kind, "world", tp, after, occ, p.gather_tokens / occ * H * kAct);
    if (deepep) {
      c.runs = false;
      c.wire_bytes = 0;
      c.time_s = 0;
    }
    lp.collectives.push_back(c);
  };
  if (atp > 1) {
    lp.collectives.push_back(split_reduce ? coll("attn_tp_reduce_scatter", CollKind::reduce_scatter,
                                                 "attn_tp", atp, "o_proj", occ, T / occ * H * kAct)
                                          : coll("attn_tp_all_reduce", CollKind::all_reduce, "attn_tp", atp,
                                                 "o_proj", occ, T / occ * H * kAct));
  }
  const double Tn = split_reduce ? T / double(atp) : T;
  lp.ops.push_back(op("post_attention_layernorm", OpKind::norm, Precision::none,
                      fmt::format("[{}, {}]", n(Tn / occ), c_.hidden_size), kNormFlops * Tn * H,
                      H * kAct * occ, 2 * Tn * H * kAct, 2 * Tn * H * kAct));
  if (gathered) dp_gather("dp_all_gather", CollKind::all_gather, "post_attention_layernorm");
  const double Tall = gathered ? Tg : T;  // tokens the MoE group sees
  // Tokens this rank routes (and runs the shared expert on); DeepEP's: the average rank's share of the
  // deployment's tokens (the ranks dispatch their own rows, no padding).
  const double Town =
      deepep ? (gathered && p.dispatch_tokens >= 0 ? p.dispatch_tokens : Tall) / double(tp) : Tall;
  const double pairs = Tall * k / double(ep);  // token-expert pairs computed here (uniform routing)
  const double El = E / double(ep);
  const double routed_per_occ = gathered ? double(p.tokens_global_shape) : double(p.tokens_shape);
  const double touched = El * (1.0 - std::pow(1.0 - k / E, routed_per_occ));  // expected local experts hit
  const std::string town = n(Town / occ);

  lp.ops.push_back(
      op("router_gate", OpKind::gemm, Precision::bf16,
         fmt::format("[{}, {}] x [{}, {}]^T", town, c_.hidden_size, c_.n_routed_experts, c_.hidden_size),
         2 * Town * H * E, linear_bytes(c_, c_.n_routed_experts, c_.hidden_size, false) * occ,
         Town * H * kAct, Town * E * 4));
  lp.ops.push_back(op("router_topk", OpKind::topk, Precision::none,
                      fmt::format("[{}, {}] -> top-{}", town, c_.n_routed_experts, c_.num_experts_per_tok),
                      6 * Town * E, E * 4 * occ, Town * E * 4, Town * k * 8));
  const bool fp8_dispatch = deepep && c_.fp8.enabled && d_.deepep_fp8_dispatch;
  const double act_in = fp8_dispatch ? 1.0 : kAct;
  if (deepep) {
    // First the pair counts each rank sends each (DeepEP's dispatch layout: the receive sizes), then each
    // (token, pick) pair: its row (FP8 codes + a scale per 128 values, or bf16), its expert and weight.
    Collective layout =
        coll("ep_dispatch_layout", CollKind::dispatch, "ep", ep, "router_topk", occ, double(ep) * 8);
    layout.article = false;
    lp.collectives.push_back(layout);
    lp.collectives.push_back(coll(
        "ep_dispatch", CollKind::dispatch, "ep", ep, "router_topk", occ, Town / occ * k * H * act_in,
        fp8_dispatch ? Town / occ * k * double(ceil_div(c_.hidden_size, 128)) * 4 : 0, Town / occ * k * 8));
  }
  // The shared expert runs before the routed experts on one rank (their combine adds its output: moe_sum),
  // after them with DeepEP.
  auto shared_expert = [&] {
    if (c_.n_shared_experts <= 0) return;
    const int64_t Isl = c_.moe_intermediate_size * c_.n_shared_experts / mtp;
    const double Is = double(Isl);
    lp.ops.push_back(op("shared_expert_gate_up", OpKind::gemm, pr,
                        fmt::format("[{}, {}] x [{}, {}]^T", town, c_.hidden_size, 2 * Isl, c_.hidden_size),
                        2 * Town * H * 2 * Is, 2 * linear_bytes(c_, Isl, c_.hidden_size) * occ,
                        Town * H * kAct, Town * 2 * Is * kAct));
    lp.ops.push_back(op("shared_expert_act", OpKind::elementwise, Precision::none,
                        fmt::format("[{}, {}]", town, Isl), kActFlops * Town * Is, 0, Town * 2 * Is * kAct,
                        Town * Is * kAct));
    lp.ops.push_back(op("shared_expert_down", OpKind::gemm, pr,
                        fmt::format("[{}, {}] x [{}, {}]^T", town, Isl, c_.hidden_size, Isl),
                        2 * Town * Is * H, linear_bytes(c_, c_.hidden_size, Isl) * occ, Town * Is * kAct,
                        Town * H * kAct));
  };
  if (!deepep) shared_expert();
  const int64_t Iml = c_.moe_intermediate_size / mtp;
  const double I = double(Iml);
  const std::string pshape = n(pairs / occ);
  lp.ops.push_back(op("experts_gate_up", OpKind::gemm, pr,
                      fmt::format("{} experts ({:.1f} hit), {} rows x [{}, {}]^T", int64_t(El), touched,
                                  pshape, 2 * Iml, c_.hidden_size),
                      2 * pairs * H * 2 * I, touched * 2 * linear_bytes(c_, Iml, c_.hidden_size) * occ,
                      pairs * H * act_in, pairs * 2 * I * kAct));
  lp.ops.push_back(op("experts_act", OpKind::elementwise, Precision::none,
                      fmt::format("[{}, {}]", pshape, Iml), kActFlops * pairs * I, 0, pairs * 2 * I * kAct,
                      pairs * I * kAct));
  lp.ops.push_back(op("experts_down", OpKind::gemm, pr,
                      fmt::format("{} rows x [{}, {}]^T", pshape, c_.hidden_size, Iml), 2 * pairs * I * H,
                      touched * linear_bytes(c_, c_.hidden_size, Iml) * occ, pairs * I * kAct,
                      pairs * H * kAct));
  if (deepep) {
    lp.collectives.push_back(
        coll("ep_combine", CollKind::combine, "ep", ep, "experts_down", occ, Town / occ * k * H * kAct));
  }
  if (deepep) shared_expert();
  // Weighted sum of the routed outputs (when not done by the combine), routed scaling, + shared output.
  const double rows_in = deepep ? 2 * Town : (Town + pairs);
  lp.ops.push_back(op("moe_sum", OpKind::elementwise, Precision::none,
                      fmt::format("[{}, {}]", town, c_.hidden_size), 2 * (deepep ? Town : pairs) * H, 0,
                      rows_in * H * kAct, Town * H * kAct));
  if (gathered) dp_gather("dp_reduce_scatter", CollKind::reduce_scatter, "moe_sum");
  if (split_reduce) {
    lp.collectives.push_back(
        coll("attn_tp_all_gather", CollKind::all_gather, "attn_tp", atp, "moe_sum", occ, T / occ * H * kAct));
  } else if (!gathered && tp > 1 && !deepep) {
    lp.collectives.push_back(
        coll("tp_all_reduce", CollKind::all_reduce, "world", tp, "moe_sum", occ, T / occ * H * kAct));
  }
}

}  // namespace dsaserve::plan::detail
