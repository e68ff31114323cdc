#pragma once
// The operators the model calls. Each free function dispatches on the device of its first tensor to the
// Backend registered for that device (kernels/cpu is built in; kernels/cuda registers its own). The model
// never branches on the device: it calls these.
//
// Conventions
// - Activations are f32. A "row" tensor is 2-D [rows, cols] (or 3-D [rows, heads, dim]) whose last
//   dimension is contiguous; the leading strides may be anything (views into wider tensors are fine).
// - Weights are stored as in the checkpoint: bf16, f32, or FP8 E4M3 with 128x128 block scales
//   (WeightRef). Kernels read them directly and accumulate in fp32.
// - Paged caches are 2-D [num_slots, dim] with slot = page * page_size + offset; a request's page table
//   (i32 [n_pages]) maps its position p to page_table[p / page_size].
// - Top-k ties (indexer selection, expert routing, group choice, argmax) break toward the lower index.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dummy_fill.h"
#include "core/tensor.h"
#include "kernels/kernel_options.h"

namespace dsaserve::kernels {

namespace cpu {
struct Fp8Emulation;  // kernels/cpu/cpu_ops.h
// A top-k decision observer (analysis only), given to a CPU backend (make_cpu_backend,
// make_fp8_emulation_backend; none by default): called by its moe_route ("moe_route": scores [T, E] =
// sigmoid(logits) + bias after group masking, chosen = routing ids [T, top_k]) and indexer_topk
// ("indexer_topk": scores [T, start_pos + T], NaN where a row is not ranked (at most topk visible keys) or
// a key is not visible; chosen = the result).
using TopkObserver = std::function<void(std::string_view op, const Tensor& scores, const Tensor& chosen)>;
}  // namespace cpu

// The forms of a weight that a backend's kernels read besides the weight itself, made once when a model
// is put on that backend (Backend::derive_weight, called by model::Model for each of its weights) and
// carried with the weight (model/weights.h Linear::derived -> WeightRef::derived), so that no kernel
// looks a weight up by its address. Every form is optional: a kernel that finds none makes it for the
// call (the same values, only slower), so a WeightRef made by hand works as well.
struct DerivedWeight {
  Tensor bf16;        // an FP8 weight dequantised to bf16 [out, in] (linears outside the FP8 recipe,
                      // linear_t, the absorbed MLA projections)
  Tensor f32;         // a bf16 or FP8 weight as f32 [out, in] (GemmPrecision::fp32)
  Tensor fp8_scales;  // an FP8 weight's scale_inv with its rows padded to a multiple of 4 floats [nb, ld]
                      // (the block-scaled cuBLASLt GEMM)
};

// What the model runs on a weight, which decides the forms a backend derives for it: the linears
// (linear, linear_multi); kv_b, the linears and the absorbed MLA projections (absorb_q / absorb_v,
// linear_t); a routed expert's projection (moe_experts).
enum class WeightUse { linear, absorb, expert };

// A Linear weight W [out, in]: y = x @ W^T. FP8 weights carry scale_inv F32 [ceil(out/block_n),
// ceil(in/block_k)] and the real value is W[r][c] * scale_inv[r / block_n][c / block_k].
struct WeightRef {
  Tensor weight;     // [out, in] bf16 | f32 | f8e4m3fn
  Tensor scale_inv;  // [ceil(out/block_n), ceil(in/block_k)] f32; undefined unless weight is fp8
  int64_t block_n = 128;
  int64_t block_k = 128;
  // Its forms derived by the backend it runs on (null: none; the kernels make what they need per call).
  std::shared_ptr<const DerivedWeight> derived;
  int64_t rows() const { return weight.size(0); }
  int64_t cols() const { return weight.size(1); }
};

// A SwiGLU MLP: down(silu(gate(x)) * up(x)).
struct MlpRef {
  WeightRef gate, up, down;
};

// The form of one MoE layer's routed experts that a backend's moe_experts reads as a set, made once when a
// model is put on that backend (Backend::derive_experts, called by model::Model for each MoE layer) and
// held with the layer's weights (model/weights.h MoeWeights::experts_derived), so that no kernel keeps
// tables by weight address: the CUDA device paths' table of the experts' weight pointers. moe_experts
// checks it was made from the experts it is handed; without one the CUDA op makes it for the call.
struct DerivedExperts {
  std::vector<const void*> weights;  // what it was made from: per expert gate, up, down, then their
                                     // scale_inv (null unless FP8)
  DType dtype = DType::f32;          // expert 0's weights (every expert's alike where `table` is defined)
  int64_t hidden = 0, inter = 0, block_n = 128, block_k = 128;
  Tensor table;          // the backend's table of the weights (CUDA: u8 [experts * sizeof(MoeExpertWeights)],
                         // kernels/cuda/moe/moe_params.h); undefined where its kernels cannot take them
  std::string unusable;  // why not (empty when `table` is defined)
};

// Rotary position embedding of `dim` channels. Angles follow Hugging Face exactly: inv_freq and
// position * inv_freq are rounded to fp32, then cos/sin of that fp32 angle (times attention_factor).
// interleaved: pairs (x0,x1),(x2,x3)... rotate; the result is written de-interleaved (all rotated
// evens, then all rotated odds), which keeps every dot product of q and k the same.
// Not interleaved (NeoX): pairs (x_i, x_{i+dim/2}).
struct RopeParams {
  int64_t dim = 0;
  double theta = 10000.0;
  bool interleaved = true;
  // yarn (DeepSeek configs): inv_freq blends interpolation and extrapolation over the ramp.
  bool yarn = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 1.0;  // multiplies cos and sin
};

// The inverse frequencies [dim / 2] rounded to fp32, as the reference computes them.
std::vector<float> rope_inv_freq(const RopeParams& p);

// One request's view of a paged cache.
struct PagedSeq {
  // [num_slots, dim] f32 (every backend). The CUDA backend also takes kernel-format caches, served by
  // its sm_90a kernels: the MLA latent cache as bf16 [slots, 576] or FP8 u8 [slots, 656] (paged_store
  // of whole [T, 576] rows for FP8) and the indexer keys as bf16 [slots, 128] or FP8 u8 [slots, 132]
  // (paged_store of whole [T, 128] rows, quantised per token); paged_gather returns f32.
  Tensor cache;
  Tensor page_table;  // i32 [n_pages]
  int64_t page_size = 64;
};

// The attention kernels' launch plan for a step's rows (PagedRows): the split counts and workspace sizes
// a batched kernel would otherwise work out on every call, worked out once per step on the host
// (Ops::plan_mla_rows / plan_indexer_rows; model/step_plan.h) and read by every layer (FlashInfer's and
// FlashMLA's plan-then-run). A plan depends on the call's shape only (plus, for the indexer, the host
// row lengths when it was given them). A kernel given a plan checks that it was made for the call;
// without one (planned false, or no plan) it plans the call itself, the same way. A backend whose
// kernels need no plan (the CPU) returns empty plans.
struct MlaRowsPlan {
  bool planned = false;
  int64_t rows = 0, heads = 0, max_keys = 0;  // the call it was made for (max_keys: sel's k, or max_len)
  int splits = 1;                             // key-range splits per row (1: no partial workspace)
  int64_t partial_out_floats = 0;             // workspace when splits > 1: [rows, splits, heads, kv_lora]
  int64_t partial_lse_floats = 0;             // and [rows, splits, heads]
};
struct IndexerRowsPlan {
  bool planned = false;
  int64_t rows = 0, max_len = 0, topk = 0;  // the call it was made for
  bool packed = false;  // scores only for the rows with more than topk keys (from the host lengths)
  // Consecutive rows [r0, r1), one launch each, whose f32 scores (score_floats) stay within the score
  // budget; splits / split_len: select CTAs per row; work_words: the u32 select workspace.
  struct Block {
    int64_t r0 = 0, r1 = 0, score_floats = 0, splits = 1, split_len = 0, work_words = 0;
  };
  std::vector<Block> blocks;
};

// A ragged batch of R query rows over one paged cache (many requests in one call): row i reads the page
// table row row_seq[i] and sees positions 0..row_len[i]-1. A request's tokens are consecutive rows of one
// sequence with lengths start_pos + 1, start_pos + 2, ...; a decode step has one row per request. The
// metadata is the same for every layer of a step: build it once, swap only the cache.
struct PagedRows {
  Tensor cache;       // as PagedSeq::cache
  Tensor page_table;  // i32 [num_seqs, max_pages] on the cache's device, rows contiguous
  int64_t page_size = 64;
  Tensor row_seq;  // i32 [R] on the cache's device
  Tensor row_len;  // i32 [R] on the cache's device, each >= 1
  // The same values on the host (backends without a batched kernel split the rows into requests).
  std::span<const int32_t> seq_host, len_host;
  int64_t max_len = 0;  // the largest row_len
  // The step's launch plans for these rows (model/step_plan.h), or null: the kernel plans the call.
  const MlaRowsPlan* mla_plan = nullptr;
  const IndexerRowsPlan* indexer_plan = nullptr;
};

// Expert routing result: per token the chosen experts and their weights.
struct Routing {
  Tensor ids;      // i32 [T, top_k]
  Tensor weights;  // f32 [T, top_k]
};

struct MoeRouteParams {
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t top_k = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  // Throws dsaserve::Error unless the grouping fits `n_experts` (every backend checks through this).
  void validate(int64_t n_experts) const;
};

// An activation's FP8 copy in the CUDA backend's GEMM recipe (codes u8 [Tp, K] e4m3, scales f32 [K / 128,
// Tp]; rows >= `rows` are padding), made by the operator that produced the activation so that the FP8
// linears reading it skip their own quantisation pass. Empty where a backend makes none (the CPU).
struct Fp8Act {
  Tensor codes;
  Tensor scales;
  int64_t rows = 0;
  bool defined() const { return codes.defined(); }
};

// ---- operators ----

// table [V, H] (bf16 | f32), ids i32 [T] -> f32 [T, H]. Ids out of range throw.
Tensor embedding(const Tensor& table, const Tensor& ids);
// x [T, D] -> x * rsqrt(mean(x^2) + eps) * w (computed in fp32).
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps);
// residual [T, D] += x (in place), returns rms_norm(residual).
Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps);
// rms_norm / add_rms_norm that also leave the output's FP8 copy in `q` where the backend has one (CUDA,
// D % 128 == 0); the returned tensor is the plain op's, bit for bit.
Tensor rms_norm_fp8(const Tensor& x, const Tensor& w, double eps, Fp8Act& q);
Tensor add_rms_norm_fp8(Tensor& residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q);
// x [T, D] -> (x - mean) / sqrt(var + eps) * w + b (biased variance, like torch).
Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps);

