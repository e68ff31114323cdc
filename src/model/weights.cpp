#include "model/weights.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <set>

#include "core/error.h"
#include "kernels/ops.h"

namespace dsaserve::model {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A checkpoint's tensors by name.
class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const io::Checkpoint& ckpt) : ckpt_(ckpt) {}
  bool has(const std::string& name) const override { return ckpt_.contains(name); }
  Tensor get(const std::string& name, const Shape&) override { return ckpt_.get(name); }
  std::vector<std::string> names() const override { return ckpt_.names(); }

 private:
  const io::Checkpoint& ckpt_;
};

// Looks tensors up by name, checks shapes, and remembers what was used and what was missing.
class Binder {
 public:
  Binder(const ModelConfig& cfg, WeightSource& src) : cfg_(cfg), src_(src) {}

  bool has(const std::string& name) const { return src_.has(name); }

  Tensor get(const std::string& name, const Shape& shape) {
    if (!src_.has(name)) {
      missing_.push_back(name);
      return {};
    }
    used_.insert(name);
    Tensor t = src_.get(name, shape);
    if (!t.defined()) return t;  // a dry run (dummy_tensors): nothing is made
    if (t.shape() != shape) {
      errors_.push_back(fmt::format("tensor '{}': shape {} but the config implies {}", name,
                                    shape_str(t.shape()), shape_str(shape)));
    } else if (!dtype_is_float(t.dtype())) {
      errors_.push_back(
          fmt::format("tensor '{}': dtype {} is not a float type", name, dtype_name(t.dtype())));
    }
    return t;
  }

  Linear linear(const std::string& prefix, int64_t out, int64_t in) {
    Linear l;
    l.weight = get(prefix + ".weight", {out, in});
    const std::string sname = prefix + ".weight_scale_inv";
    if (l.weight.defined() && l.weight.dtype() == DType::f8e4m3fn) {
      const Shape sshape{ceil_div(out, cfg_.fp8.block_n), ceil_div(in, cfg_.fp8.block_k)};
      l.scale_inv = get(sname, sshape);
      if (l.scale_inv.defined() && l.scale_inv.dtype() != DType::f32) {
        errors_.push_back(
            fmt::format("tensor '{}': dtype {} (expected F32)", sname, dtype_name(l.scale_inv.dtype())));
      }
    } else if (l.weight.defined() && l.weight.dtype() == DType::f8e5m2) {
      errors_.push_back(fmt::format("tensor '{}.weight': F8_E5M2 weights are not supported", prefix));
    }
    return l;
  }

  MlpWeights mlp(const std::string& p, int64_t hidden, int64_t inter) {
    return {linear(p + ".gate_proj", inter, hidden), linear(p + ".up_proj", inter, hidden),
            linear(p + ".down_proj", hidden, inter)};
  }

