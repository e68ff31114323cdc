#pragma once
// StepPlan: one model step worked out once on the host from its ForwardBatch (FlashInfer's / FlashMLA's
// plan-then-run), read by every layer. It holds the pass kind, per request its new tokens, its attention
// form and the rows whose logits the step returns; the step's device inputs (ids, positions, cache slots,
// the attention rows and the page table, the gather indices) packed into one i32 buffer that is uploaded
// once (StepInputs); and the attention kernels' launch plans (split counts, workspace sizes:
// kernels::MlaRowsPlan / IndexerRowsPlan), so no layer re-plans or uploads anything.
//
// Model::forward builds and uploads a plan itself; a caller that needs the inputs in fixed device memory
// (CUDA graphs: runtime/engine/cuda_graph_runner.h) builds it with Model::plan_step, binds it to its own
// buffer (bind) and fills that buffer from pack() before each replay.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "model/forward_batch.h"
#include "model/model.h"

namespace dsaserve::model {

// The pass a step runs. prefill: prompt tokens only (whole prompts or chunks); decode: every request
// decodes one token; mixed: both; verify: decoding requests with several new tokens each (speculative
// verification: the last accepted token + the drafts, logits at every row). The MTP layer's passes: draft
// (one token per decoding request) and draft_extend (over prompt or accepted tokens).
enum class StepKind : uint8_t { prefill, decode, mixed, verify, draft, draft_extend };
const char* step_kind_name(StepKind k);
// The kind of a batch's pass (the target model's, or with mtp the MTP layer's), from its requests' state.
StepKind step_kind(const ForwardBatch& b, bool mtp = false);

// Offsets (in i32 elements) of the step's inputs in its one upload. For a decode batch of B requests with
// one token each and no gathers this is 5 B + B x pages: the static inputs of a CUDA graph.
struct StepLayout {
  int64_t tokens = 0;         // T
  int64_t seqs = 0;           // page-table rows: max(R, 1)
  int64_t pages = 0;          // page-table columns
  int64_t logit_rows = 0;     // rows gathered for the logits (0: the logits are every row's, in order)
  int64_t absorbed_rows = 0;  // tokens gathered for the absorbed form (0: none, or all of them)
  int64_t ids() const { return 0; }
  int64_t positions() const { return tokens; }
  int64_t slots() const { return 2 * tokens; }
  int64_t row_seq() const { return 3 * tokens; }
  int64_t row_len() const { return 4 * tokens; }
  int64_t page_table() const { return 5 * tokens; }  // [seqs, pages], row-major
  int64_t logit_rows_at() const { return page_table() + seqs * pages; }
  int64_t absorbed_rows_at() const { return logit_rows_at() + logit_rows; }
  int64_t size() const { return absorbed_rows_at() + absorbed_rows; }
  bool operator==(const StepLayout&) const = default;
};

// Fixed shapes for a plan (a CUDA graph's): the kernels' context bound and the page-table width.
struct StepCapacity {
  int64_t max_len = 0;  // >= every request's length
  int64_t pages = 0;    // page-table columns; pages * page_size >= max_len
};

// What a plan reads from the model and the forward options (Model::plan_config).
struct StepPlanConfig {
  AttentionForm attention = AttentionForm::automatic;
  int64_t mha_min_tokens = 256;
  AttentionFormRule form_rule{};
  bool all_logits = true;
  // heads, topk (0: no indexer) and the MLA dims of the form rule; tokens / context are per request.
  AttentionShape dims{0, 0, 1, 0};
  bool mtp = false;                      // the MTP layer's pass (draft / draft_extend)
  std::optional<StepCapacity> capacity;  // fixed shapes (CUDA graphs); unset: the batch's own
  // Whether the kernels may size their work from the host rows (off for CUDA graphs: a captured kernel
  // must not depend on the capture batch's row lengths, which replays change).
  bool host_rows = true;
};

// The device side of a plan: views of one i32 buffer (StepPlan::bind / upload).
struct StepInputs {
  Tensor buffer;                    // i32 [layout.size()]
  Tensor ids, positions, slots;     // i32 [T]
  Tensor row_seq, row_len;          // i32 [T]: each token's request and visible length
  Tensor page_table;                // i32 [seqs, pages]
  Tensor logit_rows;                // i32 [layout.logit_rows] or undefined
  Tensor absorbed_rows;             // i32 [layout.absorbed_rows] or undefined
  std::vector<Tensor> page_tables;  // per request, i32 [its used pages] (views of page_table)
  bool defined() const { return buffer.defined(); }
};

struct StepPlan {
  StepKind kind = StepKind::prefill;
  int64_t page_size = 64;
  int64_t max_len = 0;        // the kernels' context bound: the longest request, or the capacity's
  bool host_rows = true;      // see StepPlanConfig
  bool runs_indexer = false;  // the model has an indexer and max_len > its top-k
  int64_t index_topk = 0;     // 0: no indexer
  int64_t heads = 0;
  bool all_decoding = false;  // every request is decoding (a pass of a decode step)
  // The trace's step and pass names (the plan's keys, docs/plan.md): "prefill" / "decode"; "prefill",
  // "decode", "verify", "draft", "draft_extend" (over decoding requests) or "prefill_draft_extend".
  const char* trace_step() const { return all_decoding ? "decode" : "prefill"; }
  const char* trace_pass() const;