// y = x @ W[r0:r1]^T: x [T, in] -> [T, r1 - r0]. r1 < 0 means all rows. When `out` is given
// ([T, r1 - r0] view, last dim contiguous) the result is written there and `out` is returned.
Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0 = 0, int64_t r1 = -1, Tensor out = {});
// linear(x, W_i) for each weight: the parts of a projection that share their input (q_a and kv_a, gate
// and up). The results are linear()'s; a backend may share work between the parts (the CUDA backend
// quantises x once for all its FP8 weights).
// `q`: x's FP8 copy from its producer (rms_norm_fp8), used instead of quantising x again.
std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                 const Fp8Act* q = nullptr);
// y = x @ W[r0:r1]: x [T, r1 - r0] -> [T, in] (the transposed product; MLA's absorbed W_UK).
Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out = {});

// In place on x [T, n, p.dim] (a view, e.g. the rope part of q) at positions i32 [T].
void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p);

// silu(gate) * up: [T, I] each -> [T, I].
Tensor silu_mul(const Tensor& gate, const Tensor& up);
// silu_mul, and where the backend makes it with the product (CUDA), the output's FP8 copy for the FP8 linear
// that reads it (the down projections): the codes and scales that linear's activation quantisation would
// make (rows as gemm's fp8_act_rows; pass it to linear_multi). Otherwise q is left empty (the default).
Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q);
// x [T, V] -> i32 [T] (the first maximum).
Tensor argmax(const Tensor& x);
// a += b, both [T, D].
void add_inplace(Tensor& a, const Tensor& b);
// dst = src, both [T, D] row views (dst may be a column slice of a wider tensor).
void copy_rows(Tensor& dst, const Tensor& src);
// Rows idx (i32 [m]) of x [T, D] -> [m, D].
Tensor gather_rows(const Tensor& x, const Tensor& idx);

