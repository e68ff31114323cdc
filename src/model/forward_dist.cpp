// The sharded forward's collectives (model/shard.h): the vocabulary-parallel embedding and LM head, the
// partial sums of the row-parallel layers, attention DP's gathers around the MLP and DeepEP's dispatch and
// combine, at the places the reference article and the plan put them.
//
// The scattered mode (sliced(): attention DP, and DeepEP's MoE layers under attention TP), SGLang's
// LayerCommunicator: o_proj's partial sums are reduce-scattered over attention TP to each rank's rows
// (RowSplit), the residual add and the post-attention norm run on those rows, the MLP side sees the rows
// of every rank (a world all-gather, the MLP's partial sums, a world reduce-scatter; or DeepEP), and at the
// layer boundary the rows are all-gathered over attention TP again (attention needs every row of its DP
// group). Decode steps gather equal lengths (each rank padded to the largest slice), prefill steps the
// variable-length forms.
#include "dist/process_groups.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/deepep.h"
#include "model/model.h"
#include "trace/trace.h"

namespace dsaserve::model {

std::shared_ptr<Model> Model::sharded(const Shard& s) const {
  DSA_CHECK(shard_.whole(), "model: already a shard (rank {} of {})", shard_.rank, shard_.layout.tp);
  return std::make_shared<Model>(cfg_, ckpt_, shard_weights(w_, cfg_, s), backend_, kv_dtype_, s);
}

void Model::all_reduce(Tensor& t, dist::GroupKind group, const char* name, const ForwardOptions& opt) const {
  if (shard_.whole()) return;
  dist::Communicator& c = opt.dist->comm(group);
  if (c.size() > 1) c.all_reduce(t, name);
}

Tensor Model::embed(const Tensor& table, const ForwardBatch& batch, const Tensor& ids,
                    const ForwardOptions& opt) const {
  if (shard_.whole()) return ops_.embedding(table, ids);
  // This rank's rows [v0, v0 + n) and a zero row n: a token of another rank reads the zero row, so the
  // all-reduce over the attention TP group sums exactly one embedding row per token.
  DSA_CHECK(opt.inputs == nullptr, "forward: a sharded model takes its step inputs from the batch");
  const int64_t v0 = shard_.vocab_begin(cfg_), n = shard_.vocab_rows(cfg_), T = batch.num_tokens();
  Tensor local = Tensor::empty({T}, DType::i32);
  int32_t* l = local.data<int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = batch.input_ids[size_t(t)];
    l[t] = int32_t(id >= v0 && id < v0 + n ? id - v0 : n);
  }
  Tensor x = ops_.embedding(table, table.device() == Device::cpu ? local : local.to(table.device()));
  all_reduce(x, dist::GroupKind::attn_tp, "embed_all_reduce", opt);
  return x;
}

void Model::broadcast_topk(Tensor& sel, const ForwardOptions& opt) const {
  if (shard_.whole() || shard_.attn_tp() == 1) return;
  DSA_CHECK(sel.is_contiguous(), "forward: the top-k selection {} is not contiguous", sel.describe());
  opt.dist->comm(dist::GroupKind::attn_tp).broadcast(sel, 0, "indexer_topk_broadcast");
}

Tensor Model::gather_vocab(const Tensor& local, const ForwardOptions& opt) const {
  if (shard_.whole() || shard_.attn_tp() == 1) return local;
  dist::Communicator& c = opt.dist->comm(dist::GroupKind::attn_tp);
  const int64_t T = local.size(0), n = local.size(1), parts = c.size();
  Tensor g = Tensor::empty({parts * T, n}, local.dtype(), local.device());
  c.all_gather(local.contiguous(), g, "lm_head_all_gather");
  if (T == 1 || parts == 1) return g.view({T, parts * n});
  // [parts, T, n] -> [T, parts, n]: each row's vocabulary in rank order.
  return g.view({parts, T, n}).transpose(0, 1).contiguous().view({T, parts * n});
}

kernels::Routing Model::local_routing(kernels::Routing r) const {
  if (shard_.layout.ep_size == 1) return r;
  // The experts of other EP ranks are not here: their picks read local expert 0 with weight 0 (their
  // rows add nothing; the owner adds them, and the world all-reduce after the MoE sums the ranks).
  const Device d = r.ids.device();
  Tensor ids = r.ids.to(Device::cpu).contiguous().clone(), w = r.weights.to(Device::cpu).contiguous().clone();
  const int64_t e0 = shard_.expert_begin(cfg_), ne = shard_.local_experts(cfg_);
  int32_t* ip = ids.data<int32_t>();
  float* wp = w.data<float>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (ip[i] >= e0 && ip[i] < e0 + ne) {
      ip[i] -= int32_t(e0);
    } else {
      ip[i] = 0;
      wp[i] = 0.f;
    }
  }
  return {d == Device::cpu ? ids : ids.to(d), d == Device::cpu ? w : w.to(d)};
}

