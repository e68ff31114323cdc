// Host wrappers of the attention operators: absorbed MLA and MHA attention (the indexer's:
// indexer/ops_indexer.cpp). Over kernel-format latent caches (bf16 or FP8) they run the sm_90a kernels
// (attention_kernels.h); over f32 caches the plain kernels of attention.cu. The MHA form runs the
// tensor-core prefill kernel where select_mha_kernel (kernels/kernel_options.h) picks it, else attention.cu.
#include <algorithm>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/attention/attention_params.h"
#include "kernels/cuda/attention/mha_prefill_params.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"

namespace dsaserve::kernels::cuda {

namespace {

KeySelection selection(const Tensor& sel, int64_t T, int64_t start_pos, const char* what) {
  KeySelection k{nullptr, 0, 0, start_pos};
  if (!sel.defined()) return k;
  DSA_CHECK(sel.device() == Device::cuda && sel.dtype() == DType::i32 && sel.dim() == 2 && sel.size(0) == T &&
                (sel.stride(1) == 1 || sel.size(1) <= 1),
            "{}: selection must be CUDA i32 [{}, k], got {}", what, T, sel.describe());
  // Entries outside -1..start_pos+t are skipped by the kernels (never read out of bounds).
  k.sel = static_cast<const int32_t*>(sel.raw_data());
  k.sel_k = sel.size(1);
  k.sel_stride = sel.stride(0);
  return k;
}

}  // namespace

Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale, const KernelOptions& o) {
  if (kv.cache.defined() && kv.cache.dtype() != DType::f32) {
    (void)mla_kv_format(kv.cache);  // bf16 [slots, 576] or u8 [slots, 656], else a clear error
    return mla_attention_absorbed_sm90(q_lat, q_rope, kv, start_pos, sel, scale, o);
  }
  const Rows3View ql = rows3_f32(q_lat, "mla q_lat");
  const Rows3View qr = rows3_f32(q_rope, "mla q_rope");
  const int64_t T = ql.n0, nh = ql.n1, L = ql.n2, R = qr.n2;
  DSA_CHECK(qr.n0 == T && qr.n1 == nh, "mla: q_lat {} and q_rope {} differ", q_lat.describe(),
            q_rope.describe());
  const RowView c = rows_f32(kv.cache, "mla kv cache");
  DSA_CHECK(c.cols == L + R, "mla: cache rows of {} values, expected kv_lora {} + rope {}", c.cols, L, R);
  check_pages(kv, start_pos + T, c.rows, "mla kv cache");
  MlaParams p{};
  p.q_lat = ql.p;
  p.q_rope = qr.p;
  p.cache = c.p;
  p.page_table = i32_vec(kv.page_table, "mla page table");
  Tensor out = Tensor::empty({T, nh, L}, DType::f32, Device::cuda);
  p.out = out.data<float>();
  p.tokens = T;
  p.heads = nh;
  p.L = L;
  p.R = R;
  p.ql_s0 = ql.s0;
  p.ql_s1 = ql.s1;
  p.qr_s0 = qr.s0;
  p.qr_s1 = qr.s1;
  p.cache_stride = c.stride;
  p.page_size = kv.page_size;
  p.num_slots = c.rows;
  p.keys = selection(sel, T, start_pos, "mla");
  p.scale = float(scale);
  check_launch(launch_mla_absorbed(p, op_stream()), "mla_attention_absorbed");
  return out;
}

Tensor mla_attention_batch(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                           double scale, const KernelOptions& o) {
  return mla_decode(q_lat, q_rope, kv.cache, kv.page_table, kv.page_size, kv.row_seq, kv.row_len, kv.max_len,
                    sel, scale, op_stream(), o, kv.mla_plan);
}

Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale, const KernelOptions& o) {
  const Rows3View qv = rows3_f32(q, "mha q");
  const Rows3View kn = rows3_f32(k_nope, "mha k_nope");
  const RowView kr = rows_f32(k_rope, "mha k_rope");
  const Rows3View vv = rows3_f32(v, "mha v");
  const int64_t T = qv.n0, nh = qv.n1, nope = kn.n2, R = kr.cols, S = kn.n0, dv = vv.n2;
  check_attention_mha_shapes(q, k_nope, k_rope, v, start_pos);
  DSA_CHECK(start_pos >= 0, "mha: start position {}", start_pos);
  if (select_mha_kernel(o.mha, !sel.defined(), mha_prefill_supported(nope, R, dv)) == MhaKernel::mma) {
    // Tensor cores over bf16 copies of the keys and values (the query is converted as the kernel stages it).
    const cudaStream_t s = op_stream();
    return mha_prefill(q, mha_bf16_copy(k_nope, s), mha_bf16_copy(k_rope, s), mha_bf16_copy(v, s), start_pos,
                       scale, s);
  }
  MhaParams p{};
  p.q = qv.p;
  p.k_nope = kn.p;
  p.k_rope = kr.p;
  p.v = vv.p;
  Tensor out = Tensor::empty({T, nh, dv}, DType::f32, Device::cuda);
  p.out = out.data<float>();
  p.tokens = T;
  p.heads = nh;
  p.nope = nope;
  p.R = R;
  p.dv = dv;
  p.S = S;
  p.q_s0 = qv.s0;
  p.q_s1 = qv.s1;
  p.kn_s0 = kn.s0;
  p.kn_s1 = kn.s1;
  p.kr_s0 = kr.stride;
  p.v_s0 = vv.s0;
  p.v_s1 = vv.s1;
  p.keys = selection(sel, T, start_pos, "mha");
  p.scale = float(scale);
  check_launch(launch_mha(p, op_stream()), "attention_mha");
  return out;
}

}  // namespace dsaserve::kernels::cuda
