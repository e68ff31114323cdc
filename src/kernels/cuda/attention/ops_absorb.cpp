// MLA's absorbed projections for every head in one cuBLASLt strided-batched GEMM (batch = heads).
//
// kv_b [nh P, L] (P = nope + dv rows per head, nope first) is row-major, so W_UK[h] (rows h P .. h P +
// nope) and W_UV[h] (rows h P + nope .. (h + 1) P) are already a strided batch of [rows, L] matrices with
// batch stride P L: the GEMM reads them in place (an FP8 kv_b as its bf16 copy derived at model load).
// In cuBLASLt's column-major terms, per head h:
//   absorb_q: D[L, T] = A[L, nope] B[nope, T], A = W_UK[h] (lda L), B = q_nope[:, h] (ldb = token stride)
//   absorb_v: D[dv, T] = A^T[dv, L] B[L, T],  A = W_UV[h] (lda L), B = out_lat[:, h]
// with D the output's head slice (ldd = token stride, batch stride = head stride).
//
// Numerics (GemmPrecision::fast): the f32 activations are rounded to bf16 (one conversion kernel into a
// packed [T, nh, K] buffer, absorb.cu), bf16 x bf16 products accumulate in fp32, f32 output; FP8 weights
// enter as their bf16 dequantisation. This is the per-head linear_t path's arithmetic; the per-head v_up
// linear used a two-term bf16 split of the activations (its N <= 512 rule), which this drops (the GPU test
// holds both within 1e-2 of the CPU, per row L2). From KernelOptions::absorb_fused_min_tokens tokens
// absorb_v's arithmetic (absorb_q's measured slower that way) runs in one launch of the f32-activation kernel
// (gemm_f32act_params.h), which rounds the activations to bf16 as it stages them: no conversion pass, no
// packed copy (at 4,096 tokens and 64 heads the pass reads 201 / 537 MB and writes 101 / 268 MB for absorb_q
// / absorb_v). GemmPrecision::fp32: f32 weights (gemm_weight_f32: the copy the fp32 linears use, so kv_b is
// held in f32 once) and the f32 activations read in place.
#include <cublasLt.h>

#include <array>
#include <map>
#include <mutex>
#include <string>

#include "kernels/cuda/attention/absorb_params.h"
#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/gemm_f32act_params.h"
#include "kernels/cuda/gemm/lt_handle.h"

namespace dsaserve::kernels::cuda {

namespace {

#define DSA_ABSORB_LT_CHECK(expr)                                                                 \
  do {                                                                                            \
    cublasStatus_t _s = (expr);                                                                   \
    if (_s != CUBLAS_STATUS_SUCCESS) ::dsaserve::fail("cuBLASLt error {} in {}", int(_s), #expr); \
  } while (0)

constexpr int64_t kWorkspace = int64_t(4) << 20;

// f32, trans_a, M, N, K, lda, ldb, ldd, batch, stride a, b, d, alignment a, b, d (bytes).
using Key = std::array<int64_t, 15>;

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
};

// The absorbed GEMMs' state of one device (per_device_state): the device's cuBLASLt handle (shared with
// the linears), a workspace, the plans.
struct State {
  State() : handle(device_lt_handle()), workspace(Tensor::empty({kWorkspace}, DType::u8, Device::cuda)) {}
  cublasLtHandle_t handle = nullptr;
  Tensor workspace;  // from the caching allocator
  std::mutex mu;
  std::map<Key, Plan> plans;
};

State& state() { return per_device_state<State>(); }

int64_t align_of(const void* p, std::initializer_list<int64_t> byte_strides) {
  int64_t a = 256;
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto fits = [&](int64_t x) {
    if (u % uint64_t(x) != 0) return false;
    for (int64_t s : byte_strides)
      if (s % x != 0) return false;
    return true;
  };
  while (a > 1 && !fits(a)) a /= 2;
  return a;
}

void set_batch(cublasLtMatrixLayout_t l, int32_t batch, int64_t stride) {
  DSA_ABSORB_LT_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
  DSA_ABSORB_LT_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &stride, sizeof stride));
}