// cache[slot[i], :] = src[i, :]: cache [num_slots, D] (a view may select columns), slots i32 [T].
void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src);
// The first n rows of one request's cache: [n, D].
Tensor paged_gather(const PagedSeq& seq, int64_t n);

// DSA indexer for one request with `T` new tokens at positions start_pos..start_pos+T-1, whose index
// keys are already in `keys`. score[t, s] = sum_h w[t, h] * weight_scale * relu(q[t, h] . k[s] * scale)
// for s <= start_pos + t. Returns i32 [T, min(topk, start_pos + T)]: row t holds the top-k key positions
// (ascending), or all positions 0..start_pos+t when there are at most topk, padded with -1.
Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                    double scale, double weight_scale);

// MLA attention, absorbed (MQA) form, one request: q_lat [T, nh, kv_lora], q_rope [T, nh, rope] against
// the latent cache [slots, kv_lora + rope] (kv then rotated k_rope). Keys of row t: sel[t] (i32 [T, k],
// -1 = none) or, when sel is undefined, every position <= start_pos + t. Returns out_lat [T, nh, kv_lora].
Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                              int64_t start_pos, const Tensor& sel, double scale);
// indexer_topk for a ragged batch of rows (see PagedRows): q [R, ih, id], w [R, ih] -> i32
// [R, min(topk, max_len)]; row i as indexer_topk gives it for its request (position row_len[i] - 1), its
// top-k positions ascending, or all of 0..row_len[i]-1 when there are at most topk, padded with -1.
Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk, double scale,
                         double weight_scale);
