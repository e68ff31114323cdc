// Plain attention kernels (the stand-ins until the fast ones land): one block of kWarps warps per
// (token, head); each warp walks every kWarps-th key with an online softmax, the lanes splitting the head
// dimensions (lane + 32 j); the warps merge their partial results through shared memory at the end.
#include "kernels/cuda/attention/attention_params.h"
#include "kernels/cuda/common/device_util.cuh"

namespace dsaserve::kernels::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kQ = 24;  // query/key values per lane: dims <= 768
constexpr int kO = 16;  // output values per lane: dims <= 512

// Number of candidate keys of row t and the position of candidate j (-1: skip).
__device__ __forceinline__ int64_t num_candidates(const KeySelection& k, int64_t t) {
  return k.sel ? k.sel_k : k.start_pos + t + 1;
}
__device__ __forceinline__ int64_t candidate(const KeySelection& k, int64_t t, int64_t j) {
  if (!k.sel) return j;
  const int64_t s = k.sel[t * k.sel_stride + j];
  return (s < 0 || s > k.start_pos + t) ? -1 : s;
}

struct Softmax {
  float m, l;  // running maximum and sum (l == 0: no key yet)
  float acc[kO];
};

// Merges the warps' (m, l, acc) and writes out[0..n) = acc / l; zeros when no key was visible.
__device__ void merge_and_store(Softmax& st, int64_t n, float* out) {
  __shared__ float sm[kWarps], sl[kWarps];
  __shared__ float sacc[kWarps][kO * 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    sm[w] = st.m;
    sl[w] = st.l;
  }
#pragma unroll
  for (int j = 0; j < kO; ++j) sacc[w][lane + 32 * j] = st.acc[j];
  __syncthreads();
  float M = sm[0];
  for (int i = 1; i < kWarps; ++i) M = fmaxf(M, sm[i]);
  float L = 0.0f, f[kWarps];
  for (int i = 0; i < kWarps; ++i) {
    f[i] = sl[i] > 0.0f ? expf(sm[i] - M) : 0.0f;
    L += sl[i] * f[i];
  }
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    float v = 0.0f;
    for (int i = 0; i < kWarps; ++i) v += sacc[i][c] * f[i];
    out[c] = L > 0.0f ? v / L : 0.0f;
  }
}

__device__ __forceinline__ void online_update(Softmax& st, float score, const float* vals) {
  const float m_new = fmaxf(st.m, score);
  const float corr = st.l > 0.0f ? expf(st.m - m_new) : 0.0f;
  const float pj = expf(score - m_new);
  st.l = st.l * corr + pj;
#pragma unroll
  for (int j = 0; j < kO; ++j) st.acc[j] = st.acc[j] * corr + pj * vals[j];
  st.m = m_new;
}

__global__ void __launch_bounds__(kWarps * 32) sm90_mla_absorbed_kernel(MlaParams p) {
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t D = p.L + p.R;
  float q[kQ];
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const int64_t d = lane + 32 * j;
    q[j] = d < p.L ? p.q_lat[t * p.ql_s0 + h * p.ql_s1 + d]
           : d < D ? p.q_rope[t * p.qr_s0 + h * p.qr_s1 + (d - p.L)]
                   : 0.0f;
  }
  Softmax st;
  st.m = -__int_as_float(0x7f800000);
  st.l = 0.0f;
#pragma unroll
  for (int j = 0; j < kO; ++j) st.acc[j] = 0.0f;
  const int64_t n = num_candidates(p.keys, t);
  for (int64_t j = w; j < n; j += kWarps) {
    const int64_t s = candidate(p.keys, t, j);
    if (s < 0) continue;
    const int64_t page = p.page_table[s / p.page_size];
    const int64_t slot = page * p.page_size + s % p.page_size;
    if (page < 0 || slot >= p.num_slots) continue;
    const float* k = p.cache + slot * p.cache_stride;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kQ; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) part += q[i] * k[d];
    }
    const float score = warp_sum(part) * p.scale;
    float vals[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) {
      const int64_t d = lane + 32 * i;
      vals[i] = d < p.L ? k[d] : 0.0f;
    }
    online_update(st, score, vals);
  }
  merge_and_store(st, p.L, p.out + (t * p.heads + h) * p.L);
}

__global__ void __launch_bounds__(kWarps * 32) sm90_mha_kernel(MhaParams p) {
  const int64_t t = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t D = p.nope + p.R;
  float q[kQ];
#pragma unroll
  for (int j = 0; j < kQ; ++j) {
    const int64_t d = lane + 32 * j;
    q[j] = d < D ? p.q[t * p.q_s0 + h * p.q_s1 + d] : 0.0f;
  }
  Softmax st;
  st.m = -__int_as_float(0x7f800000);
  st.l = 0.0f;
#pragma unroll
  for (int j = 0; j < kO; ++j) st.acc[j] = 0.0f;
  const int64_t n = num_candidates(p.keys, t);
  for (int64_t j = w; j < n; j += kWarps) {
    const int64_t s = candidate(p.keys, t, j);
    if (s < 0 || s >= p.S) continue;
    const float* kn = p.k_nope + s * p.kn_s0 + h * p.kn_s1;
    const float* kr = p.k_rope + s * p.kr_s0;
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kQ; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < p.nope) {
        part += q[i] * kn[d];
      } else if (d < D) {
        part += q[i] * kr[d - p.nope];
      }
    }
    const float score = warp_sum(part) * p.scale;
    const float* v = p.v + s * p.v_s0 + h * p.v_s1;
    float vals[kO];
#pragma unroll
    for (int i = 0; i < kO; ++i) {
      const int64_t d = lane + 32 * i;
      vals[i] = d < p.dv ? v[d] : 0.0f;
    }
    online_update(st, score, vals);
  }
  merge_and_store(st, p.dv, p.out + (t * p.heads + h) * p.dv);
}

}  // namespace

cudaError_t launch_mla_absorbed(const MlaParams& p, cudaStream_t stream) {
  if (p.tokens * p.heads == 0) return cudaSuccess;
  if (p.L + p.R > 32 * kQ || p.L > 32 * kO) return cudaErrorInvalidValue;
  sm90_mla_absorbed_kernel<<<unsigned(p.tokens * p.heads), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_mha(const MhaParams& p, cudaStream_t stream) {
  if (p.tokens * p.heads == 0) return cudaSuccess;
  if (p.nope + p.R > 32 * kQ || p.dv > 32 * kO) return cudaErrorInvalidValue;
  sm90_mha_kernel<<<unsigned(p.tokens * p.heads), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace dsaserve::kernels::cuda
