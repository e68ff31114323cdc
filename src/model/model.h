#pragma once
// Model: the glm_moe_dsa / deepseek_v32 forward pass (../shared/docs/MODEL.md) over a ForwardBatch and a
// paged KvCache, written once against kernels/ops.h (it never branches on the device).
//
// One forward serves any mix of prefills, prefill chunks and single-token decodes (and the verify shape:
// decoding requests with several new tokens), planned once per step (model/step_plan.h). Each step writes the
// new tokens' latent KV (and indexer keys) into the cache at out_cache_loc, then attends over every
// cached position of the request (or its DSA selection). MTP layers run through forward_mtp with their
// own KV layers (indices L, L+1, ...) in the same cache and the same page tables.
#include <array>
#include <filesystem>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "kernels/ops.h"
#include "model/config.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/shard.h"
#include "model/weights.h"

namespace dsaserve::dist {
class ProcessGroups;
}

namespace dsaserve::model {

// How MLA attends: the MHA form expands the cached latents through kv_b_proj (cheap for long prefills),
// the absorbed form folds kv_b_proj into the query and the output (cheap for decode). Both give the same
// numbers; `automatic` picks per request by AttentionFormRule (by default: MHA for requests with at least
// mha_min_tokens new tokens).
enum class AttentionForm { automatic, mha, absorbed };

enum class DeepepPayload : uint8_t;  // model/deepep.h
struct StepPlan;                     // model/step_plan.h
struct StepPlanConfig;               // model/step_plan.h
struct StepInputs;                   // model/step_plan.h
struct StepCapacity;                 // model/step_plan.h

// One request's attention work in a step, as the automatic form choice sees it: `tokens` new tokens after
// `context` cached ones, `heads` query heads (per rank), each row attending min(topk, visible) keys
// (topk 0: dense, every visible key), and the MLA dims (GLM-5.x defaults).
struct AttentionShape {
  int64_t tokens = 0, context = 0, heads = 0, topk = 0;
  int64_t latent = 512, rope = 64, nope = 192, dv = 256;
};

// A throughput (TFLOP/s) measured at a few chunk sizes (the request's new tokens): linear in log2(tokens)
// between the points, the last point's rate above them, and below the first point the first rate scaled by
// tokens / its tokens (rates rise with the chunk: no rate above what was measured is assumed). No point
// set: unmeasured (0). A single rate converts to one point at every size.
struct RateByTokens {
  static constexpr int kPoints = 4;
  std::array<int64_t, kPoints> tokens{};  // ascending; entries after the last point are 0
  std::array<double, kPoints> tflops{};
  constexpr RateByTokens() = default;
  constexpr RateByTokens(double flat) : tokens{flat != 0 ? 1 : 0}, tflops{flat} {}  // NOLINT: implicit
  constexpr RateByTokens(std::array<int64_t, kPoints> t, std::array<double, kPoints> r)
      : tokens(t), tflops(r) {}
  bool set() const { return tokens[0] > 0; }
  double at(int64_t tokens) const;  // 0 when not set
  // Why the points are not usable ("" when they are): tokens ascending from >= 1, rates positive.
  std::string problem() const;
};

// Measured throughputs (TFLOP/s, FLOPs counted as attention_form_flops counts them) of the parts of the
// two forms for one head class; 0 = not measured. attention_gpu_bench's `prefill` table prints them
// (`RESULT form_rates ...` lines): set the defaults below from that run on the serving GPU; mha_attn_dense
// from `attention_gpu_bench mha` (the op column: the prefill table's dense cases give only 256 and 1,024).
// The attention rates are those of a request with a DSA selection (context + tokens > topk: each row its
// own keys, so neighbouring rows share few); the *_dense ones, when set, those of a request attending all
// its keys causally (no selection: neighbouring rows share their keys, which an MHA kernel can reuse; the
// MHA kernel's rate moves with the chunk, so it is a rate per chunk size).
struct AttentionFormRates {
  double absorbed_attn = 0;  // mla_attention_rows: 2 (latent + rope + latent) FLOPs per key, head and row
  double absorb_gemm = 0;    // absorb_q + absorb_v: 2 latent (nope + dv) per head and row
  double mha_attn = 0;       // attention_mha (+ its copy): 2 (nope + rope + dv) per key, head and row
  double expand_gemm = 0;    // paged_gather + the kv_b_proj linear: 2 latent (nope + dv) per head, position
  double absorbed_attn_dense = 0;  // 0: absorbed_attn
  RateByTokens mha_attn_dense{};   // not set: mha_attn
  bool measured() const { return absorbed_attn > 0 && absorb_gemm > 0 && mha_attn > 0 && expand_gemm > 0; }
};

// AttentionForm::automatic's rule past ForwardOptions::mha_min_tokens, its constants in one place. Below
// mha_min_tokens new tokens a request always takes the absorbed form (decode steps, speculative
// verification; CUDA graphs rely on it). From there: when the rates of the request's head class are
// measured, the form with the lower estimated time (attention_form_seconds); otherwise the MHA form (the
// rule before issue 8). The rates are the H200's (`attention_gpu_bench prefill`, TFLOP/s: top-2048, chunks of
// 256-4096 tokens after 0-32768 cached; the rule picked the faster form in 9 of 9 cases per head class).
// The MHA form's attention over a selection is a CUDA-core stand-in (0.4 TFLOP/s): requests with a DSA
// selection take the absorbed form. Dense chunks (context + tokens <= topk) run the tensor-core kernel
// (sm90_mha_prefill.cu; `attention_gpu_bench mha`, the op with its bf16 copies, context 0: 64 heads 38.6 /
// 128.7 / 214.9 TFLOP/s at 256 / 1,024 / 4,096 tokens, 16 heads 83.6 at 1,024), so a dense prompt of
// about 300-2,048 tokens takes the MHA form (at 1,024 tokens, 64 heads: ~0.32 ms against ~0.46 absorbed).
struct AttentionFormRule {
  // heads <= this use `narrow`, else `wide`: the cutoff where the MLA decode selector changes kernel
  // (kernels/kernel_options.h select_mla_decode_kernel: v2 up to it, v5 / v6 above).
  int64_t narrow_max_heads = kernels::kMlaDecodeNarrowMaxHeads;
  AttentionFormRates wide{
      297.5, 171.3, 0.4,
      571.8, 257.8, RateByTokens{{256, 1024, 4096, 0}, {38.6, 128.7, 214.9, 0}}};  // 64 heads (v5)
  AttentionFormRates narrow{
      76.5, 140.4, 0.4, 381.2, 79.0, RateByTokens{{1024, 0, 0, 0}, {83.6, 0, 0, 0}}};  // 16 heads per rank
};

// FLOPs of one request's attention part in each form (see AttentionFormRates for what each part counts).
struct AttentionFormFlops {
  double absorbed_attn = 0, absorb_gemm = 0, mha_attn = 0, expand_gemm = 0;
  double absorbed() const { return absorbed_attn + absorb_gemm; }
  double mha() const { return mha_attn + expand_gemm; }
};
AttentionFormFlops attention_form_flops(const AttentionShape& s);
// The model's part of a request's AttentionShape (`heads` query heads: this rank's; topk 0 without an
// indexer, the MLA dims); tokens and context are the request's, 0 here.
AttentionShape attention_dims(const ModelConfig& c, int64_t heads);
// Estimated seconds of each form at the given rates (requires rates.measured()).
struct AttentionFormSeconds {
  double absorbed = 0, mha = 0;
};
AttentionFormSeconds attention_form_seconds(const AttentionShape& s, const AttentionFormRates& rates);
// The automatic choice: true for the MHA form. Throws dsaserve::Error on negative sizes, no heads or
// negative rates.
bool automatic_uses_mha(int64_t mha_min_tokens, const AttentionFormRule& rule, const AttentionShape& s);

struct ForwardOptions {
  AttentionForm attention = AttentionForm::automatic;
  int64_t mha_min_tokens = 256;   // `automatic`: the absorbed form below this many new tokens
  AttentionFormRule form_rule{};  // `automatic` from mha_min_tokens on (automatic_uses_mha)
  bool all_logits = true;         // logits of every token; false: only each request's last token
  bool keep_hidden = false;       // also return the final normed hidden states (the MTP layer's input)
  // The step's plan (Model::plan_step of this batch and these options), and its inputs already on the
  // model's device (CUDA graphs: bound to a graph's static buffer, so the forward makes no host->device
  // copy; such a plan is built with a capacity and without host rows, so no kernel sizes its work from
  // the capture batch). A plan without inputs is uploaded by the forward; neither: the forward plans the
  // step itself. Inputs need their plan.
  const StepPlan* plan = nullptr;
  const StepInputs* inputs = nullptr;
  // A sharded model's ranks (Model::sharded): the groups its collectives run in, of the model's layout and
  // rank. Every rank of the layout runs the same forward calls. Null for a whole model.
  const dist::ProcessGroups* dist = nullptr;
  // SGLANG_DSA_TOPK_BROADCAST (--dsa-topk-broadcast): the attention TP ranks take rank 0's top-k indices
  // (a broadcast after each full indexer layer) instead of trusting their own identical computation.
  bool dsa_topk_broadcast = false;
  // Attention DP (--attn-dp-size > 1): the tokens each DP group runs in this step, by DP rank (this rank's
  // group: the batch's), and whether every group's step is a decode or idle (the world gathers then pad
  // to equal lengths, as SGLang's all_gather_into_tensor; otherwise the variable-length forms). Empty: the
  // forward all-gathers them over the world first (one small collective, "dp_tokens_all_gather").
  std::vector<int64_t> dp_tokens;
  bool dp_decode = false;
  // --moe-a2a-backend deepep: each MoE layer dispatches every rank's own rows to the EP ranks of their
  // experts and combines the outputs back (all-to-all-v over EP; needs --ep-size = --tp), instead of each
  // rank computing its experts' share of every row before an all-reduce. With attention DP its MoE layers
  // skip the world gathers (each rank dispatches its DP group's rows, its attention-TP slice of them, as
  // SGLang's scattered MLP mode); an idle DP rank dispatches and combines zero rows.
  bool moe_a2a_deepep = false;
  // Its payloads (model/deepep.h): FP8 dispatch (e4m3 codes, one f32 scale per 128 columns) and bf16
  // combine where the routed experts are FP8 block-scaled, as SGLang runs DeepEP on FP8 models; false
  // (--deepep-bf16-dispatch, SGLang's SGLANG_DEEPEP_BF16_DISPATCH) or other experts: the rows as the model
  // holds them both ways (f32 on the CPU: the reference's numbers).
  bool deepep_fp8_dispatch = true;
};

struct ForwardOutput {
  // f32 [T, vocab] (all_logits) or the plan's logit rows: each request's last token (a verifying request:
  // each of its tokens), then extra_logit_rows (StepPlan::logit_rows).
  Tensor logits;
  Tensor hidden;  // f32 [T, H] final normed hidden (lm_head input), when keep_hidden
};

class Model {
 public:
  // Reads config.json and the checkpoint under `dir` and binds every weight (MTP layers when asked).
  static std::shared_ptr<Model> load(const std::filesystem::path& dir, bool with_mtp = true);
  // backend: the device context the forward's operators run on (its device must be the weights'; its
  // KernelOptions pick the kernels); null: the registered backend of the weights' device (ops.h backend()).
  // kv_dtype: the dtype of the caches make_cache makes (unset: KvCache::create's default for the device).
  // shard: the part of the weights `weights` are (model/shard.h; default: all of them).
  Model(ModelConfig cfg, io::Checkpoint ckpt, ModelWeights weights,
        std::shared_ptr<kernels::Backend> backend = nullptr,
        std::optional<KvCacheDtype> kv_dtype = std::nullopt, Shard shard = {});
  // The same model (weights shared) running on `backend` (e.g. kernels::make_fp8_emulation_backend, or a
  // CUDA backend with other KernelOptions), its make_cache making kv_dtype caches.
  std::shared_ptr<Model> with_backend(std::shared_ptr<kernels::Backend> backend,
                                      std::optional<KvCacheDtype> kv_dtype = std::nullopt) const;
  // Null when the model runs on the registered backend.
  const std::shared_ptr<kernels::Backend>& backend() const { return backend_; }
  // The operators the forward calls (bound to backend()).
  const kernels::Ops& ops() const { return ops_; }