// mla_attention_absorbed for a ragged batch of rows: q_lat [R, nh, kv_lora], q_rope [R, nh, rope];
// row i attends to sel[i] (i32 [R, k], -1 = none) or, when sel is undefined, to 0..row_len[i]-1.
// Returns out_lat [R, nh, kv_lora], each row as mla_attention_absorbed gives it for its request.
Tensor mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                          double scale);
// Ordinary attention, MHA form, one request: q [T, nh, nope + rope] (nope first), keys [k_nope | k_rope]
// with k_nope [S, nh, nope], the shared k_rope [S, rope], values v [S, nh, dv]. Key selection as in
// mla_attention_absorbed. Returns [T, nh, dv].
Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                     int64_t start_pos, const Tensor& sel, double scale);
// The shape rules of attention_mha (every backend checks through this); throws dsaserve::Error.
void check_attention_mha_shapes(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                                int64_t start_pos);

// ---- MLA fused / batched operators (their Backend defaults run the unfused sequence of ops above) ----

// MLA's absorbed query projection for every head in one call: q_lat[t, h] = q_nope[t, h] @ W_UK[h], where
// W_UK[h] = rows [h P, h P + nope) of kv_b [nh P, L] (P = kv_b.rows() / nh = nope + dv per head, nope
// first). q_nope [T, nh, nope] (a view, last dim contiguous) -> [T, nh, L] (into `out` when given).
Tensor absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out = {});
// MLA's absorbed output projection for every head: o[t, h] = out_lat[t, h] @ W_UV[h]^T, W_UV[h] = rows
// [h P + P - dv, (h + 1) P) of kv_b. out_lat [T, nh, L] -> [T, nh, dv] (into `out`, a [T, nh, dv] view
// with a contiguous last dim, when given).
Tensor absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out = {});
// absorb_v, and where the backend can make it with the product (the CUDA backend's prefill-sized fused
// launch), the result's FP8 copy for the FP8 linear that reads it as [T, nh * dv] (o_proj): q holds the
// codes and scales that linear's activation quantisation would make (rows as gemm's fp8_act_rows; pass it
// to linear_multi). Otherwise q is left empty (the default: absorb_v).
Tensor absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out, Fp8Act& q);
// The shape rules of absorb_q (q = true: x is q_nope, `d` unused) and absorb_v (x is out_lat, d = dv)
// (every backend checks through this; throws dsaserve::Error).
struct AbsorbDims {
  int64_t tokens = 0, heads = 0, nope = 0, dv = 0, latent = 0, per_head = 0;  // per_head = nope + dv
};
AbsorbDims absorb_dims(const Tensor& x, const WeightRef& kv_b, bool q, int64_t d);
// The MLA KV cache write of T tokens: ckv [T, L + rope] f32 (h @ kv_a^T, not modified);
// cache[slots[t]] = [rms_norm(ckv[t, :L]) * norm_w | RoPE(ckv[t, L:]) at positions[t]] (rope.dim = rope,
// interleaved per `rope`). cache as PagedSeq::cache (f32 [slots, L + rope], or the CUDA kernel formats),
// slots i32 [T]. A slot outside the cache throws, except on the CUDA kernel-format caches (one fused
// kernel, no host sync), where that token's row is skipped.
void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                  const RopeParams& rope, Tensor& cache, const Tensor& slots);
// The DSA indexer key write: k [T, id] f32 (h @ wk^T, not modified); cache[slots[t]] = layer_norm(k[t]) *
// norm_w + norm_b with RoPE on its first rope.dim channels (rope first). cache f32 or bf16 [slots, id].
void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                     const Tensor& positions, const RopeParams& rope, Tensor& cache, const Tensor& slots);

