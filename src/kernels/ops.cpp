#include "kernels/ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/indexer_key_fp8.h"
#include "trace/trace.h"

namespace dsaserve::kernels {

namespace {

// moe_experts' `add` on the CPU: after the sum, as add_inplace.
Tensor with_add(Tensor out, const Tensor* add) {
  if (add != nullptr) cpu::add_inplace(out, *add);
  return out;
}

// The CPU backend: forwards to kernels/cpu (the reference).
class CpuBackend : public Backend {
 public:
  CpuBackend(const KernelOptions& o, cpu::TopkObserver observer)
      : Backend(Device::cpu, 0, o), observer_(std::move(observer)) {}
  Tensor embedding(const Tensor& table, const Tensor& ids) override { return cpu::embedding(table, ids); }
  Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) override { return cpu::rms_norm(x, w, eps); }
  Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) override {
    return cpu::add_rms_norm(residual, x, w, eps);
  }
  Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) override {
    return cpu::layer_norm(x, w, b, eps);
  }
  Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) override {
    return cpu::linear(x, w, r0, r1, std::move(out));
  }
  Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) override {
    return cpu::linear_t(x, w, r0, r1, std::move(out));
  }
  void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) override {
    cpu::rope_inplace(x, positions, p);
  }
  Tensor silu_mul(const Tensor& gate, const Tensor& up) override { return cpu::silu_mul(gate, up); }
  Tensor argmax(const Tensor& x) override { return cpu::argmax(x); }
  void add_inplace(Tensor& a, const Tensor& b) override { cpu::add_inplace(a, b); }
  void copy_rows(Tensor& dst, const Tensor& src) override { cpu::copy_rows(dst, src); }
  Tensor gather_rows(const Tensor& x, const Tensor& idx) override { return cpu::gather_rows(x, idx); }
  void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) override {
    cpu::paged_store(cache, slots, src);
  }
  Tensor paged_gather(const PagedSeq& seq, int64_t n) override { return cpu::paged_gather(seq, n); }
  Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                      double scale, double weight_scale) override {
    return cpu::indexer_topk(q, w, keys, start_pos, topk, scale, weight_scale, observer());
  }
  Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                int64_t start_pos, const Tensor& sel, double scale) override {
    return cpu::mla_attention_absorbed(q_lat, q_rope, kv, start_pos, sel, scale);
  }
  Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                       int64_t start_pos, const Tensor& sel, double scale) override {
    return cpu::attention_mha(q, k_nope, k_rope, v, start_pos, sel, scale);
  }
  Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) override {
    return cpu::moe_route(logits, bias, p, observer());
  }
  // The reference quantises nothing: x (with q, its dequantised value) is the input.
  Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                     const Fp8Act*, const DerivedExperts*, const Tensor* add) override {
    return with_add(cpu::moe_experts(x, routing, experts), add);
  }
  void fill_dummy(Tensor& t, const dummy::FillSpec& f) override { cpu::fill_dummy(t, f); }

 protected:
  const cpu::TopkObserver* observer() const { return observer_ ? &observer_ : nullptr; }

 private:
  cpu::TopkObserver observer_;  // empty: none (cpu_ops.h)
};

