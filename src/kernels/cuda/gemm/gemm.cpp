#include "kernels/cuda/gemm/gemm.h"

#include <cublasLt.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <optional>

#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/gemm/gemm_f32act_params.h"
#include "kernels/cuda/gemm/gemm_small_params.h"
#include "kernels/cuda/gemm/lt_handle.h"

namespace dsaserve::kernels::cuda {

namespace {

#define DSA_LT_CHECK(expr)                                                                        \
  do {                                                                                            \
    cublasStatus_t _s = (expr);                                                                   \
    if (_s != CUBLAS_STATUS_SUCCESS) ::dsaserve::fail("cuBLASLt error {} in {}", int(_s), #expr); \
  } while (0)

constexpr size_t kWorkspace = size_t(32) << 20;
// Heuristic candidates kept per plan; products of at least kTuneFlops are timed once, candidate by
// candidate, on their first call (outside graph capture) and the fastest is kept.
constexpr int kCandidates = 8;
constexpr double kTuneFlops = 2e10;

// Column-major view of the row-major product: D[M, N] (M = output features, N = tokens, ld = row stride
// of Y) = op(A)[M, K] B[K, N].
// fp8_tn: FP8 operands, bf16 D; fp8_tn_f32: FP8 operands, f32 D (no rounding, no widening pass).
enum class Kind : int64_t { bf16_tn, bf16_nn, f32_tn, f32_nn, fp8_tn, fp8_tn_f32 };
using PlanKey = std::array<int64_t, 10>;  // kind, M, N, K, lda, ldb, ldd, align a, b, d

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's best few, best first
  bool tuned = false;                            // algo picked by timing the candidates
  bool ok = false;
};

// The linears' cuBLASLt state of one device (per_device_state): the device's one cuBLASLt handle (the
// absorbed-MLA GEMMs use it too: lt_handle()), a workspace, the plans. What is derived from a weight
// travels with it (WeightRef::derived: derive_gemm_weight), never in a table here.
struct Lt {
  Lt() {
    DSA_LT_CHECK(cublasLtCreate(&handle));
    DSA_CUDA_CHECK(cudaMalloc(&workspace, kWorkspace));
  }
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::map<PlanKey, Plan> plans;
  uint32_t* small_counters = nullptr;  // kFp8SmallCounters zeros for the split small-T kernel
  GemmStats stats;
};

Lt& lt() { return per_device_state<Lt>(); }

int64_t alignment(const void* p, int64_t ld_bytes) {
  int64_t a = 256;
  const auto u = reinterpret_cast<uintptr_t>(p);
  while (a > 1 && (u % uint64_t(a) != 0 || ld_bytes % a != 0)) a /= 2;
  return a;
}

const Plan& plan_for(const PlanKey& key) {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.plans.find(key);
  if (it != l.plans.end()) return it->second;
  const Kind kind = Kind(key[0]);
  const int64_t M = key[1], N = key[2], K = key[3], lda = key[4], ldb = key[5], ldd = key[6];
  const bool fp8 = kind == Kind::fp8_tn || kind == Kind::fp8_tn_f32;
  const bool trans_a = kind == Kind::bf16_tn || kind == Kind::f32_tn || fp8;
  cudaDataType_t in_type = CUDA_R_16BF, d_type = CUDA_R_32F;
  if (kind == Kind::f32_tn || kind == Kind::f32_nn) in_type = CUDA_R_32F;
  if (fp8) {
    in_type = CUDA_R_8F_E4M3;
    d_type = kind == Kind::fp8_tn ? CUDA_R_16BF : CUDA_R_32F;
  }
  Plan p;
  DSA_LT_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (fp8) {
    const cublasLtMatmulMatrixScale_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                                      bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof am));
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof bm));
    // The heuristic wants scale pointers set (as in the verified probe); each call sets the real ones.
    const void* heuristic_scale_ptr = l.workspace;
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &heuristic_scale_ptr, sizeof heuristic_scale_ptr));
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &heuristic_scale_ptr, sizeof heuristic_scale_ptr));
  }
  DSA_LT_CHECK(
      cublasLtMatrixLayoutCreate(&p.a, in_type, uint64_t(trans_a ? K : M), uint64_t(trans_a ? M : K), lda));
  DSA_LT_CHECK(cublasLtMatrixLayoutCreate(&p.b, in_type, uint64_t(K), uint64_t(N), ldb));
  DSA_LT_CHECK(cublasLtMatrixLayoutCreate(&p.d, d_type, uint64_t(M), uint64_t(N), ldd));
  cublasLtMatmulPreference_t pref = nullptr;
  DSA_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspace;
  DSA_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const uint32_t aa = uint32_t(key[7]), ab = uint32_t(key[8]), ad = uint32_t(key[9]);
  if (!fp8) {  // FP8 operands are fresh 256-byte aligned buffers: the probe's defaults
    DSA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                                      sizeof aa));
    DSA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                                      sizeof ab));
    DSA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad,
                                                      sizeof ad));
    DSA_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad,
                                                      sizeof ad));
  }
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> h{};
  int got = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(l.handle, p.desc, p.a, p.b, p.d, p.d, pref, kCandidates, h.data(), &got);
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = s == CUBLAS_STATUS_SUCCESS && got > 0;
  if (p.ok) {
    p.algo = h[0].algo;
    for (int i = 0; i < got; ++i)
      if (h[size_t(i)].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(h[size_t(i)].algo);
  } else {
    ++l.stats.failed_plans;
    l.stats.last_failure =
        fmt::format("kind {} M {} N {} K {} ld {}/{}/{} align {}/{}/{}: status {}, {} algorithms", key[0], M,
                    N, K, lda, ldb, ldd, key[7], key[8], key[9], int(s), got);
  }
  ++l.stats.plans;
  return l.plans.emplace(key, p).first->second;
}