// Router: logits f32 [T, E]; s = sigmoid(logits); choice = s + bias; grouped top-k; weights = s of the
// chosen, normalised (+1e-20) when asked, times routed_scaling_factor.
Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p);
// sum_k routing.weights[t, k] * experts[routing.ids[t, k]](x[t]) -> f32 [T, H].
// `q` (may be null): x's FP8 copy (Fp8Act: codes u8 [Tp, H], scales f32 [H / 128, Tp], on x's device), x
// then being its dequantised value, as a DeepEP FP8 dispatch delivers them: the experts that quantise their
// input (the CUDA device_fp8 path, the FP8 emulation backend) read q instead of quantising x again, so the
// result is bit for bit that of quantising the original rows where they run; the others compute on x.
// `derived` (may be null): the set's form its backend derived (DerivedExperts: the model's
// MoeWeights::experts_derived), made from these experts; changes no bit, only saves the backend making it.
// `add` (may be null): f32 [T, H] on x's device (the shared expert's output) added to each token's sum after
// it, bit for bit moe_experts(...) followed by add_inplace(out, *add); the CUDA backend adds it in the
// combine that writes the sum (one pass over [T, H] fewer).
Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                   const Fp8Act* q = nullptr, const DerivedExperts* derived = nullptr,
                   const Tensor* add = nullptr);

// Dummy weights (--load-format dummy, model/dummy_weights.h): fills the contiguous tensor `t` (bf16, f32
// or f8e4m3fn) as core/dummy_fill.h defines; every backend writes the same bytes for the same spec.
void fill_dummy(Tensor& t, const dummy::FillSpec& f);

// The CUDA indexer (indexer_topk_rows on kernel-format caches) splits its rows so that one launch's f32
// score buffer stays within this many bytes (scores of one row of n keys: 4 n bytes; a row is never
// split). runtime/engine/device.h's workspace estimate counts this bound, not rows x context.
inline constexpr int64_t kIndexerScoreBudgetBytes = int64_t(1) << 30;

// ---- backends ----

// One implementation of every operator for a device, with the KernelOptions its kernels run with (a
// backend object is one device context: make_backend). The CPU backend is built in; the CUDA module
// registers its own with register_backend(Device::cuda, ...).
class Backend {
 public:
  // ordinal: which device of that kind (the CUDA device index; 0 for the CPU).
  Backend(Device device, int ordinal, const KernelOptions& options)
      : device_(device), ordinal_(ordinal), options_(options) {}
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  Device device() const { return device_; }
  int ordinal() const { return ordinal_; }
  const KernelOptions& options() const { return options_; }
  // The forms of `w` (on this backend's device) this backend's kernels read for `use` (DerivedWeight),
  // made now; null when they need none (the default: the CPU backends). The model calls it for each of
  // its weights when it is put on this backend (model load), never during a step.
  virtual std::shared_ptr<const DerivedWeight> derive_weight(const WeightRef& w, WeightUse use) const;
  // The form of one MoE layer's routed experts (on this backend's device) its moe_experts reads
  // (DerivedExperts), made now; null when it needs none (the default: the CPU backends). The model calls
  // it for each MoE layer when it is put on this backend (model load), never during a step.
  virtual std::shared_ptr<const DerivedExperts> derive_experts(const std::vector<MlpRef>& experts) const;

