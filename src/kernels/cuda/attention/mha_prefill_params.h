#pragma once
// Parameters of the dense MHA-form prefill attention on tensor cores (sm90_mha_prefill.cu): causal, no
// selection (row t attends keys 0 .. start_pos + t), bf16 keys and values, f32 queries and output.
#include <cuda_runtime.h>

#include <cstdint>

namespace dsaserve::kernels::cuda {

// out[t, h] = softmax_s(scale * q[t, h] . [k_nope[s, h] | k_rope[s]]) v[s, h] over s = 0 .. start_pos + t.
// bf16 rows must start 16-byte aligned (every stride a multiple of 8 values, the bases 16-byte aligned).
struct MhaPrefillParams {
  const float* q;      // [tokens, heads, nope + R] f32, strides q_s0, q_s1 (last dim contiguous)
  const void* k_nope;  // [S, heads, nope] bf16, strides kn_s0, kn_s1 (values)
  const void* k_rope;  // [S, R] bf16, stride kr_s0: shared by every head
  const void* v;       // [S, heads, dv] bf16, strides v_s0, v_s1
  float* out;          // [tokens, heads, dv] f32 contiguous
  int64_t tokens, heads, nope, R, dv, S, start_pos;
  int64_t q_s0, q_s1, kn_s0, kn_s1, kr_s0, v_s0, v_s1;
  float scale;
  int tile_rows;  // query rows of a block: 64 or 128; 0: mha_prefill_tile_rows
};

// Whether launch_mha_prefill has a configuration for these head dims: (nope + R, dv) = (256, 256)
// (GLM-5.x: 192 + 64, 256) or (192, 128) (DeepSeek-V3.2: 128 + 64, 128), nope and R multiples of 8.
bool mha_prefill_supported(int64_t nope, int64_t R, int64_t dv);
// The query rows of a block launch_mha_prefill picks for tile_rows 0: 128 when heads x ceil(tokens / 128)
// blocks fill the SMs, else 64 (twice the blocks, two an SM).
int mha_prefill_tile_rows(int64_t heads, int64_t tokens, int num_sms);
// cudaErrorInvalidValue for unsupported dims or misaligned bf16 rows; requires start_pos + tokens <= S.
cudaError_t launch_mha_prefill(const MhaPrefillParams& p, cudaStream_t stream);

// dst[i, j, k] = bf16(src[i, j, k]) for an f32 [n0, n1, n2] view (strides s0, s1, last dim contiguous) into
// a contiguous bf16 [n0, n1, n2] buffer (the keys and values of launch_mha_prefill).
struct MhaToBf16Params {
  const float* src;  // [n0, n1, n2] strides s0, s1
  void* dst;         // [n0, n1, n2] bf16 contiguous
  int64_t n0, n1, n2, s0, s1;
};
cudaError_t launch_mha_to_bf16(const MhaToBf16Params& p, cudaStream_t stream);

}  // namespace dsaserve::kernels::cuda
