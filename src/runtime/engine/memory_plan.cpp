#include "runtime/engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/ops.h"

namespace dsaserve::runtime {

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;
constexpr double kGiB = 1024.0 * 1024 * 1024;

// The caching allocator's size classes (kernels/cuda/common/allocator.h): four per power of two below 64 MiB
// (at most 25% over), 2 MiB steps above. `n` tensors of `bytes` together.
int64_t rounded(int64_t bytes, int64_t n = 1) {
  if (bytes <= 0) return 0;
  const int64_t each = (bytes + n - 1) / n;
  return each < 64 * kMiB ? n * (each + each / 4 + 512) : n * (each + 2 * kMiB);
}

struct Phase {
  std::string name;
  std::vector<WorkspaceTerm> terms;
  int64_t bytes() const {
    int64_t s = 0;
    for (const auto& t : terms) s += t.bytes;
    return s;
  }
  void add(std::string what, int64_t bytes, int64_t n = 1) {
    if (bytes > 0) terms.push_back({std::move(what), rounded(bytes, n)});
  }
};

// The phases of one step of T tokens (chunk: the most of one request), R requests, contexts up to ctx.
// Bytes of what each phase holds; `scores_cap` bounds the indexer's score buffer.
std::vector<Phase> step_phases(const model::ModelConfig& c, const StepLimits& lim, int64_t T, int64_t chunk,
                               int64_t R, int64_t ctx, int64_t scores_cap) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, L = c.kv_lora_rank, rope = c.qk_rope_head_dim,
                dq = c.qk_nope_head_dim + rope, dv = c.v_head_dim, ql = c.q_lora_rank;
  const bool ix = c.has_indexer();
  const int64_t topk = ix ? std::min(c.index_topk, ctx) : 0;
  const int64_t f = 4;  // f32
  // Alive through the step: the residual stream and the last MLP output; the DSA selection (the last
  // full layer's, and the next one's while it is computed).
  Phase base{"step", {}};
  base.add("residual stream + pending MLP output [T, H] x2", 2 * T * H * f, 2);
  if (ix) base.add("DSA selection i32 [T, topk] x2", 2 * T * topk * 4, 2);

  Phase attn{"attention", {}};
  attn.add("attention input [T, H] + FP8 copy", T * H * f + T * H + T * (H / 128) * f, 3);
  attn.add("q_a, kv_a outputs [T, q_lora + kv_lora + rope]", T * (ql + L + rope) * f, 2);
  attn.add("q_a norm [T, q_lora] + FP8 copy", T * ql * f + T * ql + T * (ql / 128) * f, 3);
  if (ix) {
    attn.add("indexer q, k, weights [T, ih x id + id + ih]",
             T * (c.index_n_heads * c.index_head_dim + c.index_head_dim + c.index_n_heads) * f, 3);
    attn.add("indexer select workspace (8 KB a row)", T * (2048 + 1) * 4 + T * 8);
    // Every row scores its visible keys (n > topk only); the CUDA indexer splits rows to stay within
    // the budget.
    const int64_t scores = ctx > c.index_topk ? std::min(T * ctx * f, scores_cap) : 0;
    attn.add("indexer scores (f32, split to the budget)", scores);
    attn.add("bf16 copy of the input (wk / weights_proj)", T * H * 2);
  }
  attn.add("q [T, heads, nope + rope]", T * nh * dq * f);
  attn.add("attention output [T, heads, v]", T * nh * dv * f);
  attn.add("absorbed q and output latents [T, heads, kv_lora] x2", 2 * T * nh * L * f, 2);
  attn.add("o_proj FP8 input + output [T, H]", T * nh * dv + T * (nh * dv / 128) * f + T * H * f, 3);
  const int64_t mha_ctx = mha_expand_context(c, lim.forward, chunk, ctx);
  if (mha_ctx > 0) {  // one request's whole context expanded per head: latents, [k_nope | v], output
    attn.add("MHA form: gathered latents [S, kv_lora + rope]", mha_ctx * (L + rope) * f);
    attn.add("MHA form: per-head K/V [S, heads, nope + v]", mha_ctx * nh * (c.qk_nope_head_dim + dv) * f);
    attn.add("MHA form: output [chunk, heads, v]", chunk * nh * dv * f);
  }

