// Host wrappers of the row-wise operators: embedding, norms, RoPE, SiLU-mul, argmax, row copies and adds,
// gathers and the paged cache's store / gather.
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/graph.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/elementwise/elementwise_params.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/indexer/indexer_kernels.h"

namespace dsaserve::kernels::cuda {

namespace {

RowsParams rows_params(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows,
                       int64_t cols, RowOp op, bool pdl) {
  RowsParams p{};
  p.pdl = pdl;
  p.src = src;
  p.dst = dst;
  p.src_stride = src_stride;
  p.dst_stride = dst_stride;
  p.rows = rows;
  p.cols = cols;
  p.op = op;
  p.page_size = 1;
  return p;
}

// Range checks that read indices back to the host; skipped under graph capture (a device->host copy is
// illegal there: the graph runner validates its batches on the host before every replay).
void check_indices(const Tensor& idx, int64_t bound, const char* what) {
  if (capturing()) return;
  const std::vector<int32_t> v = i32_to_host(idx);
  for (size_t i = 0; i < v.size(); ++i) {
    DSA_CHECK(v[i] >= 0 && v[i] < bound, "{}: index {} at {} outside [0, {})", what, v[i], i, bound);
  }
}

// The RoPE tables of one device (per_device_state): inverse frequencies per parameter set.
struct RopeTables {
  using Key = std::tuple<int64_t, double, bool, double, int64_t, double, double>;
  std::mutex mu;
  std::map<Key, Tensor> inv_freq;
};

}  // namespace

const float* rope_inv_freq_device(const RopeParams& p) {
  RopeTables& t = per_device_state<RopeTables>();
  const RopeTables::Key key{p.dim,       p.theta,    p.yarn, p.factor, p.original_max_position_embeddings,
                            p.beta_fast, p.beta_slow};
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.inv_freq.find(key);
  if (it == t.inv_freq.end()) {
    DSA_CHECK(!capturing(),
              "rope: inverse frequencies first needed inside a CUDA graph capture (run one eager "
              "step of the same model before capturing)");
    const std::vector<float> inv = rope_inv_freq(p);
    const Tensor host = Tensor::from_vector(inv, {int64_t(inv.size())});
    it = t.inv_freq.emplace(key, host.to(Device::cuda)).first;
  }
  return it->second.data<float>();
}

namespace {

Tensor norm_common(const Tensor& x, Tensor* residual, const Tensor& w, double eps, const char* what,
                   Fp8Act* q, const KernelOptions& o) {
  const RowView xv = rows_f32(x, what);
  RowView rv{};
  if (residual) {
    rv = rows_f32(*residual, "add_rms_norm residual");
    DSA_CHECK(rv.rows == xv.rows && rv.cols == xv.cols, "add_rms_norm: residual {} and input {} differ",
              residual->describe(), x.describe());
  }
  const bool wb = vec_bf16(w, xv.cols, "rms_norm weight");
  Tensor out = Tensor::empty({xv.rows, xv.cols}, DType::f32, Device::cuda);
  RmsNormParams p{xv.p,         residual ? rv.p : nullptr,
                  w.raw_data(), out.data<float>(),
                  xv.rows,      xv.cols,
                  xv.stride,    rv.stride,
                  wb,           eps};
  p.pdl = o.pdl;
  if (q) {
    *q = Fp8Act{};
    if (rms_norm_fp8_fusable(p) && o.gemm == GemmPrecision::fast) {
      const int64_t Tp = fp8_act_rows(xv.rows, o.gemm_fp8_small_max_tokens);
      *q = empty_fp8_act(xv.rows, Tp, xv.cols);
      p.q_codes = q->codes.data_u8();
      p.q_scales = q->scales.data<float>();
      p.q_rows_pad = Tp;
    }
  }
  check_launch(launch_rms_norm(p, op_stream()), what);
  return out;
}

}  // namespace

Tensor embedding(const Tensor& table, const Tensor& ids, const KernelOptions& o) {
  DSA_CHECK(table.defined() && table.device() == Device::cuda && table.dim() == 2 && table.is_contiguous() &&
                (table.dtype() == DType::bf16 || table.dtype() == DType::f32),
            "embedding: table must be a contiguous 2-D CUDA bf16/f32 tensor");
  const int32_t* id = i32_vec(ids, "embedding ids");
  const int64_t T = ids.size(0), V = table.size(0), H = table.size(1);
  if (!capturing()) {  // under capture the caller has checked the ids on the host
    const std::vector<int32_t> host = i32_to_host(ids);
    for (int64_t t = 0; t < T; ++t) {
      DSA_CHECK(host[size_t(t)] >= 0 && host[size_t(t)] < V,
                "token id {} at index {} is out of range [0, {})", host[size_t(t)], t, V);
    }
  }
  Tensor out = Tensor::empty({T, H}, DType::f32, Device::cuda);
  EmbeddingParams p{table.raw_data(), id, out.data<float>(), T, H, table.dtype() == DType::bf16};
  p.pdl = o.pdl;
  check_launch(launch_embedding(p, op_stream()), "embedding");
  return out;
}

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, const KernelOptions& o) {
  return norm_common(x, nullptr, w, eps, "rms_norm", nullptr, o);
}

Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps, const KernelOptions& o) {
  return norm_common(x, &residual, w, eps, "add_rms_norm", nullptr, o);
}

