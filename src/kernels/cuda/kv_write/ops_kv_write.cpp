// Host wrappers of the fused KV-cache writes (kv_write_params.h). No host sync and no upload per call:
// slots and positions stay on the GPU (a slot outside the cache is skipped by the kernel, not reported),
// the RoPE inverse frequencies are uploaded once per parameter set.
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/cuda/kv_write/kv_write_params.h"

namespace dsaserve::kernels::cuda {

namespace {

bool is_aligned(const void* p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

bool on_gpu_i32(const Tensor& t, int64_t n) {
  return t.defined() && t.device() == Device::cuda && t.dtype() == DType::i32 && t.dim() == 1 &&
         t.size(0) == n && (t.stride(0) == 1 || n <= 1);
}

// A contiguous CUDA vector of n values, bf16 or f32.
bool vec_ok(const Tensor& w, int64_t n) {
  return w.defined() && w.device() == Device::cuda && w.dim() == 1 && w.size(0) == n && w.is_contiguous() &&
         (w.dtype() == DType::bf16 || w.dtype() == DType::f32);
}

}  // namespace

bool mla_kv_write_fused(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                        const RopeParams& rope, Tensor& cache, const Tensor& slots, const KernelOptions& o) {
  // The kernel formats (bf16 [slots, 576], FP8 u8 [slots, 656]) of 512 + 64 rows only; anything else
  // (the f32 stand-in cache) takes the unfused sequence.
  if (!cache.defined() || cache.device() != Device::cuda || cache.dim() != 2 || !cache.is_contiguous())
    return false;
  const bool bf16 = cache.dtype() == DType::bf16 && cache.size(1) == kMlaDim;
  const bool fp8 = cache.dtype() == DType::u8 && cache.size(1) == kMlaFp8RowBytes;
  if (!(bf16 || fp8) || ckv.size(1) != kMlaDim || rope.dim != kMlaRope) return false;
  const MlaKvFormat f = bf16 ? MlaKvFormat::bf16 : MlaKvFormat::fp8_e4m3;
  const int64_t T = ckv.size(0);
  DSA_CHECK(ckv.device() == Device::cuda, "mla_kv_write: ckv {} must be on the GPU", ckv.describe());
  DSA_CHECK(vec_ok(norm_w, kMlaLatent), "mla_kv_write: norm weight {} should be a CUDA bf16/f32 [{}]",
            norm_w.describe(), kMlaLatent);
  DSA_CHECK(on_gpu_i32(positions, T) && on_gpu_i32(slots, T),
            "mla_kv_write: positions {} and slots {} should be contiguous CUDA i32 [{}]",
            positions.describe(), slots.describe(), T);
  const bool wb = norm_w.dtype() == DType::bf16;
  // The float4 row loads: otherwise the unfused sequence (which handles any view).
  if (T > 0 && (ckv.stride(1) != 1 || ckv.stride(0) % 4 != 0 || !is_aligned(ckv.raw_data(), 16) ||
                !is_aligned(norm_w.raw_data(), wb ? 8 : 16)))
    return false;
  MlaKvWriteParams p{};
  p.ckv = ckv.data<float>();
  p.norm_w = norm_w.raw_data();
  p.positions = positions.data<int32_t>();
  p.inv_freq = rope_inv_freq_device(rope);
  p.slots = slots.data<int32_t>();
  p.cache = cache.raw_data();
  p.tokens = T;
  p.ckv_stride = ckv.stride(0);
  p.num_slots = cache.size(0);
  p.eps = eps;
  p.attention_factor = rope.attention_factor;
  p.norm_w_bf16 = wb;
  p.interleaved = rope.interleaved;
  p.format = f;
  p.pdl = o.pdl;
  check_launch(launch_mla_kv_write(p, op_stream()), "mla_kv_write");
  return true;
}

bool indexer_k_write_fused(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                           const Tensor& positions, const RopeParams& rope, Tensor& cache,
                           const Tensor& slots, const KernelOptions& o) {
  // bf16 index keys and the FP8 format; the f32 stand-in takes the unfused sequence.
  if (!cache.defined() || cache.device() != Device::cuda ||
      (cache.dtype() != DType::bf16 && cache.dtype() != DType::u8))
    return false;
  const bool fp8 = cache.dtype() == DType::u8;
  const int64_t T = k.size(0), D = k.size(1);
  if (D > kIndexerKMaxDim) return false;
  DSA_CHECK(k.device() == Device::cuda && (k.stride(1) == 1 || D <= 1) && cache.dim() == 2 &&
                (fp8 ? D == kIndexerDim && indexer_key_format(cache) == IndexerKeyFormat::fp8_e4m3
                     : cache.size(1) == D && (cache.stride(1) == 1 || D <= 1)),
            "indexer_k_write: keys {} do not fit the cache {}", k.describe(), cache.describe());
  DSA_CHECK(vec_ok(norm_w, D) && vec_ok(norm_b, D),
            "indexer_k_write: norm weight {} and bias {} should be CUDA bf16/f32 [{}]", norm_w.describe(),
            norm_b.describe(), D);
  DSA_CHECK(on_gpu_i32(positions, T) && on_gpu_i32(slots, T),
            "indexer_k_write: positions {} and slots {} should be contiguous CUDA i32 [{}]",
            positions.describe(), slots.describe(), T);
  IndexerKWriteParams p{};
  p.k = k.data<float>();
  p.w = norm_w.raw_data();
  p.b = norm_b.raw_data();
  p.positions = positions.data<int32_t>();
  p.inv_freq = rope_inv_freq_device(rope);
  p.slots = slots.data<int32_t>();
  p.cache = cache.raw_data();
  p.tokens = T;
  p.dim = D;
  p.rope_dim = rope.dim;
  p.k_stride = k.stride(0);
  p.cache_stride = cache.stride(0);
  p.num_slots = cache.size(0);
  p.eps = eps;
  p.attention_factor = rope.attention_factor;
  p.w_bf16 = norm_w.dtype() == DType::bf16;
  p.b_bf16 = norm_b.dtype() == DType::bf16;
  p.interleaved = rope.interleaved;
  p.fp8 = fp8;
  p.pdl = o.pdl;
  check_launch(launch_indexer_k_write(p, op_stream()), "indexer_k_write");
  return true;
}

}  // namespace dsaserve::kernels::cuda
