// The decoder layer and the model forward (MODEL.md steps 1-11), against kernels/ops.h only.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "dist/process_groups.h"
#include "model/model.h"
#include "model/step_plan.h"
#include "trace/trace.h"

namespace dsaserve::model {

using trace::OpScope;  // spans named like the plan's op records (docs/plan.md); free when tracing is off

namespace {

// An op span's shape in the plan's notation (plan/builder.cpp), from the tensors that ran; only when
// tracing. A fused span gets one shape per part (shapes()).
template <class... A>
void shape(OpScope& s, fmt::format_string<A...> f, A&&... a) {
  if (s.on()) s.arg("shape", fmt::format(f, std::forward<A>(a)...));
}
void shapes(OpScope& s, std::vector<std::string> parts) {
  if (s.on()) s.arg("shape", std::move(parts));
}
// Bytes per token of a paged cache tensor (the storage format the cache write produces).
int64_t bytes_per_token(const Tensor& cache, const KvCache& kc) {
  return int64_t(cache.nbytes()) / (kc.num_pages * kc.page_size);
}

double yarn_mscale(double factor, double m) { return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; }

kernels::RopeParams rope_params(const ModelConfig& c, bool interleaved) {
  kernels::RopeParams p;
  p.dim = c.qk_rope_head_dim;
  p.theta = c.rope.theta;
  p.interleaved = interleaved;
  if (c.rope.type == "yarn") {
    p.yarn = true;
    p.factor = c.rope.factor;
    p.original_max_position_embeddings = c.rope.original_max_position_embeddings > 0
                                             ? c.rope.original_max_position_embeddings
                                             : c.max_position_embeddings;
    p.beta_fast = c.rope.beta_fast;
    p.beta_slow = c.rope.beta_slow;
    // Hugging Face's yarn attention factor on cos/sin (1 for DeepSeek configs, where mscale ==
    // mscale_all_dim); the softmax scale carries mscale_all_dim (ModelConfig::attention_scale).
    p.attention_factor =
        (c.rope.mscale != 0.0 && c.rope.mscale_all_dim != 0.0)
            ? yarn_mscale(p.factor, c.rope.mscale) / yarn_mscale(p.factor, c.rope.mscale_all_dim)
            : yarn_mscale(p.factor, 1.0);
  }
  return p;
}

}  // namespace

// Per-forward state: the step's plan and its device inputs (both built once per step, the same for every
// layer), and the DSA selection carried from layer to layer.
struct Model::Step {
  const ForwardBatch* batch = nullptr;
  const ForwardOptions* opt = nullptr;
  const StepPlan* plan = nullptr;
  const StepInputs* in = nullptr;
  Tensor sel_rows;          // i32 [T, k] from the last full indexer layer, or undefined (= every key)
  std::vector<Tensor> sel;  // per request, i32 [T_r, k] or undefined (= every visible key)
  bool have_sel = false;
  RowSplit split;  // the step's rows over the ranks (sharded, in the scattered mode: Model::sliced)

