// The sharded forward's collectives (model/shard.h): the vocabulary-parallel embedding and LM head, and
// the partial sums of the row-parallel layers, at the places the reference article and the plan put them.
#include <cstring>

#include "dist/process_groups.h"
#include "model/model.h"

namespace dsaserve::model {

std::shared_ptr<Model> Model::sharded(const Shard& s) const {
  DSA_CHECK(shard_.whole(), "model: already a shard (rank {} of {})", shard_.rank, shard_.layout.tp);
  return std::make_shared<Model>(cfg_, ckpt_, shard_weights(w_, cfg_, s), backend_, kv_dtype_, s);
}

void Model::all_reduce(Tensor& t, dist::GroupKind group, const char* name, const ForwardOptions& opt) const {
  if (shard_.whole()) return;
  opt.dist->comm(group).all_reduce(t, name);
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
  if (shard_.whole()) return;
  DSA_CHECK(sel.is_contiguous(), "forward: the top-k selection {} is not contiguous", sel.describe());
  opt.dist->comm(dist::GroupKind::attn_tp).broadcast(sel, 0, "indexer_topk_broadcast");
}

Tensor Model::gather_vocab(const Tensor& local, const ForwardOptions& opt) const {
  if (shard_.whole()) return local;
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

}  // namespace dsaserve::model
