#pragma once
// What a serving process holds on its device besides the weights and the KV pool, from the config and
// the serving options alone (pure arithmetic: no device, so it is unit-tested on the CPU), and the KV
// pool that leaves. serve --device cuda sizes its pool with it.
//
// The activation workspace is a bound on the bytes alive at once in one step under the scheduler's
// limits (SchedulerConfig: at most max_prefill_tokens prefill tokens plus max_running_requests decodes a
// step, at most min(chunked_prefill_size, max_prefill_tokens) new tokens of one request, max_context
// positions): every intermediate of the forward (model/forward.cpp) and of the CUDA operators it calls
// (gemm FP8 copies, the MoE's rows packed by expert, the indexer's select workspace), at the peak of a
// layer (the attention or the MLP part, whichever is larger) plus what lives through the step (residual
// stream, the DSA selection), each rounded as the caching allocator rounds (kernels/cuda/common/allocator.h).
// The indexer's f32 scores count kernels::kIndexerScoreBudgetBytes at most (the CUDA indexer splits its
// rows to stay within it), not rows x context. The MHA form's per-head K/V of a whole context counts
// only when the attention form rule can choose it for such a step. CUDA graphs keep their own pool.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"

namespace dsaserve::runtime {

struct StepLimits {
  int64_t max_running_requests = 64;    // requests in a step (decode tokens, logits rows)
  int64_t max_prefill_tokens = 16384;   // new prefill tokens a step
  int64_t chunked_prefill_size = 4096;  // new tokens of one request a step; <= 0: max_prefill_tokens
  int64_t max_context = 0;              // positions of a request (0: the model's max_position_embeddings)
  int64_t cuda_graph_max_bs = 0;        // decode graphs up to this batch (0: none)
  // Speculative decoding's draft tokens per round (0: off). On, the graphs are the verify graphs
  // (steps + 1 rows per request) and the MTP layer's draft graphs instead of decode graphs.
  int64_t speculative_num_steps = 0;
  model::ForwardOptions forward;  // the attention form rule
};

struct WorkspaceTerm {
  std::string name;
  int64_t bytes = 0;
};

struct WorkspaceEstimate {
  int64_t step_tokens = 0;          // tokens of the largest step
  int64_t chunk_tokens = 0;         // new tokens of one request in it
  std::vector<WorkspaceTerm> step;  // alive at the step's peak (the larger phase's terms)
  std::string peak_phase;           // "attention", "moe", "dense mlp" or "lm_head"
  int64_t step_bytes = 0;           // sum of `step`
  int64_t graph_pool_bytes = 0;     // CUDA graphs' pool and static outputs (0 without graphs)
  int64_t fixed_bytes = 0;          // kernel scratch (split-K partials, plans, page tables, rows)
  int64_t total() const { return step_bytes + graph_pool_bytes + fixed_bytes; }
  // One line: total and its parts (GiB).
  std::string describe() const;
};

WorkspaceEstimate estimate_workspace(const model::ModelConfig& cfg, const StepLimits& lim);
// The longest context (cached + new positions) a request of up to `chunk` new tokens can expand in the MHA
// form, which the workspace holds as per-head K/V: AttentionForm::mha any (max_ctx); automatic where its rule
// picks MHA for some chunk size and cached length (powers of two, and the ends; today's H200 rates: dense
// chunks only, so at most the top-k's positions with an indexer); absorbed 0.
int64_t mha_expand_context(const model::ModelConfig& cfg, const model::ForwardOptions& fo, int64_t chunk,
                           int64_t max_ctx);

// The device memory split at start-up (bytes).
struct MemorySplit {
  int64_t weights = 0;
  int64_t free_after_weights = 0;  // device memory free once the weights are up
  int64_t free_now = 0;            // free after warm-up (its cached blocks released)
  int64_t workspace = 0;           // WorkspaceEstimate::total()
  int64_t reserve = 0;             // headroom kept free (fragmentation, the driver, other libraries)
  int64_t kv_bytes = 0;            // the KV pool
  double kv_share() const {
    return free_after_weights > 0 ? double(kv_bytes) / double(free_after_weights) : 0;
  }
};

// The KV pool without --mem-fraction-static: free_now - workspace - reserve, with reserve = 1 GiB or
// 1% of the device, whichever is larger. With mem_fraction_static in (0, 1): mem_fraction_static x
// free_now - workspace (the flag's meaning before). kv_bytes may come out <= 0 (the caller refuses).
MemorySplit split_memory(int64_t weights, int64_t free_after_weights, int64_t free_now, int64_t total,
                         int64_t workspace, double mem_fraction_static = 0);

}  // namespace dsaserve::runtime