// The CPU backend with the CUDA backend's FP8 arithmetic emulated (cpu::Fp8Emulation): its linears (and
// the expert linears) quantise their input as the GPU does; with fp8_kv_cache its cache writes round as the
// GPU's FP8 KV cache stores.
class Fp8EmulationBackend final : public CpuBackend {
 public:
  Fp8EmulationBackend(cpu::Fp8Emulation e, cpu::TopkObserver observer)
      : CpuBackend(KernelOptions{}, std::move(observer)), e_(std::move(e)) {}
  Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) override {
    return cpu::linear(x, w, r0, r1, std::move(out), &e_);
  }
  Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                     const Fp8Act* q, const DerivedExperts*, const Tensor* add) override {
    return with_add(cpu::moe_experts(x, routing, experts, &e_, q), add);
  }
  // With Fp8Emulation::fp8_kv_cache: Backend's sequences, each row rounded as the GPU's FP8 cache stores it.
  void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                    const RopeParams& rope, Tensor& cache, const Tensor& slots) override {
    if (!e_.fp8_kv_cache) {
      CpuBackend::mla_kv_write(ckv, norm_w, eps, positions, rope, cache, slots);
      return;
    }
    const int64_t T = ckv.size(0), L = ckv.size(1) - rope.dim, R = rope.dim;
    if (T == 0) return;
    Tensor row = Tensor::empty({T, L + R}, DType::f32);  // [kv | k_rope]
    cpu::copy_rows(row, ckv);
    Tensor k_pe = row.view({T, 1, L + R}).slice(2, L, L + R);  // [T, 1, rope]
    cpu::rope_inplace(k_pe, positions, rope);
    Tensor lat = row.slice(1, 0, L);
    cpu::copy_rows(lat, cpu::rms_norm(ckv.slice(1, 0, L), norm_w, eps));
    cpu::paged_store(cache, slots, cpu::mla_latent_fp8_round(row, L));
  }
  void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                       const Tensor& positions, const RopeParams& rope, Tensor& cache,
                       const Tensor& slots) override {
    if (!e_.fp8_kv_cache) {
      CpuBackend::indexer_k_write(k, norm_w, norm_b, eps, positions, rope, cache, slots);
      return;
    }
    const int64_t T = k.size(0), D = k.size(1);
    if (T == 0) return;
    const Tensor ki = cpu::layer_norm(k, norm_w, norm_b, eps);  // [T, id], rope part first
    Tensor ki_pe = ki.view({T, 1, D}).slice(2, 0, rope.dim);
    cpu::rope_inplace(ki_pe, positions, rope);
    cpu::paged_store(cache, slots, cpu::indexer_key_fp8_decode(cpu::indexer_key_fp8_encode(ki)));
  }

 private:
  cpu::Fp8Emulation e_;
};

CpuBackend g_cpu{KernelOptions{}, {}};

// Kernel spans (trace/trace.h): off unless a recorder is installed.
#define DSA_KERNEL_SPAN(name, x)      \
  trace::Scope span_(name, "kernel"); \
  if (span_.on()) span_.arg("x", (x).shape())

// x [T, in] against rows r0..r1 of W: 2 T (r1 - r0) in FLOPs, the rows' weight bytes.
void linear_args(trace::Scope& s, const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1) {
  const int64_t rows = (r1 < 0 ? w.rows() : r1) - r0, T = x.dim() > 0 ? x.numel() / x.size(-1) : 0;
  s.arg("x", x.shape()).arg("w", w.weight.shape()).arg("rows", rows);
  s.arg("flops", 2.0 * double(T) * double(rows) * double(w.cols()));
  s.arg("weight_bytes", double(rows) * double(w.cols()) * double(dtype_size(w.weight.dtype())));
}
std::atomic<Backend*> g_cuda{nullptr};

}  // namespace

Backend& backend(Device d) {
  if (d == Device::cpu) return g_cpu;
  Backend* b = g_cuda.load();
  DSA_CHECK(b != nullptr, "no {} backend is registered (a build without CUDA?)", device_name(d));
  return *b;
}

std::shared_ptr<Backend> make_cpu_backend(const KernelOptions& options, cpu::TopkObserver observer) {
  return std::make_shared<CpuBackend>(options, std::move(observer));
}

std::shared_ptr<Backend> make_fp8_emulation_backend(const cpu::Fp8Emulation& e, cpu::TopkObserver observer) {
  return std::make_shared<Fp8EmulationBackend>(e, std::move(observer));
}

Backend& Ops::on(Device d) const { return b_ != nullptr && b_->device() == d ? *b_ : kernels::backend(d); }