  // Rows [t0, t1) of the step over one layer's cache, seeing at most max_len keys, with the kernels'
  // launch plan `mla` (and the indexer's plan for the whole step). The host rows only when the plan
  // allows (not with CUDA graphs: a captured kernel must not size its work from the capture batch).
  kernels::PagedRows rows(const Tensor& cache, int64_t t0, int64_t t1, int64_t max_len,
                          const kernels::MlaRowsPlan* mla) const {
    const StepPlan& p = *plan;
    const bool whole = t0 == 0 && t1 == p.num_tokens();
    std::span<const int32_t> seq, len;
    if (p.host_rows) {
      seq = std::span<const int32_t>(p.row_seq).subspan(size_t(t0), size_t(t1 - t0));
      len = std::span<const int32_t>(p.row_len).subspan(size_t(t0), size_t(t1 - t0));
    }
    return kernels::PagedRows{cache,
                              in->page_table,
                              p.page_size,
                              whole ? in->row_seq : in->row_seq.slice(0, t0, t1),
                              whole ? in->row_len : in->row_len.slice(0, t0, t1),
                              seq,
                              len,
                              max_len,
                              mla,
                              whole ? &p.indexer : nullptr};
  }
  kernels::PagedRows all_rows(const Tensor& cache) const {
    return rows(cache, 0, plan->num_tokens(), plan->max_len, &plan->mla);
  }
};

kernels::WeightRef Model::ref(const Linear& l) const {
  return kernels::WeightRef{l.weight, l.scale_inv, cfg_.fp8.block_n, cfg_.fp8.block_k, l.derived};
}

std::vector<kernels::MlpRef> Model::expert_refs(const MoeWeights& moe) const {
  std::vector<kernels::MlpRef> experts;
  experts.reserve(moe.experts.size());
  for (const MlpWeights& e : moe.experts) experts.push_back({ref(e.gate), ref(e.up), ref(e.down)});
  return experts;
}

void Model::derive_weights() {
  const Device d = w_.embed_tokens.device();
  const kernels::Backend& b = backend_ ? *backend_ : kernels::backend(d);
  const int64_t bn = cfg_.fp8.block_n, bk = cfg_.fp8.block_k;
  // Slots holding one tensor (a tied head and the MTP layer's copy of it, uploaded once by
  // ModelWeights::to) share one set of forms, as they share the tensor (this pass only: nothing is kept).
  using Key = std::tuple<const void*, Shape, DType, kernels::WeightUse>;
  std::map<Key, std::shared_ptr<const kernels::DerivedWeight>> made;
  for_each_derived_slot(w_,
                        [&](const Tensor& weight, const Tensor& scale_inv,
                            std::shared_ptr<const kernels::DerivedWeight>& derived, kernels::WeightUse use) {
                          derived = nullptr;
                          if (!weight.defined() || weight.device() != d) return;
                          const Key key{weight.raw_data(), weight.shape(), weight.dtype(), use};
                          const auto it = made.find(key);
                          if (it != made.end()) {
                            derived = it->second;
                            return;
                          }
                          derived = b.derive_weight(kernels::WeightRef{weight, scale_inv, bn, bk}, use);
                          made.emplace(key, derived);
                        });
  // Each MoE layer's routed experts as a set (the CUDA device paths' table of their weights), where they
  // live on this model's device.
  for_each_moe(w_, [&](MoeWeights& moe) {
    moe.experts_derived = nullptr;
    if (moe.experts.empty() || !moe.experts[0].gate.weight.defined() ||
        moe.experts[0].gate.weight.device() != d)
      return;
    moe.experts_derived = b.derive_experts(expert_refs(moe));
  });
}

Model::Model(ModelConfig cfg, io::Checkpoint ckpt, ModelWeights weights,
             std::shared_ptr<kernels::Backend> backend, std::optional<KvCacheDtype> kv_dtype, Shard shard)
    : cfg_(std::move(cfg)),
      ckpt_(std::move(ckpt)),
      w_(std::move(weights)),
      backend_(std::move(backend)),
      kv_dtype_(kv_dtype),
      ops_(backend_.get()),
      shard_(std::move(shard)) {
  DSA_CHECK(backend_ == nullptr || backend_->device() == w_.embed_tokens.device(),
            "model: a {} backend for weights on {}", device_name(backend_ ? backend_->device() : Device::cpu),
            device_name(w_.embed_tokens.device()));
  derive_weights();
}

std::shared_ptr<Model> Model::with_backend(std::shared_ptr<kernels::Backend> backend,
                                           std::optional<KvCacheDtype> kv_dtype) const {
  return std::make_shared<Model>(cfg_, ckpt_, w_, std::move(backend), kv_dtype, shard_);
}

std::shared_ptr<Model> Model::load(const std::filesystem::path& dir, bool with_mtp) {
  ModelConfig cfg = ModelConfig::from_file(dir / "config.json");
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  ModelWeights w = ModelWeights::bind(cfg, ckpt, with_mtp);
  return std::make_shared<Model>(std::move(cfg), std::move(ckpt), std::move(w));
}

KvCache Model::make_cache(int64_t num_pages, int64_t page_size) const {
  return KvCache::create(cfg_, num_pages, page_size, !w_.mtp.empty(), w_.embed_tokens.device(), kv_dtype_);
}

Tensor Model::attention(const LayerWeights& lw, int64_t kv_layer, bool own_indexer, const Tensor& h,
                        const kernels::Fp8Act& hq, Step& st, KvCache& cache) const {
  const ModelConfig& c = cfg_;
  const AttentionWeights& aw = lw.attn;
  const ForwardBatch& b = *st.batch;
  // This rank's heads (q_b / kv_b / o_proj are split by heads over attention TP).
  const int64_t T = h.size(0), nh = c.num_attention_heads / shard_.attn_tp(), nope = c.qk_nope_head_dim,
                rope = c.qk_rope_head_dim;
  const int64_t dq = nope + rope, dv = c.v_head_dim, L = c.kv_lora_rank;
  constexpr double kLoraEps = 1e-6;  // q_a_layernorm / kv_a_layernorm use the RMSNorm default eps

  // The steps run in the plan's op order (docs/plan.md); each is one span when tracing.
  // q_a and kv_a projections: h @ q_a^T [T, q_lora], c = h @ kv_a^T = [kv | k_rope] [T, L + rope].
  Tensor q_a, ckv;
  {
    OpScope span("qkv_a_proj");
    std::vector<Tensor> parts = ops_.linear_multi(h, {ref(aw.q_a_proj), ref(aw.kv_a_proj)}, &hq);
    q_a = std::move(parts[0]);
    ckv = std::move(parts[1]);
    shape(span, "[{}, {}] x [{}, {}]^T", T, h.size(1), q_a.size(1) + ckv.size(1), h.size(1));
  }
  Tensor q_resid;
  kernels::Fp8Act q_resid_q;
  {
    OpScope span("q_a_layernorm");
    // [T, q_lora], and its FP8 copy for q_b and the indexer's wq_b when those are FP8
    q_resid = aw.q_b_proj.is_fp8() ? ops_.rms_norm_fp8(q_a, aw.q_a_layernorm, kLoraEps, q_resid_q)
                                   : ops_.rms_norm(q_a, aw.q_a_layernorm, kLoraEps);
    shape(span, "[{}, {}]", T, q_resid.size(1));
  }
  {
    // One fused op: kv = RMSNorm(c[:, :L]) * kv_a_layernorm, k_rope = RoPE(c[:, L:]), and the row
    // [kv | k_rope] stored at the step's slots (the FP8 cache quantises whole rows). Nothing reads kv
    // afterwards but the cache.
    OpScope span("kv_a_layernorm+kv_cache_write");
    ops_.mla_kv_write(ckv, aw.kv_a_layernorm, kLoraEps, st.in->positions, rope_params(c, true),
                      cache.kv[size_t(kv_layer)], st.in->slots);
    shapes(span,
           {fmt::format("[{}, {}]", T, L), fmt::format("[{}, {}] -> {} B/token", T, ckv.size(1),
                                                       bytes_per_token(cache.kv[size_t(kv_layer)], cache))});
  }

  // DSA indexer (full layers): top-k key positions per query; shared layers reuse the last selection.
  if (c.has_indexer() && own_indexer) {
    const IndexerWeights& iw = *aw.indexer;
    const int64_t ih = c.index_n_heads, id = c.index_head_dim;
    Tensor qi, ki_raw, wts;
    {
      OpScope span("indexer_wq_b");
      qi = ops_.linear_multi(q_resid, {ref(iw.wq_b)}, &q_resid_q)[0].view(
          {T, ih, id});  // rope first, then the rest
      shape(span, "[{}, {}] x [{}, {}]^T", T, q_resid.size(1), ih * id, q_resid.size(1));
    }
    {
      OpScope span("indexer_wk_weights_proj");
      std::vector<Tensor> parts = ops_.linear_multi(h, {ref(iw.wk), ref(iw.weights_proj)}, &hq);
      ki_raw = std::move(parts[0]);  // [T, id]
      wts = std::move(parts[1]);     // [T, ih]
      shape(span, "[{}, {}] x [{}, {}]^T", T, h.size(1), ki_raw.size(1) + wts.size(1), h.size(1));
    }
    {
      OpScope span("indexer_k_cache_write");
      Tensor qi_pe = qi.slice(2, 0, rope);
      ops_.rope_inplace(qi_pe, st.in->positions, rope_params(c, c.indexer_rope_interleaved));
      // ki = LayerNorm(ki_raw), RoPE on its rope part (first), stored at the step's slots: one op (an FP8
      // cache, u8 [slots, 132], quantises each key: 128 e4m3 codes + one f32 scale).
      ops_.indexer_k_write(ki_raw, iw.k_norm_weight, iw.k_norm_bias, c.indexer_norm_eps, st.in->positions,
                           rope_params(c, c.indexer_rope_interleaved), cache.index_k[size_t(kv_layer)],
                           st.in->slots);
      shape(span, "[{}, {}] q + [{}, {}] k -> {} B/token", T, ih * id, T, ki_raw.size(1),
            bytes_per_token(cache.index_k[size_t(kv_layer)], cache));
    }
    // Scores and top-k are one kernel (requests with at most index_topk keys skip it).
    OpScope span("indexer_logits+indexer_topk");
    if (span.on()) {
      int64_t ctx = 0;  // the longest request's keys
      for (int64_t r = 0; r < b.num_requests(); ++r)
        ctx = std::max(ctx, b.start_pos[size_t(r)] + b.num_new(r));
      shapes(span, {fmt::format("{} q x [{}, {}] . {} keys", T, ih, id, ctx),
                    fmt::format("[{}, {}] -> top-{}", T, ctx, c.index_topk)});
    }
    // One call for every token of the step; rows that see at most index_topk keys get all of them
    // (ascending, padded with -1), so when no request has more, the selection is left undefined.
    st.sel_rows =
        !st.plan->runs_indexer
            ? Tensor()
            : ops_.indexer_topk_rows(qi, wts, st.all_rows(cache.index_k[size_t(kv_layer)]), c.index_topk,
                                     std::pow(double(id), -0.5), std::pow(double(ih), -0.5));
    if (st.opt->dsa_topk_broadcast && st.sel_rows.defined()) broadcast_topk(st.sel_rows, *st.opt);
    for (int64_t r = 0; r < b.num_requests(); ++r) {
      const int64_t a0 = b.token_begin[size_t(r)], a1 = b.token_begin[size_t(r) + 1],
                    s0 = b.start_pos[size_t(r)];
      // A request whose rows see at most index_topk keys attends to all of them.
      st.sel[size_t(r)] = s0 + (a1 - a0) <= c.index_topk ? Tensor() : st.sel_rows.slice(0, a0, a1);
    }
    st.have_sel = true;
  }
  DSA_CHECK(!c.has_indexer() || st.have_sel,
            "layer with a shared indexer has no earlier full layer to reuse");

  // q = q_resid @ q_b^T -> [T, nh, nope + rope]; RoPE on the rope part once, before its first use.
  Tensor q;
  {
    OpScope span("q_b_proj");
    q = ops_.linear_multi(q_resid, {ref(aw.q_b_proj)}, &q_resid_q)[0].view({T, nh, dq});
    shape(span, "[{}, {}] x [{}, {}]^T", T, q_resid.size(1), nh * dq, q_resid.size(1));
  }
  bool q_roped = false;
  auto rope_q = [&] {
    if (q_roped) return;
    OpScope span("q_rope");
    Tensor q_pe = q.slice(2, nope, dq);  // [T, nh, rope]
    ops_.rope_inplace(q_pe, st.in->positions, rope_params(c, true));
    shape(span, "[{}, {}, {}]", q_pe.size(0), q_pe.size(1), q_pe.size(2));
    q_roped = true;
  };

  // Attention: MHA form per request for long extends; the absorbed form for the rest, whose query and
  // output projections (W_UK, W_UV: the per-head slices of kv_b_proj) run once over all their tokens.
  const double scale = c.attention_scale();
  const kernels::WeightRef kv_b = ref(aw.kv_b_proj);  // [nh * (nope + dv), L]
  Tensor attn = Tensor::empty({T, nh, dv}, DType::f32, h.device());
  kernels::Fp8Act attn_q;  // attn's FP8 copy for an FP8 o_proj, when absorb_v_fp8 makes it
  // The plan chose each request's form (StepPlan::mha) once for the step.
  const std::vector<int64_t>& absorbed = st.plan->absorbed;  // requests in the absorbed form
  for (int64_t r = 0; r < b.num_requests(); ++r) {
    if (st.plan->mha[size_t(r)] == 0) continue;
    const int64_t a0 = b.token_begin[size_t(r)], a1 = b.token_begin[size_t(r) + 1],
                  s0 = b.start_pos[size_t(r)];
    const int64_t Tr = a1 - a0, S = s0 + Tr;
    // [k_nope | v] = kv @ kv_b^T per head for every cached position.
    const kernels::PagedSeq seq{cache.kv[size_t(kv_layer)], st.in->page_tables[size_t(r)], cache.page_size};
    Tensor lat, kvx;
    {
      OpScope span("kv_b_proj");
      lat = ops_.paged_gather(seq, S);                                       // [S, L + rope]
      kvx = ops_.linear(lat.slice(1, 0, L), kv_b).view({S, nh, nope + dv});  // [S, nh, nope + dv]
      shape(span, "[{}, {}] x [{}, {}]^T", S, L, nh * (nope + dv), L);
    }
    rope_q();
    OpScope span("mha");
    shape(span, "{} q x {} heads x [{}] . causal keys", Tr, nh, dq);
    const Tensor o =
        ops_.attention_mha(q.slice(0, a0, a1), kvx.slice(2, 0, nope), lat.slice(1, L, L + rope),
                           kvx.slice(2, nope, nope + dv), s0, st.sel[size_t(r)], scale);  // [Tr, nh, dv]
    Tensor dst = attn.slice(0, a0, a1).view({Tr * nh, dv});
    ops_.copy_rows(dst, o.view({Tr * nh, dv}));
  }
  if (!absorbed.empty()) {
    const int64_t Ta = st.plan->all_absorbed() ? T : st.plan->layout.absorbed_rows;
    // When Ta < T, MHA requests ran first and q is already rotated before this gather; when Ta == T,
    // qa is q itself and rope_q() below rotates it (the nope part read here is not touched by RoPE).
    Tensor qa, q_lat;
    {
      OpScope span("q_nope_absorb");
      qa = Ta == T ? q
                   : ops_.gather_rows(q.view({T, nh * dq}), st.in->absorbed_rows)
                         .view({Ta, nh, dq});  // [Ta, nh, dq]
      // q_lat[h] = q_nope[h] @ W_UK[h] -> [Ta, nh, L], every head in one batched op
      q_lat = ops_.absorb_q(qa.slice(2, 0, nope), kv_b);
      shape(span, "{} x [{}, {}] x [{}, {}]", nh, Ta, nope, nope, L);
    }
    rope_q();
    // Attend over each request's latents -> out_lat [Ta, nh, L].
    Tensor out_lat = Ta == T ? Tensor() : Tensor::empty({Ta, nh, L}, DType::f32, h.device());
    int64_t p0 = 0;
    std::optional<OpScope> attn_span(std::in_place, c.has_indexer() ? "sparse_mla" : "mla");
    if (attn_span->on()) {
      int64_t ctx = 0;  // the longest request's keys
      for (int64_t r : absorbed) ctx = std::max(ctx, b.start_pos[size_t(r)] + b.num_new(r));
      shape(*attn_span, "{} q x {} heads x [{} + {}] . {} keys", Ta, nh, L, rope,
            c.has_indexer() ? std::min(c.index_topk, ctx) : ctx);
    }
    if (Ta == T) {  // every token: one call for the step's rows
      out_lat = ops_.mla_attention_rows(q_lat, qa.slice(2, nope, dq), st.all_rows(cache.kv[size_t(kv_layer)]),
                                        c.has_indexer() ? st.sel_rows : Tensor(), scale);
    } else {  // MHA requests took some tokens: one call per absorbed request, over its rows of the step
      for (size_t i = 0; i < absorbed.size(); ++i) {
        const int64_t r = absorbed[i], Tr = b.num_new(r), s0 = b.start_pos[size_t(r)],
                      a0 = b.token_begin[size_t(r)];
        const Tensor o = ops_.mla_attention_rows(
            q_lat.slice(0, p0, p0 + Tr), qa.slice(0, p0, p0 + Tr).slice(2, nope, dq),
            st.rows(cache.kv[size_t(kv_layer)], a0, a0 + Tr, s0 + Tr, &st.plan->mla_request[i]),
            st.sel[size_t(r)], scale);
        Tensor dst = out_lat.slice(0, p0, p0 + Tr).view({Tr * nh, L});
        ops_.copy_rows(dst, o.view({Tr * nh, L}));
        p0 += Tr;
      }
    }
    attn_span.reset();
    // o[h] = out_lat[h] @ W_UV[h]^T -> [Ta, nh, dv], then back to the requests' rows.
    OpScope span("v_up_absorb");
    shape(span, "{} x [{}, {}] x [{}, {}]", nh, Ta, L, L, dv);
    // Every head in one op; when it writes attn itself, also attn's FP8 copy for o_proj where it can.
    Tensor oa = Ta == T && aw.o_proj.is_fp8() ? ops_.absorb_v_fp8(out_lat, kv_b, dv, attn, attn_q)
                                              : ops_.absorb_v(out_lat, kv_b, dv, Ta == T ? attn : Tensor());
    if (Ta != T) {
      p0 = 0;
      for (int64_t r : absorbed) {
        const int64_t Tr = b.num_new(r), a0 = b.token_begin[size_t(r)];
        Tensor dst = attn.slice(0, a0, a0 + Tr).view({Tr * nh, dv});
        ops_.copy_rows(dst, oa.slice(0, p0, p0 + Tr).view({Tr * nh, dv}));
        p0 += Tr;
      }
    }
  }
  OpScope span("o_proj");
  Tensor out = attn_q.defined() ? ops_.linear_multi(attn.view({T, nh * dv}), {ref(aw.o_proj)}, &attn_q)[0]
                                : ops_.linear(attn.view({T, nh * dv}), ref(aw.o_proj));  // [T, H]
  shape(span, "[{}, {}] x [{}, {}]^T", T, nh * dv, out.size(1), nh * dv);
  return out;
}

Tensor Model::dense_mlp(const MlpWeights& m, const Tensor& h, const kernels::Fp8Act& hq, bool shared) const {
  // The span names: "mlp_*" or "shared_expert_*".
  static constexpr const char* kMlp[] = {"mlp_gate_up", "mlp_act", "mlp_down"};
  static constexpr const char* kShared[] = {"shared_expert_gate_up", "shared_expert_act",
                                            "shared_expert_down"};
  const char* const* names = shared ? kShared : kMlp;
  Tensor g, u, a;
  kernels::Fp8Act aq;  // a's FP8 copy for an FP8 down projection, when the backend makes it
  {
    OpScope span(names[0]);
    std::vector<Tensor> parts = ops_.linear_multi(h, {ref(m.gate), ref(m.up)}, &hq);
    g = std::move(parts[0]);
    u = std::move(parts[1]);
    shape(span, "[{}, {}] x [{}, {}]^T", h.size(0), h.size(1), g.size(1) + u.size(1), h.size(1));
  }
  {
    OpScope span(names[1]);
    a = m.down.is_fp8() ? ops_.silu_mul_fp8(g, u, aq) : ops_.silu_mul(g, u);
    shape(span, "[{}, {}]", a.size(0), a.size(1));
  }
  OpScope span(names[2]);
  Tensor out = aq.defined() ? ops_.linear_multi(a, {ref(m.down)}, &aq)[0] : ops_.linear(a, ref(m.down));
  shape(span, "[{}, {}] x [{}, {}]^T", a.size(0), a.size(1), out.size(1), a.size(1));
  return out;
}

kernels::Routing Model::route(const MoeWeights& moe, const Tensor& h) const {
  Tensor logits;
  {
    OpScope span("router_gate");
    logits = ops_.linear(h, kernels::WeightRef{moe.gate, {}, 128, 128, moe.gate_derived});  // [T, E] fp32
    shape(span, "[{}, {}] x [{}, {}]^T", h.size(0), h.size(1), logits.size(1), h.size(1));
  }
  kernels::MoeRouteParams p;
  p.n_group = cfg_.n_group;
  p.topk_group = cfg_.topk_group;
  p.top_k = cfg_.num_experts_per_tok;
  p.norm_topk_prob = cfg_.norm_topk_prob;
  p.routed_scaling_factor = cfg_.routed_scaling_factor;
  OpScope span("router_topk");
  kernels::Routing routing = ops_.moe_route(logits, moe.e_score_correction_bias, p);
  shape(span, "[{}, {}] -> top-{}", logits.size(0), logits.size(1), p.top_k);
  return routing;
}

Tensor Model::mlp(const LayerWeights& lw, const Tensor& h, const kernels::Fp8Act& hq,
                  const ForwardOptions& opt, bool reduce) const {
  auto dense = [&](const MlpWeights& m, bool shared) { return dense_mlp(m, h, hq, shared); };
  if (lw.mlp_type == MlpType::dense) {
    Tensor out = dense(*lw.mlp, false);
    // Split over every rank (--moe-dense-tp-size tp, the default) or whole on each (1: nothing to sum).
    if (reduce && shard_.dense_tp() > 1) all_reduce(out, dist::GroupKind::world, "tp_all_reduce", opt);
    return out;
  }
  const MoeWeights& moe = *lw.moe;
  const kernels::Routing routing = local_routing(route(moe, h));
  // Sharded: each rank's routed experts and shared-expert slice give partial sums over the world (MoE TP x
  // EP); the shared expert is split over MoE TP only, so one EP rank adds it. It runs first: the experts'
  // combine adds it to the routed sum (moe_sum, no pass of its own).
  Tensor sh;
  if (moe.shared_experts && shard_.ep_rank() == 0) sh = dense(*moe.shared_experts, true);
  Tensor out;
  {
    OpScope span(sh.defined() ? "experts_gate_up+experts_act+experts_down+moe_sum"
                              : "experts_gate_up+experts_act+experts_down");  // one op
    // h's FP8 copy (post_attention_layernorm made it for the shared expert) instead of quantising h again:
    // the same codes and scales (the GEMM input rule).
    out = ops_.moe_experts(h, routing, expert_refs(moe), hq.defined() ? &hq : nullptr,
                           moe.experts_derived.get(), sh.defined() ? &sh : nullptr);
    if (span.on() && !moe.experts.empty()) {
      const int64_t E = int64_t(moe.experts.size()), T = h.size(0), rows = T * cfg_.num_experts_per_tok,
                    H = h.size(1), I = moe.experts[0].gate.weight.size(0);
      std::vector<std::string> parts{fmt::format("{} experts, {} rows x [{}, {}]^T", E, rows, 2 * I, H),
                                     fmt::format("[{}, {}]", rows, I),
                                     fmt::format("{} rows x [{}, {}]^T", rows, H, I)};
      if (sh.defined()) parts.push_back(fmt::format("[{}, {}]", T, H));
      shapes(span, std::move(parts));
    }
  }
  if (reduce) all_reduce(out, dist::GroupKind::world, "tp_all_reduce", opt);
  return out;
}

ForwardOutput Model::finish(const Tensor& hidden, const kernels::WeightRef& head, const Step& st) const {
  ForwardOutput out;
  OpScope span("lm_head");
  // The plan's logits rows (each request's last token, a verifying request's every token, the extra rows),
  // gathered; every row in order (all_logits, or a decode step's one token per request): no gather. With
  // TP the vocab-parallel shards are gathered.
  out.logits = gather_vocab(st.in->logit_rows.defined()
                                ? ops_.linear(ops_.gather_rows(hidden, st.in->logit_rows), head)
                                : ops_.linear(hidden, head),
                            *st.opt);
  shape(span, "[{}, {}] x [{}, {}]^T", out.logits.size(0), hidden.size(1), out.logits.size(1),
        hidden.size(1));
  if (st.opt->keep_hidden) out.hidden = hidden;
  return out;
}

namespace {
struct LayerRun {
  Tensor residual;  // the running x
  Tensor pending;   // the last MLP output, added before the next norm (undefined at the start)
};
}  // namespace

StepPlanConfig Model::plan_config(const ForwardOptions& opt, bool mtp) const {
  const ModelConfig& c = cfg_;
  StepPlanConfig pc;
  pc.attention = opt.attention;
  pc.mha_min_tokens = opt.mha_min_tokens;
  pc.form_rule = opt.form_rule;
  pc.all_logits = opt.all_logits;
  pc.dims = attention_dims(c, c.num_attention_heads / shard_.attn_tp());  // this rank's heads
  pc.mtp = mtp;
  return pc;
}

StepPlan Model::plan_step(const ForwardBatch& batch, const ForwardOptions& opt, const StepCapacity* capacity,
                          bool mtp) const {
  StepPlanConfig pc = plan_config(opt, mtp);
  const Device dev = w_.embed_tokens.device();
  if (capacity != nullptr) {
    pc.capacity = *capacity;
    pc.host_rows = dev == Device::cpu;  // the CPU backend splits rows by request on the host (no capture)
  }
  StepPlan p = StepPlan::build(batch, pc);
  p.plan_kernels(ops_, dev);
  return p;
}

ForwardOutput Model::forward(const ForwardBatch& batch, KvCache& cache, const ForwardOptions& opt) const {
  return forward_mtp(batch, Tensor(), cache, opt, -1);
}

ForwardOutput Model::forward_mtp(const ForwardBatch& batch, const Tensor& hidden, KvCache& cache,
                                 const ForwardOptions& opt, int64_t k) const {
  const ModelConfig& c = cfg_;
  const bool mtp = k >= 0;
  DSA_CHECK(!mtp || k < num_mtp_layers(), "MTP layer {} requested, the model has {} loaded", k,
            num_mtp_layers());
  DSA_CHECK(batch.page_size == cache.page_size, "batch page size {} differs from the cache's {}",
            batch.page_size, cache.page_size);
  batch.validate(c.vocab_size, cache.num_pages);
  DSA_CHECK(shard_.whole() || (opt.dist != nullptr && opt.dist->layout() == shard_.layout &&
                               opt.dist->rank() == shard_.rank),
            "forward: the shard of rank {} ({}) needs ForwardOptions::dist of that rank and layout",
            shard_.rank, shard_.layout.describe());
  const int64_t L = c.num_hidden_layers, T = batch.num_tokens();
  DSA_CHECK(int64_t(cache.kv.size()) >= (mtp ? L + k + 1 : L), "the KV cache has {} layers, too few for {}",
            cache.kv.size(), mtp ? "the MTP layer" : "the model");
  const Device dev = w_.embed_tokens.device();

  Step st;
  st.batch = &batch;
  st.opt = &opt;
  const int64_t R = batch.num_requests();
  // The step's plan and its device inputs: built and uploaded here (one copy) unless the caller has them.
  DSA_CHECK(opt.inputs == nullptr || opt.plan != nullptr, "forward: pre-uploaded inputs without their plan");
  std::optional<StepPlan> own_plan;
  if (opt.plan == nullptr) own_plan.emplace(plan_step(batch, opt, nullptr, mtp));
  const StepPlan& plan = opt.plan != nullptr ? *opt.plan : *own_plan;
  {
    int64_t longest = 0;
    for (int64_t r = 0; r < R; ++r)
      longest = std::max(longest, batch.start_pos[size_t(r)] + batch.num_new(r));
    const bool plan_mtp = plan.kind == StepKind::draft || plan.kind == StepKind::draft_extend;
    DSA_CHECK(plan.num_tokens() == T && plan.num_requests() == R && plan.page_size == batch.page_size &&
                  plan.max_len >= longest && plan_mtp == mtp,
              "forward: the step plan ({} tokens, {} requests, context {}, {}) does not match the batch ({} "
              "tokens, {} requests, longest {}{})",
              plan.num_tokens(), plan.num_requests(), plan.max_len, step_kind_name(plan.kind), T, R, longest,
              mtp ? ", MTP" : "");
  }
  std::optional<StepInputs> own_inputs;
  if (opt.inputs == nullptr) own_inputs.emplace(plan.upload(dev));
  const StepInputs& in = opt.inputs != nullptr ? *opt.inputs : *own_inputs;
  DSA_CHECK(in.defined() && in.buffer.device() == dev && in.buffer.size(0) >= plan.layout.size() &&
                int64_t(in.page_tables.size()) == R,
            "forward: the step inputs do not match the plan ({} values on {})", plan.layout.size(),
            device_name(dev));
  st.plan = &plan;
  st.in = &in;
  const Tensor& ids = in.ids;
  st.sel.resize(size_t(R));
  if (!shard_.whole() && (shard_.layout.attn_dp_size > 1 || opt.moe_a2a_deepep))
    st.split = row_split(T, plan.kind == StepKind::decode || plan.kind == StepKind::draft, opt);

  // Trace context: the plan's step and pass names, from the requests' state (a one-token prompt or chunk
  // is a prefill; a step of decoding requests only is a decode).
  trace::PassScope pass_scope(plan.trace_step(), plan.trace_pass(), dev != Device::cpu);
  if (pass_scope.on()) {  // the batch, for plan::plan_step: [[new tokens, cached tokens], ...]
    nlohmann::json reqs = nlohmann::json::array();
    for (int64_t r = 0; r < batch.num_requests(); ++r)
      reqs.push_back({batch.num_new(r), batch.start_pos[size_t(r)]});
    pass_scope.arg("requests", std::move(reqs)).arg("all_logits", opt.all_logits).arg("mtp", mtp);
    if (shard_.layout.attn_dp_size > 1)  // every DP group's tokens: the world gathers' rows
      pass_scope.arg("dp_tokens", st.split.dp_tokens).arg("dp_equal", st.split.equal);
  }  // op spans of a device pass are timed with CUDA events
  auto kind_name = [&](const LayerWeights& lw, int64_t l) -> std::string {
    if (mtp) return "mtp";
    const char* ix = !c.has_indexer()                                  ? "none"
                     : c.indexer_types[size_t(l)] == IndexerType::full ? "full"
                                                                       : "shared";
    return std::string(lw.mlp_type == MlpType::dense ? "dense." : "moe.") + ix;
  };

  auto run_layer = [&](const LayerWeights& lw, int64_t kv_layer, bool own_indexer, LayerRun& run) {
    std::optional<trace::LayerScope> layer_span;
    if (trace::active() != nullptr) layer_span.emplace(kv_layer, kind_name(lw, kv_layer));
    // The norms also write their output's FP8 copy where FP8 linears read it (CUDA; none on the CPU).
    const MlpWeights* dense_in = lw.mlp_type == MlpType::dense ? &*lw.mlp
                                 : lw.moe->shared_experts      ? &*lw.moe->shared_experts
                                                               : nullptr;
    const bool fp8_attn_in = lw.attn.q_a_proj.is_fp8(), fp8_mlp_in = dense_in && dense_in->gate.is_fp8();
    Tensor h;
    kernels::Fp8Act hq, h2q;
    {
      OpScope span("input_layernorm");
      if (run.pending.defined()) {
        h = fp8_attn_in
                ? ops_.add_rms_norm_fp8(run.residual, run.pending, lw.input_layernorm, c.rms_norm_eps, hq)
                : ops_.add_rms_norm(run.residual, run.pending, lw.input_layernorm, c.rms_norm_eps);
      } else {
        h = fp8_attn_in ? ops_.rms_norm_fp8(run.residual, lw.input_layernorm, c.rms_norm_eps, hq)
                        : ops_.rms_norm(run.residual, lw.input_layernorm, c.rms_norm_eps);
      }
      shape(span, "[{}, {}]", h.size(0), h.size(1));
    }
    Tensor a = attention(lw, kv_layer, own_indexer, h, hq, st, cache);
    if (sliced(lw, opt)) {
      // The scattered mode (forward_dist.cpp): o_proj's partial sums reduce-scattered to this rank's rows,
      // the residual and the norm on those rows, the MLP side across the ranks, and (attention TP) the
      // rows all-gathered back at the layer boundary, the next residual whole again.
      const RowSplit& sp = st.split;
      Tensor a_s = scatter_attention(a, sp, opt);
      Tensor res_s = run.residual.slice(0, sp.begin, sp.end);
      Tensor h2_s = a_s;  // no rows: nothing to normalise
      if (sp.rows() > 0) {
        OpScope span("post_attention_layernorm");
        h2_s = ops_.add_rms_norm(res_s, a_s, lw.post_attention_layernorm, c.rms_norm_eps);
        shape(span, "[{}, {}]", h2_s.size(0), h2_s.size(1));
      }
      Tensor out_s = mlp_rows(lw, h2_s, sp, opt);
      if (shard_.attn_tp() == 1) {
        run.pending = out_s;
      } else {
        if (sp.rows() > 0) ops_.add_inplace(res_s, out_s);
        run.residual = gather_attention_rows(res_s, sp, opt);
        run.pending = Tensor();
      }
      return;
    }
    all_reduce(a, dist::GroupKind::attn_tp, "attn_tp_all_reduce", opt);  // o_proj's partial sums
    Tensor h2;
    {
      OpScope span("post_attention_layernorm");
      h2 = fp8_mlp_in
               ? ops_.add_rms_norm_fp8(run.residual, a, lw.post_attention_layernorm, c.rms_norm_eps, h2q)
               : ops_.add_rms_norm(run.residual, a, lw.post_attention_layernorm, c.rms_norm_eps);
      shape(span, "[{}, {}]", h2.size(0), h2.size(1));
    }
    run.pending = mlp(lw, h2, h2q, opt);
  };
  // Head and tail ops carry the kind "head" / "tail" (the plan's keys for them); layer -1.

  LayerRun run;
  if (!mtp) {
    {
      trace::LayerScope head(-1, "head");
      OpScope span("embed_tokens");
      run.residual = embed(w_.embed_tokens, batch, ids, opt);  // [T, H]
      shape(span, "[{}] -> [{}, {}]", T, T, run.residual.size(1));
    }
    for (int64_t l = 0; l < L; ++l) {
      run_layer(w_.layers[size_t(l)], l, c.has_indexer() && c.indexer_types[size_t(l)] == IndexerType::full,
                run);
    }
    trace::LayerScope tail(-1, "tail");
    Tensor normed;
    {
      OpScope span("final_norm");
      normed = run.pending.defined() ? ops_.add_rms_norm(run.residual, run.pending, w_.norm, c.rms_norm_eps)
                                     : ops_.rms_norm(run.residual, w_.norm, c.rms_norm_eps);
      shape(span, "[{}, {}]", normed.size(0), normed.size(1));
    }
    return finish(normed, ref(w_.lm_head), st);
  }

  // MTP: u = eh_proj([RMSNorm(embed(t_{p+1})) * enorm ; RMSNorm(h_p) * hnorm]), one decoder layer, head.
  const MtpWeights& m = w_.mtp[size_t(k)];
  DSA_CHECK(hidden.defined() && hidden.dim() == 2 && hidden.size(0) == T && hidden.size(1) == c.hidden_size,
            "MTP needs the target hidden states [{}, {}]", T, c.hidden_size);
  Tensor cat = Tensor::empty({T, 2 * c.hidden_size}, DType::f32, dev);
  Tensor emb;
  {
    trace::LayerScope head(-1, "head");
    OpScope span("embed_tokens");
    emb = embed(m.embed_tokens.defined() ? m.embed_tokens : w_.embed_tokens, batch, ids, opt);
    shape(span, "[{}] -> [{}, {}]", T, T, emb.size(1));
  }
  {
    std::optional<trace::LayerScope> layer_span;
    if (trace::active() != nullptr) layer_span.emplace(L + k, "mtp");
    {
      OpScope span("mtp_enorm");
      Tensor cat_e = cat.slice(1, 0, c.hidden_size);
      ops_.copy_rows(cat_e, ops_.rms_norm(emb, m.enorm, c.rms_norm_eps));
      shape(span, "[{}, {}]", T, cat_e.size(1));
    }
    {
      OpScope span("mtp_hnorm");
      Tensor cat_h = cat.slice(1, c.hidden_size, 2 * c.hidden_size);
      ops_.copy_rows(cat_h, ops_.rms_norm(hidden, m.hnorm, c.rms_norm_eps));
      shape(span, "[{}, {}]", T, cat_h.size(1));
    }
    OpScope span("mtp_eh_proj");
    run.residual = ops_.linear(cat, ref(m.eh_proj));  // [T, H]
    shape(span, "[{}, {}] x [{}, {}]^T", T, cat.size(1), run.residual.size(1), cat.size(1));
  }
  run_layer(m.layer, L + k, c.has_indexer(), run);
  trace::LayerScope tail(-1, "tail");
  Tensor normed;
  {
    OpScope span("shared_head_norm");
    normed = run.pending.defined()
                 ? ops_.add_rms_norm(run.residual, run.pending, m.shared_head_norm, c.rms_norm_eps)
                 : ops_.rms_norm(run.residual, m.shared_head_norm, c.rms_norm_eps);
    shape(span, "[{}, {}]", normed.size(0), normed.size(1));
  }
  return finish(normed, m.shared_head ? ref(*m.shared_head) : ref(w_.lm_head), st);
}

}  // namespace dsaserve::model