  bool any_dense = false, any_moe = false;
  for (model::MlpType t : c.mlp_layer_types) (t == model::MlpType::dense ? any_dense : any_moe) = true;
  std::vector<Phase> out{base, attn};
  auto mlp_common = [&](Phase& p) {
    p.add("attention output [T, H] + MLP input + FP8 copy", 2 * T * H * f + T * H + T * (H / 128) * f, 4);
  };
  if (any_dense) {
    Phase d{"dense mlp", {}};
    mlp_common(d);
    const int64_t I = c.intermediate_size;
    d.add("gate, up, act [T, I] x3 + FP8 copy", 3 * T * I * f + T * I + T * (I / 128) * f, 5);
    d.add("MLP output [T, H]", T * H * f);
    out.push_back(d);
  }
  if (any_moe) {
    Phase m{"moe", {}};
    mlp_common(m);
    const int64_t E = c.n_routed_experts, k = c.num_experts_per_tok, I = c.moe_intermediate_size, M = T * k;
    m.add("router logits [T, E] + routing + bf16 input copy", T * E * f + 2 * T * k * 4 + T * H * 2, 3);
    m.add("expert plan (i32)", (E * 3 + 2 * M + 8) * 4);
    // The host path (many rows): rows packed by expert, gate, up, act, their FP8 copies, outputs.
    m.add("experts: inputs packed by expert [T x top-k, H]", M * H * f);
    m.add("experts: gate, up, act [T x top-k, I] x3 + FP8 copies",
          3 * M * I * f + M * (H + I) + M * ((H + I) / 128) * f, 5);
    m.add("experts: outputs [T x top-k, H] + combined [T, H]", M * H * f + T * H * f, 2);
    if (c.n_shared_experts > 0) {
      const int64_t Is = I * c.n_shared_experts;
      m.add("shared expert gate, up, act [T, I_s] x3 + FP8 copy + output",
            3 * T * Is * f + T * Is + T * H * f, 5);
    }
    out.push_back(m);
  }
  Phase tail{"lm_head", {}};
  tail.add("final norm [T, H] + last rows [R, H] + bf16 copy", T * H * f + R * H * (f + 2), 3);
  tail.add("logits [R, vocab] f32", R * c.vocab_size * f);
  out.push_back(tail);
  return out;
}

// The largest phase on top of the step's base.
void peak(const std::vector<Phase>& phases, std::vector<WorkspaceTerm>& terms, std::string& name,
          int64_t& bytes) {
  const Phase* best = nullptr;
  for (size_t i = 1; i < phases.size(); ++i)
    if (best == nullptr || phases[i].bytes() > best->bytes()) best = &phases[i];
  terms = phases[0].terms;
  terms.insert(terms.end(), best->terms.begin(), best->terms.end());
  name = best->name;
  bytes = phases[0].bytes() + best->bytes();
}

}  // namespace

// The search over chunk sizes and cached lengths (memory_plan.h).
int64_t mha_expand_context(const model::ModelConfig& c, const model::ForwardOptions& fo, int64_t chunk,
                           int64_t max_ctx) {
  if (fo.attention == model::AttentionForm::absorbed) return 0;
  if (fo.attention == model::AttentionForm::mha) return max_ctx;
  std::vector<int64_t> toks;
  for (int64_t t = std::max<int64_t>(fo.mha_min_tokens, 1); t < chunk; t *= 2) toks.push_back(t);
  toks.push_back(chunk);
  int64_t found = 0;
  for (int64_t t : toks) {
    for (int64_t cached = 0;; cached = cached == 0 ? 1 : cached * 2) {
      const int64_t cap = std::max<int64_t>(max_ctx - t, 0);
      cached = std::min(cached, cap);
      model::AttentionShape s = model::attention_dims(c, c.num_attention_heads);
      s.tokens = t;
      s.context = cached;
      if (model::automatic_uses_mha(fo.mha_min_tokens, fo.form_rule, s)) found = std::max(found, cached + t);
      if (cached >= cap) break;
    }
  }
  return std::min(found, max_ctx);
}