// D = alpha op(A) B + beta D with `algo`.
cublasStatus_t launch(const Plan& p, const cublasLtMatmulAlgo_t& algo, const void* A, const void* B, void* D,
                      float beta, const float* a_scale, const float* b_scale) {
  Lt& l = lt();
  if (a_scale) {
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                sizeof a_scale));
    DSA_LT_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                sizeof b_scale));
  }
  const float alpha = 1.0f;
  return cublasLtMatmul(l.handle, p.desc, &alpha, A, p.a, B, p.b, &beta, D, p.d, D, p.d, &algo, l.workspace,
                        kWorkspace, op_stream());
}

// Times each heuristic candidate of a large product once (3 runs each after one warm-up, CUDA events)
// and keeps the fastest. Not while the stream is being captured into a graph (that needs a host wait).
void tune(const Plan& cp, double flops, const void* A, const void* B, void* D, const float* a_scale,
          const float* b_scale) {
  if (cp.tuned || flops < kTuneFlops || cp.candidates.size() < 2) return;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(op_stream(), &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  Plan& p = const_cast<Plan&>(cp);  // plans live in the map; only algo / tuned change, under the lock
  if (p.tuned) return;
  cudaEvent_t e0, e1;
  DSA_CUDA_CHECK(cudaEventCreate(&e0));
  DSA_CUDA_CHECK(cudaEventCreate(&e1));
  float best = -1.0f;
  for (const cublasLtMatmulAlgo_t& a : p.candidates) {
    if (launch(p, a, A, B, D, 0.0f, a_scale, b_scale) != CUBLAS_STATUS_SUCCESS) continue;
    DSA_CUDA_CHECK(cudaEventRecord(e0, op_stream()));
    bool ok = true;
    for (int i = 0; i < 3 && ok; ++i)
      ok = launch(p, a, A, B, D, 0.0f, a_scale, b_scale) == CUBLAS_STATUS_SUCCESS;
    DSA_CUDA_CHECK(cudaEventRecord(e1, op_stream()));
    DSA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    DSA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (ok && (best < 0.0f || ms < best)) {
      best = ms;
      p.algo = a;
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  p.tuned = true;
  ++l.stats.tuned_plans;
}

void run(const Plan& p, const void* A, const void* B, void* D, float beta, const float* a_scale = nullptr,
         const float* b_scale = nullptr) {
  DSA_LT_CHECK(launch(p, p.algo, A, B, D, beta, a_scale, b_scale));
}

void count(int64_t GemmStats::*field) {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  ++(l.stats.*field);
}

void check_weight(const WeightRef& w, const char* what) {
  DSA_CHECK(w.weight.defined() && w.weight.device() == Device::cuda && w.weight.dim() == 2 &&
                w.weight.is_contiguous(),
            "{}: weight must be a contiguous 2-D CUDA tensor, got {}", what,
            w.weight.defined() ? w.weight.describe() : "undefined");
  const DType dt = w.weight.dtype();
  if (dt == DType::f8e4m3fn) {
    DSA_CHECK(w.block_n > 0 && w.block_k > 0, "{}: bad fp8 block size", what);
    const int64_t sn = (w.rows() + w.block_n - 1) / w.block_n, sk = (w.cols() + w.block_k - 1) / w.block_k;
    DSA_CHECK(w.scale_inv.defined() && w.scale_inv.device() == Device::cuda &&
                  w.scale_inv.dtype() == DType::f32 && w.scale_inv.is_contiguous() &&
                  w.scale_inv.dim() == 2 && w.scale_inv.size(0) == sn && w.scale_inv.size(1) == sk,
              "{}: fp8 weight {} needs a CUDA f32 scale_inv [{}, {}]", what, w.weight.describe(), sn, sk);
  } else {
    DSA_CHECK(dt == DType::bf16 || dt == DType::f32, "{}: unsupported weight dtype {}", what, dtype_name(dt));
  }
}

// pdl: a programmatic dependent launch (KernelOptions::pdl; the weights' derived forms: false).
void cast_rows(const void* src, bool src_bf16, int64_t src_stride, void* dst, bool dst_bf16,
               int64_t dst_stride, int64_t rows, int64_t cols, const char* what, bool pdl);

// The FP8 weight dequantised to bf16 (or f32), made now.
Tensor make_dequantised(const WeightRef& w, bool f32) {
  Tensor out = Tensor::empty({w.rows(), w.cols()}, f32 ? DType::f32 : DType::bf16, Device::cuda);
  check_launch(launch_dequant_fp8({static_cast<const uint8_t*>(w.weight.raw_data()),
                                   static_cast<const float*>(w.scale_inv.raw_data()), out.raw_data(),
                                   w.rows(), w.cols(), w.block_n, w.block_k, f32},
                                  op_stream()),
               f32 ? "dequantise fp8 weight to f32" : "dequantise fp8 weight");
  if (!f32) count(&GemmStats::dequantised);
  return out;
}

// The bf16 or FP8 weight as f32, made now.
Tensor make_f32(const WeightRef& w) {
  if (w.weight.dtype() == DType::f8e4m3fn) return make_dequantised(w, true);
  Tensor out = Tensor::empty({w.rows(), w.cols()}, DType::f32, Device::cuda);
  cast_rows(w.weight.raw_data(), true, w.cols(), out.raw_data(), false, w.cols(), w.rows(), w.cols(),
            "bf16 weight to f32", false);
  return out;
}

// The FP8 weight's block scales with rows padded to a multiple of 4 floats, made now.
Tensor make_padded_scales(const WeightRef& w) {
  const int64_t nb = w.scale_inv.size(0), kb = w.scale_inv.size(1), ld = (kb + 3) / 4 * 4;
  Tensor out = Tensor::empty({nb, ld}, DType::f32, Device::cuda);
  check_launch(
      launch_pad_scales({static_cast<const float*>(w.scale_inv.raw_data()), out.data<float>(), nb, kb, ld},
                        op_stream()),
      "pad fp8 scales");
  return out;
}

// The FP8 weight dequantised to bf16: its derived copy, else one made for this call.
Tensor dequantised(const WeightRef& w) {
  if (w.derived && w.derived->bf16.defined()) return w.derived->bf16;
  return make_dequantised(w, false);
}

// The weight as f32 (fp32 precision mode): its derived copy, else one made for this call.
Tensor as_f32(const WeightRef& w) {
  if (w.derived && w.derived->f32.defined()) return w.derived->f32;
  return make_f32(w);
}

// The weight's padded block scales [nb, ld]: its derived ones, else ones made for this call.
Tensor padded_scales(const WeightRef& w) {
  if (w.derived && w.derived->fp8_scales.defined()) return w.derived->fp8_scales;
  return make_padded_scales(w);
}

void cast_rows(const void* src, bool src_bf16, int64_t src_stride, void* dst, bool dst_bf16,
               int64_t dst_stride, int64_t rows, int64_t cols, const char* what, bool pdl) {
  RowsParams p{};
  p.pdl = pdl;
  p.src = src;
  p.dst = dst;
  p.rows = rows;
  p.cols = cols;
  p.src_stride = src_stride;
  p.dst_stride = dst_stride;
  p.src_bf16 = src_bf16;
  p.dst_bf16 = dst_bf16;
  p.op = RowOp::copy;
  check_launch(launch_rows(p, op_stream()), what);
}

// out [T, M] (+)= x [T, K] . A where A is bf16 or f32 at `a_ptr` (TN: rows of K, NN: rows of M) with
// leading dimension lda. Handles the activation conversion, the split, and an unaligned output (those
// kernels programmatic dependent launches with pdl; cuBLASLt's are ordinary).
void gemm_dense(const RowView& x, const void* a_ptr, bool a_f32, bool trans_a, int64_t lda, int64_t M,
                const RowView& o, bool split, const char* what, bool pdl) {
  const int64_t T = x.rows, K = x.cols;
  Tensor hi, lo;
  const void* b_ptr = nullptr;
  int64_t ldb = K;
  if (a_f32) {
    b_ptr = x.p;
    ldb = x.stride;
  } else {
    hi = Tensor::empty({T, K}, DType::bf16, Device::cuda);
    if (split) {
      lo = Tensor::empty({T, K}, DType::bf16, Device::cuda);
      SplitBf16Params sp{x.p, hi.data_u16(), lo.data_u16(), T, K, x.stride};
      sp.pdl = pdl;
      check_launch(launch_split_bf16(sp, op_stream()), what);
    } else {
      cast_rows(x.p, false, x.stride, hi.raw_data(), true, K, T, K, what, pdl);
    }
    b_ptr = hi.raw_data();
  }
  const Kind kind =
      a_f32 ? (trans_a ? Kind::f32_tn : Kind::f32_nn) : (trans_a ? Kind::bf16_tn : Kind::bf16_nn);
  const int64_t es = a_f32 ? 4 : 2;
  auto key_for = [&](const void* d, int64_t ldd) {
    return PlanKey{
        int64_t(kind),        M, T, K, lda, ldb, ldd, alignment(a_ptr, lda * es), alignment(b_ptr, ldb * es),
        alignment(d, ldd * 4)};
  };
  const Plan* p = &plan_for(key_for(o.p, o.stride));
  Tensor tmp;
  float* d = o.p;
  if (!p->ok) {  // e.g. an output view whose stride cuBLASLt cannot take: write a packed tensor, copy
    tmp = Tensor::empty({T, M}, DType::f32, Device::cuda);
    d = tmp.data<float>();
    p = &plan_for(key_for(d, M));
    DSA_CHECK(p->ok, "{}: cuBLASLt has no algorithm for [{}, {}] x [{}, {}]", what, T, K, K, M);
  }
  tune(*p, 2.0 * double(M) * double(T) * double(K), a_ptr, b_ptr, d, nullptr, nullptr);
  run(*p, a_ptr, b_ptr, d, 0.0f);
  if (split) run(*p, a_ptr, lo.raw_data(), d, 1.0f);
  if (tmp.defined()) cast_rows(d, false, M, o.p, false, o.stride, T, M, what, pdl);
  count(a_f32 ? &GemmStats::f32_calls : &GemmStats::bf16_calls);
}

}  // namespace

cublasLtHandle_t device_lt_handle() { return lt().handle; }

int64_t fp8_act_rows(int64_t T, int64_t small_max_tokens) {
  const int64_t small = std::min(small_max_tokens, kFp8SmallMaxTokens);
  return T <= small ? (T <= 8 ? 8 : T <= 16 ? 16 : 32) : (T + 3) / 4 * 4;
}

Fp8Act empty_fp8_act(int64_t T, int64_t Tp, int64_t K) {
  return Fp8Act{Tensor::empty({Tp, K}, DType::u8, Device::cuda),
                Tensor::empty({K / 128, Tp}, DType::f32, Device::cuda), T};
}

namespace {

// The recipe's activation quantisation of f32 rows (x.cols % 128 == 0).
Fp8Act quantise_rows(const RowView& x, const KernelOptions& o) {
  const int64_t T = x.rows, K = x.cols;
  const int64_t Tp = fp8_act_rows(T, o.gemm_fp8_small_max_tokens);
  Fp8Act a = empty_fp8_act(T, Tp, K);
  QuantFp8Params p{x.p, a.codes.data_u8(), a.scales.data<float>(), T, Tp, K, x.stride};
  p.pdl = o.pdl;
  check_launch(launch_quant_fp8(p, op_stream()), "linear: fp8 activation quantisation");
  return a;
}

// The split small-T kernels' counters (kFp8SmallCounters, zeroed once; each split launch leaves them zero).
uint32_t* small_counters() {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  if (l.small_counters == nullptr) {
    DSA_CUDA_CHECK(cudaMalloc(&l.small_counters, size_t(kFp8SmallCounters) * sizeof(uint32_t)));
    DSA_CUDA_CHECK(cudaMemset(l.small_counters, 0, size_t(kFp8SmallCounters) * sizeof(uint32_t)));
  }
  return l.small_counters;
}

// The FP8 recipe's arithmetic for T <= kFp8SmallMaxTokens tokens with the weight-streaming kernel
// (gemm_small_params.h), f32 outputs written in place; pdl: a programmatic dependent launch. parts: one
// weight's rows (linear), or up to 1 + kFp8SmallMaxMore weights on the same activations in one launch
// (linear_multi's parts with KernelOptions::gemm_small_fuse), their row slices one grid under one K split.
void fp8_small(const Fp8Act& a, const std::vector<Fp8SmallSegment>& parts, bool pdl) {
  DSA_CHECK(!parts.empty() && parts.size() <= size_t(1 + kFp8SmallMaxMore),
            "linear: {} parts for one FP8 small-T launch", parts.size());
  const Fp8SmallSegment& first = parts[0];
  Fp8SmallGemmParams p{};
  p.w = first.w;
  p.w_scale = first.w_scale;
  p.row0 = first.row0;
  p.w_scale_ld = first.w_scale_ld;
  p.out = first.out;
  p.out_stride = first.out_stride;
  p.N = first.N;
  for (size_t i = 1; i < parts.size(); ++i) p.more[i - 1] = parts[i];
  p.n_more = int(parts.size()) - 1;
  p.xq = static_cast<const uint8_t*>(a.codes.raw_data());
  p.x_scale = a.scales.data<float>();
  p.T = a.rows;
  p.Tp = a.codes.size(0);
  p.K = a.codes.size(1);
  const int64_t slices = fp8_small_slices(p);
  p.ctas_per_sm = fp8_small_ctas_per_sm(slices * 128, p.Tp);  // resolved once: the split and the launch
  p.splits = fp8_small_fused_splits(slices, p.K, p.Tp, p.ctas_per_sm);
  p.pdl = pdl;
  Tensor partial;
  if (p.splits > 1) {
    partial = Tensor::empty({fp8_small_fused_scratch(p)}, DType::f32, Device::cuda);
    p.partial = partial.data<float>();
    p.counters = small_counters();
  }
  check_launch(launch_fp8_small_gemm(p, op_stream()), "linear: fp8 small-T GEMM");
  count(&GemmStats::fp8_small_calls);
  if (parts.size() > 1) count(&GemmStats::fp8_small_fused_calls);
}

// Rows [r0, r1) of FP8 weight w into o, as one part of an FP8 small-T launch.
Fp8SmallSegment fp8_small_part(const WeightRef& w, int64_t r0, int64_t r1, const RowView& o) {
  return {static_cast<const uint8_t*>(w.weight.raw_data()) + r0 * w.cols(),
          static_cast<const float*>(w.scale_inv.raw_data()),
          r0,
          w.scale_inv.size(1),
          o.p,
          o.stride,
          r1 - r0};
}

// The narrow bf16 linears' two-term recipe for T <= kBf16SmallMaxTokens in one weight-streaming launch
// (gemm_small_params.h): one weight, or up to 1 + kBf16SmallMaxMore on the same x (linear_multi's narrow
// parts with KernelOptions::gemm_small_fuse); false when the shapes or alignments do not fit it (nothing
// launched: cuBLASLt then runs).
bool bf16_small(const RowView& x, const std::vector<Bf16SmallSegment>& parts, bool pdl) {
  const int64_t T = x.rows, K = x.cols;
  if (parts.empty() || parts.size() > size_t(1 + kBf16SmallMaxMore) || T > kBf16SmallMaxTokens ||
      K % 64 != 0 || x.stride % 4 != 0 || (reinterpret_cast<uintptr_t>(x.p) & 15) != 0)
    return false;
  for (const Bf16SmallSegment& s : parts)
    if ((reinterpret_cast<uintptr_t>(s.w) & 15) != 0) return false;
  Bf16SmallGemmParams p{};
  p.w = parts[0].w;
  p.out = parts[0].out;
  p.out_stride = parts[0].out_stride;
  p.N = parts[0].N;
  for (size_t i = 1; i < parts.size(); ++i) p.more[i - 1] = parts[i];
  p.n_more = int(parts.size()) - 1;
  p.x = x.p;
  p.x_stride = x.stride;
  p.T = T;
  p.K = K;
  p.splits = bf16_small_fused_splits(bf16_small_slices(p), K);
  p.pdl = pdl;
  Tensor partial;
  if (p.splits > 1) {
    partial = Tensor::empty({bf16_small_fused_scratch(p)}, DType::f32, Device::cuda);
    p.partial = partial.data<float>();
    p.counters = small_counters();
  }
  check_launch(launch_bf16_small_gemm(p, op_stream()), "linear: bf16 small-T GEMM");
  count(&GemmStats::bf16_small_calls);
  if (parts.size() > 1) count(&GemmStats::bf16_small_fused_calls);
  return true;
}

// Whether a narrow bf16 product of T tokens (the two-term recipe) runs the fused kernel: from
// KernelOptions::gemm_split_fused_min_tokens tokens, above the small-T kernel's range.
bool split_fused_applies(int64_t T, const KernelOptions& o) {
  return o.gemm_split_fused_min_tokens > 0 && T >= o.gemm_split_fused_min_tokens && T > kBf16SmallMaxTokens;
}

// The narrow bf16 linears' two-term recipe for many tokens in one launch (gemm_f32act_params.h): x [T, K]
// times each part's bf16 rows (weights[i]: N_i contiguous rows of K) into outs[i] [T, N_i]; the parts share
// the launch (x read once). False when the shapes or alignments do not fit it (nothing launched).
bool split_fused(const RowView& x, const std::vector<const void*>& weights, const std::vector<RowView>& outs,
                 bool pdl) {
  if (weights.empty() || weights.size() > size_t(kF32ActMaxSegments) || weights.size() != outs.size())
    return false;
  F32ActGemmParams p{};
  p.x = x.p;
  p.x_ld = x.stride;
  p.T = x.rows;
  p.K = x.cols;
  p.batch = 1;
  p.split = true;
  p.pdl = pdl;
  p.segments = int(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) {
    DSA_CHECK(outs[i].rows == x.rows, "linear: fused split output rows {} != {}", outs[i].rows, x.rows);
    p.seg[i] = {static_cast<const uint16_t*>(weights[i]), x.cols, outs[i].p, outs[i].stride, outs[i].cols};
  }
  if (!f32act_gemm_supported(p)) return false;
  check_launch(launch_f32act_gemm(p, op_stream()), "linear: fused two-term bf16 GEMM");
  count(&GemmStats::bf16_fused_calls);
  return true;
}

bool fp8_recipe_applies(const WeightRef& w, int64_t K, int64_t r0, int64_t N) {
  return w.block_n == 128 && w.block_k == 128 && K % 128 == 0 && r0 % 128 == 0 && N % 8 == 0;
}

// Whether FP8 products on these quantised activations take the small-T kernel.
bool fp8_small_applies(const Fp8Act& act, const KernelOptions& opts) {
  const int64_t T = act.rows, Tp = act.codes.size(0);
  return T <= kFp8SmallMaxTokens && T <= opts.gemm_fp8_small_max_tokens && (Tp == 8 || Tp == 16 || Tp == 32);
}

// The FP8 recipe's GEMM on quantised activations; false when cuBLASLt has no plan (caller falls back).
bool gemm_fp8_quantised(const Fp8Act& act, const WeightRef& w, int64_t r0, int64_t r1, const RowView& o,
                        const KernelOptions& opts) {
  const int64_t T = act.rows, K = act.codes.size(1), N = r1 - r0, Tp = act.codes.size(0);
  if (fp8_small_applies(act, opts)) {
    fp8_small(act, {fp8_small_part(w, r0, r1, o)}, opts.pdl);
    return true;
  }
  const Tensor sc = padded_scales(w);  // [nb, ld]
  const uint8_t* a_ptr = static_cast<const uint8_t*>(w.weight.raw_data()) + r0 * K;
  const void* xq = act.codes.raw_data();
  const float* xs = act.scales.data<float>();
  const float* a_scale = sc.data<float>() + (r0 / 128) * sc.size(1);
  const double flops = 2.0 * double(N) * double(Tp) * double(K);
  // f32 D straight into the output when it holds the padded token count; else into a packed buffer.
  const bool direct = Tp == T;
  Tensor d32 = direct ? Tensor() : Tensor::empty({Tp, N}, DType::f32, Device::cuda);
  float* d32_ptr = direct ? o.p : d32.data<float>();
  const int64_t ld32 = direct ? o.stride : N;
  const Plan& p32 = plan_for(PlanKey{int64_t(Kind::fp8_tn_f32), N, Tp, K, K, K, ld32, alignment(a_ptr, K),
                                     alignment(xq, K), alignment(d32_ptr, ld32 * 4)});
  Tensor d16;
  const Plan* p = &p32;
  if (!p32.ok) {  // no f32-output algorithm: bf16 D, widened afterwards
    d16 = Tensor::empty({Tp, N}, DType::bf16, Device::cuda);
    p = &plan_for(PlanKey{int64_t(Kind::fp8_tn), N, Tp, K, K, K, N, alignment(a_ptr, K), alignment(xq, K),
                          alignment(d16.raw_data(), N * 2)});
    if (!p->ok) return false;
  }
  void* d_ptr = p32.ok ? static_cast<void*>(d32_ptr) : d16.raw_data();
  tune(*p, flops, a_ptr, xq, d_ptr, a_scale, xs);
  run(*p, a_ptr, xq, d_ptr, 0.0f, a_scale, xs);
  if (!p32.ok) {
    cast_rows(d16.raw_data(), true, N, o.p, false, o.stride, T, N, "linear: fp8 output", opts.pdl);
  } else if (!direct) {
    cast_rows(d32_ptr, false, N, o.p, false, o.stride, T, N, "linear: fp8 output", opts.pdl);
  }
  count(&GemmStats::fp8_calls);
  return true;
}

// The FP8 recipe; false when the shape is outside it (the caller falls back).
bool gemm_fp8(const RowView& x, const WeightRef& w, int64_t r0, int64_t r1, const RowView& o,
              const KernelOptions& opts) {
  if (!fp8_recipe_applies(w, x.cols, r0, r1 - r0)) return false;
  return gemm_fp8_quantised(quantise_rows(x, opts), w, r0, r1, o, opts);
}

}  // namespace

void gemm_linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                 const KernelOptions& o) {
  check_weight(w, "linear");
  const RowView xv = rows_f32(x, "linear input");
  const RowView ov = rows_f32(out, "linear output");
  const int64_t K = w.cols(), N = r1 - r0, T = xv.rows;
  DSA_CHECK(xv.cols == K, "linear: input {} does not match weight {}", x.describe(), w.weight.describe());
  DSA_CHECK(ov.rows == T && ov.cols == N, "linear: output {} should be [{}, {}]", out.describe(), T, N);
  if (T == 0 || N == 0) return;
  DSA_CHECK(K > 0, "linear: empty input features");
  const bool exact = o.gemm == GemmPrecision::fp32;
  const DType dt = w.weight.dtype();
  if (!exact && dt == DType::f8e4m3fn && gemm_fp8(xv, w, r0, r1, ov, o)) return;
  const bool f32 = exact || dt == DType::f32;
  const Tensor a = dt == DType::f32        ? w.weight
                   : exact                 ? as_f32(w)
                   : dt == DType::f8e4m3fn ? dequantised(w)
                                           : w.weight;
  const void* a_ptr = static_cast<const char*>(a.raw_data()) + r0 * K * (f32 ? 4 : 2);
  const bool split = !f32 && N <= kSplitMaxRows;
  // (One narrow weight keeps the split pass + cuBLASLt at every size: the fused launch measured slower for
  // router_gate [256 x 6144] on the H100, 199 vs 168 us at 4,096 tokens, 131 vs 71 at 1,024; it pays where
  // two parts share it: linear_multi below.) Wide bf16 weights take the small-T kernel too when
  // KernelOptions::gemm_bf16_small_wide (the LM head at decode).
  if ((split || (!f32 && o.gemm_bf16_small_wide)) &&
      bf16_small(xv, {{static_cast<const uint16_t*>(a_ptr), ov.p, ov.stride, N}}, o.pdl))
    return;
  gemm_dense(xv, a_ptr, f32, true, K, N, ov, split, "linear", o.pdl);
}

void gemm_linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                   const KernelOptions& o) {
  check_weight(w, "linear_t");
  const RowView xv = rows_f32(x, "linear_t input");
  const RowView ov = rows_f32(out, "linear_t output");
  const int64_t R = r1 - r0, C = w.cols(), T = xv.rows;
  DSA_CHECK(xv.cols == R, "linear_t: input {} should have {} columns", x.describe(), R);
  DSA_CHECK(ov.rows == T && ov.cols == C, "linear_t: output {} should be [{}, {}]", out.describe(), T, C);
  if (T == 0 || C == 0) return;
  DSA_CHECK(R > 0, "linear_t: empty row range");
  const bool exact = o.gemm == GemmPrecision::fp32;
  const DType dt = w.weight.dtype();
  const bool f32 = exact || dt == DType::f32;
  const Tensor a = dt == DType::f32        ? w.weight
                   : exact                 ? as_f32(w)
                   : dt == DType::f8e4m3fn ? dequantised(w)
                                           : w.weight;
  const void* a_ptr = static_cast<const char*>(a.raw_data()) + r0 * C * (f32 ? 4 : 2);
  gemm_dense(xv, a_ptr, f32, false, C, C, ov, false, "linear_t", o.pdl);
}

