#include "kernels/cuda/backend.h"

#include <mutex>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/device_context.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "kernels/cuda/indexer/indexer_topk_params.h"

namespace dsaserve::kernels::cuda {

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int ordinal, const KernelOptions& o) : Backend(Device::cuda, ordinal, o) {}
  // Made on this backend's device (whichever is current on the calling thread).
  std::shared_ptr<const DerivedWeight> derive_weight(const WeightRef& w, WeightUse use) const override {
    const DeviceGuard on(ordinal());
    return derive_gemm_weight(w, use, options());
  }
  std::shared_ptr<const DerivedExperts> derive_experts(const std::vector<MlpRef>& experts) const override {
    const DeviceGuard on(ordinal());
    return derive_moe_experts(experts);
  }
  Tensor embedding(const Tensor& table, const Tensor& ids) override {
    return cuda::embedding(table, ids, options());
  }
  Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) override {
    return cuda::rms_norm(x, w, eps, options());
  }
  Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) override {
    return cuda::add_rms_norm(residual, x, w, eps, options());
  }
  Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) override {
    return cuda::layer_norm(x, w, b, eps, options());
  }
  Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) override {
    return cuda::linear(x, w, r0, r1, std::move(out), options());
  }
  std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                   const Fp8Act* q) override {
    return gemm_linear_multi(x, ws, q, options());
  }
  Tensor norm_fp8(Tensor* residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q) override {
    return cuda::norm_fp8(residual, x, w, eps, q, options());
  }
  Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) override {
    return cuda::linear_t(x, w, r0, r1, std::move(out), options());
  }
  void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) override {
    cuda::rope_inplace(x, positions, p, options());
  }
  Tensor silu_mul(const Tensor& gate, const Tensor& up) override {
    return cuda::silu_mul(gate, up, options());
  }
  Tensor argmax(const Tensor& x) override { return cuda::argmax(x, options()); }
  void add_inplace(Tensor& a, const Tensor& b) override { cuda::add_inplace(a, b, options()); }
  void copy_rows(Tensor& dst, const Tensor& src) override { cuda::copy_rows(dst, src, options()); }
  Tensor gather_rows(const Tensor& x, const Tensor& idx) override {
    return cuda::gather_rows(x, idx, options());
  }
  Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q) override {
    return cuda::silu_mul_fp8(gate, up, q, options());
  }
  void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) override {
    cuda::paged_store(cache, slots, src, options());
  }
  Tensor paged_gather(const PagedSeq& seq, int64_t n) override {
    return cuda::paged_gather(seq, n, options());
  }
  Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                      double scale, double weight_scale) override {
    return cuda::indexer_topk(q, w, keys, start_pos, topk, scale, weight_scale, options());
  }
  Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                int64_t start_pos, const Tensor& sel, double scale) override {
    return cuda::mla_attention_absorbed(q_lat, q_rope, kv, start_pos, sel, scale, options());
  }
  // Kernel-format caches: one launch of the ragged sm_90a kernel for the batch; f32 caches: per request.
  Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk,
                           double scale, double weight_scale) override {
    // One call for every row: the scores of the rows with more than topk keys packed (offsets computed
    // on the device) plus the select workspace (8 KB a row); past kIndexerScoreBudgetBytes of scores the
    // rows run in blocks that stay within it (indexer/indexer_kernels.h).
    if (keys.cache.defined() && keys.cache.dtype() != DType::f32)
      return cuda::indexer_topk_batch(q, w, keys, topk, scale, weight_scale, options());
    return Backend::indexer_topk_rows(q, w, keys, topk, scale, weight_scale);
  }
  Tensor mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                            double scale) override {
    if (kv.cache.defined() && kv.cache.dtype() != DType::f32)
      return cuda::mla_attention_batch(q_lat, q_rope, kv, sel, scale, options());
    return Backend::mla_attention_rows(q_lat, q_rope, kv, sel, scale);
  }
  // The step's launch plans of the two batched kernels above (kernel-format caches; an f32 cache's
  // per-request path ignores them).
  MlaRowsPlan plan_mla_rows(int64_t rows, int64_t heads, int64_t max_keys) override {
    return cuda::plan_mla_decode(rows, heads, max_keys, options());
  }
  IndexerRowsPlan plan_indexer_rows(int64_t rows, int64_t max_len, int64_t topk,
                                    std::span<const int32_t> len_host) override {
    return cuda::plan_indexer_topk(rows, max_len, topk, len_host);
  }
  // MLA fused / batched ops: one kernel (or one batched GEMM) where it applies, else the unfused default.
  Tensor absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out) override {
    const AbsorbDims a = absorb_dims(q_nope, kv_b, true, 0);
    if (!out.defined()) out = Tensor::empty({a.tokens, a.heads, a.latent}, DType::f32, Device::cuda);
    if (absorb_q_batched(q_nope, kv_b, out, options())) return out;
    return Backend::absorb_q(q_nope, kv_b, std::move(out));
  }
  Tensor absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out) override {
    const AbsorbDims a = absorb_dims(out_lat, kv_b, false, dv);
    if (!out.defined()) out = Tensor::empty({a.tokens, a.heads, a.dv}, DType::f32, Device::cuda);
    if (absorb_v_batched(out_lat, kv_b, dv, out, options())) return out;
    return Backend::absorb_v(out_lat, kv_b, dv, std::move(out));
  }
  Tensor absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out,
                      Fp8Act& q) override {
    const AbsorbDims a = absorb_dims(out_lat, kv_b, false, dv);
    if (!out.defined()) out = Tensor::empty({a.tokens, a.heads, a.dv}, DType::f32, Device::cuda);
    if (absorb_v_batched(out_lat, kv_b, dv, out, options(), &q)) return out;
    q = Fp8Act{};
    return Backend::absorb_v(out_lat, kv_b, dv, std::move(out));
  }
  void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                    const RopeParams& rope, Tensor& cache, const Tensor& slots) override {
    if (!mla_kv_write_fused(ckv, norm_w, eps, positions, rope, cache, slots, options()))
      Backend::mla_kv_write(ckv, norm_w, eps, positions, rope, cache, slots);
  }
  void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                       const Tensor& positions, const RopeParams& rope, Tensor& cache,
                       const Tensor& slots) override {
    if (!indexer_k_write_fused(k, norm_w, norm_b, eps, positions, rope, cache, slots, options()))
      Backend::indexer_k_write(k, norm_w, norm_b, eps, positions, rope, cache, slots);
  }
  Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                       int64_t start_pos, const Tensor& sel, double scale) override {
    return cuda::attention_mha(q, k_nope, k_rope, v, start_pos, sel, scale, options());
  }
  Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) override {
    return cuda::moe_route(logits, bias, p, options());
  }
  Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                     const Fp8Act* q, const DerivedExperts* derived, const Tensor* add) override {
    return cuda::moe_experts(x, routing, experts, options(), q, derived, add);
  }
  void fill_dummy(Tensor& t, const dummy::FillSpec& f) override { cuda::fill_dummy(t, f); }
};

}  // namespace

Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
              const KernelOptions& o) {
  DSA_CHECK(w.weight.defined() && w.weight.dim() == 2, "linear: weight must be 2-D");
  if (r1 < 0) r1 = w.rows();
  DSA_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "linear: rows [{}, {}) outside weight {}", r0, r1,
            w.weight.describe());
  DSA_CHECK(x.defined() && x.dim() == 2, "linear: input must be 2-D, got {}",
            x.defined() ? x.describe() : "undefined");
  out = out_or_new(std::move(out), x.size(0), r1 - r0, "linear output");
  gemm_linear(x, w, r0, r1, out, o);
  return out;
}

Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
                const KernelOptions& o) {
  DSA_CHECK(w.weight.defined() && w.weight.dim() == 2, "linear_t: weight must be 2-D");
  DSA_CHECK(0 <= r0 && r0 <= r1 && r1 <= w.rows(), "linear_t: rows [{}, {}) outside weight {}", r0, r1,
            w.weight.describe());
  DSA_CHECK(x.defined() && x.dim() == 2, "linear_t: input must be 2-D");
  out = out_or_new(std::move(out), x.size(0), w.cols(), "linear_t output");
  gemm_linear_t(x, w, r0, r1, out, o);
  return out;
}

namespace {
// The current device's default-options backend (per_device_state makes it with that device current).
struct DefaultBackend {
  CudaBackend backend{current_device(), KernelOptions{}};
};
}  // namespace

Backend& cuda_backend() { return per_device_state<DefaultBackend>().backend; }

std::shared_ptr<Backend> make_backend(const KernelOptions& options) {
  install();
  return std::make_shared<CudaBackend>(current_device(), options);
}

void install_backend() {
  install();
  static std::once_flag once;
  std::call_once(once, [] { register_backend(Device::cuda, &cuda_backend()); });
}

}  // namespace dsaserve::kernels::cuda
