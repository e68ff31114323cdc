// Sparse MLA decode: the latent-cache writer, the kernel and split choosers, the split combine kernel and
// the dispatch to decode kernels v2 and v5 (sm90_mla_decode.cuh).
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/attention/mla_decode_params.h"
#include "kernels/cuda/attention/sm90_mla_decode.cuh"
#include "kernels/cuda/common/launch_util.cuh"
#include "kernels/cuda/common/pdl.cuh"

namespace dsaserve::kernels::cuda {

namespace {

// One warp per row: bf16 rows are plain conversions; FP8 rows get one scale per 128 latent values.
__global__ void sm90_mla_cache_store_kernel(const MlaCacheStoreParams p) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= p.n) return;
  const int64_t slot = p.slots[i];
  if (slot < 0 || slot >= p.num_slots) return;
  const float* src = p.src + i * p.src_stride;
  if (p.format == MlaKvFormat::bf16) {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.cache) + slot * kMlaDim;
    for (int c = lane; c < kMlaDim; c += 32) dst[c] = __float2bfloat16_rn(src[c]);
    return;
  }
  unsigned char* dst = static_cast<unsigned char*>(p.cache) + slot * kMlaFp8RowBytes;
  for (int b = 0; b < kMlaLatent / 128; ++b) {
    float v[4], amax = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = src[b * 128 + lane * 4 + j];
      amax = fmaxf(amax, fabsf(v[j]));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = amax / 448.f;
    const float inv = amax > 0.f ? 448.f / amax : 0.f;
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      word |= uint32_t(__nv_cvt_float_to_fp8(v[j] * inv, __NV_SATFINITE, __NV_E4M3)) << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(dst + b * 128 + lane * 4) = word;
    if (lane == 0) *reinterpret_cast<float*>(dst + kMlaLatent + b * 4) = scale;
  }
  __nv_bfloat16* rope = reinterpret_cast<__nv_bfloat16*>(dst + kMlaLatent + 16);
  for (int c = lane; c < kMlaRope; c += 32) rope[c] = __float2bfloat16_rn(src[kMlaLatent + c]);
}

// One warp per position: the cached row back to f32 (bf16 widened; fp8 codes times their block scale).
__global__ void sm90_mla_cache_gather_kernel(const MlaCacheGatherParams p) {
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= p.n) return;
  const int64_t slot = int64_t(p.page_table[i / p.page_size]) * p.page_size + i % p.page_size;
  float* dst = p.out + i * kMlaDim;
  if (slot < 0 || slot >= p.num_slots) {
    for (int c = lane; c < kMlaDim; c += 32) dst[c] = 0.f;
    return;
  }
  if (p.format == MlaKvFormat::bf16) {
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.cache) + slot * kMlaDim;
    for (int c = lane; c < kMlaDim; c += 32) dst[c] = __bfloat162float(src[c]);
    return;
  }
  const unsigned char* src = static_cast<const unsigned char*>(p.cache) + slot * kMlaFp8RowBytes;
  const float* scales = reinterpret_cast<const float*>(src + kMlaLatent);
  for (int c = lane; c < kMlaLatent; c += 32) {
    __nv_fp8_e4m3 code;
    code.__x = src[c];
    dst[c] = float(code) * scales[c / 128];
  }
  const __nv_bfloat16* rope = reinterpret_cast<const __nv_bfloat16*>(src + kMlaLatent + 16);
  for (int c = lane; c < kMlaRope; c += 32) dst[kMlaLatent + c] = __bfloat162float(rope[c]);
}

