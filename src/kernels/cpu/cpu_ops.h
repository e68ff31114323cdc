#pragma once
// CPU implementations of kernels/ops.h (the reference every other backend is tested against).
// Multi-threaded with parallel_for, fp32 accumulation (fp64 for norm statistics), weights read as stored
// and dequantised per block on the fly.
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cpu {

Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);
struct Fp8Emulation;
// emu: the GPU's FP8 activation arithmetic (see Fp8Emulation below; null or disabled: the reference).
Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
              const Fp8Emulation* emu = nullptr);
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
                    double scale, double weight_scale, const TopkObserver* observer = nullptr);
Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale);
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale);
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p,
                  const TopkObserver* observer = nullptr);
// emu: as linear's, for every expert linear. q (may be null): x's FP8 copy in the GEMM recipe (Fp8Act,
// e.g. a DeepEP FP8 dispatch's codes and scales, x then their dequantised value): with an enabled group128
// emulation the gate / up linears read q's values instead of quantising x (the same values, bit for bit,
// when q is x's fp8_quantize_row128; see moe.cpp); otherwise ignored.
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const Fp8Emulation* emu = nullptr, const Fp8Act* q = nullptr);
void fill_dummy(Tensor& t, const dummy::FillSpec& f);

// ---- emulation of the CUDA backend's FP8 GEMM arithmetic (opt-in; accuracy studies and tests) ----

// Granularity of the activation scale. group128 is what the CUDA backend does
// (kernels/cuda/elementwise/quant.cu: per token, per group of 128 columns); token (one scale per row) and
// tensor (one per linear call) exist only to compare against it; none leaves the input unquantised (only
// bf16_output applies: a baseline).
enum class Fp8ActScale { group128, token, tensor, none };

struct Fp8Emulation {
  bool enabled = false;
  Fp8ActScale scale = Fp8ActScale::group128;
  // Round each product to bf16, as the GPU's FP8 GEMM writes its D matrix in bf16.
  bool bf16_output = true;
  // Restricts the emulation to some weights (ablations); empty: every linear the GPU runs in FP8.
  std::function<bool(const WeightRef&)> select;
  // Independent of `enabled`: the cache writes (mla_kv_write, indexer_k_write) store, still in the f32
  // cache, the values the GPU's FP8 KV cache (--kv-cache-dtype fp8_e4m3) holds: latent rows as
  // mla_latent_fp8_round makes them, index keys as e4m3 codes times one scale per key
  // (indexer_key_fp8.h). A CPU reference for the GPU's FP8 KV cache: its rounding flips index top-k
  // choices at small margins, which then agree.
  bool fp8_kv_cache = false;
};

// Given to linear (and enabled), linear over rows the CUDA backend would run through its FP8 block GEMM
// (fp8_gemm_eligible) first replaces its input by the FP8 value the GPU multiplies (fp8_quant_dequant),
// then multiplies in fp32 with the exactly dequantised weight. The model runs it through the emulating
// backend (kernels/ops.h make_fp8_emulation_backend): the plain CPU backend stays the pure reference.

// Whether the CUDA backend's linear takes its FP8 block GEMM for rows [r0, r1) of `w` (the rule of
// kernels/cuda/gemm/gemm.cpp: an FP8 weight with 128x128 blocks, in features and r0 multiples of 128, r1 - r0
// a multiple of 8). The others run dequantised to bf16 there and are not quantised here.
bool fp8_gemm_eligible(const WeightRef& w, int64_t r0, int64_t r1);
// The activation scale of a group whose largest magnitude is amax: amax / 448 in fp32, 1 when amax is 0.
float fp8_act_scale(float amax);
// q[i] = e4m3(x[i] / s), saturating to +-448 (NaN stays NaN), for i < n: the CUDA kernel's rounding.
void fp8_quantize(const float* x, int64_t n, float s, uint8_t* q);
// One row of K values (K a multiple of 128) quantised as the FP8 GEMMs quantise their input, per group of
// 128: scales[g * scale_stride] = fp8_act_scale(amax of the group), codes[i] = fp8_quantize with that scale.
// fp8_quant_dequant(group128) is, per row, f8e4m3fn_to_f32(codes[i]) * scales[i / 128] of this.
void fp8_quantize_row128(const float* x, int64_t K, uint8_t* codes, float* scales, int64_t scale_stride = 1);
// The values an FP8 latent-cache row holds (the CUDA store kernels' rule,
// kernels/cuda/attention/mla_decode_params.h): in each group of 128 of the first `latent` values, with amax
// the group's largest magnitude, x becomes e4m3_satfinite(x * (448 / amax)) * (amax / 448) (an all-zero group
// stays zero); the values after them (the rope key) are rounded to bf16. rows f32 [n, cols], latent a
// multiple of 128 <= cols -> new f32 [n, cols] contiguous.
Tensor mla_latent_fp8_round(const Tensor& rows, int64_t latent);
// x [T, K] (K a multiple of 128 for group128) -> f32 [T, K] contiguous: every value replaced by
// e4m3_to_f32(q) * s, the value the GPU's FP8 GEMM multiplies. Throws for Fp8ActScale::none.
Tensor fp8_quant_dequant(const Tensor& x, Fp8ActScale scale = Fp8ActScale::group128);

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