void register_backend(Device d, Backend* b) {
  DSA_CHECK(d != Device::cpu, "the CPU backend is built in and cannot be replaced");
  g_cuda.store(b);
}

std::vector<float> rope_inv_freq(const RopeParams& p) {
  DSA_CHECK(p.dim > 0 && p.dim % 2 == 0, "rope dim {} must be positive and even", p.dim);
  const int64_t half = p.dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in fp32.
    const float expo = float(2 * i) / float(p.dim);
    const float pw = float(std::pow(double(float(p.theta)), double(expo)));
    inv[size_t(i)] = 1.0f / pw;
  }
  if (!p.yarn) return inv;
  // yarn: pos_freqs = base ** (arange(0, dim, 2) / dim); blend 1/pos_freqs and 1/(factor*pos_freqs).
  DSA_CHECK(p.factor > 0 && p.original_max_position_embeddings > 0, "yarn needs factor and original max pos");
  auto correction_dim = [&](double rotations) {
    return (double(p.dim) * std::log(double(p.original_max_position_embeddings) / (rotations * 2 * M_PI))) /
           (2 * std::log(p.theta));
  };
  double low = std::floor(correction_dim(p.beta_fast));
  double high = std::ceil(correction_dim(p.beta_slow));
  low = std::max(low, 0.0);
  high = std::min(high, double(p.dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float expo = float(2 * i) / float(p.dim);
    const float pos_freq = float(std::pow(double(float(p.theta)), double(expo)));
    const float extrap = 1.0f / pos_freq;
    const float interp = 1.0f / (float(p.factor) * pos_freq);
    double ramp = (double(i) - low) / (high - low);
    ramp = std::min(1.0, std::max(0.0, ramp));
    const float extrap_factor = float(1.0 - ramp);
    inv[size_t(i)] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
  }
  return inv;
}