std::vector<Tensor> gemm_linear_multi(const Tensor& x, const std::vector<WeightRef>& ws, const Fp8Act* q,
                                      const KernelOptions& o) {
  DSA_CHECK(x.defined() && x.dim() == 2, "linear_multi: input must be 2-D, got {}",
            x.defined() ? x.describe() : "nothing");
  const int64_t T = x.size(0);
  std::vector<Tensor> out;
  out.reserve(ws.size());
  // Which weights the FP8 recipe covers, decided once per weight.
  std::vector<bool> recipe(ws.size(), false);
  int64_t fp8 = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const WeightRef& w = ws[i];
    check_weight(w, "linear_multi");
    out.push_back(Tensor::empty({T, w.rows()}, DType::f32, Device::cuda));
    recipe[i] = w.weight.dtype() == DType::f8e4m3fn && fp8_recipe_applies(w, x.size(1), 0, w.rows());
    if (recipe[i]) ++fp8;
  }
  // A producer's copy is used when it has the layout quantise_rows would make (same codes, bit for bit).
  const bool given = q != nullptr && q->defined() && q->rows == T && q->codes.dim() == 2 &&
                     q->codes.size(0) == fp8_act_rows(T, o.gemm_fp8_small_max_tokens) &&
                     q->codes.size(1) == x.size(1);
  const bool share = (fp8 >= 2 || (fp8 >= 1 && given)) && T > 0 && o.gemm == GemmPrecision::fast;
  std::optional<Fp8Act> act;
  if (share && given) act = *q;
  // Narrow bf16 weights (the two-term recipe) at fused-kernel sizes: up to kF32ActMaxSegments of them in
  // one launch (the indexer's wk + weights_proj), the same arithmetic as gemm_linear's fused path.
  std::vector<bool> done(ws.size(), false);
  if (o.gemm == GemmPrecision::fast && split_fused_applies(T, o) && x.device() == Device::cuda) {
    std::vector<size_t> narrow;
    for (size_t i = 0; i < ws.size(); ++i)
      if (ws[i].weight.dtype() == DType::bf16 && ws[i].rows() <= kSplitMaxRows && ws[i].cols() == x.size(1))
        narrow.push_back(i);
    if (narrow.size() >= 2) {
      const RowView xv = rows_f32(x, "linear_multi input");
      for (size_t j = 0; j + 1 < narrow.size(); j += 2) {
        const size_t a = narrow[j], b = narrow[j + 1];
        if (split_fused(xv, {ws[a].weight.raw_data(), ws[b].weight.raw_data()},
                        {rows_f32(out[a], "linear_multi output"), rows_f32(out[b], "linear_multi output")},
                        o.pdl))
          done[a] = done[b] = true;
      }
    }
  }
  // KernelOptions::gemm_small_fuse: the parts `take` accepts, in groups of up to `most`, each group one
  // launch of `launch` (the output rows of a group's parts; false: nothing launched, the parts stay for the
  // per-part path below). A part left alone keeps that path too.
  auto fuse_parts = [&](size_t most, auto take, auto launch) {
    std::vector<size_t> parts;
    for (size_t i = 0; i < ws.size(); ++i)
      if (!done[i] && take(i)) parts.push_back(i);
    for (size_t j = 0; j + 1 < parts.size(); j += most) {
      const std::vector<size_t> group(parts.begin() + long(j),
                                      parts.begin() + long(std::min(parts.size(), j + most)));
      if (!launch(group)) continue;
      for (size_t i : group) done[i] = true;
    }
  };
  // Narrow bf16 parts on the small-T kernel (the two-term recipe).
  if (o.gemm == GemmPrecision::fast && o.gemm_small_fuse && T > 0 && T <= kBf16SmallMaxTokens &&
      x.device() == Device::cuda) {
    const RowView xv = rows_f32(x, "linear_multi input");
    fuse_parts(
        size_t(1 + kBf16SmallMaxMore),
        [&](size_t i) {
          return ws[i].weight.dtype() == DType::bf16 && ws[i].rows() <= kSplitMaxRows &&
                 ws[i].cols() == xv.cols;
        },
        [&](const std::vector<size_t>& group) {
          std::vector<Bf16SmallSegment> segs;
          for (size_t i : group) {
            const RowView ov = rows_f32(out[i], "linear_multi output");
            segs.push_back(
                {static_cast<const uint16_t*>(ws[i].weight.raw_data()), ov.p, ov.stride, ws[i].rows()});
          }
          return bf16_small(xv, segs, o.pdl);
        });
  }
  // FP8 parts on the small-T kernel.
  if (share && o.gemm_small_fuse && fp8 >= 2 && x.device() == Device::cuda) {
    const RowView xv = rows_f32(x, "linear_multi input");
    if (!act) act = quantise_rows(xv, o);
    if (fp8_small_applies(*act, o)) {
      fuse_parts(
          size_t(1 + kFp8SmallMaxMore), [&](size_t i) { return recipe[i] && ws[i].cols() == xv.cols; },
          [&](const std::vector<size_t>& group) {
            std::vector<Fp8SmallSegment> segs;
            for (size_t i : group)
              segs.push_back(fp8_small_part(ws[i], 0, ws[i].rows(), rows_f32(out[i], "linear_multi output")));
            fp8_small(*act, segs, o.pdl);
            return true;
          });
    }
  }
  for (size_t i = 0; i < ws.size(); ++i) {
    const WeightRef& w = ws[i];
    if (done[i]) continue;
    if (share && recipe[i]) {
      const RowView xv = rows_f32(x, "linear_multi input");
      DSA_CHECK(xv.cols == w.cols(), "linear_multi: input {} does not match weight {}", x.describe(),
                w.weight.describe());
      if (!act) act = quantise_rows(xv, o);
      if (gemm_fp8_quantised(*act, w, 0, w.rows(), rows_f32(out[i], "linear_multi output"), o)) continue;
    }
    gemm_linear(x, w, 0, w.rows(), out[i], o);
  }
  return out;
}