// One warp per row of the copy: lane l dequantises latent values 16 l .. 16 l + 15 (scale block l / 8) as
// v5's producer warpgroup (sm90_mla_decode_v5_fp8.cu) does; lanes 0-7 copy the rope's 16-byte chunks.
__global__ void sm90_mla_cache_bf16_copy_kernel(const MlaCacheBf16CopyParams p) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  const int64_t per_seq = p.seq_pages * p.page_size;
  if (i < p.num_seqs * p.seq_pages && lane == 0) p.out_page_table[i] = int32_t(i);
  if (i >= p.num_seqs * per_seq) return;
  const int64_t s = i / per_seq, pos = i % per_seq;
  const int64_t page = p.page_table[s * p.pt_stride + pos / p.page_size];
  const int64_t slot = page * p.page_size + pos % p.page_size;
  uint4* dst = reinterpret_cast<uint4*>(static_cast<unsigned char*>(p.out) + i * kMlaBf16RowBytes);
  if (page < 0 || slot >= p.num_slots) {
    dst[lane * 2] = dst[lane * 2 + 1] = make_uint4(0, 0, 0, 0);
    if (lane < 8) dst[64 + lane] = make_uint4(0, 0, 0, 0);
    return;
  }
  const unsigned char* src = static_cast<const unsigned char*>(p.cache) + slot * kMlaFp8RowBytes;
  const uint4 codes = *reinterpret_cast<const uint4*>(src + lane * 16);
  const float sc = reinterpret_cast<const float*>(src + kMlaLatent)[lane / 8];
  dst[lane * 2] = mla_detail::dequant_fp8x8(make_uint2(codes.x, codes.y), sc);
  dst[lane * 2 + 1] = mla_detail::dequant_fp8x8(make_uint2(codes.z, codes.w), sc);
  if (lane < 8) dst[64 + lane] = reinterpret_cast<const uint4*>(src + kMlaLatent + 16)[lane];
}

// out[r, h] = sum_s 2^(lse_s - max) O_s / sum_s 2^(lse_s - max) over the splits of (r, h). 128 threads of
// 4 columns; the split weights go through shared memory 128 at a time, and the partial rows are read with
// 8 loads in flight per thread (every split writes its partial row, zeros when it saw no key).
// Launched as a programmatic dependent of the decode kernel (always: it is the same op): it may start while
// the decode grid drains and waits (griddepcontrol.wait) until that grid has finished and its writes are
// visible; then the next kernel may be scheduled (a programmatic one with KernelOptions::pdl).
__global__ void __launch_bounds__(128) sm90_mla_combine_kernel(const MlaDecodeParams p) {
  __shared__ float s_w[128];
  __shared__ float s_max[4];
  pdl_enter();
  const int64_t r = blockIdx.x, h = blockIdx.y;
  const int tid = threadIdx.x, c = tid * 4;
  const float* lse = p.partial_lse + r * p.splits * p.heads + h;
  float mx = -INFINITY;
  for (int s = tid; s < p.splits; s += 128) mx = fmaxf(mx, lse[int64_t(s) * p.heads]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if ((tid & 31) == 0) s_max[tid >> 5] = mx;
  __syncthreads();
  mx = fmaxf(fmaxf(s_max[0], s_max[1]), fmaxf(s_max[2], s_max[3]));
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float den = 0.f;
  const float* part = p.partial_out + (r * p.splits * p.heads + h) * kMlaLatent + c;
  const int64_t split_stride = p.heads * kMlaLatent;
  for (int s0 = 0; s0 < p.splits; s0 += 128) {
    const int n = p.splits - s0 < 128 ? p.splits - s0 : 128;
    if (tid < n) {
      const float l = lse[int64_t(s0 + tid) * p.heads];
      s_w[tid] = mx == -INFINITY || l == -INFINITY ? 0.f : exp2f(l - mx);
    }
    __syncthreads();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      float4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = *reinterpret_cast<const float4*>(part + (s0 + i + j) * split_stride);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float w = s_w[i + j];
        if (w > 0.f) {
          acc.x += w * v[j].x;
          acc.y += w * v[j].y;
          acc.z += w * v[j].z;
          acc.w += w * v[j].w;
          den += w;
        }
      }
    }
    for (; i < n; ++i) {
      const float w = s_w[i];
      if (w > 0.f) {
        const float4 v = *reinterpret_cast<const float4*>(part + (s0 + i) * split_stride);
        acc.x += w * v.x;
        acc.y += w * v.y;
        acc.z += w * v.z;
        acc.w += w * v.w;
        den += w;
      }
    }
    __syncthreads();  // s_w is rewritten by the next group of splits
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
  *reinterpret_cast<float4*>(p.out + (r * p.heads + h) * kMlaLatent + c) =
      make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

}  // namespace