  // The same model holding only rank `s.rank`'s shard of the weights (model/shard.h); its forward needs
  // ForwardOptions::dist. Throws dsaserve::Error when a size does not split.
  std::shared_ptr<Model> sharded(const Shard& s) const;
  const Shard& shard() const { return shard_; }

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  int64_t num_mtp_layers() const { return int64_t(w_.mtp.size()); }

  // A KV cache for this model (with the MTP layers' KV when they are loaded), in the model's kv_dtype.
  KvCache make_cache(int64_t num_pages, int64_t page_size = 64) const;
  std::optional<KvCacheDtype> kv_dtype() const { return kv_dtype_; }

  ForwardOutput forward(const ForwardBatch& batch, KvCache& cache, const ForwardOptions& opt = {}) const;

  // The plan of one step (model/step_plan.h): host arrays, the attention forms and logits rows of `opt`,
  // and the kernels' launch plans from this model's backend. capacity: fixed shapes (CUDA graphs; the
  // kernels then see no host rows on a device); mtp: the MTP layer's pass.
  StepPlanConfig plan_config(const ForwardOptions& opt, bool mtp = false) const;
  StepPlan plan_step(const ForwardBatch& batch, const ForwardOptions& opt,
                     const StepCapacity* capacity = nullptr, bool mtp = false) const;

