#include "kernels/cuda/attention/attention_kernels.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda/attention/mha_prefill_params.h"
#include "kernels/cuda/common/check.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/query_rows.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"

namespace dsaserve::kernels::cuda {

namespace {

int sm_count() { return device_sm_count(); }

}  // namespace

Tensor mla_kv_cache_empty(int64_t num_slots, MlaKvFormat format) {
  DSA_CHECK(num_slots > 0, "mla cache: {} slots", num_slots);
  return format == MlaKvFormat::bf16 ? Tensor::empty({num_slots, kMlaDim}, DType::bf16, Device::cuda)
                                     : Tensor::empty({num_slots, kMlaFp8RowBytes}, DType::u8, Device::cuda);
}

MlaKvFormat mla_kv_format(const Tensor& cache) {
  DSA_CHECK(cache.defined() && cache.device() == Device::cuda && cache.dim() == 2 && cache.is_contiguous(),
            "mla cache: expected a contiguous 2-D CUDA tensor, got {}",
            cache.defined() ? cache.describe() : std::string("nothing"));
  if (cache.dtype() == DType::bf16 && cache.size(1) == kMlaDim) return MlaKvFormat::bf16;
  if (cache.dtype() == DType::u8 && cache.size(1) == kMlaFp8RowBytes) return MlaKvFormat::fp8_e4m3;
  fail("mla cache: expected bf16 [slots, {}] or u8 [slots, {}] (fp8), got {}", kMlaDim, kMlaFp8RowBytes,
       cache.describe());
}

void mla_kv_cache_store(Tensor& cache, const Tensor& slots, const Tensor& src, cudaStream_t stream) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(src, DType::f32, 2, "mla cache store source");
  check_gpu(slots, DType::i32, 1, "mla cache store slots");
  DSA_CHECK(src.size(1) == kMlaDim && slots.size(0) == src.size(0),
            "mla cache store: source {} should be [{}, {}] for slots {}", src.describe(), slots.size(0),
            kMlaDim, slots.describe());
  MlaCacheStoreParams p{};
  p.src = src.data<float>();
  p.slots = slots.data<int32_t>();
  p.cache = cache.raw_data();
  p.n = src.size(0);
  p.src_stride = src.stride(0);
  p.num_slots = cache.size(0);
  p.format = f;
  DSA_CUDA_CHECK(launch_mla_cache_store(p, stream));
}

Tensor mla_kv_cache_gather(const Tensor& cache, const Tensor& page_table, int64_t page_size, int64_t n,
                           cudaStream_t stream) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(page_table, DType::i32, 1, "mla cache gather page table");
  DSA_CHECK(n >= 0, "mla cache gather: {} positions", n);
  check_pages(PagedSeq{cache, page_table, page_size}, n, cache.size(0), "mla cache gather");
  Tensor out = Tensor::empty({n, kMlaDim}, DType::f32, Device::cuda);
  MlaCacheGatherParams p{};
  p.cache = cache.raw_data();
  p.page_table = page_table.data<int32_t>();
  p.out = out.data<float>();
  p.n = n;
  p.page_size = page_size;
  p.num_slots = cache.size(0);
  p.format = f;
  DSA_CUDA_CHECK(launch_mla_cache_gather(p, stream));
  return out;
}

MlaRowsPlan plan_mla_decode(int64_t rows, int64_t heads, int64_t max_keys, const KernelOptions& opts) {
  DSA_CHECK(rows >= 0 && heads >= 0 && max_keys >= 0, "mla decode plan: {} rows, {} heads, {} keys", rows,
            heads, max_keys);
  MlaRowsPlan pl;
  pl.planned = true;
  pl.rows = rows;
  pl.heads = heads;
  pl.max_keys = max_keys;
  pl.splits =
      rows == 0 || heads == 0 ? 1 : mla_decode_splits(rows, heads, max_keys, sm_count(), opts.mla_decode);
  if (pl.splits > 1) {
    pl.partial_out_floats = rows * pl.splits * heads * kMlaLatent;
    pl.partial_lse_floats = rows * pl.splits * heads;
  }
  return pl;
}