const Plan& plan_for(const Key& k) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.plans.find(k);
  if (it != s.plans.end()) return it->second;
  const bool f32 = k[0] != 0, trans_a = k[1] != 0;
  const int64_t M = k[2], N = k[3], K = k[4], lda = k[5], ldb = k[6], ldd = k[7];
  const int32_t batch = int32_t(k[8]);
  const cudaDataType_t in = f32 ? CUDA_R_32F : CUDA_R_16BF;
  Plan p;
  DSA_ABSORB_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  DSA_ABSORB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DSA_ABSORB_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  DSA_ABSORB_LT_CHECK(
      cublasLtMatrixLayoutCreate(&p.a, in, uint64_t(trans_a ? K : M), uint64_t(trans_a ? M : K), lda));
  DSA_ABSORB_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, uint64_t(K), uint64_t(N), ldb));
  DSA_ABSORB_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_32F, uint64_t(M), uint64_t(N), ldd));
  set_batch(p.a, batch, k[9]);
  set_batch(p.b, batch, k[10]);
  set_batch(p.d, batch, k[11]);
  cublasLtMatmulPreference_t pref = nullptr;
  DSA_ABSORB_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = uint64_t(kWorkspace);
  DSA_ABSORB_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t aa = uint32_t(k[12]), ab = uint32_t(k[13]), ad = uint32_t(k[14]);
  DSA_ABSORB_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa));
  DSA_ABSORB_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab));
  DSA_ABSORB_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad));
  DSA_ABSORB_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad));
  cublasLtMatmulHeuristicResult_t h{};
  int got = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(s.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &h, &got);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = st == CUBLAS_STATUS_SUCCESS && got > 0;
  if (p.ok) p.algo = h.algo;
  return s.plans.emplace(k, p).first->second;
}

// The weight in the GEMM's input type: bf16 and f32 weights as they are; in fp32 mode gemm_weight_f32's
// copy (shared with the linears); FP8 in fast mode its derived bf16 copy (made at model load), else one
// dequantised for this call.
Tensor dense_weight(const WeightRef& w, bool f32) {
  const DType dt = w.weight.dtype();
  if (f32) return gemm_weight_f32(w);
  if (dt == DType::bf16 || dt == DType::f32) return w.weight;
  if (w.derived && w.derived->bf16.defined()) return w.derived->bf16;
  DSA_CHECK(w.scale_inv.defined() && w.scale_inv.device() == Device::cuda &&
                w.scale_inv.dtype() == DType::f32 && w.scale_inv.is_contiguous(),
            "absorb: fp8 kv_b {} needs a CUDA f32 scale_inv", w.weight.describe());
  Tensor out = Tensor::empty({w.rows(), w.cols()}, DType::bf16, Device::cuda);
  check_launch(launch_dequant_fp8({static_cast<const uint8_t*>(w.weight.raw_data()),
                                   static_cast<const float*>(w.scale_inv.raw_data()), out.raw_data(),
                                   w.rows(), w.cols(), w.block_n, w.block_k, false},
                                  op_stream()),
               "absorb: dequantise kv_b");
  return out;
}

// The product of many tokens in one launch of the f32-activation kernel (gemm_f32act_params.h: x rounded
// to bf16 as it is staged, no conversion pass or packed copy); same operands as batched() below. With `q`
// (absorb_v) the launch also writes the output's FP8 copy as the FP8 linears read [T, nh M] (q_rows rows:
// gemm.h fp8_act_rows) where the output is contiguous and M a multiple of 128; q is left empty otherwise.
// False when the views or alignments do not fit it (nothing launched).
bool batched_fused(const Tensor& x, const Tensor& dense, int64_t a_offset, int64_t a_stride, bool trans_a,
                   int64_t M, Tensor& out, Fp8Act* q, int64_t q_rows, const char* what, bool pdl) {
  const int64_t nh = x.size(1), L = dense.size(1);
  if (dense.dtype() != DType::bf16 || x.dtype() != DType::f32 || x.stride(2) != 1) return false;
  F32ActGemmParams p{};
  p.x = static_cast<const float*>(x.raw_data());
  p.x_ld = x.stride(0);
  p.x_bs = x.stride(1);
  // absorb_q (trans_a false): W_UK[h] is [K = nope][N = L], rows L apart; absorb_v (trans_a): W_UV[h] is
  // [N = dv][K = L], rows L apart.
  p.seg[0] = {static_cast<const uint16_t*>(dense.raw_data()) + a_offset, L, out.data<float>(), out.stride(0),
              M};
  p.segments = 1;
  p.w_bs = a_stride;
  p.out_bs = out.stride(1);
  p.T = x.size(0);
  p.K = x.size(2);
  p.batch = int(nh);
  p.split = false;
  p.trans_w = !trans_a;
  p.pdl = pdl;
  if (!f32act_gemm_supported(p)) return false;
  Fp8Act copy;
  if (q != nullptr && out.stride(1) == M && out.stride(0) == nh * M && (nh * M) % 128 == 0) {
    const int64_t cols = nh * M;
    F32ActGemmParams pq = p;
    copy = empty_fp8_act(p.T, q_rows, cols);
    pq.q_codes = copy.codes.data_u8();
    pq.q_scales = copy.scales.data<float>();
    pq.q_ld = cols;
    pq.q_bs = M;
    pq.q_rows = q_rows;
    if (f32act_gemm_supported(pq)) {
      p = pq;
    } else {
      copy = Fp8Act{};
    }
  }
  check_launch(launch_f32act_gemm(p, op_stream()), what);
  if (q != nullptr) *q = std::move(copy);
  return true;
}

