#pragma once
// Internal to the planner: byte sizes of weights and caches, and the layout-derived token counts.
#include <cstdint>

#include "model/config.h"
#include "plan/plan.h"

namespace dsaserve::plan::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of a Linear weight [out, in]: FP8 (1 B) plus one float scale per block_n x block_k block when the
// checkpoint is FP8 and the tensor is one of the quantized ones; bf16 (2 B) otherwise.
inline double linear_bytes(const model::ModelConfig& c, int64_t out, int64_t in, bool quantized = true) {
  if (quantized && c.fp8.enabled) {
    return double(out) * double(in) +
           4.0 * double(ceil_div(out, c.fp8.block_n) * ceil_div(in, c.fp8.block_k));
  }
  return 2.0 * double(out) * double(in);
}

// Bytes per token per layer of the MLA latent cache. fp8_e4m3 uses FlashMLA's layout: kv_lora FP8 values,
// one float scale per 128 of them, and the rope part kept in bf16 (512 + 16 + 128 = 656 for GLM-5.x).
inline double kv_bytes_per_token_layer(const model::ModelConfig& c, KvDtype d) {
  if (d == KvDtype::bf16) return 2.0 * double(c.kv_lora_rank + c.qk_rope_head_dim);
  return double(c.kv_lora_rank) + 4.0 * double(ceil_div(c.kv_lora_rank, 128)) +
         2.0 * double(c.qk_rope_head_dim);
}

// Indexer K cache per token per full layer: FP8 key + one float scale (128 + 4), whatever the KV dtype.
inline double indexer_bytes_per_token_layer(const model::ModelConfig& c) {
  return c.has_indexer() ? double(c.index_head_dim) + 4.0 : 0.0;
}

}  // namespace dsaserve::plan::detail
