#pragma once
// The host-side plan of CUDA-graph steps (no CUDA here; tested in CI): which captured graph a batch
// replays and how the batch is padded and packed into the graph's static inputs.
//
// Three passes replay graphs (GraphPass): decode steps (every request one new token), and with
// speculative decoding the verify pass (every request its last token + the drafts: tokens = steps + 1
// rows, a logits row each) and the MTP layer's draft steps (one token per request). A graph is keyed by
// (bs, ctx, tokens): bs requests of `tokens` new tokens each (bs from batch_buckets(): 1, 2, 4, ..., up
// to --cuda-graph-max-bs, which is itself the last bucket), and a context capacity ctx that every
// request's length fits in (the kernels take it as their max_len; shorter rows are ragged). Context
// buckets: index_topk when no request is longer (the forward then skips the indexer, as eagerly), else
// the powers of two above it (at least one page). A batch of B < bs requests is padded with requests
// that write their KV into a scratch page no request owns (tokens 0 at positions 0 .. tokens - 1) and
// whose logits are dropped.
#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "model/step_plan.h"

namespace dsaserve::runtime {

// What a graph runs. decode: Model::forward of one token per request (logits only); verify:
// Model::forward of `tokens` rows per request (every row's logits and hidden state); draft: the MTP
// layer (Model::forward_mtp, layer 0) of one token per request (logits and hidden state).
enum class GraphPass : uint8_t { decode, verify, draft };
const char* graph_pass_name(GraphPass p);

struct GraphKey {
  int64_t bs = 0;      // requests the graph runs
  int64_t ctx = 0;     // context capacity: every request's length <= ctx
  int64_t tokens = 1;  // new tokens (rows) per request: 1, or steps + 1 for a verify graph
  auto operator<=>(const GraphKey&) const = default;
};

struct GraphPlanConfig {
  int64_t max_bs = 256;    // the largest batch replayed (--cuda-graph-max-bs); 0: no graphs
  int64_t index_topk = 0;  // the model's DSA top-k; 0 for a model without an indexer
  int64_t page_size = 64;
  int64_t max_ctx_cells = int64_t(1) << 27;  // rows x ctx limit (the indexer's f32 scores are rows x ctx)
};

// 1, 2, 4, ... below max_bs, then max_bs itself; empty when max_bs <= 0.
std::vector<int64_t> batch_buckets(int64_t max_bs);
// The smallest bucket >= b, or 0 when b exceeds them all.
int64_t batch_bucket(int64_t b, std::span<const int64_t> buckets);
// The context bucket of a batch whose longest request has max_len tokens (see above).
int64_t context_bucket(int64_t max_len, int64_t index_topk, int64_t page_size);
// Pages per page-table row of a graph of context capacity ctx.
inline int64_t pages_for_ctx(int64_t ctx, int64_t page_size) { return (ctx + page_size - 1) / page_size; }

// A configuration with what every decode step reads from it, built once: the batch buckets.
class GraphPlan {
 public:
  explicit GraphPlan(const GraphPlanConfig& cfg = {});
  const GraphPlanConfig& config() const { return cfg_; }
  std::span<const int64_t> buckets() const { return buckets_; }  // batch_buckets(config().max_bs)

 private:
  GraphPlanConfig cfg_;
  std::vector<int64_t> buckets_;
};

// Whether decode steps may replay CUDA graphs at all, and the largest batch captured: the one rule that
// serve's memory estimate, the engine (its scratch page) and the runner follow. Graphs need a CUDA build,
// the model and cache on CUDA, a kernel-format latent cache (bf16 / FP8: the f32 stand-in takes per-request
// host paths) and decode tokens in the absorbed form (the MHA form sizes its work from the host context).
struct GraphSupport {
  int64_t max_bs = 0;                // --cuda-graph-max-bs (0: --disable-cuda-graph)
  int64_t max_running_requests = 0;  // no bucket above it (larger batches never occur); 0: no limit
  bool built = false;                // cuda_graphs_built()
  Device device = Device::cpu;       // the model's weights and KV cache
  bool kernel_format_cache = false;  // the latent cache is bf16 / FP8
  model::AttentionForm attention = model::AttentionForm::automatic;
  int64_t mha_min_tokens = 256;
  int64_t tokens =
      1;  // new tokens per request of the pass (verify: steps + 1); all must take the absorbed form
};
// The largest batch graphs replay (min(max_bs, max_running_requests)), or 0 when they cannot run (for
// s.tokens rows per request: more rows than a page, or rows that the MHA form would take, cannot).
int64_t cuda_graph_max_batch(const GraphSupport& s);
// The support of a model whose cache will be kv_dtype (unset: the model's, else KvCache::create's default)
// under `forward` (the engine's options), with the flags' limits; built: cuda_graphs_built().
GraphSupport graph_support(const model::Model& m, std::optional<model::KvCacheDtype> kv_dtype,
                           const model::ForwardOptions& forward, int64_t max_bs, int64_t max_running_requests,
                           bool built);

// The graph a step replays (the one per-step decision): only a decode step (every request decoding
// exactly one new token) of at most max_bs requests whose logits are its R rows (no extra rows), within
// max_ctx_cells; nullopt otherwise (the step runs eagerly). The plan is the step's own (no capacity).
std::optional<GraphKey> decode_graph_key(const model::StepPlan& p, const GraphPlan& plan);
// The same for a batch (what its plan under the engine's options would say). Allocates nothing.
std::optional<GraphKey> decode_graph_key(const model::ForwardBatch& b, const GraphPlan& plan);
// The graph of a speculative pass's batch (verify: tokens = steps + 1; draft: 1): only when every
// request has exactly `tokens` new tokens (a uniform shape; else nullopt: the pass runs eagerly), at most
// max_bs requests, tokens within a page (the padding requests' scratch page), no extra logits rows, and
// bs x tokens x ctx within max_ctx_cells. The caller names the pass (the batch's kind is not checked: the
// round builds its verify rows as prompt-like rows). Allocates nothing.
std::optional<GraphKey> spec_graph_key(const model::ForwardBatch& b, int64_t tokens, const GraphPlan& plan);

// The static inputs of a graph: the step layout of bs requests of k.tokens tokens each over
// pages_for_ctx(ctx) pages (model/step_plan.h), one upload per replay.
using DecodeInputLayout = model::StepLayout;
DecodeInputLayout decode_input_layout(const GraphKey& k, int64_t page_size);
// The shapes a graph of key k is captured with (the plan's capacity).
model::StepCapacity graph_capacity(const GraphKey& k, int64_t page_size);

// The batch a graph of key k runs for `b` (decode_graph_key / spec_graph_key gave k): its B requests, then
// bs - B padding requests on `scratch_page` (k.tokens tokens 0 at positions 0 ..), every request marked
// decoding (so the plan's logits rows are every row: a decode or verify step). Throws when b does not fit.
model::ForwardBatch graph_batch(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page);
// The batch a graph is captured with: bs padding rows (graph_batch of an empty batch), so an eager run
// of it only writes the scratch page.
model::ForwardBatch padding_batch(const GraphKey& k, int32_t scratch_page, int64_t page_size);

// Packs a batch into `out` (layout's size): the StepPlan of graph_batch(b, k, scratch_page) at the
// graph's capacity, packed (page-table rows: the used pages, then the last used page; the scratch page for
// padding rows). Throws when the batch does not fit the key.
void pack_decode_inputs(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page,
                        std::span<int32_t> out);

}  // namespace dsaserve::runtime