Fp8Act quantize_fp8_activations(const Tensor& x, const KernelOptions& o) {
  const RowView xv = rows_f32(x, "fp8 activations");
  DSA_CHECK(xv.cols % 128 == 0, "fp8 activations: {} features, not a multiple of 128", xv.cols);
  return quantise_rows(xv, o);
}

void gemm_linear_fp8(const Fp8Act& a, const WeightRef& w, int64_t r0, int64_t r1, Tensor& out,
                     const KernelOptions& o) {
  check_weight(w, "linear_fp8");
  DSA_CHECK(w.weight.dtype() == DType::f8e4m3fn, "linear_fp8: weight {} is not FP8", w.weight.describe());
  DSA_CHECK(a.codes.defined() && a.codes.dim() == 2 && a.codes.size(1) == w.cols() && a.scales.defined() &&
                a.rows <= a.codes.size(0),
            "linear_fp8: activations do not match weight {}", w.weight.describe());
  const RowView ov = rows_f32(out, "linear_fp8 output");
  const int64_t N = r1 - r0;
  DSA_CHECK(ov.rows == a.rows && ov.cols == N, "linear_fp8: output {} should be [{}, {}]", out.describe(),
            a.rows, N);
  DSA_CHECK(fp8_recipe_applies(w, w.cols(), r0, N) && gemm_fp8_quantised(a, w, r0, r1, ov, o),
            "linear_fp8: rows [{}, {}) of {} are outside the FP8 recipe", r0, r1, w.weight.describe());
}