// One batched product over the heads. x: the activations [T, nh, K] f32; the weight operand of head h
// starts at dense + a_offset + h * a_stride elements; out [T, nh, M] f32. From `fused_min_tokens` tokens
// (> 0) a bf16 weight runs batched_fused. False when the views do not fit (heads not evenly strided) or
// cuBLASLt has no algorithm: nothing is launched then. pdl: the activations' conversion as a programmatic
// dependent launch (KernelOptions::pdl).
bool batched(const Tensor& x, const Tensor& dense, int64_t a_offset, int64_t a_stride, bool trans_a,
             int64_t M, Tensor& out, int64_t fused_min_tokens, Fp8Act* q, int64_t q_rows, const char* what,
             bool pdl) {
  const int64_t T = x.size(0), nh = x.size(1), K = x.size(2), L = dense.size(1);
  if (T == 0) return true;
  if (x.stride(2) != 1 || x.stride(0) != nh * x.stride(1) || out.device() != Device::cuda ||
      out.dtype() != DType::f32 || out.stride(2) != 1)
    return false;
  if (fused_min_tokens > 0 && T >= fused_min_tokens &&
      batched_fused(x, dense, a_offset, a_stride, trans_a, M, out, q, q_rows, what, pdl))
    return true;
  const bool f32 = dense.dtype() == DType::f32;
  const int64_t es = f32 ? 4 : 2;
  Tensor packed;  // bf16 [T, nh, K]: the activations rounded to the GEMM's input type
  const void* b_ptr = x.raw_data();
  int64_t ldb = x.stride(0), sb = x.stride(1);
  if (!f32) {
    packed = Tensor::empty({T, nh, K}, DType::bf16, Device::cuda);
    b_ptr = packed.raw_data();
    ldb = nh * K;
    sb = K;
  }
  const void* a_ptr = static_cast<const char*>(dense.raw_data()) + a_offset * es;
  const int64_t ldd = out.stride(0), sd = out.stride(1);
  const Plan& pl = plan_for(
      Key{f32, trans_a, M, T, K, L, ldb, ldd, nh, a_stride, sb, sd, align_of(a_ptr, {L * es, a_stride * es}),
          align_of(b_ptr, {ldb * es, sb * es}), align_of(out.raw_data(), {ldd * 4, sd * 4})});
  if (!pl.ok) return false;
  if (!f32) {
    const float* xp = static_cast<const float*>(x.raw_data());
    CastBf16Params c{xp, packed.data_u16(), T * nh, K, x.stride(1)};
    c.pdl = pdl;
    if (K % 4 == 0 && x.stride(1) % 4 == 0 && reinterpret_cast<uintptr_t>(xp) % 16 == 0) {
      check_launch(launch_cast_bf16_x4(c, op_stream()), what);
    } else {  // the scalar row conversion (same rounding)
      RowsParams p{};
      p.src = xp;
      p.dst = packed.raw_data();
      p.rows = T * nh;
      p.cols = K;
      p.src_stride = x.stride(1);
      p.dst_stride = K;
      p.dst_bf16 = true;
      p.op = RowOp::copy;
      p.page_size = 1;
      p.pdl = pdl;
      check_launch(launch_rows(p, op_stream()), what);
    }
  }
  State& s = state();
  const float alpha = 1.0f, beta = 0.0f;
  DSA_ABSORB_LT_CHECK(cublasLtMatmul(s.handle, pl.desc, &alpha, a_ptr, pl.a, b_ptr, pl.b, &beta,
                                     out.raw_data(), pl.d, out.raw_data(), pl.d, &pl.algo,
                                     s.workspace.raw_data(), size_t(kWorkspace), op_stream()));
  return true;
}