bool Model::sliced(const LayerWeights& lw, const ForwardOptions& opt) const {
  if (shard_.whole()) return false;
  return shard_.layout.attn_dp_size > 1 || (opt.moe_a2a_deepep && lw.mlp_type == MlpType::moe);
}

RowSplit Model::row_split(int64_t tokens, bool decode, const ForwardOptions& opt) const {
  const dist::ParallelLayout& l = shard_.layout;
  DSA_CHECK(!opt.moe_a2a_deepep || l.ep_size == l.tp,
            "forward: --moe-a2a-backend deepep runs with --ep-size = --tp so far (got {})", l.describe());
  if (l.attn_dp_size == 1) return RowSplit::make(shard_, {tokens}, decode);
  const int64_t d = l.attn_dp_rank(shard_.rank);
  if (!opt.dp_tokens.empty()) {
    DSA_CHECK(int64_t(opt.dp_tokens.size()) == l.attn_dp_size && opt.dp_tokens[size_t(d)] == tokens,
              "forward: ForwardOptions::dp_tokens has {} entries (DP group {}: {}) for --attn-dp-size {} and "
              "{} tokens here",
              opt.dp_tokens.size(), d, d < int64_t(opt.dp_tokens.size()) ? opt.dp_tokens[size_t(d)] : -1,
              l.attn_dp_size, tokens);
    return RowSplit::make(shard_, opt.dp_tokens, opt.dp_decode);
  }
  // Every rank's [tokens, decode or idle], over the world (SGLang's scheduler syncs these once a step).
  dist::Communicator& w = opt.dist->comm(dist::GroupKind::world);
  Tensor mine = Tensor::empty({1, 2}, DType::i64), all = Tensor::empty({w.size(), 2}, DType::i64);
  mine.data<int64_t>()[0] = tokens;
  mine.data<int64_t>()[1] = decode || tokens == 0 ? 1 : 0;
  w.all_gather(mine, all, "dp_tokens_all_gather");
  std::vector<int64_t> dp(size_t(l.attn_dp_size));
  bool equal = true;
  for (int64_t r = 0; r < w.size(); ++r) {
    dp[size_t(l.attn_dp_rank(r))] = all.data<int64_t>()[2 * r];
    equal = equal && all.data<int64_t>()[2 * r + 1] != 0;
  }
  return RowSplit::make(shard_, std::move(dp), equal);
}

Tensor Model::scatter_attention(const Tensor& a, const RowSplit& sp, const ForwardOptions& opt) const {
  if (shard_.attn_tp() == 1) return a;
  Tensor out = Tensor::empty({sp.rows(), a.size(1)}, a.dtype(), a.device());
  opt.dist->comm(dist::GroupKind::attn_tp)
      .reduce_scatter_v(a.contiguous(), out, sp.attn_rows, "attn_tp_reduce_scatter");
  return out;
}

Tensor Model::gather_attention_rows(const Tensor& rows, const RowSplit& sp, const ForwardOptions& opt) const {
  int64_t T = 0;
  for (int64_t n : sp.attn_rows) T += n;
  Tensor out = Tensor::empty({T, rows.size(1)}, rows.dtype(), rows.device());
  opt.dist->comm(dist::GroupKind::attn_tp)
      .all_gather_v(rows.contiguous(), out, sp.attn_rows, "attn_tp_all_gather");
  return out;
}

Tensor Model::mlp_rows(const LayerWeights& lw, const Tensor& h, const RowSplit& sp,
                       const ForwardOptions& opt) const {
  const bool moe = lw.mlp_type == MlpType::moe;
  if (moe && opt.moe_a2a_deepep) return moe_deepep(lw, h, opt);
  const int64_t n = h.size(0), H = h.size(1);
  if (!moe && shard_.dense_tp() == 1)  // a replicated dense MLP: this rank's rows alone, nothing to sum
    return n > 0 ? mlp(lw, h, {}, opt, false) : h;
  // Every rank's rows (every DP group's tokens, in order), the MLP's partial sums over the world (dense
  // TP, or MoE TP x EP), and this rank's rows of their sum.
  dist::Communicator& w = opt.dist->comm(dist::GroupKind::world);
  const int64_t G = sp.world_rows();
  Tensor g = Tensor::empty({G, H}, h.dtype(), h.device());
  if (sp.equal) {
    Tensor padded = h;
    if (n != sp.block) {
      padded = Tensor::zeros({sp.block, H}, h.dtype(), h.device());
      if (n > 0) {
        Tensor head = padded.slice(0, 0, n);
        head.copy_from(h);
      }
    }
    w.all_gather(padded.contiguous(), g, "dp_all_gather");
  } else {
    w.all_gather_v(h.contiguous(), g, sp.rank_rows, "dp_all_gather");
  }
  const Tensor out = G > 0 ? mlp(lw, g, {}, opt, false) : g;
  if (sp.equal) {
    Tensor b = Tensor::empty({sp.block, H}, h.dtype(), h.device());
    w.reduce_scatter(out.contiguous(), b, "dp_reduce_scatter");
    return n == sp.block ? b : b.slice(0, 0, n).contiguous();
  }
  Tensor mine = Tensor::empty({n, H}, h.dtype(), h.device());
  w.reduce_scatter_v(out.contiguous(), mine, sp.rank_rows, "dp_reduce_scatter");
  return mine;
}