Tensor Ops::embedding(const Tensor& table, const Tensor& ids) const {
  DSA_KERNEL_SPAN("embedding", ids);
  return on(table.device()).embedding(table, ids);
}
Tensor Ops::rms_norm(const Tensor& x, const Tensor& w, double eps) const {
  DSA_KERNEL_SPAN("rms_norm", x);
  return on(x.device()).rms_norm(x, w, eps);
}
Tensor Ops::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) const {
  DSA_KERNEL_SPAN("add_rms_norm", x);
  return on(x.device()).add_rms_norm(residual, x, w, eps);
}
Tensor Ops::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) const {
  DSA_KERNEL_SPAN("layer_norm", x);
  return on(x.device()).layer_norm(x, w, b, eps);
}
Tensor Ops::linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) const {
  trace::Scope span_("linear", "kernel");
  if (span_.on()) linear_args(span_, x, w, r0, r1);
  return on(x.device()).linear(x, w, r0, r1, std::move(out));
}
std::vector<Tensor> Ops::linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                      const Fp8Act* q) const {
  trace::Scope span_("linear_multi", "kernel");
  if (span_.on()) {
    double flops = 0, bytes = 0;
    const int64_t T = x.dim() > 0 ? x.numel() / x.size(-1) : 0;
    for (const WeightRef& w : ws) {
      flops += 2.0 * double(T) * double(w.rows()) * double(w.cols());
      bytes += double(w.rows()) * double(w.cols()) * double(dtype_size(w.weight.dtype()));
    }
    span_.arg("x", x.shape())
        .arg("weights", int64_t(ws.size()))
        .arg("flops", flops)
        .arg("weight_bytes", bytes);
  }
  return on(x.device()).linear_multi(x, ws, q);
}
Tensor Ops::rms_norm_fp8(const Tensor& x, const Tensor& w, double eps, Fp8Act& q) const {
  DSA_KERNEL_SPAN("rms_norm", x);
  return on(x.device()).norm_fp8(nullptr, x, w, eps, q);
}
Tensor Ops::add_rms_norm_fp8(Tensor& residual, const Tensor& x, const Tensor& w, double eps,
                             Fp8Act& q) const {
  DSA_KERNEL_SPAN("add_rms_norm", x);
  return on(x.device()).norm_fp8(&residual, x, w, eps, q);
}
Tensor Ops::linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) const {
  trace::Scope span_("linear_t", "kernel");
  if (span_.on()) linear_args(span_, x, w, r0, r1);
  return on(x.device()).linear_t(x, w, r0, r1, std::move(out));
}
void Ops::rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) const {
  DSA_KERNEL_SPAN("rope_inplace", x);
  on(x.device()).rope_inplace(x, positions, p);
}
Tensor Ops::silu_mul(const Tensor& gate, const Tensor& up) const {
  DSA_KERNEL_SPAN("silu_mul", gate);
  return on(gate.device()).silu_mul(gate, up);
}
Tensor Ops::silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q) const {
  DSA_KERNEL_SPAN("silu_mul", gate);
  return on(gate.device()).silu_mul_fp8(gate, up, q);
}
Tensor Ops::argmax(const Tensor& x) const {
  DSA_KERNEL_SPAN("argmax", x);
  return on(x.device()).argmax(x);
}
void fill_dummy(Tensor& t, const dummy::FillSpec& f) { backend(t.device()).fill_dummy(t, f); }
void Ops::add_inplace(Tensor& a, const Tensor& b) const {
  DSA_KERNEL_SPAN("add_inplace", a);
  on(a.device()).add_inplace(a, b);
}
void Ops::copy_rows(Tensor& dst, const Tensor& src) const {
  DSA_KERNEL_SPAN("copy_rows", src);
  on(dst.device()).copy_rows(dst, src);
}
Tensor Ops::gather_rows(const Tensor& x, const Tensor& idx) const {
  DSA_KERNEL_SPAN("gather_rows", x);
  return on(x.device()).gather_rows(x, idx);
}
void Ops::paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) const {
  DSA_KERNEL_SPAN("paged_store", src);
  on(cache.device()).paged_store(cache, slots, src);
}
Tensor Ops::paged_gather(const PagedSeq& seq, int64_t n) const {
  DSA_KERNEL_SPAN("paged_gather", seq.cache);
  return on(seq.cache.device()).paged_gather(seq, n);
}
Tensor Ops::indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos,
                         int64_t topk, double scale, double weight_scale) const {
  DSA_KERNEL_SPAN("indexer_topk", q);
  return on(q.device()).indexer_topk(q, w, keys, start_pos, topk, scale, weight_scale);
}
Tensor Ops::mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                   int64_t start_pos, const Tensor& sel, double scale) const {
  DSA_KERNEL_SPAN("mla_attention_absorbed", q_lat);
  return on(q_lat.device()).mla_attention_absorbed(q_lat, q_rope, kv, start_pos, sel, scale);
}
Tensor Ops::indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk,
                              double scale, double weight_scale) const {
  DSA_KERNEL_SPAN("indexer_topk", q);
  return on(q.device()).indexer_topk_rows(q, w, keys, topk, scale, weight_scale);
}
Tensor Ops::mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv,
                               const Tensor& sel, double scale) const {
  DSA_KERNEL_SPAN("mla_attention_absorbed", q_lat);
  return on(q_lat.device()).mla_attention_rows(q_lat, q_rope, kv, sel, scale);
}
MlaRowsPlan Ops::plan_mla_rows(Device d, int64_t rows, int64_t heads, int64_t max_keys) const {
  return on(d).plan_mla_rows(rows, heads, max_keys);
}
IndexerRowsPlan Ops::plan_indexer_rows(Device d, int64_t rows, int64_t max_len, int64_t topk,
                                       std::span<const int32_t> len_host) const {
  return on(d).plan_indexer_rows(rows, max_len, topk, len_host);
}
Tensor Ops::attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                          int64_t start_pos, const Tensor& sel, double scale) const {
  DSA_KERNEL_SPAN("attention_mha", q);
  return on(q.device()).attention_mha(q, k_nope, k_rope, v, start_pos, sel, scale);
}
void check_attention_mha_shapes(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                                int64_t start_pos) {
  DSA_CHECK(q.dim() == 3 && k_nope.dim() == 3 && k_rope.dim() == 2 && v.dim() == 3,
            "mha: q {}, k_nope {}, k_rope {}, v {} must be 3-D, 3-D, 2-D, 3-D", q.describe(),
            k_nope.describe(), k_rope.describe(), v.describe());
  const int64_t T = q.size(0), nh = q.size(1), nope = k_nope.size(2), R = k_rope.size(1), S = k_nope.size(0);
  DSA_CHECK(q.size(2) == nope + R, "mha: q {} should have nope {} + rope {} per head", q.describe(), nope, R);
  DSA_CHECK(k_nope.size(1) == nh && v.size(1) == nh && v.size(0) == S && k_rope.size(0) == S,
            "mha: k_nope {}, k_rope {}, v {} disagree", k_nope.describe(), k_rope.describe(), v.describe());
  DSA_CHECK(start_pos + T <= S, "mha: {} keys cannot serve positions up to {}", S, start_pos + T - 1);
}