  virtual Tensor embedding(const Tensor& table, const Tensor& ids) = 0;
  virtual Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) = 0;
  virtual Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) = 0;
  virtual Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) = 0;
  virtual Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) = 0;
  virtual Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out) = 0;
  // The default calls linear() for each weight (ignoring q).
  virtual std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                           const Fp8Act* q);
  // The default runs rms_norm / add_rms_norm (residual non-null) and leaves q empty.
  virtual Tensor norm_fp8(Tensor* residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q);
  virtual void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) = 0;
  virtual Tensor silu_mul(const Tensor& gate, const Tensor& up) = 0;
  // The default runs silu_mul and leaves q empty.
  virtual Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q);
  virtual Tensor argmax(const Tensor& x) = 0;
  virtual void add_inplace(Tensor& a, const Tensor& b) = 0;
  virtual void copy_rows(Tensor& dst, const Tensor& src) = 0;
  virtual Tensor gather_rows(const Tensor& x, const Tensor& idx) = 0;
  virtual void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) = 0;
  virtual Tensor paged_gather(const PagedSeq& seq, int64_t n) = 0;
  virtual Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos,
                              int64_t topk, double scale, double weight_scale) = 0;
  virtual Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                        int64_t start_pos, const Tensor& sel, double scale) = 0;
  // The batched forms. The default splits the rows into requests (runs of one sequence at consecutive
  // positions) and calls the one-request operators above: the CPU results are exactly theirs.
  virtual Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk,
                                   double scale, double weight_scale);
  virtual Tensor mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv,
                                    const Tensor& sel, double scale);
  // Launch plans of the batched forms for a step's rows (see MlaRowsPlan): mla_attention_rows of `rows`
  // rows x `heads` heads over at most max_keys keys a row; indexer_topk_rows of `rows` rows of at most
  // max_len keys (len_host: their lengths, or empty). The defaults: empty plans (nothing to plan).
  virtual MlaRowsPlan plan_mla_rows(int64_t rows, int64_t heads, int64_t max_keys);
  virtual IndexerRowsPlan plan_indexer_rows(int64_t rows, int64_t max_len, int64_t topk,
                                            std::span<const int32_t> len_host);
  virtual Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                               int64_t start_pos, const Tensor& sel, double scale) = 0;
  // The MLA fused / batched forms. The defaults run the unfused sequence through this backend's own
  // operators (per-head linear_t / linear; rms_norm, rope_inplace, copy_rows, paged_store; layer_norm,
  // rope_inplace, paged_store): the CPU results are exactly those of the sequence.
  virtual Tensor absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out);
  virtual Tensor absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out);
  // The default runs absorb_v and leaves q empty.
  virtual Tensor absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out,
                              Fp8Act& q);
  virtual void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                            const RopeParams& rope, Tensor& cache, const Tensor& slots);
  virtual void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                               const Tensor& positions, const RopeParams& rope, Tensor& cache,
                               const Tensor& slots);
  virtual Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) = 0;
  virtual Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                             const Fp8Act* q, const DerivedExperts* derived, const Tensor* add) = 0;
  virtual void fill_dummy(Tensor& t, const dummy::FillSpec& f) = 0;

 private:
  Device device_;
  int ordinal_;
  KernelOptions options_;
};

// The registered backend of a device (default KernelOptions); throws when none is registered (e.g. CUDA
// in a CPU-only build).
Backend& backend(Device d);
// A CPU backend of its own (the reference: no option changes its arithmetic; `options` is kept for
// Backend::options()). For a CUDA one: kernels/cuda/backend.h make_backend (runtime::make_backend picks).
std::shared_ptr<Backend> make_cpu_backend(const KernelOptions& options = {}, cpu::TopkObserver observer = {});
// The CPU backend with the CUDA backend's FP8 arithmetic emulated (kernels/cpu/cpu_ops.h Fp8Emulation):
// its linears and expert linears quantise their inputs as the GPU does, and with e.fp8_kv_cache its cache
// writes round as the GPU's FP8 KV cache stores. A reference for the GPU's FP8 numbers, kept apart from
// the pure reference (make_cpu_backend).
std::shared_ptr<Backend> make_fp8_emulation_backend(const cpu::Fp8Emulation& e,
                                                    cpu::TopkObserver observer = {});
// Installs (or, with null, removes) the backend of a non-CPU device. The pointer must outlive its use.
void register_backend(Device d, Backend* b);