Tensor mla_decode(const Tensor& q_lat, const Tensor& q_rope, const Tensor& cache, const Tensor& page_table,
                  int64_t page_size, const Tensor& row_seq, const Tensor& row_len, int64_t max_len,
                  const Tensor& sel, double scale, cudaStream_t stream, const KernelOptions& opts,
                  const MlaRowsPlan* given) {
  const MlaKvFormat f = mla_kv_format(cache);
  check_gpu(q_lat, DType::f32, 3, "mla decode q_lat");
  check_gpu(q_rope, DType::f32, 3, "mla decode q_rope");
  const int64_t R = q_lat.size(0), nh = q_lat.size(1);
  DSA_CHECK(q_lat.size(2) == kMlaLatent && q_rope.size(0) == R && q_rope.size(1) == nh &&
                q_rope.size(2) == kMlaRope,
            "mla decode: q_lat {} / q_rope {} should be [R, heads, {}] / [R, heads, {}]", q_lat.describe(),
            q_rope.describe(), kMlaLatent, kMlaRope);
  const RowDesc d = check_rows(page_table, page_size, row_seq, row_len, R, max_len, "mla decode");
  MlaDecodeParams p{};
  if (sel.defined()) {
    check_gpu(sel, DType::i32, 2, "mla decode selection");
    DSA_CHECK(sel.size(0) == R, "mla decode: selection {} should have {} rows", sel.describe(), R);
    p.sel = sel.data<int32_t>();
    p.sel_k = sel.size(1);
    p.sel_stride = sel.stride(0);
  }
  Tensor out = Tensor::empty({R, nh, kMlaLatent}, DType::f32, Device::cuda);
  if (R == 0 || nh == 0) return out;
  p.q_lat = q_lat.data<float>();
  p.q_rope = q_rope.data<float>();
  p.cache = cache.raw_data();
  p.page_table = page_table.data<int32_t>();
  p.row_seq = d.row_seq;
  p.row_len = row_len.data<int32_t>();
  p.out = out.data<float>();
  p.rows = R;
  p.heads = nh;
  p.ql_s0 = q_lat.stride(0);
  p.ql_s1 = q_lat.stride(1);
  p.qr_s0 = q_rope.stride(0);
  p.qr_s1 = q_rope.stride(1);
  p.num_seqs = d.num_seqs;
  p.pt_cols = d.pt_cols;
  p.pt_stride = d.pt_stride;
  p.page_size = page_size;
  p.num_slots = cache.size(0);
  p.max_keys = sel.defined() ? p.sel_k : max_len;
  p.kernel = opts.mla_decode;
  p.v5_order = opts.mla_v5_order;
  p.head_groups_adjacent = opts.mla_head_groups_adjacent;
  p.pdl = opts.pdl;
  const MlaRowsPlan plan =
      given != nullptr && given->planned ? *given : plan_mla_decode(R, nh, p.max_keys, opts);
  DSA_CHECK(plan.rows == R && plan.heads == nh && plan.max_keys == p.max_keys,
            "mla decode: a plan for {} rows x {} heads x {} keys, the call has {} x {} x {}", plan.rows,
            plan.heads, plan.max_keys, R, nh, p.max_keys);
  p.splits = plan.splits;
  p.scale = float(scale);
  p.format = f;
  Tensor part_out, part_lse;
  if (p.splits > 1) {
    part_out = Tensor::empty({plan.partial_out_floats}, DType::f32, Device::cuda);
    part_lse = Tensor::empty({plan.partial_lse_floats}, DType::f32, Device::cuda);
    p.partial_out = part_out.data<float>();
    p.partial_lse = part_lse.data<float>();
  }
  Tensor copy, copy_pt;
  const int64_t seq_pages = std::min(d.pt_cols, (max_len + page_size - 1) / page_size);
  if (f == MlaKvFormat::fp8_e4m3 &&
      select_mla_fp8_bf16_copy(opts.mla_decode, nh, R, d.num_seqs * seq_pages * page_size, p.max_keys)) {
    // Prefill-sized rows: the bf16 kernel (v6, or a requested v5) on a bf16 copy of the sequences' rows
    // (kernel_options.h).
    copy = Tensor::empty({d.num_seqs * seq_pages * page_size, kMlaDim}, DType::bf16, Device::cuda);
    copy_pt = Tensor::empty({d.num_seqs, seq_pages}, DType::i32, Device::cuda);
    MlaCacheBf16CopyParams cp{};
    cp.cache = p.cache;
    cp.page_table = p.page_table;
    cp.out = copy.raw_data();
    cp.out_page_table = copy_pt.data<int32_t>();
    cp.num_seqs = d.num_seqs;
    cp.pt_stride = d.pt_stride;
    cp.seq_pages = seq_pages;
    cp.page_size = page_size;
    cp.num_slots = p.num_slots;
    cp.pdl = opts.pdl;
    DSA_CUDA_CHECK(launch_mla_cache_bf16_copy(cp, stream));
    p.cache = copy.raw_data();
    p.page_table = copy_pt.data<int32_t>();
    p.pt_cols = p.pt_stride = seq_pages;
    p.num_slots = copy.size(0);
    p.format = MlaKvFormat::bf16;
  }
  DSA_CUDA_CHECK(launch_mla_decode(p, stream));
  return out;
}