DeepepPayload Model::deepep_payload(const MoeWeights& moe, const ForwardOptions& opt) const {
  // FP8 where the experts' gate / up run as FP8 block GEMMs (their input quantised per 128 columns), as
  // SGLang dispatches on FP8 models unless SGLANG_DEEPEP_BF16_DISPATCH.
  if (!opt.deepep_fp8_dispatch || moe.experts.empty() || cfg_.hidden_size % 128 != 0)
    return DeepepPayload::activations;
  const MlpWeights& e = moe.experts[0];
  return kernels::cpu::fp8_gemm_eligible(ref(e.gate), 0, -1) &&
                 kernels::cpu::fp8_gemm_eligible(ref(e.up), 0, -1)
             ? DeepepPayload::fp8
             : DeepepPayload::activations;
}

Tensor Model::moe_deepep(const LayerWeights& lw, const Tensor& h, const ForwardOptions& opt) const {
  // DeepEP's pattern over the EP group (the world: --ep-size = --tp), model/deepep.h: this rank's rows
  // dispatched to the EP ranks of their experts (FP8 codes and scales on FP8 block-scaled experts, else
  // the rows as held), each rank's experts on what it received, the weighted outputs combined back (bf16
  // with FP8 dispatch) and summed per row.
  using trace::OpScope;
  const MoeWeights& moe = *lw.moe;
  dist::Communicator& ep = opt.dist->comm(dist::GroupKind::ep);
  const int64_t n = h.size(0), H = h.size(1);
  const Device dev = h.device();
  DSA_CHECK(h.dtype() == DType::f32, "forward: DeepEP dispatch of {} rows (f32 expected)", h.describe());
  const DeepepPayload payload = deepep_payload(moe, opt);
  Tensor ids, wts, hx = Tensor::empty({0, H}, DType::f32);
  if (n > 0) {
    const kernels::Routing r = route(moe, h);
    ids = r.ids.to(Device::cpu).contiguous();
    wts = r.weights.to(Device::cpu).contiguous();
    hx = h.to(Device::cpu).contiguous();
  }
  const DeepepDispatched d = deepep_dispatch(ep, hx, ids, wts, shard_.local_experts(cfg_), payload);
  const int64_t R = d.x.size(0);
  Tensor y = Tensor::empty({R, H}, DType::f32);
  if (R > 0) {
    const std::vector<kernels::MlpRef> experts = expert_refs(moe);
    OpScope span("experts_gate_up+experts_act+experts_down");
    auto on = [&](const Tensor& t) { return dev == Device::cpu ? t : t.to(dev); };
    const kernels::Routing local{on(d.ids), on(d.weights)};
    const kernels::Fp8Act q =
        d.q.defined() ? kernels::Fp8Act{on(d.q.codes), on(d.q.scales), d.q.rows} : kernels::Fp8Act{};
    y = ops_.moe_experts(on(d.x), local, experts, q.defined() ? &q : nullptr, moe.experts_derived.get())
            .to(Device::cpu)
            .contiguous();
  }
  Tensor out = deepep_combine(ep, d, y);
  if (dev != Device::cpu) out = out.to(dev);
  if (moe.shared_experts && n > 0) {  // whole on each rank (MoE TP 1): this rank's rows
    const Tensor sh = dense_mlp(*moe.shared_experts, h, {}, true);
    ops_.add_inplace(out, sh);
  }
  return out;
}

void Model::idle_step(const ForwardOptions& opt, bool mtp) const {
  DSA_CHECK(!shard_.whole() && shard_.layout.attn_dp_size > 1 && opt.dist != nullptr,
            "idle_step: a rank of an attention DP layout with its groups (ForwardOptions::dist)");
  DSA_CHECK(!mtp || num_mtp_layers() > 0, "idle_step: the MTP pass of a model without MTP layers");
  const RowSplit sp = row_split(0, true, opt);
  const Tensor none = Tensor::empty({0, cfg_.hidden_size}, DType::f32, w_.embed_tokens.device());
  if (mtp) {
    (void)mlp_rows(w_.mtp[0].layer, none, sp, opt);
    return;
  }
  // Traced as an "idle" pass of the deployment's step (a decode when every DP group decodes or idles):
  // its collectives are that step's on this rank (no batch: the plan prices no ops for it).
  trace::PassScope pass_scope(sp.equal ? "decode" : "prefill", "idle",
                              w_.embed_tokens.device() != Device::cpu);
  for (const LayerWeights& lw : w_.layers) (void)mlp_rows(lw, none, sp, opt);
}

}  // namespace dsaserve::model