  LayerWeights layer(int64_t idx, IndexerType itype, MlpType mtype) {
    const ModelConfig& c = cfg_;
    const int64_t H = c.hidden_size, nh = c.num_attention_heads;
    const std::string p = fmt::format("model.layers.{}", idx);
    LayerWeights w;
    w.input_layernorm = get(p + ".input_layernorm.weight", {H});
    w.post_attention_layernorm = get(p + ".post_attention_layernorm.weight", {H});
    AttentionWeights& a = w.attn;
    const std::string ap = p + ".self_attn";
    a.q_a_proj = linear(ap + ".q_a_proj", c.q_lora_rank, H);
    a.q_a_layernorm = get(ap + ".q_a_layernorm.weight", {c.q_lora_rank});
    a.q_b_proj = linear(ap + ".q_b_proj", nh * c.qk_head_dim(), c.q_lora_rank);
    a.kv_a_proj = linear(ap + ".kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, H);
    a.kv_a_layernorm = get(ap + ".kv_a_layernorm.weight", {c.kv_lora_rank});
    a.kv_b_proj = linear(ap + ".kv_b_proj", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
    a.o_proj = linear(ap + ".o_proj", H, nh * c.v_head_dim);
    if (itype == IndexerType::full) {
      const std::string ip = ap + ".indexer";
      IndexerWeights iw;
      iw.wq_b = linear(ip + ".wq_b", c.index_n_heads * c.index_head_dim, c.q_lora_rank);
      iw.wk = linear(ip + ".wk", c.index_head_dim, H);
      iw.k_norm_weight = get(ip + ".k_norm.weight", {c.index_head_dim});
      iw.k_norm_bias = get(ip + ".k_norm.bias", {c.index_head_dim});
      iw.weights_proj = linear(ip + ".weights_proj", c.index_n_heads, H);
      a.indexer = std::move(iw);
    }
    w.mlp_type = mtype;
    if (mtype == MlpType::dense) {
      w.mlp = mlp(p + ".mlp", H, c.intermediate_size);
    } else {
      MoeWeights m;
      const int64_t E = c.n_routed_experts;
      m.gate = get(p + ".mlp.gate.weight", {E, H});
      m.e_score_correction_bias = get(p + ".mlp.gate.e_score_correction_bias", {E});
      m.experts.reserve(size_t(E));
      for (int64_t e = 0; e < E; ++e) {
        m.experts.push_back(mlp(fmt::format("{}.mlp.experts.{}", p, e), H, c.moe_intermediate_size));
      }
      if (c.n_shared_experts > 0) {
        m.shared_experts = mlp(p + ".mlp.shared_experts", H, c.moe_intermediate_size * c.n_shared_experts);
      }
      w.moe = std::move(m);
    }
    return w;
  }

  void finish(bool with_mtp) const {
    std::vector<std::string> unexpected;
    const std::string mtp_prefix_base = "model.layers.";
    for (const std::string& n : src_.names()) {
      if (used_.count(n)) continue;
      if (!with_mtp && is_mtp_tensor(n)) continue;
      unexpected.push_back(n);
    }
    if (missing_.empty() && unexpected.empty() && errors_.empty()) return;
    auto list = [](const std::vector<std::string>& v) {
      const size_t shown = std::min<size_t>(v.size(), 12);
      std::string s = fmt::format("{}", fmt::join(v.begin(), v.begin() + std::ptrdiff_t(shown), ", "));
      if (v.size() > shown) s += fmt::format(", ... ({} more)", v.size() - shown);
      return s;
    };
    std::string msg = "checkpoint does not match the config:";
    if (!missing_.empty()) msg += fmt::format(" {} missing tensors: {};", missing_.size(), list(missing_));
    if (!unexpected.empty())
      msg += fmt::format(" {} unexpected tensors: {};", unexpected.size(), list(unexpected));
    if (!errors_.empty()) msg += fmt::format(" {}", list(errors_));
    fail("{}", msg);
  }

  bool is_mtp_tensor(const std::string& n) const {
    int64_t idx = -1;
    if (std::sscanf(n.c_str(), "model.layers.%ld.", &idx) == 1) return idx >= cfg_.num_hidden_layers;
    return false;
  }

 private:
  const ModelConfig& cfg_;
  WeightSource& src_;
  std::set<std::string> used_;
  std::vector<std::string> missing_;
  std::vector<std::string> errors_;
};

}  // namespace

ModelWeights ModelWeights::bind(const ModelConfig& cfg, const io::Checkpoint& ckpt, bool with_mtp) {
  CheckpointSource src(ckpt);
  return bind(cfg, src, with_mtp);
}

ModelWeights ModelWeights::bind(const ModelConfig& cfg, WeightSource& src, bool with_mtp) {
  Binder b(cfg, src);
  ModelWeights w;
  const int64_t H = cfg.hidden_size, V = cfg.vocab_size;
  w.embed_tokens = b.get("model.embed_tokens.weight", {V, H});
  w.norm = b.get("model.norm.weight", {H});
  if (cfg.tie_word_embeddings && !b.has("lm_head.weight")) {
    w.lm_head.weight = w.embed_tokens;
  } else {
    w.lm_head = b.linear("lm_head", V, H);
  }
  for (int64_t l = 0; l < cfg.num_hidden_layers; ++l) {
    w.layers.push_back(b.layer(l, cfg.indexer_types[size_t(l)], cfg.mlp_layer_types[size_t(l)]));
  }
  if (with_mtp) {
    for (int64_t k = 0; k < cfg.num_nextn_predict_layers; ++k) {
      const int64_t idx = cfg.num_hidden_layers + k;
      const std::string p = fmt::format("model.layers.{}", idx);
      MtpWeights m;
      m.enorm = b.get(p + ".enorm.weight", {H});
      m.hnorm = b.get(p + ".hnorm.weight", {H});
      m.eh_proj = b.linear(p + ".eh_proj", H, 2 * H);
      // The MTP block is a MoE layer when the checkpoint has a router for it (GLM-5, DeepSeek-V3).
      const MlpType mt = b.has(p + ".mlp.gate.weight") ? MlpType::moe : MlpType::dense;
      m.layer = b.layer(idx, cfg.has_indexer() ? IndexerType::full : IndexerType::none, mt);
      m.shared_head_norm = b.get(p + ".shared_head.norm.weight", {H});
      if (b.has(p + ".embed_tokens.weight")) m.embed_tokens = b.get(p + ".embed_tokens.weight", {V, H});
      if (b.has(p + ".shared_head.head.weight")) m.shared_head = b.linear(p + ".shared_head.head", V, H);
      w.mtp.push_back(std::move(m));
    }
  }
  b.finish(with_mtp);
  return w;
}

namespace {

// Calls fn on every tensor slot of the weights (defined or not).
void for_each_tensor(ModelWeights& w, const std::function<void(Tensor&)>& fn) {
  auto lin = [&](Linear& l) {
    fn(l.weight);
    fn(l.scale_inv);
  };
  auto mlp = [&](MlpWeights& m) {
    lin(m.gate);
    lin(m.up);
    lin(m.down);
  };
  auto layer = [&](LayerWeights& l) {
    fn(l.input_layernorm);
    fn(l.post_attention_layernorm);
    AttentionWeights& a = l.attn;
    for (Linear* x : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.kv_b_proj, &a.o_proj}) lin(*x);
    fn(a.q_a_layernorm);
    fn(a.kv_a_layernorm);
    if (a.indexer) {
      lin(a.indexer->wq_b);
      lin(a.indexer->wk);
      lin(a.indexer->weights_proj);
      fn(a.indexer->k_norm_weight);
      fn(a.indexer->k_norm_bias);
    }
    if (l.mlp) mlp(*l.mlp);
    if (l.moe) {
      fn(l.moe->gate);
      fn(l.moe->e_score_correction_bias);
      for (auto& e : l.moe->experts) mlp(e);
      if (l.moe->shared_experts) mlp(*l.moe->shared_experts);
    }
  };
  fn(w.embed_tokens);
  fn(w.norm);
  lin(w.lm_head);
  for (auto& l : w.layers) layer(l);
  for (auto& m : w.mtp) {
    fn(m.enorm);
    fn(m.hnorm);
    lin(m.eh_proj);
    layer(m.layer);
    fn(m.shared_head_norm);
    fn(m.embed_tokens);
    if (m.shared_head) lin(*m.shared_head);
  }
}

}  // namespace