// The operators above bound to one backend, the device context of a model (make_backend: its device and
// KernelOptions): an operator whose tensors live on that backend's device runs there, any other on the
// registered backend of its device. Ops() has no backend of its own: the free functions above are Ops().
class Ops {
 public:
  Ops() = default;
  explicit Ops(Backend* b) : b_(b) {}
  Backend* backend() const { return b_; }

  Tensor embedding(const Tensor& table, const Tensor& ids) const;
  Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) const;
  Tensor add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, double eps) const;
  Tensor rms_norm_fp8(const Tensor& x, const Tensor& w, double eps, Fp8Act& q) const;
  Tensor add_rms_norm_fp8(Tensor& residual, const Tensor& x, const Tensor& w, double eps, Fp8Act& q) const;
  Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) const;
  Tensor linear(const Tensor& x, const WeightRef& w, int64_t r0 = 0, int64_t r1 = -1, Tensor out = {}) const;
  std::vector<Tensor> linear_multi(const Tensor& x, const std::vector<WeightRef>& ws,
                                   const Fp8Act* q = nullptr) const;
  Tensor linear_t(const Tensor& x, const WeightRef& w, int64_t r0, int64_t r1, Tensor out = {}) const;
  void rope_inplace(Tensor& x, const Tensor& positions, const RopeParams& p) const;
  Tensor silu_mul(const Tensor& gate, const Tensor& up) const;
  Tensor silu_mul_fp8(const Tensor& gate, const Tensor& up, Fp8Act& q) const;
  Tensor argmax(const Tensor& x) const;
  void add_inplace(Tensor& a, const Tensor& b) const;
  void copy_rows(Tensor& dst, const Tensor& src) const;
  Tensor gather_rows(const Tensor& x, const Tensor& idx) const;
  void paged_store(Tensor& cache, const Tensor& slots, const Tensor& src) const;
  Tensor paged_gather(const PagedSeq& seq, int64_t n) const;
  Tensor indexer_topk(const Tensor& q, const Tensor& w, const PagedSeq& keys, int64_t start_pos, int64_t topk,
                      double scale, double weight_scale) const;
  Tensor mla_attention_absorbed(const Tensor& q_lat, const Tensor& q_rope, const PagedSeq& kv,
                                int64_t start_pos, const Tensor& sel, double scale) const;
  Tensor indexer_topk_rows(const Tensor& q, const Tensor& w, const PagedRows& keys, int64_t topk,
                           double scale, double weight_scale) const;
  Tensor mla_attention_rows(const Tensor& q_lat, const Tensor& q_rope, const PagedRows& kv, const Tensor& sel,
                            double scale) const;
  // The launch plans of the backend of device `d` (Backend::plan_mla_rows / plan_indexer_rows).
  MlaRowsPlan plan_mla_rows(Device d, int64_t rows, int64_t heads, int64_t max_keys) const;
  IndexerRowsPlan plan_indexer_rows(Device d, int64_t rows, int64_t max_len, int64_t topk,
                                    std::span<const int32_t> len_host) const;
  Tensor attention_mha(const Tensor& q, const Tensor& k_nope, const Tensor& k_rope, const Tensor& v,
                       int64_t start_pos, const Tensor& sel, double scale) const;
  Tensor absorb_q(const Tensor& q_nope, const WeightRef& kv_b, Tensor out = {}) const;
  Tensor absorb_v(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out = {}) const;
  Tensor absorb_v_fp8(const Tensor& out_lat, const WeightRef& kv_b, int64_t dv, Tensor out, Fp8Act& q) const;
  void mla_kv_write(const Tensor& ckv, const Tensor& norm_w, double eps, const Tensor& positions,
                    const RopeParams& rope, Tensor& cache, const Tensor& slots) const;
  void indexer_k_write(const Tensor& k, const Tensor& norm_w, const Tensor& norm_b, double eps,
                       const Tensor& positions, const RopeParams& rope, Tensor& cache,
                       const Tensor& slots) const;
  Routing moe_route(const Tensor& logits, const Tensor& bias, const MoeRouteParams& p) const;
  Tensor moe_experts(const Tensor& x, const Routing& routing, const std::vector<MlpRef>& experts,
                     const Fp8Act* q = nullptr, const DerivedExperts* derived = nullptr,
                     const Tensor* add = nullptr) const;

 private:
  Backend& on(Device d) const;
  Backend* b_ = nullptr;
};

}  // namespace dsaserve::kernels