namespace {

// A request inside a PagedRows batch: rows [begin, end) of sequence seq at positions start_pos...
struct RowRun {
  int64_t begin = 0, end = 0, seq = 0, start_pos = 0;
};

// Splits the rows into runs of one sequence at consecutive positions; checks the host metadata.
std::vector<RowRun> row_runs(const PagedRows& b, int64_t rows, const char* what) {
  DSA_CHECK(int64_t(b.seq_host.size()) == rows && int64_t(b.len_host.size()) == rows,
            "{}: {} rows but host metadata of {} / {} rows", what, rows, b.seq_host.size(),
            b.len_host.size());
  DSA_CHECK(b.page_table.defined() && b.page_table.dtype() == DType::i32 && b.page_table.dim() == 2,
            "{}: page table must be i32 [num_seqs, max_pages], got {}", what,
            b.page_table.defined() ? b.page_table.describe() : std::string("nothing"));
  std::vector<RowRun> runs;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t s = b.seq_host[size_t(i)], n = b.len_host[size_t(i)];
    DSA_CHECK(s >= 0 && s < b.page_table.size(0), "{}: row {} names sequence {} of {}", what, i, s,
              b.page_table.size(0));
    DSA_CHECK(n >= 1 && n <= b.max_len, "{}: row {} sees {} positions, max_len is {}", what, i, n, b.max_len);
    if (!runs.empty() && runs.back().seq == s && runs.back().start_pos + (i - runs.back().begin) + 1 == n) {
      runs.back().end = i + 1;
    } else {
      runs.push_back(RowRun{i, i + 1, s, n - 1});
    }
  }
  return runs;
}

PagedSeq run_seq(const PagedRows& b, const RowRun& r) {
  return PagedSeq{b.cache, b.page_table.select(0, r.seq), b.page_size};
}

}  // namespace

Tensor Backend::norm_fp8(Tensor* residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q) {
  q = Fp8Act{};
  return residual ? add_rms_norm(*residual, x, w, eps) : rms_norm(x, w, eps);
}

Tensor Backend::silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q) {
  q = Fp8Act{};
  return silu_mul(gate, up);
}

std::vector<Tensor> Backend::linear_multi(const Tensor& x, const std::vector<WeightRef>& ws, const Fp8Act*) {
  std::vector<Tensor> out;
  out.reserve(ws.size());
  for (const WeightRef& w : ws) out.push_back(linear(x, w, 0, w.rows(), Tensor()));
  return out;
}

