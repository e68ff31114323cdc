// Fused KV-cache writes: one block of 256 threads per token.
//
// MLA latent (kKvThreads threads): thread i < 128 holds latent values 4i..4i+3 (one float4), the block
// reduces their squares in fp64 exactly as sm90_rms_norm_vec_kernel<1> does (same per-thread order, same
// block_sum over 8 warps), scales them, and stores them; warp 0 rotates the 32 rope pairs as rope.cu does.
// The FP8 format quantises each 128-value block in the warp that holds it (warp w: values 128w..128w+127),
// as sm90_mla_cache_store_kernel does.
//
// Indexer key: the LayerNorm statistics of sm90_layer_norm_kernel (same order, same reduction), the row
// in shared memory, the rope pairs rotated from it, bf16 stores; or, for the FP8 index-key format, the
// finished key in shared memory, quantised and stored by warp 0 exactly as launch_indexer_key_store does.
#include <cuda_bf16.h>

#include "kernels/cuda/common/device_util.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"
#include "kernels/cuda/indexer/sm90_indexer_fp8.cuh"
#include "kernels/cuda/kv_write/kv_write_params.h"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kKvThreads = 256;  // the unfused norms' block size: the same reduction tree
constexpr int kLatent4 = kMlaLatent / 4;
constexpr int kRopeHalf = kMlaRope / 2;
static_assert(kLatent4 <= kKvThreads && kRopeHalf <= 32, "one float4 per thread, rope pairs in warp 0");
constexpr int kKPer = (kIndexerKMaxDim + kKvThreads - 1) / kKvThreads;  // indexer-key channels per thread

__global__ void __launch_bounds__(kKvThreads) sm90_mla_kv_write_kernel(const MlaKvWriteParams p) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* x = p.ckv + t * p.ckv_stride;

  // Every global read is issued before the reduction (the norm weights, the rope inputs and angle): a
  // decode step's token is one block, whose time is its chain of memory round trips.
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f), w = v;
  if (tid < kLatent4) {
    v = reinterpret_cast<const float4*>(x)[tid];
    w = load4_any(p.norm_w, p.norm_w_bf16, tid);
  }
  float ra = 0.f, rc = 0.f, ang = 0.f;  // warp 0: this lane's rope pair and its angle
  if (warp == 0 && lane < kRopeHalf) {
    const int i = lane;
    const float* e = x + kMlaLatent;
    ra = p.interleaved ? e[2 * i] : e[i];
    rc = p.interleaved ? e[2 * i + 1] : e[i + kRopeHalf];
    ang = p.inv_freq[i] * float(p.positions[t]);
  }
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;  // the whole block: no barrier is left waiting
  // RoPE of the shared key (rope.cu's arithmetic), before the reduction's barriers: lane i of warp 0
  // rotates pair i.
  float e0 = 0.f, e1 = 0.f;  // the rotated values of channels i and i + 32 (de-interleaved layout)
  if (warp == 0 && lane < kRopeHalf) {
    const float cs = float(cos(double(ang)) * p.attention_factor);
    const float sn = float(sin(double(ang)) * p.attention_factor);
    e0 = rope_first(ra, rc, cs, sn);
    e1 = rope_second(ra, rc, cs, sn);
  }
  // RMSNorm statistics (sm90_rms_norm_vec_kernel<1>'s order).
  double ss = 0.0;
  if (tid < kLatent4) {
    ss += double(v.x) * double(v.x);
    ss += double(v.y) * double(v.y);
    ss += double(v.z) * double(v.z);
    ss += double(v.w) * double(v.w);
  }
  ss = block_sum(ss);
  const float r = float(1.0 / sqrt(ss / double(kMlaLatent) + p.eps));
  float4 o = v;
  if (tid < kLatent4) o = make_float4(w.x * (v.x * r), w.y * (v.y * r), w.z * (v.z * r), w.w * (v.w * r));

  if (p.format == MlaKvFormat::bf16) {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.cache) + slot * kMlaDim;
    if (tid < kLatent4) {
      __nv_bfloat162 lo = __halves2bfloat162(__float2bfloat16_rn(o.x), __float2bfloat16_rn(o.y));
      __nv_bfloat162 hi = __halves2bfloat162(__float2bfloat16_rn(o.z), __float2bfloat16_rn(o.w));
      uint2 u;
      u.x = *reinterpret_cast<uint32_t*>(&lo);
      u.y = *reinterpret_cast<uint32_t*>(&hi);
      reinterpret_cast<uint2*>(dst)[tid] = u;  // 8-byte aligned: rows are 1152 bytes
    }
    if (warp == 0 && lane < kRopeHalf) {
      dst[kMlaLatent + lane] = __float2bfloat16_rn(e0);
      dst[kMlaLatent + kRopeHalf + lane] = __float2bfloat16_rn(e1);
    }
    return;
  }
  // FP8: warp w < 4 holds latent block w (values 128w + 4 lane + j), as the cache store reads it.
  unsigned char* dst = static_cast<unsigned char*>(p.cache) + slot * kMlaFp8RowBytes;
  if (tid < kLatent4) {
    float amax = 0.f;
    amax = fmaxf(amax, fabsf(o.x));
    amax = fmaxf(amax, fabsf(o.y));
    amax = fmaxf(amax, fabsf(o.z));
    amax = fmaxf(amax, fabsf(o.w));
    amax = warp_max(amax);
    *reinterpret_cast<uint32_t*>(dst + 4 * tid) = fp8_kv_codes4(o.x, o.y, o.z, o.w, fp8_kv_inv_scale(amax));
    if (lane == 0) *reinterpret_cast<float*>(dst + kMlaLatent + 4 * warp) = fp8_kv_scale(amax);
  }
  if (warp == 0 && lane < kRopeHalf) {
    __nv_bfloat16* rope = reinterpret_cast<__nv_bfloat16*>(dst + kMlaLatent + 16);
    rope[lane] = __float2bfloat16_rn(e0);
    rope[kRopeHalf + lane] = __float2bfloat16_rn(e1);
  }
}

