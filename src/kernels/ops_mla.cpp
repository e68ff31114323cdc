// The MLA fused / batched operators of kernels/ops.h (absorb_q, absorb_v, mla_kv_write,
// indexer_k_write): dispatch, shape rules, and the Backend defaults that run the unfused op sequence.
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "trace/trace.h"

namespace dsaserve::kernels {

namespace {

std::string describe(const Tensor& t) { return t.defined() ? t.describe() : std::string("nothing"); }

// The checks shared by the two cache writes: x [T, cols] f32 on the cache's device, positions and slots
// i32 [T], and a rope dimension that fits.
void check_write(const Tensor& x, const Tensor& positions, const RopeParams& rope, const Tensor& cache,
                 const Tensor& slots, const char* what) {
  DSA_CHECK(x.defined() && x.dim() == 2 && x.dtype() == DType::f32, "{}: input must be f32 [T, cols], got {}",
            what, describe(x));
  DSA_CHECK(rope.dim > 0 && rope.dim % 2 == 0 && rope.dim <= x.size(1),
            "{}: rope dim {} does not fit rows of {} values", what, rope.dim, x.size(1));
  DSA_CHECK(positions.defined() && positions.dim() == 1 && positions.dtype() == DType::i32 &&
                positions.size(0) == x.size(0),
            "{}: positions {} should be i32 [{}]", what, describe(positions), x.size(0));
  DSA_CHECK(slots.defined() && slots.dim() == 1 && slots.dtype() == DType::i32 && slots.size(0) == x.size(0),
            "{}: slots {} should be i32 [{}]", what, describe(slots), x.size(0));
  DSA_CHECK(cache.defined() && cache.dim() == 2 && cache.device() == x.device() &&
                positions.device() == x.device() && slots.device() == x.device(),
            "{}: cache {}, positions and slots must be on the input's device ({})", what, describe(cache),
            device_name(x.device()));
}

}  // namespace

AbsorbDims absorb_dims(const Tensor& x, const WeightRef& kv_b, bool q, int64_t d) {
  const char* what = q ? "absorb_q" : "absorb_v";
  DSA_CHECK(x.defined() && x.dim() == 3 && x.dtype() == DType::f32,
            "{}: input must be f32 [T, heads, dim], got {}", what, describe(x));
  DSA_CHECK(kv_b.weight.defined() && kv_b.weight.dim() == 2 && kv_b.weight.device() == x.device(),
            "{}: kv_b {} must be a 2-D weight on the input's device", what, describe(kv_b.weight));
  AbsorbDims a;
  a.tokens = x.size(0);
  a.heads = x.size(1);
  a.latent = kv_b.cols();
  DSA_CHECK(a.heads > 0 && kv_b.rows() % a.heads == 0, "{}: kv_b {} does not split into {} heads", what,
            kv_b.weight.describe(), a.heads);
  a.per_head = kv_b.rows() / a.heads;
  a.nope = q ? x.size(2) : a.per_head - d;
  a.dv = q ? a.per_head - a.nope : d;
  DSA_CHECK(a.nope > 0 && a.dv > 0, "{}: {} rows per head of kv_b {} do not hold nope {} + v {}", what,
            a.per_head, kv_b.weight.describe(), a.nope, a.dv);
  DSA_CHECK(q || x.size(2) == a.latent, "{}: out_lat {} should have {} latent values per head", what,
            x.describe(), a.latent);
  return a;
}

Tensor Ops::absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out) const {
  trace::Scope span_("absorb_q", "kernel");
  if (span_.on()) span_.arg("x", q_nope.shape()).arg("w", kv_b.weight.shape());
  return on(q_nope.device()).absorb_q(q_nope, kv_b, std::move(out));
}

Tensor Ops::absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out) const {
  trace::Scope span_("absorb_v", "kernel");
  if (span_.on()) span_.arg("x", out_lat.shape()).arg("w", kv_b.weight.shape());
  return on(out_lat.device()).absorb_v(out_lat, kv_b, dv, std::move(out));
}

Tensor Ops::absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out,
                         Fp8Act& q) const {
  trace::Scope span_("absorb_v", "kernel");
  if (span_.on()) span_.arg("x", out_lat.shape()).arg("w", kv_b.weight.shape());
  return on(out_lat.device()).absorb_v_fp8(out_lat, kv_b, dv, std::move(out), q);
}