std::string WorkspaceEstimate::describe() const {
  return fmt::format(
      "{:.2f} GiB (step of {} tokens, chunks of {}: {:.2f} GiB at its {} peak; CUDA graph pool {:.2f} GiB; "
      "kernel scratch {:.2f} GiB)",
      double(total()) / kGiB, step_tokens, chunk_tokens, double(step_bytes) / kGiB, peak_phase,
      double(graph_pool_bytes) / kGiB, double(fixed_bytes) / kGiB);
}

WorkspaceEstimate estimate_workspace(const model::ModelConfig& c, const StepLimits& lim) {
  DSA_CHECK(lim.max_running_requests > 0 && lim.max_prefill_tokens > 0,
            "workspace estimate: max_running_requests ({}) and max_prefill_tokens ({}) must be positive",
            lim.max_running_requests, lim.max_prefill_tokens);
  const int64_t ctx = std::max<int64_t>(lim.max_context > 0 ? lim.max_context : c.max_position_embeddings, 1);
  WorkspaceEstimate e;
  // The scheduler's bounds (runtime/scheduler): prefill tokens under max_prefill_tokens, one request's
  // chunk under chunked_prefill_size, plus one token per other running request.
  e.chunk_tokens = lim.chunked_prefill_size > 0 ? std::min(lim.chunked_prefill_size, lim.max_prefill_tokens)
                                                : lim.max_prefill_tokens;
  e.step_tokens = lim.max_prefill_tokens + lim.max_running_requests;
  peak(step_phases(c, lim, e.step_tokens, e.chunk_tokens, lim.max_running_requests, ctx,
                   kernels::kIndexerScoreBudgetBytes),
       e.step, e.peak_phase, e.step_bytes);
  if (lim.cuda_graph_max_bs > 0) {
    // One pool shared by every graph (they replay one at a time), but blocks of different sizes are not
    // shared: batch buckets 1, 2, 4, ... and context buckets (powers of two) sum to about twice the
    // largest. A graph runs only with rows x ctx <= 2^27 (runtime/engine/cuda_graph_plan.h).
    const int64_t bs = std::min(lim.cuda_graph_max_bs, lim.max_running_requests);
    StepLimits dec = lim;
    dec.forward.attention = model::AttentionForm::absorbed;  // graphs' rows take the absorbed form
    // The pool of one set of graphs of bs requests x `tokens` rows, and the static outputs they write
    // (logits rows, and with `hidden` the hidden rows; draft graphs also read static input rows).
    auto graph_set = [&](int64_t tokens, bool hidden, bool hidden_in) {
      const int64_t rows = bs * tokens;
      const int64_t cells = std::min<int64_t>(rows * ctx, int64_t(1) << 27);
      std::vector<WorkspaceTerm> t;
      std::string name;
      int64_t bytes = 0;
      peak(step_phases(c, dec, rows, tokens, rows, std::max<int64_t>(cells / rows, 1), cells * 4), t, name,
           bytes);
      const int64_t outputs = rows * c.vocab_size * 4 + (hidden ? rows * c.hidden_size * 4 : 0) +
                              (hidden_in ? bs * c.hidden_size * 4 : 0);
      return 2 * bytes + cells * 4 + rounded(outputs);
    };
    if (lim.speculative_num_steps > 0) {  // verify graphs and the MTP layer's draft graphs
      e.graph_pool_bytes = graph_set(lim.speculative_num_steps + 1, true, false) + graph_set(1, true, true);
    } else {
      e.graph_pool_bytes = graph_set(1, false, false);
    }
  }
  e.fixed_bytes = 512 * kMiB;  // MLA / FP8 GEMM split-K partials, MoE plans, page tables, row tensors
  e.fixed_bytes += rounded(int64_t(lim.max_running_requests) * 4 * 16);
  return e;
}

MemorySplit split_memory(int64_t weights, int64_t free_after_weights, int64_t free_now, int64_t total,
                         int64_t workspace, double mem_fraction_static) {
  MemorySplit m;
  m.weights = weights;
  m.free_after_weights = free_after_weights;
  m.free_now = free_now;
  m.workspace = workspace;
  if (mem_fraction_static > 0) {
    m.kv_bytes = int64_t(mem_fraction_static * double(free_now)) - workspace;
  } else {
    m.reserve = std::max<int64_t>(int64_t(1) << 30, total / 100);
    m.kv_bytes = free_now - workspace - m.reserve;
  }
  return m;
}

}  // namespace dsaserve::runtime