std::shared_ptr<const DerivedWeight> Backend::derive_weight(const WeightRef&, WeightUse) const {
  return nullptr;
}
std::shared_ptr<const DerivedExperts> Backend::derive_experts(const std::vector<MlpRef>&) const {
  return nullptr;
}

MlaRowsPlan Backend::plan_mla_rows(int64_t, int64_t, int64_t) { return MlaRowsPlan{}; }
IndexerRowsPlan Backend::plan_indexer_rows(int64_t, int64_t, int64_t, std::span<const int32_t>) {
  return IndexerRowsPlan{};
}

Tensor Backend::indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk,
                                  double scale, double weight_scale) {
  const int64_t R = q.size(0);
  DSA_CHECK(topk > 0, "indexer: topk {} must be positive", topk);
  const std::vector<RowRun> runs = row_runs(keys, R, "indexer rows");
  const int64_t kout = std::min(topk, keys.max_len);
  Tensor out = Tensor::empty({R, kout}, DType::i32);  // assembled on the host
  int32_t* o = out.data<int32_t>();
  for (const RowRun& r : runs) {
    const int64_t T = r.end - r.begin, S = r.start_pos + T;
    if (S <= topk) {  // every row sees at most topk keys: all of them, no scoring
      for (int64_t t = 0; t < T; ++t) {
        int32_t* row = o + (r.begin + t) * kout;
        for (int64_t j = 0; j < kout; ++j) row[j] = j <= r.start_pos + t ? int32_t(j) : -1;
      }
      continue;
    }
    const Tensor sel = indexer_topk(q.slice(0, r.begin, r.end), w.slice(0, r.begin, r.end), run_seq(keys, r),
                                    r.start_pos, topk, scale, weight_scale);
    const Tensor h = sel.device() == Device::cpu ? sel : sel.to(Device::cpu);  // [T, min(topk, S)]
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* src = h.data<int32_t>() + t * h.stride(0);
      int32_t* row = o + (r.begin + t) * kout;
      for (int64_t j = 0; j < kout; ++j) row[j] = j < h.size(1) ? src[j] : -1;
    }
  }
  return q.device() == Device::cpu ? out : out.to(q.device());
}

Tensor Backend::mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv,
                                   const Tensor& sel, double scale) {
  DSA_CHECK(q_lat.dim() == 3, "mla rows: q_lat must be [R, heads, kv_lora], got {}", q_lat.describe());
  const int64_t R = q_lat.size(0), nh = q_lat.size(1), L = q_lat.size(2);
  DSA_CHECK(!sel.defined() || (sel.dim() == 2 && sel.size(0) == R),
            "mla rows: selection {} should have {} rows", sel.defined() ? sel.describe() : std::string(), R);
  const std::vector<RowRun> runs = row_runs(kv, R, "mla rows");
  Tensor out = Tensor::empty({R, nh, L}, DType::f32, q_lat.device());
  for (const RowRun& r : runs) {
    const int64_t T = r.end - r.begin;
    const Tensor o = mla_attention_absorbed(q_lat.slice(0, r.begin, r.end), q_rope.slice(0, r.begin, r.end),
                                            run_seq(kv, r), r.start_pos,
                                            sel.defined() ? sel.slice(0, r.begin, r.end) : Tensor(), scale);
    Tensor dst = out.slice(0, r.begin, r.end).view({T * nh, L});
    copy_rows(dst, o.view({T * nh, L}));
  }
  return out;
}

void MoeRouteParams::validate(int64_t n_experts) const {
  DSA_CHECK(n_group >= 1 && n_experts % n_group == 0, "moe_route: {} experts do not split into {} groups",
            n_experts, n_group);
  DSA_CHECK(topk_group >= 1 && topk_group <= n_group, "moe_route: topk_group {} of {} groups", topk_group,
            n_group);
  const int64_t per_group = n_experts / n_group;
  DSA_CHECK(top_k >= 1 && top_k <= topk_group * per_group, "moe_route: top_k {} exceeds {} eligible experts",
            top_k, topk_group * per_group);
}