Tensor norm_fp8(Tensor* residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q,
                const KernelOptions& o) {
  return norm_common(x, residual, w, eps, residual ? "add_rms_norm" : "rms_norm", &q, o);
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const KernelOptions& o) {
  const RowView xv = rows_f32(x, "layer_norm input");
  const bool wb = vec_bf16(w, xv.cols, "layer_norm weight");
  const bool bb = vec_bf16(b, xv.cols, "layer_norm bias");
  Tensor out = Tensor::empty({xv.rows, xv.cols}, DType::f32, Device::cuda);
  LayerNormParams p{xv.p, w.raw_data(), b.raw_data(), out.data<float>(), xv.rows, xv.cols, xv.stride,
                    wb,   bb,           eps};
  p.pdl = o.pdl;
  check_launch(launch_layer_norm(p, op_stream()), "layer_norm");
  return out;
}

void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p, const KernelOptions& o) {
  const Rows3View v = rows3_f32(x, "rope input");
  DSA_CHECK(v.n2 == p.dim, "rope: last dimension of {} should be the rope dim {}", x.describe(), p.dim);
  const int32_t* pos = i32_vec(positions, "rope positions");
  DSA_CHECK(positions.size(0) == v.n0, "rope: {} positions for {} tokens", positions.size(0), v.n0);
  const float* inv = rope_inv_freq_device(p);
  RopeKernelParams k{v.p, pos, inv, v.n0, v.n1, v.n2, v.s0, v.s1, p.interleaved, p.attention_factor};
  k.pdl = o.pdl;
  check_launch(launch_rope(k, op_stream()), "rope");
}

Tensor silu_mul(const Tensor& gate, const Tensor& up, const KernelOptions& o) {
  const RowView g = rows_f32(gate, "silu_mul gate");
  const RowView u = rows_f32(up, "silu_mul up");
  DSA_CHECK(g.rows == u.rows && g.cols == u.cols, "silu_mul: gate {} and up {} differ", gate.describe(),
            up.describe());
  Tensor out = Tensor::empty({g.rows, g.cols}, DType::f32, Device::cuda);
  SiluMulParams p{g.p, u.p, out.data<float>(), g.rows, g.cols, g.stride, u.stride, g.cols};
  p.pdl = o.pdl;
  check_launch(launch_silu_mul(p, op_stream()), "silu_mul");
  return out;
}