GemmStats gemm_stats() {
  Lt& l = lt();
  std::lock_guard<std::mutex> lock(l.mu);
  return l.stats;
}

Tensor gemm_weight_f32(const WeightRef& w) {
  check_weight(w, "weight as f32");
  return w.weight.dtype() == DType::f32 ? w.weight : as_f32(w);
}

std::shared_ptr<const DerivedWeight> derive_gemm_weight(const WeightRef& w, WeightUse use,
                                                        const KernelOptions& o) {
  const Tensor& t = w.weight;
  if (!t.defined() || t.device() != Device::cuda || t.dim() != 2 || !t.is_contiguous() || t.numel() == 0)
    return nullptr;
  const DType dt = t.dtype();
  const bool fp8 = dt == DType::f8e4m3fn;
  if (fp8) {
    const int64_t sn = w.block_n > 0 ? (w.rows() + w.block_n - 1) / w.block_n : -1,
                  sk = w.block_k > 0 ? (w.cols() + w.block_k - 1) / w.block_k : -1;
    const Tensor& s = w.scale_inv;
    if (!s.defined() || s.device() != Device::cuda || s.dtype() != DType::f32 || !s.is_contiguous() ||
        s.dim() != 2 || s.size(0) != sn || s.size(1) != sk)
      return nullptr;  // the calls report it (check_weight)
  } else if (dt != DType::bf16) {
    return nullptr;  // f32 weights are multiplied as they are; other dtypes are refused by the calls
  }
  DerivedWeight d;
  if (o.gemm == GemmPrecision::fp32) {
    d.f32 = make_f32(w);  // every product of the weight multiplies it (linears, absorb, experts' loop)
  } else if (fp8 && !(use == WeightUse::expert && moe_fp8_grouped_weight(w, o))) {
    const bool recipe = fp8_recipe_applies(w, w.cols(), 0, w.rows());
    if (recipe) d.fp8_scales = make_padded_scales(w);
    if (!recipe || use == WeightUse::absorb) d.bf16 = make_dequantised(w, false);
  }
  if (!d.bf16.defined() && !d.f32.defined() && !d.fp8_scales.defined()) return nullptr;
  return std::make_shared<const DerivedWeight>(std::move(d));
}

}  // namespace dsaserve::kernels::cuda