// The product of a decode batch (T <= KernelOptions::absorb_small_max_tokens) in one launch of the
// small-T kernel (absorb_params.h) over a bf16 weight: the activations read as they are. x: [T, nh, K] f32;
// head h's weight operand at dense + a_offset + h a_stride; out [T, nh, M] f32. rows_form: absorb_q's W_UK
// ([K, M] per head), else absorb_v's W_UV ([M, K]). False when the shapes or alignments do not fit it
// (nothing launched).
bool batched_small(const Tensor& x, const Tensor& dense, int64_t a_offset, int64_t a_stride, bool rows_form,
                   int64_t M, Tensor& out, const char* what, bool pdl) {
  if (dense.dtype() != DType::bf16 || x.dtype() != DType::f32 || x.stride(2) != 1 ||
      out.device() != Device::cuda || out.dtype() != DType::f32 || out.stride(2) != 1)
    return false;
  AbsorbSmallParams p{};
  p.w = static_cast<const uint16_t*>(dense.raw_data()) + a_offset;
  p.w_ld = dense.size(1);
  p.w_bs = a_stride;
  p.x = static_cast<const float*>(x.raw_data());
  p.x_ts = x.stride(0);
  p.x_hs = x.stride(1);
  p.out = out.data<float>();
  p.out_ts = out.stride(0);
  p.out_hs = out.stride(1);
  p.T = x.size(0);
  p.heads = x.size(1);
  p.K = x.size(2);
  p.N = M;
  p.rows_form = rows_form;
  p.pdl = pdl;
  if (!absorb_small_supported(p)) return false;  // not this kernel's shapes: the caller's path runs
  check_launch(launch_absorb_small(p, op_stream()), what);
  return true;
}

void check_out(const Tensor& out, int64_t T, int64_t nh, int64_t n, const char* what) {
  DSA_CHECK(out.defined() && out.dim() == 3 && out.size(0) == T && out.size(1) == nh && out.size(2) == n,
            "{}: output {} should be [{}, {}, {}]", what,
            out.defined() ? out.describe() : std::string("nothing"), T, nh, n);
}

bool weight_ok(const WeightRef& w) {
  const DType dt = w.weight.dtype();
  return w.weight.device() == Device::cuda && w.weight.is_contiguous() &&
         (dt == DType::bf16 || dt == DType::f32 || dt == DType::f8e4m3fn);
}

}  // namespace

bool absorb_q_batched(const Tensor& q_nope, const WeightRef& kv_b, Tensor& out, const KernelOptions& o) {
  const AbsorbDims a = absorb_dims(q_nope, kv_b, true, 0);
  check_out(out, a.tokens, a.heads, a.latent, "absorb_q");
  if (!weight_ok(kv_b) || q_nope.device() != Device::cuda) return false;
  const bool f32 = o.gemm == GemmPrecision::fp32;
  const Tensor w = dense_weight(kv_b, f32);
  // D[L, T] = W_UK[h] (column-major [L, nope], lda L) . q_nope[:, h]
  // (absorb_q stays on cuBLASLt's strided batch at every size: the fused launch measured slower on the H100,
  // 448 vs 365 us at 4,096 tokens, 1,723 vs 1,401 at 16,384; absorb_v gains, 408 vs 492.)
  if (!f32 && a.tokens > 0 && a.tokens <= o.absorb_small_max_tokens &&
      batched_small(q_nope, w, 0, a.per_head * a.latent, true, a.latent, out, "absorb_q", o.pdl))
    return true;
  return batched(q_nope, w, 0, a.per_head * a.latent, false, a.latent, out, 0, nullptr, 0, "absorb_q", o.pdl);
}

bool absorb_v_batched(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor& out,
                      const KernelOptions& o, Fp8Act* q) {
  if (q != nullptr) *q = Fp8Act{};
  const AbsorbDims a = absorb_dims(out_lat, kv_b, false, dv);
  check_out(out, a.tokens, a.heads, a.dv, "absorb_v");
  if (!weight_ok(kv_b) || out_lat.device() != Device::cuda) return false;
  const bool f32 = o.gemm == GemmPrecision::fp32;
  const Tensor w = dense_weight(kv_b, f32);
  // D[dv, T] = W_UV[h]^T (stored column-major [L, dv], lda L) . out_lat[:, h]
  if (!f32 && a.tokens > 0 && a.tokens <= o.absorb_small_max_tokens &&
      batched_small(out_lat, w, a.nope * a.latent, a.per_head * a.latent, false, a.dv, out, "absorb_v",
                    o.pdl))
    return true;
  return batched(out_lat, w, a.nope * a.latent, a.per_head * a.latent, true, a.dv, out,
                 o.absorb_fused_min_tokens, f32 ? nullptr : q,
                 fp8_act_rows(a.tokens, o.gemm_fp8_small_max_tokens), "absorb_v", o.pdl);
}

}  // namespace dsaserve::kernels::cuda