cudaError_t launch_mla_cache_store(const MlaCacheStoreParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int warps = 8;
  sm90_mla_cache_store_kernel<<<unsigned((p.n + warps - 1) / warps), warps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_mla_cache_gather(const MlaCacheGatherParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  const int warps = 8;
  sm90_mla_cache_gather_kernel<<<unsigned((p.n + warps - 1) / warps), warps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

MlaDecodeKernel mla_decode_kernel(const MlaDecodeParams& p) {
  return select_mla_decode_kernel(p.kernel, p.heads, p.rows, p.format == MlaKvFormat::fp8_e4m3);
}

int mla_decode_splits(int64_t rows, int64_t heads, int64_t max_keys, int num_sms, MlaDecodeKernel requested) {
  // v2: 16 heads and 64 keys a block; v6 (the bf16 default: the cache format is not known here; over FP8 v5
  // runs chunks of whole 64-key blocks just as well) 64 keys; v5 32.
  const MlaDecodeKernel k = select_mla_decode_kernel(requested, heads, rows);
  const int64_t rows_per_block = k == MlaDecodeKernel::v2 ? 16 : 64;
  const int64_t tile = k == MlaDecodeKernel::v5 ? 32 : 64;
  const int64_t base = rows * ((heads + rows_per_block - 1) / rows_per_block);
  int64_t max_split = (max_keys + tile - 1) / tile;  // at least one tile per split
  if (max_split > 64) max_split = 64;
  if (max_split <= 1 || base <= 0 || num_sms <= 0) return 1;
  // Modelled time (us): waves x (a fixed ~2 us per block + its KV bytes at one SM's share of HBM,
  // 4.3 TB/s / 132) + the partial rows written and re-read by the combine at full bandwidth.
  const double sm_bytes_per_us = 4.3e6 / 132.0, hbm_bytes_per_us = 4.3e6;
  double best = 1e30;
  int best_s = 1;
  for (int64_t s = 1; s <= max_split; ++s) {
    const int64_t keys = ((max_keys + s - 1) / s + tile - 1) / tile * tile;
    const double waves = double((base * s + num_sms - 1) / num_sms);
    double t = waves * (2.0 + double(keys) * kMlaBf16RowBytes / sm_bytes_per_us);
    if (s > 1) t += double(base * s * rows_per_block) * kMlaLatent * 8.0 / hbm_bytes_per_us;
    if (t < best - 1e-9) {
      best = t;
      best_s = int(s);
    }
  }
  return best_s;
}

cudaError_t launch_mla_cache_bf16_copy(const MlaCacheBf16CopyParams& p, cudaStream_t stream) {
  const int64_t n = p.num_seqs * p.seq_pages * p.page_size;
  if (n == 0) return cudaSuccess;
  if (p.page_size <= 0) return cudaErrorInvalidValue;
  const int warps = 8;
  return launch_pdl(p.pdl, sm90_mla_cache_bf16_copy_kernel, dim3(unsigned((n + warps - 1) / warps)),
                    dim3(warps * 32), 0, stream, p);
}

cudaError_t launch_mla_decode(const MlaDecodeParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.heads == 0) return cudaSuccess;
  if (p.splits < 1 || (p.splits > 1 && (!p.partial_out || !p.partial_lse))) return cudaErrorInvalidValue;
  if (p.page_size <= 0 || p.page_size > 0x7fffffff) return cudaErrorInvalidValue;  // kernels split in 32 bits
  if (p.rows * ((p.heads + 63) / 64) > 0x7fffffff) return cudaErrorInvalidValue;   // v5_grid's x (adjacent)
  const MlaDecodeKernel kernel = mla_decode_kernel(p);
  const cudaError_t e = kernel == MlaDecodeKernel::v2   ? mla_detail::launch_decode_v2(p, stream)
                        : kernel == MlaDecodeKernel::v6 ? mla_detail::launch_decode_v6(p, stream)
                                                        : mla_detail::launch_decode_v5(p, stream);
  if (e != cudaSuccess || p.splits == 1) return e;
  return launch_pdl(true, sm90_mla_combine_kernel, dim3(unsigned(p.rows), unsigned(p.heads)), dim3(128), 0,
                    stream, p);
}

}  // namespace dsaserve::kernels::cuda