__global__ void __launch_bounds__(kKvThreads) sm90_indexer_k_write_kernel(const IndexerKWriteParams p) {
  __shared__ float row[kIndexerKMaxDim];
  __shared__ float key[kIndexerKMaxDim];  // the FP8 format's finished key, before quantisation
  pdl_enter();
  const int64_t t = blockIdx.x;
  const float* x = p.k + t * p.k_stride;
  // The key, the norm's weight and bias and the position are read once, up front (the block's time at a
  // decode step is its chain of memory round trips); thread i holds channels i + kKvThreads j.
  float xv[kKPer], wv[kKPer], bv[kKPer];
#pragma unroll
  for (int j = 0; j < kKPer; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kKvThreads;
    xv[j] = wv[j] = bv[j] = 0.f;
    if (i < p.dim) {
      xv[j] = x[i];
      wv[j] = load_any(p.w, p.w_bf16, i);
      bv[j] = load_any(p.b, p.b_bf16, i);
    }
  }
  const float pos = float(p.positions[t]);
  const int64_t slot = p.slots[t];
  if (slot < 0 || slot >= p.num_slots) return;  // the whole block
  // The first rope pair of this thread's angle, before the barriers (rope.cu's arithmetic).
  float cs0 = 0.f, sn0 = 0.f;
  if (threadIdx.x < p.rope_dim / 2) {
    const float ang = p.inv_freq[threadIdx.x] * pos;
    cs0 = float(cos(double(ang)) * p.attention_factor);
    sn0 = float(sin(double(ang)) * p.attention_factor);
  }
  // sm90_layer_norm_kernel's statistics, in its loops' order.
  double s = 0.0;
#pragma unroll
  for (int j = 0; j < kKPer; ++j)
    if (threadIdx.x + int64_t(j) * kKvThreads < p.dim) s += double(xv[j]);
  const double mean = block_sum(s) / double(p.dim);
  double v = 0.0;
#pragma unroll
  for (int j = 0; j < kKPer; ++j)
    if (threadIdx.x + int64_t(j) * kKvThreads < p.dim) v = layer_norm_sq_add(v, xv[j], mean);
  const double var = block_sum(v) / double(p.dim);
  const double r = 1.0 / sqrt(var + p.eps);
#pragma unroll
  for (int j = 0; j < kKPer; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kKvThreads;
    if (i < p.dim) row[i] = layer_norm_out(xv[j], mean, r, wv[j], bv[j]);
  }
  __syncthreads();
  // Channels past the rope part as they are; rope pairs rotated (rope.cu's arithmetic, rope first). bf16:
  // straight into the cache row; FP8: into `key`, which warp 0 then quantises and stores.
  __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.cache) + slot * p.cache_stride;
  auto put = [&](int64_t i, float v) {
    if (p.fp8) {
      key[i] = v;
    } else {
      dst[i] = __float2bfloat16_rn(v);
    }
  };
  for (int64_t i = p.rope_dim + threadIdx.x; i < p.dim; i += blockDim.x) put(i, row[i]);
  const int64_t half = p.rope_dim / 2;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float cs = cs0, sn = sn0;
    if (i != threadIdx.x) {
      const float ang = p.inv_freq[i] * pos;
      cs = float(cos(double(ang)) * p.attention_factor);
      sn = float(sin(double(ang)) * p.attention_factor);
    }
    const float a = p.interleaved ? row[2 * i] : row[i];
    const float c = p.interleaved ? row[2 * i + 1] : row[i + half];
    put(i, rope_first(a, c, cs, sn));
    put(i + half, rope_second(a, c, cs, sn));
  }
  if (!p.fp8) return;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x);
    const float v[4] = {key[4 * lane], key[4 * lane + 1], key[4 * lane + 2], key[4 * lane + 3]};
    indexer_key_store_fp8_warp(v, lane, p.cache, p.num_slots, slot);
  }
}

}  // namespace

cudaError_t launch_mla_kv_write(const MlaKvWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  return launch_pdl(p.pdl, sm90_mla_kv_write_kernel, dim3(unsigned(p.tokens)), dim3(kKvThreads), 0, stream,
                    p);
}

cudaError_t launch_indexer_k_write(const IndexerKWriteParams& p, cudaStream_t stream) {
  if (p.tokens == 0) return cudaSuccess;
  if (p.dim > kIndexerKMaxDim || p.rope_dim % 2 != 0 || p.rope_dim > p.dim || (p.fp8 && p.dim != kIndexerDim))
    return cudaErrorInvalidValue;
  return launch_pdl(p.pdl, sm90_indexer_k_write_kernel, dim3(unsigned(p.tokens)), dim3(kKvThreads), 0, stream,
                    p);
}

}  // namespace dsaserve::kernels::cuda