Tensor mla_attention_absorbed_sm90(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                   int64_t start_pos, const Tensor& sel, double scale,
                                   const KernelOptions& opts) {
  const int64_t T = q_lat.size(0);
  DSA_CHECK(start_pos >= 0, "mla: start position {}", start_pos);
  check_gpu(kv.page_table, DType::i32, 1, "mla page table");
  std::vector<int32_t> len(static_cast<size_t>(T)), seq(static_cast<size_t>(T), 0);
  for (int64_t t = 0; t < T; ++t) len[size_t(t)] = int32_t(start_pos + t + 1);
  const Tensor pt = kv.page_table.view({1, kv.page_table.size(0)});
  return mla_decode(q_lat, q_rope, kv.cache, pt, kv.page_size, gpu_i32(seq), gpu_i32(len), start_pos + T, sel,
                    scale, op_stream(), opts);
}

Tensor mha_bf16_copy(const Tensor& x, cudaStream_t stream) {
  DSA_CHECK(x.defined() && x.device() == Device::cuda && x.dtype() == DType::f32 &&
                (x.dim() == 2 || x.dim() == 3) && x.stride(x.dim() - 1) == 1,
            "mha bf16 copy: expected a 2-D or 3-D f32 CUDA tensor with a contiguous last dim, got {}",
            x.defined() ? x.describe() : std::string("nothing"));
  const bool three = x.dim() == 3;
  MhaToBf16Params p{};
  p.src = x.data<float>();
  p.n0 = x.size(0);
  p.n1 = three ? x.size(1) : 1;
  p.n2 = x.size(x.dim() - 1);
  p.s0 = x.stride(0);
  p.s1 = three ? x.stride(1) : 0;
  Tensor out = three ? Tensor::empty({p.n0, p.n1, p.n2}, DType::bf16, Device::cuda)
                     : Tensor::empty({p.n0, p.n2}, DType::bf16, Device::cuda);
  p.dst = out.raw_data();
  DSA_CUDA_CHECK(launch_mha_to_bf16(p, stream));
  return out;
}

namespace {

// A bf16 CUDA tensor of `dims` dims, last dim contiguous, 16-byte aligned rows (strides multiples of 8).
void check_bf16_rows(const Tensor& t, int64_t dims, const char* what) {
  DSA_CHECK(t.defined() && t.device() == Device::cuda && t.dtype() == DType::bf16 && t.dim() == dims &&
                t.stride(dims - 1) == 1,
            "mha prefill {}: expected a {}-D bf16 CUDA tensor with a contiguous last dim, got {}", what, dims,
            t.defined() ? t.describe() : std::string("nothing"));
  bool aligned = (reinterpret_cast<uintptr_t>(t.raw_data()) & 15) == 0;
  for (int64_t d = 0; d + 1 < dims; ++d) aligned = aligned && t.stride(d) % 8 == 0;
  DSA_CHECK(aligned, "mha prefill {}: rows must start 16-byte aligned, got {}", what, t.describe());
}

}  // namespace

Tensor mha_prefill(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                   int64_t start_pos, double scale, cudaStream_t stream, int tile_rows) {
  check_attention_mha_shapes(q, k_nope, k_rope, v, start_pos);
  DSA_CHECK(tile_rows == 0 || tile_rows == 64 || tile_rows == 128, "mha prefill: {} query rows a block",
            tile_rows);
  check_gpu(q, DType::f32, 3, "mha prefill q");
  DSA_CHECK(q.stride(2) == 1, "mha prefill q: last dim must be contiguous, got {}", q.describe());
  check_bf16_rows(k_nope, 3, "k_nope");
  check_bf16_rows(k_rope, 2, "k_rope");
  check_bf16_rows(v, 3, "v");
  const int64_t T = q.size(0), nh = q.size(1), nope = k_nope.size(2), R = k_rope.size(1), dv = v.size(2);
  DSA_CHECK(start_pos >= 0, "mha prefill: start position {}", start_pos);
  DSA_CHECK(mha_prefill_supported(nope, R, dv),
            "mha prefill: no configuration for nope {} + rope {}, dv {} (256 + 256 or 192 + 128)", nope, R,
            dv);
  Tensor out = Tensor::empty({T, nh, dv}, DType::f32, Device::cuda);
  MhaPrefillParams p{};
  p.q = q.data<float>();
  p.k_nope = k_nope.raw_data();
  p.k_rope = k_rope.raw_data();
  p.v = v.raw_data();
  p.out = out.data<float>();
  p.tokens = T;
  p.heads = nh;
  p.nope = nope;
  p.R = R;
  p.dv = dv;
  p.S = k_nope.size(0);
  p.start_pos = start_pos;
  p.q_s0 = q.stride(0);
  p.q_s1 = q.stride(1);
  p.kn_s0 = k_nope.stride(0);
  p.kn_s1 = k_nope.stride(1);
  p.kr_s0 = k_rope.stride(0);
  p.v_s0 = v.stride(0);
  p.v_s1 = v.stride(1);
  p.scale = float(scale);
  p.tile_rows = tile_rows;
  DSA_CUDA_CHECK(launch_mha_prefill(p, stream));
  return out;
}

}  // namespace dsaserve::kernels::cuda