Routing Ops::moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) const {
  DSA_KERNEL_SPAN("moe_route", logits);
  return on(logits.device()).moe_route(logits, bias, p);
}
Tensor Ops::moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                        const Fp8Act* q, const DerivedExperts* derived, const Tensor* add) const {
  DSA_KERNEL_SPAN("moe_experts", x);
  DSA_CHECK(q == nullptr || !q->defined() ||
                (q->codes.device() == x.device() && q->scales.defined() && q->scales.device() == x.device()),
            "moe_experts: the input's FP8 copy ({}) is not on the input's device ({})", q->codes.describe(),
            x.describe());
  // The addend's device here (as q's); its shape and layout where it is read (add_inplace, the CUDA combine).
  const bool has_add = add != nullptr && add->defined();
  DSA_CHECK(!has_add || add->device() == x.device(),
            "moe_experts: the addend ({}) is not on the input's device ({})", has_add ? add->describe() : "",
            x.describe());
  return on(x.device()).moe_experts(x, routing, experts, q, derived, has_add ? add : nullptr);
}

// The free operators: the registered backends (Ops without a backend of its own).
Tensor embedding(const Tensor& table, const Tensor& ids) { return Ops().embedding(table, ids); }
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) { return Ops().rms_norm(x, w, eps); }
Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) {
  return Ops().add_rms_norm(residual, x, w, eps);
}
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  return Ops().layer_norm(x, w, b, eps);
}
Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) {
  return Ops().linear(x, w, r0, r1, std::move(out));
}
std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<WeightRef>& ws, const Fp8Act* q) {
  return Ops().linear_multi(x, ws, q);
}
Tensor rms_norm_fp8(const Tensor& x, const Tensor& w, double eps, Fp8Act& q) {
  return Ops().rms_norm_fp8(x, w, eps, q);
}
Tensor add_rms_norm_fp8(Tensor& residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q) {
  return Ops().add_rms_norm_fp8(residual, x, w, eps, q);
}
Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) {
  return Ops().linear_t(x, w, r0, r1, std::move(out));
}
void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) {
  Ops().rope_inplace(x, positions, p);
}
Tensor silu_mul(const Tensor& gate, const Tensor& up) { return Ops().silu_mul(gate, up); }
Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q) {
  return Ops().silu_mul_fp8(gate, up, q);
}
Tensor argmax(const Tensor& x) { return Ops().argmax(x); }
void add_inplace(Tensor& a, const Tensor& b) { Ops().add_inplace(a, b); }
void copy_rows(Tensor& dst, const Tensor& src) { Ops().copy_rows(dst, src); }
Tensor gather_rows(const Tensor& x, const Tensor& idx) { return Ops().gather_rows(x, idx); }
void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) {
  Ops().paged_store(cache, slots, src);
}
Tensor paged_gather(const PagedSeq& seq, int64_t n) { return Ops().paged_gather(seq, n); }
Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale) {
  return Ops().indexer_topk(q, w, keys, start_pos, topk, scale, weight_scale);
}
Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale) {
  return Ops().mla_attention_absorbed(q_lat, q_rope, kv, start_pos, sel, scale);
}
Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk, double scale,
                         double weight_scale) {
  return Ops().indexer_topk_rows(q, w, keys, topk, scale, weight_scale);
}
Tensor mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                          double scale) {
  return Ops().mla_attention_rows(q_lat, q_rope, kv, sel, scale);
}
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale) {
  return Ops().attention_mha(q, k_nope, k_rope, v, start_pos, sel, scale);
}
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) {
  return Ops().moe_route(logits, bias, p);
}
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const Fp8Act* q, const DerivedExperts* derived, const Tensor* add) {
  return Ops().moe_experts(x, routing, experts, q, derived, add);
}

}  // namespace dsaserve::kernels