void Ops::mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                       const RopeParams& rope, Tensor& cache, const Tensor& slots) const {
  trace::Scope span_("mla_kv_write", "kernel");
  if (span_.on()) span_.arg("x", ckv.shape());
  check_write(ckv, positions, rope, cache, slots, "mla_kv_write");
  on(ckv.device()).mla_kv_write(ckv, norm_w, eps, positions, rope, cache, slots);
}

void Ops::indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                          const Tensor& positions, const RopeParams& rope, Tensor& cache,
                          const Tensor& slots) const {
  trace::Scope span_("indexer_k_write", "kernel");
  if (span_.on()) span_.arg("x", k.shape());
  check_write(k, positions, rope, cache, slots, "indexer_k_write");
  on(k.device()).indexer_k_write(k, norm_w, norm_b, eps, positions, rope, cache, slots);
}

// ---- Backend defaults: the unfused sequences ----

Tensor Backend::absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out) {
  const AbsorbDims a = absorb_dims(q_nope, kv_b, true, 0);
  if (!out.defined()) out = Tensor::empty({a.tokens, a.heads, a.latent}, DType::f32, q_nope.device());
  DSA_CHECK(out.dim() == 3 && out.size(0) == a.tokens && out.size(1) == a.heads && out.size(2) == a.latent,
            "absorb_q: output {} should be [{}, {}, {}]", out.describe(), a.tokens, a.heads, a.latent);
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t base = h * a.per_head;
    linear_t(q_nope.select(1, h), kv_b, base, base + a.nope, out.select(1, h));
  }
  return out;
}

Tensor Backend::absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out) {
  const AbsorbDims a = absorb_dims(out_lat, kv_b, false, dv);
  if (!out.defined()) out = Tensor::empty({a.tokens, a.heads, a.dv}, DType::f32, out_lat.device());
  DSA_CHECK(out.dim() == 3 && out.size(0) == a.tokens && out.size(1) == a.heads && out.size(2) == a.dv,
            "absorb_v: output {} should be [{}, {}, {}]", out.describe(), a.tokens, a.heads, a.dv);
  for (int64_t h = 0; h < a.heads; ++h) {
    const int64_t base = h * a.per_head + a.nope;
    linear(out_lat.select(1, h), kv_b, base, base + a.dv, out.select(1, h));
  }
  return out;
}

Tensor Backend::absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out,
                             Fp8Act& q) {
  q = Fp8Act{};
  return absorb_v(out_lat, kv_b, dv, std::move(out));
}

void Backend::mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                           const RopeParams& rope, Tensor& cache, const Tensor& slots) {
  const int64_t T = ckv.size(0), L = ckv.size(1) - rope.dim, R = rope.dim;
  if (T == 0) return;
  // The row [kv | k_rope] as the cache stores it: copied, k_rope rotated, kv normalised into its place.
  Tensor row = Tensor::empty({T, L + R}, DType::f32, ckv.device());
  copy_rows(row, ckv);
  Tensor k_pe = row.view({T, 1, L + R}).slice(2, L, L + R);  // [T, 1, rope]
  rope_inplace(k_pe, positions, rope);
  Tensor lat = row.slice(1, 0, L);
  copy_rows(lat, rms_norm(ckv.slice(1, 0, L), norm_w, eps));
  paged_store(cache, slots, row);
}

void Backend::indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                              const Tensor& positions, const RopeParams& rope, Tensor& cache,
                              const Tensor& slots) {
  const int64_t T = k.size(0), D = k.size(1);
  if (T == 0) return;
  const Tensor ki = layer_norm(k, norm_w, norm_b, eps);  // [T, id], rope part first
  Tensor ki_pe = ki.view({T, 1, D}).slice(2, 0, rope.dim);
  rope_inplace(ki_pe, positions, rope);
  paged_store(cache, slots, ki);
}

// The free operators: the registered backends (Ops without a backend of its own).
Tensor absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out) {
  return Ops().absorb_q(q_nope, kv_b, std::move(out));
}
Tensor absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out) {
  return Ops().absorb_v(out_lat, kv_b, dv, std::move(out));
}
Tensor absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out, Fp8Act& q) {
  return Ops().absorb_v_fp8(out_lat, kv_b, dv, std::move(out), q);
}
void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                  const RopeParams& rope, Tensor& cache, const Tensor& slots) {
  Ops().mla_kv_write(ckv, norm_w, eps, positions, rope, cache, slots);
}
void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                     const Tensor& positions, const RopeParams& rope, Tensor& cache, const Tensor& slots) {
  Ops().indexer_k_write(k, norm_w, norm_b, eps, positions, rope, cache, slots);
}

}  // namespace dsaserve::kernels