  // Per request.
  std::vector<int64_t> token_begin{0};  // [R + 1]
  std::vector<int64_t> start_pos;       // [R]
  std::vector<int64_t> used_pages;      // [R] pages covering start_pos + new tokens
  std::vector<uint8_t> mha;             // [R] 1: the MHA form, 0: absorbed
  std::vector<int64_t> absorbed;        // the absorbed requests, in order
  // The step's inputs on the host, as uploaded (see StepLayout).
  std::vector<int32_t> ids, positions, slots, row_seq, row_len;  // [T]
  std::vector<int32_t> page_table;     // [seqs, pages]: used pages, then the last used page repeated
  std::vector<int32_t> logit_rows;     // the rows whose logits the step returns, in order (empty: all T)
  std::vector<int32_t> absorbed_rows;  // the absorbed requests' tokens when some requests take MHA
  StepLayout layout;

  // The attention kernels' launch plans (plan_kernels; empty on backends that need none): the indexer
  // over every row, MLA over every row (every request absorbed) or one per absorbed request.
  kernels::IndexerRowsPlan indexer;
  kernels::MlaRowsPlan mla;
  std::vector<kernels::MlaRowsPlan> mla_request;  // [absorbed.size()] when some requests take MHA

  int64_t num_tokens() const { return int64_t(ids.size()); }
  int64_t num_requests() const { return int64_t(start_pos.size()); }
  int64_t num_new(int64_t r) const { return token_begin[size_t(r) + 1] - token_begin[size_t(r)]; }
  bool all_absorbed() const { return int64_t(absorbed.size()) == num_requests(); }
  // The rows of the logits the forward returns (R last-token rows, verify rows, extra rows).
  int64_t num_logit_rows() const { return logit_rows.empty() ? num_tokens() : int64_t(logit_rows.size()); }

  // The host plan of `b` (throws dsaserve::Error when the batch exceeds the capacity). Kernel plans are
  // left empty (plan_kernels).
  static StepPlan build(const ForwardBatch& b, const StepPlanConfig& cfg);
  // Fills the kernel launch plans from the backend of device `d` (ops.plan_mla_rows / plan_indexer_rows).
  void plan_kernels(const kernels::Ops& ops, Device d);
  // The upload's values in layout order; out.size() >= layout.size().
  void pack(std::span<int32_t> out) const;
  // Views of `buffer` (i32, at least layout.size() elements, on the step's device) as the step's inputs.
  StepInputs bind(const Tensor& buffer) const;
  // pack() into one host buffer, copied to `d` in one transfer (none on the CPU), bound.
  StepInputs upload(Device d) const;
};

}  // namespace dsaserve::model
