#pragma once
// CPU implementations of kernels/ops.h (the reference every other backend is tested against).
// Multi-threaded with parallel_for, fp32 accumulation (fp64 for norm statistics), weights read as stored
// and dequantised per block on the fly.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cpu {

Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out);
Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out);
void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p);
Tensor silu_mul(const Tensor& gate, const Tensor& up);
Tensor argmax(const Tensor& x);
void add_inplace(Tensor& a, const Tensor& b);
void copy_rows(Tensor& dst, const Tensor& src);
Tensor gather_rows(const Tensor& x, const Tensor& idx);
void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src);
Tensor paged_gather(const PagedSeq& seq, int64_t n);
Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale);
Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale);
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale);
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p);
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts);

// ---- helpers shared by the CPU kernels ----

// A 2-D f32 row view: rows of `cols` contiguous floats, `stride` floats apart.
struct Rows {
  float* p = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
  float* row(int64_t r) const { return p + r * stride; }
};
// Checks `t` is a CPU f32 2-D tensor with a contiguous last dimension.
Rows as_rows(const Tensor& t, const char* what);

// A 3-D f32 view [n0, n1, n2] with a contiguous last dimension.
struct Rows3 {
  float* p = nullptr;
  int64_t n0 = 0, n1 = 0, n2 = 0, s0 = 0, s1 = 0;
  float* at(int64_t i, int64_t j) const { return p + i * s0 + j * s1; }
};
Rows3 as_rows3(const Tensor& t, const char* what);

// Reads an i32 CPU tensor (1-D, contiguous) as a pointer.
const int32_t* i32_data(const Tensor& t, const char* what);

// Dequantises W[r][c0:c1] of a weight (bf16 | f32 | fp8 with block scales) into out[0 : c1-c0].
void weight_row(const WeightRef& w, int64_t r, int64_t c0, int64_t c1, float* out);
// Validates a WeightRef (dtype, 2-D, contiguous, scale shape for fp8).
void check_weight(const WeightRef& w, const char* what);

// The dot product of n floats with several independent accumulators (vectorisable, fp32).
float dot(const float* a, const float* b, int64_t n);
// out[t * so + r] = x[t * sx : +K] . w[r * K : +K] for t < T, r < N: a register-blocked product of f32
// rows (2 inputs x 4 weight rows per step). Built for AVX2 and baseline x86-64 (chosen at load time);
// both give bit-identical results (fixed accumulation order, no FMA contraction).
void gemm_nt(const float* x, int64_t sx, int64_t T, const float* w, int64_t N, int64_t K, float* out,
             int64_t so);

// Slot of position `pos` of a paged request.
inline int64_t paged_slot(const int32_t* pages, int64_t page_size, int64_t pos) {
  return int64_t(pages[pos / page_size]) * page_size + pos % page_size;
}

}  // namespace dsaserve::kernels::cpu