Tensor argmax(const Tensor& x, const KernelOptions& o) {
  const RowView xv = rows_f32(x, "argmax input");
  DSA_CHECK(xv.cols > 0, "argmax of an empty row");
  Tensor out = Tensor::empty({xv.rows}, DType::i32, Device::cuda);
  ArgmaxParams p{xv.p, out.data<int32_t>(), xv.rows, xv.cols, xv.stride};
  p.pdl = o.pdl;
  check_launch(launch_argmax(p, op_stream()), "argmax");
  return out;
}

void add_inplace(Tensor& a, const Tensor& b, const KernelOptions& o) {
  const RowView av = rows_f32(a, "add_inplace target");
  const RowView bv = rows_f32(b, "add_inplace source");
  DSA_CHECK(av.rows == bv.rows && av.cols == bv.cols, "add_inplace: {} and {} differ", a.describe(),
            b.describe());
  check_launch(launch_rows(rows_params(bv.p, bv.stride, av.p, av.stride, av.rows, av.cols, RowOp::add, o.pdl),
                           op_stream()),
               "add_inplace");
}

void copy_rows(Tensor& dst, const Tensor& src, const KernelOptions& o) {
  const RowView dv = rows_f32(dst, "copy_rows target");
  const RowView sv = rows_f32(src, "copy_rows source");
  DSA_CHECK(dv.rows == sv.rows && dv.cols == sv.cols, "copy_rows: {} into {}", src.describe(),
            dst.describe());
  check_launch(
      launch_rows(rows_params(sv.p, sv.stride, dv.p, dv.stride, dv.rows, dv.cols, RowOp::copy, o.pdl),
                  op_stream()),
      "copy_rows");
}

Tensor gather_rows(const Tensor& x, const Tensor& idx, const KernelOptions& o) {
  const RowView xv = rows_f32(x, "gather_rows input");
  const int32_t* id = i32_vec(idx, "gather_rows indices");
  check_indices(idx, xv.rows, "gather_rows");
  const int64_t m = idx.size(0);
  Tensor out = Tensor::empty({m, xv.cols}, DType::f32, Device::cuda);
  RowsParams p = rows_params(xv.p, xv.stride, out.raw_data(), xv.cols, m, xv.cols, RowOp::copy, o.pdl);
  p.src_rows = id;
  check_launch(launch_rows(p, op_stream()), "gather_rows");
  return out;
}

namespace {

// A bf16 cache view [rows, cols] (last dimension contiguous) for the converting row kernel.
struct Bf16View {
  void* p = nullptr;
  int64_t rows = 0, cols = 0, stride = 0;
};
Bf16View rows_bf16(const Tensor& t, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.dtype() == DType::bf16 && t.dim() == 2 &&
                (t.stride(1) == 1 || t.size(1) <= 1),
            "{}: expected a CUDA bf16 [rows, cols] view with a contiguous last dimension, got {}", what,
            t.defined() ? t.describe() : std::string("nothing"));
  return {t.raw_data(), t.size(0), t.size(1), t.stride(0)};
}

}  // namespace

// Caches: f32 [slots, D] (any view), bf16 [slots, D] (any view; rounded to nearest), or the FP8 latent
// cache u8 [slots, 656] (whole rows only: src [T, 576], quantised per 128 values).
void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src, const KernelOptions& o) {
  if (cache.defined() && cache.dtype() == DType::u8) {
    check_indices(slots, cache.size(0), "paged_store slots");
    if (cache.dim() == 2 && cache.size(1) == kIndexerFp8RowBytes) {
      indexer_key_cache_store(cache, slots, src, op_stream());  // FP8 index keys
    } else {
      mla_kv_cache_store(cache, slots, src, op_stream());
    }
    return;
  }
  const RowView s = rows_f32(src, "paged_store source");
  const int32_t* sl = i32_vec(slots, "paged_store slots");
  const bool bf16 = cache.defined() && cache.dtype() == DType::bf16;
  const RowView c = bf16 ? RowView{} : rows_f32(cache, "paged_store cache");
  const Bf16View cb = bf16 ? rows_bf16(cache, "paged_store cache") : Bf16View{};
  const int64_t c_rows = bf16 ? cb.rows : c.rows, c_cols = bf16 ? cb.cols : c.cols;
  DSA_CHECK(slots.size(0) == s.rows && s.cols == c_cols, "paged_store: {} slots, source {}, cache {}",
            slots.size(0), src.describe(), cache.describe());
  check_indices(slots, c_rows, "paged_store slots");
  RowsParams p = bf16 ? rows_params(s.p, s.stride, cb.p, cb.stride, s.rows, s.cols, RowOp::copy, o.pdl)
                      : rows_params(s.p, s.stride, c.p, c.stride, s.rows, s.cols, RowOp::copy, o.pdl);
  p.dst_bf16 = bf16;
  p.dst_rows = sl;
  check_launch(launch_rows(p, op_stream()), "paged_store");
}

