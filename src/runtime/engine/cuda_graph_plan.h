#pragma once
// The host-side plan of CUDA-graph decode steps (no CUDA here; tested in CI): which captured graph a
// decode batch replays and how the batch is padded and packed into the graph's static inputs.
//
// A graph is keyed by (bs, ctx): bs requests of one new token each (bs from batch_buckets(): 1, 2, 4,
// ..., up to --cuda-graph-max-bs, which is itself the last bucket), and a context capacity ctx that every
// request's length fits in (the kernels take it as their max_len; shorter rows are ragged). Context
// buckets: index_topk when no request is longer (the forward then skips the indexer, as eagerly), else
// the powers of two above it (at least one page). A batch of B < bs requests is padded with rows that
// write their KV into a scratch page no request owns (token 0 at position 0, one visible key) and whose
// logits are dropped.
#include <compare>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "model/forward_batch.h"

namespace dsaserve::runtime {

struct GraphKey {
  int64_t bs = 0;   // requests (rows) the graph runs
  int64_t ctx = 0;  // context capacity: every request's length <= ctx
  auto operator<=>(const GraphKey&) const = default;
};

struct GraphPlanConfig {
  int64_t max_bs = 256;    // the largest batch replayed (--cuda-graph-max-bs); 0: no graphs
  int64_t index_topk = 0;  // the model's DSA top-k; 0 for a model without an indexer
  int64_t page_size = 64;
  int64_t max_ctx_cells = int64_t(1) << 27;  // bs x ctx limit (the indexer's f32 scores are bs x ctx)
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

// The graph a batch replays: only a pure decode batch (every request decoding exactly one new token) of at
// most max_bs requests, within max_ctx_cells; nullopt otherwise (the step runs eagerly). Allocates nothing.
std::optional<GraphKey> decode_graph_key(const model::ForwardBatch& b, const GraphPlan& plan);

// The static inputs of a graph, packed into one i32 buffer (one upload per replay): offsets in elements.
struct DecodeInputLayout {
  int64_t bs = 0, pages = 0;  // rows, page-table columns
  int64_t ids() const { return 0; }
  int64_t positions() const { return bs; }
  int64_t slots() const { return 2 * bs; }
  int64_t row_seq() const { return 3 * bs; }
  int64_t row_len() const { return 4 * bs; }
  int64_t page_table() const { return 5 * bs; }  // [bs, pages], row-major
  int64_t size() const { return 5 * bs + bs * pages; }
};
DecodeInputLayout decode_input_layout(const GraphKey& k, int64_t page_size);

// Packs a decode batch (decode_graph_key(b) gave key k) into `out` (layout's size): its B requests, then
// bs - B padding rows on `scratch_page`. Page-table rows are padded with the row's last page (the scratch
// page for padding rows). Throws when the batch does not fit the key.
void pack_decode_inputs(const model::ForwardBatch& b, const GraphKey& k, int32_t scratch_page,
                        std::span<int32_t> out);

// The batch a graph is captured with: bs padding rows on the scratch page (what pack_decode_inputs
// writes for an empty batch), so an eager run of it only writes the scratch page.
model::ForwardBatch padding_batch(const GraphKey& k, int32_t scratch_page, int64_t page_size);

}  // namespace dsaserve::runtime
