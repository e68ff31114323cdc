#pragma once
// CUDA implementations of kernels/ops.h (host wrappers: validate, then launch on op_stream()). The Backend
// in backend.cpp forwards to these, with its KernelOptions (the GEMM precision, the attention kernels, and
// for every kernel launched in a step whether it is a programmatic dependent launch: o.pdl). Same
// contracts as the CPU reference (kernels/cpu/cpu_ops.h); index tensors (ids, slots, page tables, row
// indices) live on the GPU and are range-checked on the host.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/kernel_options.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {

// The fp32 inverse frequencies of a RopeParams on the current device (made once per device and parameter
// set; the first use must not be inside a CUDA-graph capture).
const float* rope_inv_freq_device(const RopeParams& p);

Tensor embedding(const Tensor& table, const Tensor& ids, const KernelOptions& o);
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps, const KernelOptions& o);
Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps, const KernelOptions& o);
// rms_norm / add_rms_norm (residual non-null) writing the output's FP8 copy in the same kernel when the
// rows allow it (16-byte aligned, width % 128 == 0, o.gemm fast); q stays empty otherwise. Its rows are
// padded as the linears that read it expect (gemm.h fp8_act_rows with o's small-T limit).
Tensor norm_fp8(Tensor* residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q,
                const KernelOptions& o);
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const KernelOptions& o);
// o: the GEMM precision and the FP8 small-T limit (gemm.h).
Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
              const KernelOptions& o);
Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out,
                const KernelOptions& o);
void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p, const KernelOptions& o);
Tensor silu_mul(const Tensor& gate, const Tensor& up, const KernelOptions& o);
// silu_mul and its output's FP8 copy for the FP8 linear reading it (ops.h silu_mul_fp8; rows fp8_act_rows
// with o's small-T limit); q empty where the kernel does not apply (fp32 GEMMs, widths not multiples of 128,
// unaligned views) or o.silu_mul_fp8_copy is off.
Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q, const KernelOptions& o);
Tensor argmax(const Tensor& x, const KernelOptions& o);
void add_inplace(Tensor& a, const Tensor& b, const KernelOptions& o);
void copy_rows(Tensor& dst, const Tensor& src, const KernelOptions& o);
Tensor gather_rows(const Tensor& x, const Tensor& idx, const KernelOptions& o);
// The FP8 caches' stores and gathers (the unfused fallbacks of the fused writes, the MHA form's gathers)
// launch the ordinary way; the f32 / bf16 row copies with o.pdl.
void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src, const KernelOptions& o);
Tensor paged_gather(const PagedSeq& seq, int64_t n, const KernelOptions& o);
Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale, const KernelOptions& o);
Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale, const KernelOptions& o);
// The batched ops over kernel-format caches (bf16 index keys; bf16 or FP8 latent cache): one launch of
// the ragged sm_90a kernel for all the rows (kv.row_seq / row_len / page_table already on the GPU).
Tensor indexer_topk_batch(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk, double scale,
                          double weight_scale, const KernelOptions& o);
Tensor mla_attention_batch(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                           double scale, const KernelOptions& o);
// o.mha picks the kernel (select_mha_kernel: tensor cores for dense chunks at supported dims).
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale, const KernelOptions& o);
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p, const KernelOptions& o);
// o.moe picks the path (device grouped kernels or per-expert host loop), o.gemm (and the FP8 small-T limit)
// the host loop's GEMMs. q (may be null): x's FP8 copy (ops.h moe_experts), read by the device_fp8 path
// instead of quantising x. derived (may be null): derive_moe_experts(experts), which the device paths read;
// without it they make it for the call (a synchronous upload, which a CUDA graph capture refuses: there
// the call throws). A table made from other experts throws. add (may be null): ops.h moe_experts, added by
// the combine.
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const KernelOptions& o, const Fp8Act* q = nullptr, const DerivedExperts* derived = nullptr,
                   const Tensor* add = nullptr);
