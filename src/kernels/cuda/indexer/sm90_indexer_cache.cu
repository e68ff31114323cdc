// The index-key cache in its kernel formats: the quantising FP8 store and the gather back to f32.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/indexer/indexer_topk_params.h"
#include "kernels/cuda/indexer/sm90_indexer_fp8.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 8;

// One warp per source row.
__global__ void __launch_bounds__(kWarps * 32) sm90_indexer_key_store_kernel(const IndexerKeyStoreParams p) {
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= p.n) return;
  const int64_t slot = p.slots[i];
  if (slot < 0 || slot >= p.num_slots) return;
  const float* src = p.src + i * p.src_stride + lane * 4;
  const float v[4] = {src[0], src[1], src[2], src[3]};
  indexer_key_store_fp8_warp(v, lane, p.cache, p.num_slots, slot);
}

// One warp per position; slots outside the cache give zeros.
__global__ void __launch_bounds__(kWarps * 32)
    sm90_indexer_key_gather_kernel(const IndexerKeyGatherParams p) {
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (i >= p.n) return;
  const int64_t slot = int64_t(p.page_table[i / p.page_size]) * p.page_size + i % p.page_size;
  float* dst = p.out + i * kIndexerDim;
  if (slot < 0 || slot >= p.num_slots) {
    for (int c = lane; c < kIndexerDim; c += 32) dst[c] = 0.f;
    return;
  }
  if (p.format == IndexerKeyFormat::bf16) {
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(p.cache) + slot * kIndexerDim;
    for (int c = lane; c < kIndexerDim; c += 32) dst[c] = __bfloat162float(src[c]);
    return;
  }
  const unsigned char* base = static_cast<const unsigned char*>(p.cache);
  const float s = reinterpret_cast<const float*>(base + p.num_slots * kIndexerDim)[slot];
  for (int c = lane; c < kIndexerDim; c += 32) {
    __nv_fp8_e4m3 code;
    code.__x = base[slot * kIndexerDim + c];
    dst[c] = float(code) * s;
  }
}

}  // namespace

cudaError_t launch_indexer_key_store(const IndexerKeyStoreParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  sm90_indexer_key_store_kernel<<<unsigned((p.n + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_indexer_key_gather(const IndexerKeyGatherParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  sm90_indexer_key_gather_kernel<<<unsigned((p.n + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