  // MTP layer `k`: token p of the batch is t_{p+1} at position p, `hidden` [T, H] the target model's final
  // normed hidden state at p. Returns the MTP logits (predicting t_{p+2}).
  ForwardOutput forward_mtp(const ForwardBatch& batch, const Tensor& hidden, KvCache& cache,
                            const ForwardOptions& opt = {}, int64_t k = 0) const;

  // A sharded rank whose DP group has no tokens in this step (SGLang's IDLE mode): takes part, with no
  // rows, in the collectives the other DP groups' forward runs over the world (the MLPs' gathers and
  // scatters). mtp: the MTP layer's pass. opt.dp_tokens as for forward (this group's entry 0).
  void idle_step(const ForwardOptions& opt, bool mtp = false) const;

 private:
  struct Step;  // per-forward state (forward.cpp)
  // hq / the mlp's q: h's FP8 copy from its norm (empty where the backend made none).
  Tensor attention(const LayerWeights& lw, int64_t kv_layer, bool own_indexer, const Tensor& h,
                   const kernels::Fp8Act& hq, Step& st, KvCache& cache) const;
  // reduce: sum the shard's partial output over its group (false: the caller reduce-scatters it).
  Tensor mlp(const LayerWeights& lw, const Tensor& h, const kernels::Fp8Act& hq, const ForwardOptions& opt,
             bool reduce = true) const;
  // A dense MLP (or the shared expert: its span names) on h, the output whole for m's shard.
  Tensor dense_mlp(const MlpWeights& m, const Tensor& h, const kernels::Fp8Act& hq, bool shared) const;
  // The router's picks of h's rows (global expert ids).
  kernels::Routing route(const MoeWeights& moe, const Tensor& h) const;
  // forward_dist.cpp: the scattered mode (RowSplit). Whether layer lw runs in it; the step's split; the
  // attention output's reduce-scatter to this rank's rows over attention TP and the rows' all-gather back;
  // the MLP side of this rank's rows h (the world gather, the MLP, the reduce-scatter; or DeepEP).
  bool sliced(const LayerWeights& lw, const ForwardOptions& opt) const;
  RowSplit row_split(int64_t tokens, bool decode, const ForwardOptions& opt) const;
  Tensor scatter_attention(const Tensor& a, const RowSplit& sp, const ForwardOptions& opt) const;
  Tensor gather_attention_rows(const Tensor& rows, const RowSplit& sp, const ForwardOptions& opt) const;
  Tensor mlp_rows(const LayerWeights& lw, const Tensor& h, const RowSplit& sp,
                  const ForwardOptions& opt) const;
  Tensor moe_deepep(const LayerWeights& lw, const Tensor& h, const ForwardOptions& opt) const;
  DeepepPayload deepep_payload(const MoeWeights& moe, const ForwardOptions& opt) const;
  // The routing restricted to this rank's experts (EP), renumbered from 0; other experts' picks get weight 0.
  kernels::Routing local_routing(kernels::Routing r) const;
  Tensor decoder_layers(Tensor x, Step& st, KvCache& cache, bool mtp, int64_t k) const;
  ForwardOutput finish(const Tensor& hidden, const kernels::WeightRef& head, const Step& st) const;
  kernels::WeightRef ref(const Linear& l) const;
  // The routed experts of `moe` as the MoE op takes them (each one's ref()).
  std::vector<kernels::MlpRef> expert_refs(const MoeWeights& moe) const;
  // Sets every weight's derived forms (Linear::derived, MoeWeights::gate_derived) to what this model's
  // backend derives for it (kernels::Backend::derive_weight), and each MoE layer's experts_derived to what
  // it derives for the routed experts as a set (derive_experts): the constructor's last step (model load).
  void derive_weights();
  // The token embedding (vocabulary-parallel when sharded: the attention TP group's all-reduce).
  Tensor embed(const Tensor& table, const ForwardBatch& batch, const Tensor& ids,
               const ForwardOptions& opt) const;
  // Sums a shard's partial t over `group` (nothing for a whole model or a group of one).
  void all_reduce(Tensor& t, dist::GroupKind group, const char* name, const ForwardOptions& opt) const;
  // --dsa-topk-broadcast: rank 0's selection [T, topk] to the attention TP group (in place).
  void broadcast_topk(Tensor& sel, const ForwardOptions& opt) const;
  // The LM head's logits [T, vocab] from this rank's vocabulary rows [T, vocab / attn_tp] (an all-gather).
  Tensor gather_vocab(const Tensor& local, const ForwardOptions& opt) const;

  ModelConfig cfg_;
  io::Checkpoint ckpt_;  // keeps the mapped weights alive
  ModelWeights w_;
  std::shared_ptr<kernels::Backend> backend_;
  std::optional<KvCacheDtype> kv_dtype_;
  kernels::Ops ops_;
  Shard shard_;
};

}  // namespace dsaserve::model