// The experts' device table (ops.h DerivedExperts): every expert checked against expert 0's dtype, shape
// and blocks, then their weight pointers (moe_params.h MoeExpertWeights) uploaded with a synchronous copy
// on the current device; `unusable` says why the device paths cannot take them instead (the host loop
// then runs them). What CudaBackend::derive_experts returns, called for each MoE layer at model load.
// Null for an empty set.
std::shared_ptr<const DerivedExperts> derive_moe_experts(const std::vector<MlpRef>& experts);
// Whether moe_experts with options `o` runs the routed expert projection `w` (a gate / up [I, H] or down
// [H, I]) through the FP8 grouped tensor-core kernels (the automatic choice for such experts at every
// size; device / device_fp8 asked for) that read it as stored: then it needs no derived form in fast
// mode (gemm.h derive_gemm_weight). False with o.moe host, fp32 GEMMs, or a shape they do not take.
bool moe_fp8_grouped_weight(const WeightRef& w, const KernelOptions& o);
void fill_dummy(Tensor& t, const dummy::FillSpec& f);

// The fused KV-cache writes (ops.h mla_kv_write / indexer_k_write) over kernel-format caches: the MLA
// latent cache bf16 [slots, 576] or FP8 u8 [slots, 656], the indexer keys bf16 [slots, id <= 1024]. One
// launch, no host sync (slots outside the cache are skipped on the device, not reported). Return false,
// doing nothing, where they do not apply (f32 stand-in caches, other index-key formats, unaligned views):
// the caller runs the unfused sequence.
bool mla_kv_write_fused(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                        const RopeParams& rope, Tensor& cache, const Tensor& slots, const KernelOptions& o);
bool indexer_k_write_fused(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                           const Tensor& positions, const RopeParams& rope, Tensor& cache,
                           const Tensor& slots, const KernelOptions& o);
// The batched absorbed projections (ops.h absorb_q / absorb_v) as one cuBLASLt strided-batched GEMM over
// the heads (plus one bf16 conversion of the activations; none in GemmPrecision::fp32: o.gemm; the
// conversion a programmatic dependent launch with o.pdl; cuBLASLt's launches are ordinary). The weight is
// read in place when bf16 or f32; an FP8 kv_b is read as its derived bf16 copy (kv_b.derived, made at
// model load: gemm.h derive_gemm_weight with WeightUse::absorb; the linears' fallback reads the same one);
// in GemmPrecision::fp32 the weight is gemm_weight_f32's (the derived f32 copy the fp32 linears use: kv_b
// is held in f32 once). Without a derived copy the call makes one for itself. Return false where they do
// not apply (activation views whose heads are not evenly strided, a shape cuBLASLt has no algorithm for):
// the caller runs the per-head loop. absorb_v from o.absorb_fused_min_tokens tokens (> 0) in fast mode runs
// one launch of the f32-activation kernel instead (the activations rounded to bf16 as they are staged:
// gemm/gemm_f32act_params.h), where its alignments allow; absorb_q always the strided batch (measured
// faster, kernel_options.h).
bool absorb_q_batched(const Tensor& q_nope, const WeightRef& kv_b, Tensor& out, const KernelOptions& o);
// absorb_v_batched with `q` also makes, when the fused launch runs (and the output is a contiguous [T, nh,
// dv] with dv % 128 == 0), the output's FP8 copy as an FP8 linear reads [T, nh dv] (the recipe's codes and
// scales, rows gemm.h fp8_act_rows(T, o.gemm_fp8_small_max_tokens)): absorb_v_fp8 for o_proj; else q is
// empty.
bool absorb_v_batched(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor& out,
                      const KernelOptions& o, Fp8Act* q = nullptr);

// Checks a request's page table (copied to the host) covers n positions with pages inside the cache.
void check_pages(const PagedSeq& seq, int64_t n, int64_t cache_rows, const char* what);

}  // namespace dsaserve::kernels::cuda