void for_each_derived_slot(ModelWeights& w, const DerivedSlotFn& fn) {
  using kernels::WeightUse;
  const Tensor no_scales;
  auto lin = [&](Linear& l, WeightUse use) { fn(l.weight, l.scale_inv, l.derived, use); };
  auto mlp = [&](MlpWeights& m, WeightUse use) {
    lin(m.gate, use);
    lin(m.up, use);
    lin(m.down, use);
  };
  auto layer = [&](LayerWeights& l) {
    AttentionWeights& a = l.attn;
    for (Linear* x : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.o_proj}) lin(*x, WeightUse::linear);
    lin(a.kv_b_proj, WeightUse::absorb);
    if (a.indexer) {
      lin(a.indexer->wq_b, WeightUse::linear);
      lin(a.indexer->wk, WeightUse::linear);
      lin(a.indexer->weights_proj, WeightUse::linear);
    }
    if (l.mlp) mlp(*l.mlp, WeightUse::linear);
    if (l.moe) {
      fn(l.moe->gate, no_scales, l.moe->gate_derived, WeightUse::linear);
      for (auto& e : l.moe->experts) mlp(e, WeightUse::expert);
      if (l.moe->shared_experts) mlp(*l.moe->shared_experts, WeightUse::linear);
    }
  };
  lin(w.lm_head, WeightUse::linear);
  for (auto& l : w.layers) layer(l);
  for (auto& m : w.mtp) {
    lin(m.eh_proj, WeightUse::linear);
    layer(m.layer);
    if (m.shared_head) lin(*m.shared_head, WeightUse::linear);
  }
}

void for_each_moe(ModelWeights& w, const std::function<void(MoeWeights&)>& fn) {
  for (auto& l : w.layers)
    if (l.moe) fn(*l.moe);
  for (auto& m : w.mtp)
    if (m.layer.moe) fn(*m.layer.moe);
}

ModelWeights ModelWeights::to(Device device) const {
  ModelWeights out = *this;
  // What a backend derived belongs to its device: the copy's model derives its own.
  for_each_derived_slot(out,
                        [](const Tensor&, const Tensor&, std::shared_ptr<const kernels::DerivedWeight>& d,
                           kernels::WeightUse) { d.reset(); });
  for_each_moe(out, [](MoeWeights& m) { m.experts_derived.reset(); });
  std::map<const void*, Tensor> moved;  // source data pointer -> device copy
  for_each_tensor(out, [&](Tensor& t) {
    if (!t.defined() || t.device() == device) return;
    auto it = moved.find(t.raw_data());
    if (it != moved.end() && it->second.shape() == t.shape() && it->second.dtype() == t.dtype()) {
      t = it->second;
      return;
    }
    Tensor d = t.to(device);
    moved[t.raw_data()] = d;
    t = d;
  });
  return out;
}

int64_t ModelWeights::bytes() const {
  std::set<const void*> seen;
  int64_t total = 0;
  for_each_tensor(const_cast<ModelWeights&>(*this), [&](Tensor& t) {
    if (t.defined() && seen.insert(t.raw_data()).second) total += int64_t(t.nbytes());
  });
  return total;
}

}  // namespace dsaserve::model
