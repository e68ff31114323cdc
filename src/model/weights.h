#pragma once
// Binding a checkpoint to the model's parameter slots. Tensors stay as stored (bf16 views of the mmap,
// FP8 E4M3 with their block scales); the kernels read them directly.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace dsaserve::kernels {
struct DerivedWeight;   // kernels/ops.h
struct DerivedExperts;  // kernels/ops.h
enum class WeightUse;   // kernels/ops.h
}  // namespace dsaserve::kernels

namespace dsaserve::model {

// A Linear weight [out, in]. FP8 weights carry scale_inv F32 [ceil(out/128), ceil(in/128)]; real value
// = weight[r][c] * scale_inv[r/128][c/128]. scale_inv is undefined for bf16/f32 weights.
struct Linear {
  Tensor weight;     // [out, in]
  Tensor scale_inv;  // [ceil(out/bn), ceil(in/bk)] F32, or undefined
  // The forms the model's backend derived from it when the model was made (Model: Backend::derive_weight;
  // kernels/ops.h DerivedWeight), or null. Not part of the checkpoint: copies to another device drop it.
  std::shared_ptr<const kernels::DerivedWeight> derived;
  int64_t out_features() const { return weight.size(0); }
  int64_t in_features() const { return weight.size(1); }
  bool is_fp8() const { return scale_inv.defined(); }
};

struct MlpWeights {  // down(silu(gate(x)) * up(x))
  Linear gate, up, down;
};

struct IndexerWeights {
  Linear wq_b;           // [ih * id, q_lora]
  Linear wk;             // [id, H]
  Tensor k_norm_weight;  // [id]  LayerNorm weight
  Tensor k_norm_bias;    // [id]  LayerNorm bias
  Linear weights_proj;   // [ih, H]
};

struct AttentionWeights {
  Linear q_a_proj;                        // [q_lora, H]
  Tensor q_a_layernorm;                   // [q_lora]
  Linear q_b_proj;                        // [nh * (nope + rope), q_lora]
  Linear kv_a_proj;                       // [kv_lora + rope, H]  (kv_a_proj_with_mqa)
  Tensor kv_a_layernorm;                  // [kv_lora]
  Linear kv_b_proj;                       // [nh * (nope + v), kv_lora]
  Linear o_proj;                          // [H, nh * v]
  std::optional<IndexerWeights> indexer;  // full layers only
};

struct MoeWeights {
  Tensor gate;                                                 // [n_experts, H] router weight
  std::shared_ptr<const kernels::DerivedWeight> gate_derived;  // as Linear::derived
  Tensor e_score_correction_bias;                              // [n_experts] F32
  std::vector<MlpWeights> experts;                             // [n_experts]
  // The routed experts' form as a set that the model's backend derived when the model was made (Model:
  // Backend::derive_experts; kernels/ops.h DerivedExperts), or null; as Linear::derived, copies drop it.
  std::shared_ptr<const kernels::DerivedExperts> experts_derived;
  std::optional<MlpWeights> shared_experts;
};

struct LayerWeights {
  Tensor input_layernorm;           // [H]
  Tensor post_attention_layernorm;  // [H]
  AttentionWeights attn;
  MlpType mlp_type = MlpType::dense;
  std::optional<MlpWeights> mlp;  // dense layers
  std::optional<MoeWeights> moe;  // MoE layers
};

struct MtpWeights {
  Tensor enorm;             // [H]
  Tensor hnorm;             // [H]
  Linear eh_proj;           // [H, 2H]
  LayerWeights layer;       // one decoder layer (its own indexer: always "full")
  Tensor shared_head_norm;  // [H]
  Tensor embed_tokens;      // [vocab, H] copy of the target's (may be absent -> the target's is used)
  std::optional<Linear> shared_head;  // [vocab, H] copy of lm_head (absent -> lm_head)
};

// Where the binder finds tensors by their checkpoint names: a checkpoint (ModelWeights::bind), or
// generated ones (model/dummy_weights.h). get() is called once per name that has() reports, with the
// shape the config implies; a dry source may return an undefined tensor (nothing is made).
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Tensor get(const std::string& name, const Shape& shape) = 0;
  // Every name the source holds (those no slot takes are reported as unexpected).
  virtual std::vector<std::string> names() const = 0;
};

struct ModelWeights {
  Tensor embed_tokens;  // [vocab, H]
  std::vector<LayerWeights> layers;
  Tensor norm;                  // [H]
  Linear lm_head;               // [vocab, H]
  std::vector<MtpWeights> mtp;  // num_nextn_predict_layers (stored as layers L, L+1, ...)

  // Binds every checkpoint tensor to a slot. Throws dsaserve::Error listing missing and unexpected
  // tensors (by name) and shape or dtype mismatches. `with_mtp` false ignores the MTP layers' tensors.
  static ModelWeights bind(const ModelConfig& cfg, const io::Checkpoint& ckpt, bool with_mtp = true);
  static ModelWeights bind(const ModelConfig& cfg, WeightSource& src, bool with_mtp = true);

  // A copy with every tensor on `device`, dtypes kept as stored (bf16, FP8 + F32 scales). Tensors that
  // are views of one another (a tied lm_head, the MTP layer's copies) are uploaded once.
  ModelWeights to(Device device) const;
  // Bytes of every distinct tensor.
  int64_t bytes() const;
};

// Calls fn on each weight a backend derives forms for (model::Model: kernels::Backend::derive_weight):
// every Linear (its weight, scale_inv and `derived` slot) and every router gate (no scale_inv; its
// gate_derived slot), with what the forward runs on it: kv_b the absorbed projections too
// (WeightUse::absorb), the routed experts moe_experts (expert), the others the linears (linear).
using DerivedSlotFn =
    std::function<void(const Tensor& weight, const Tensor& scale_inv,
                       std::shared_ptr<const kernels::DerivedWeight>& derived, kernels::WeightUse use)>;
void for_each_derived_slot(ModelWeights& w, const DerivedSlotFn& fn);
// Calls fn on each MoE layer's weights (the decoder layers', then the MTP layers'): the slots of the
// routed experts' derived set (MoeWeights::experts_derived).
void for_each_moe(ModelWeights& w, const std::function<void(MoeWeights&)>& fn);

}  // namespace dsaserve::model
