#pragma once
// CUDA implementations of kernels/ops.h (host wrappers: validate, then launch on op_stream()). The Backend
// in backend.cpp forwards to these. Same contracts as the CPU reference (kernels/cpu/cpu_ops.h); index
// tensors (ids, slots, page tables, row indices) live on the GPU and are range-checked on the host.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

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
// The batched ops over kernel-format caches (bf16 index keys; bf16 or FP8 latent cache): one launch of
// the ragged sm_90a kernel for all the rows (kv.row_seq / row_len / page_table already on the GPU).
Tensor indexer_topk_batch(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk, double scale,
                          double weight_scale);
Tensor mla_attention_batch(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                           double scale);
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale);
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p);
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts);

// Checks a request's page table (copied to the host) covers n positions with pages inside the cache.
void check_pages(const PagedSeq& seq, int64_t n, int64_t cache_rows, const char* what);

}  // namespace dsaserve::kernels::cuda
