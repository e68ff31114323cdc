#pragma once
// Plain parameters of the fused KV-cache writes (sm90_kv_write.cu): one kernel per layer normalises,
// rotates and stores every new token's cache row at its slot.
//
// Both kernels reproduce the unfused operators' arithmetic exactly (sm90_rms_norm_vec_kernel /
// sm90_layer_norm_kernel statistics with the same 256-thread reduction tree, rope.cu's fp32 angle and
// fp64 cos/sin, the cache stores' bf16 rounding and FP8 quantisation), so the rows they write are the
// bits the unfused sequence writes.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/mla_decode_params.h"

namespace dsaserve::kernels::cuda {

// cache[slots[t]] = [rms_norm(ckv[t, :512]) * norm_w | RoPE(ckv[t, 512:576]) at positions[t]] in the
// latent cache's format (bf16 [slots, 576], or FP8 [slots, 656]: per-128 scale = max|x| / 448).
struct MlaKvWriteParams {
  const float* ckv;          // [tokens, 576] f32, row stride ckv_stride (elements, % 4 == 0), 16-byte aligned
  const void* norm_w;        // [512] bf16 (norm_w_bf16; 8-byte aligned) or f32 (16-byte aligned), not null
  const int32_t* positions;  // [tokens] i32, not null
  const float* inv_freq;     // [32] f32 RoPE inverse frequencies (kernels::rope_inv_freq), not null
  const int32_t* slots;      // [tokens] i32; slots outside [0, num_slots) are skipped
  void* cache;               // [num_slots, row bytes] in `format`, not null
  int64_t tokens, ckv_stride, num_slots;
  double eps, attention_factor;
  bool norm_w_bf16, interleaved;
  MlaKvFormat format;
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_mla_kv_write(const MlaKvWriteParams& p, cudaStream_t stream);

inline constexpr int kIndexerKMaxDim = 1024;  // index_head_dim the fused indexer-key write takes

// cache[slots[t]] = layer_norm(k[t]) * w + b with RoPE on channels [0, rope_dim) at positions[t], bf16.
struct IndexerKWriteParams {
  const float* k;            // [tokens, dim] f32, row stride k_stride (elements), last dim contiguous
  const void* w;             // [dim] bf16 (w_bf16) or f32, not null
  const void* b;             // [dim] bf16 (b_bf16) or f32, not null
  const int32_t* positions;  // [tokens] i32, not null
  const float* inv_freq;     // [rope_dim / 2] f32, not null
  const int32_t* slots;      // [tokens] i32; slots outside [0, num_slots) are skipped
  // bf16 [num_slots, dim], row stride cache_stride (elements); or (fp8) the FP8 index-key format u8
  // [num_slots, 132] (codes [num_slots, 128], then scales [num_slots] f32; dim == 128), not null
  void* cache;
  int64_t tokens, dim, rope_dim, k_stride, cache_stride, num_slots;  // dim <= kIndexerKMaxDim
  double eps, attention_factor;
  bool w_bf16, b_bf16, interleaved;
  bool fp8;          // the FP8 format: each key quantised as launch_indexer_key_store does (bit-identical)
  bool pdl = false;  // programmatic dependent launch (KernelOptions::pdl; common/pdl.cuh)
};
cudaError_t launch_indexer_k_write(const IndexerKWriteParams& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
