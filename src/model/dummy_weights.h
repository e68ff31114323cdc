#pragma once
// Dummy weights, the SGLang / vLLM `--load-format dummy` way: every tensor a checkpoint of this config
// would hold, at the config's full widths, generated on the target device (the CUDA backend's kernel, or
// parallel_for on the CPU) with no checkpoint on disk. Bound by the same binder as a real checkpoint.
//
// - dtypes as GLM-5.x / DeepSeek-V3.x FP8 checkpoints store them when the config has a
//   quantization_config (fp8): FP8 e4m3 with F32 block scales [ceil(out/bn), ceil(in/bk)] for q_a, q_b,
//   kv_a, kv_b, o_proj, the indexer's wq_b and every gate/up/down projection (dense MLP, routed and shared
//   experts); bf16 for the embeddings, lm_head, norms, router gates, the indexer's wk and weights_proj and
//   the MTP eh_proj; F32 e_score_correction_bias. Without fp8: bf16 everywhere (the bias F32).
// - values (core/dummy_fill.h, a counter-based hash of (seed, tensor name, element)): linear weights
//   uniform with std 1/sqrt(in_features) (so a projection keeps its input's scale), embeddings uniform
//   in [-1, 1) (tied to the LM head: a linear's scale), norm weights 1 +- 1/16, biases small. Activations
//   stay finite through many layers (tests: model/dummy_weights_test.cpp, 24 layers: logits and the final
//   hidden state; cli/dummy_model_test.cpp: logits at GLM-5.3's full widths).
// - a tensor's values depend only on its name and the seed: truncating layers or adding the MTP layer
//   leaves the other tensors' bytes unchanged, and the CPU and CUDA fills give the same bytes.
// - the MTP layers (num_nextn_predict_layers) only with with_mtp (SGLang loads them for speculative
//   decoding); each is a MoE layer (as GLM-5 and DeepSeek-V3 ship it) without its own embed_tokens /
//   shared_head.head copies (the target's are used).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dummy_fill.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsaserve::model {

class Model;

// One tensor of the dummy weights.
struct DummyTensor {
  std::string name;  // the checkpoint name (model.layers.3.mlp.experts.7.gate_proj.weight)
  Shape shape;
  DType dtype = DType::bf16;
  dummy::FillSpec fill;  // seed, key (tensor_key(name)) and the value scale
};

// FNV-1a of the name: the tensor's key in the hash.
uint64_t tensor_key(const std::string& name);

// Every tensor the dummy weights hold, in binding order, without making any (sizes and dtypes: inspect,
// memory plans).
std::vector<DummyTensor> dummy_tensors(const ModelConfig& cfg, uint64_t seed = 0, bool with_mtp = false);
int64_t dummy_weight_bytes(const ModelConfig& cfg, bool with_mtp = false);

// The dummy weights, made and filled on `device` (its backend must be installed).
ModelWeights make_dummy_weights(const ModelConfig& cfg, Device device, uint64_t seed = 0,
                                bool with_mtp = false);
// A model over them (no checkpoint).
std::shared_ptr<Model> make_dummy_model(const ModelConfig& cfg, Device device, uint64_t seed = 0,
                                        bool with_mtp = false);

}  // namespace dsaserve::model