void check_pages(const PagedSeq& seq, int64_t n, int64_t cache_rows, const char* what) {
  DSA_CHECK(seq.page_size > 0, "{}: page size must be positive", what);
  const int32_t* pt = i32_vec(seq.page_table, what);
  (void)pt;
  const int64_t n_pages = seq.page_table.size(0);
  DSA_CHECK(n <= n_pages * seq.page_size, "{}: {} positions need {} pages, the page table has {}", what, n,
            (n + seq.page_size - 1) / seq.page_size, n_pages);
  const int64_t used = (n + seq.page_size - 1) / seq.page_size;
  const int64_t total_pages = cache_rows / seq.page_size;
  if (used == 0 || capturing()) return;
  const std::vector<int32_t> pages = i32_to_host(seq.page_table.slice(0, 0, used));
  for (int64_t i = 0; i < used; ++i) {
    DSA_CHECK(pages[size_t(i)] >= 0 && pages[size_t(i)] < total_pages,
              "{}: page id {} outside the pool of {} pages", what, pages[size_t(i)], total_pages);
  }
}

// f32 [n, D] from an f32 or bf16 cache [slots, D], or from the FP8 latent cache u8 [slots, 656] (-> [n,
// 576]).
Tensor paged_gather(const PagedSeq& seq, int64_t n, const KernelOptions& o) {
  if (seq.cache.defined() && seq.cache.dtype() == DType::u8) {
    if (seq.cache.dim() == 2 && seq.cache.size(1) == kIndexerFp8RowBytes) {  // FP8 index keys
      check_pages(seq, n, seq.cache.size(0), "paged_gather");
      return indexer_key_cache_gather(seq.cache, seq.page_table, seq.page_size, n, op_stream());
    }
    return mla_kv_cache_gather(seq.cache, seq.page_table, seq.page_size, n, op_stream());
  }
  const bool bf16 = seq.cache.defined() && seq.cache.dtype() == DType::bf16;
  const RowView c = bf16 ? RowView{} : rows_f32(seq.cache, "paged_gather cache");
  const Bf16View cb = bf16 ? rows_bf16(seq.cache, "paged_gather cache") : Bf16View{};
  const int64_t rows = bf16 ? cb.rows : c.rows, cols = bf16 ? cb.cols : c.cols;
  check_pages(seq, n, rows, "paged_gather");
  Tensor out = Tensor::empty({n, cols}, DType::f32, Device::cuda);
  RowsParams p = bf16 ? rows_params(cb.p, cb.stride, out.raw_data(), cols, n, cols, RowOp::copy, o.pdl)
                      : rows_params(c.p, c.stride, out.raw_data(), cols, n, cols, RowOp::copy, o.pdl);
  p.src_bf16 = bf16;
  p.page_table = i32_vec(seq.page_table, "paged_gather page table");
  p.page_size = seq.page_size;
  check_launch(launch_rows(p, op_stream()), "paged_gather");
  return out;
}

}  // namespace dsaserve::kernels::cuda
