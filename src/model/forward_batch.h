#pragma once
// ForwardBatch: the plain-data input of one model step. Any mix of requests, each with its new tokens
// (a whole prefill, a chunk of a longer prefill, or one decode token), the number of its tokens already
// in the KV cache (its start position) and its page table. Built on the host by the runtime (or a test),
// consumed by Model::forward. Lives in model/ because it is the model's input contract; runtime/ builds it.
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace dsaserve::model {

struct ForwardBatch {
  int64_t page_size = 64;
  // Per token, request-major: request r owns tokens [token_begin[r], token_begin[r + 1]).
  std::vector<int32_t> input_ids;      // [T]
  std::vector<int32_t> positions;      // [T] absolute position in its sequence
  std::vector<int32_t> out_cache_loc;  // [T] cache slot the token's KV is written to
  // Per request.
  std::vector<int64_t> token_begin{0};  // [R + 1]
  std::vector<int64_t> start_pos;       // [R] tokens already cached (= position of its first new token)
  // [R] 1: the request is decoding (its new token is one it generated; several new tokens: its last
  // accepted token and the drafts to verify, each row's logits returned: StepPlan's verify kind); 0: its
  // new tokens are prompt tokens (a prefill, or a chunk of one, even of a single token). Picks the step's
  // kind (model/step_plan.h), its logits rows and its name in traces.
  std::vector<uint8_t> decoding;
  // Page tables in CSR form: request r's pages are page_indices[page_begin[r] .. page_begin[r + 1]).
  std::vector<int64_t> page_begin{0};  // [R + 1]
  std::vector<int32_t> page_indices;
  // Extra logits rows (ForwardOptions::all_logits false): batch token indices whose logits the step also
  // returns, after the R last-token rows, in this order (prompt logprobs). Empty: the R rows only.
  std::vector<int32_t> extra_logit_rows;

  int64_t num_tokens() const { return int64_t(input_ids.size()); }
  int64_t num_requests() const { return int64_t(start_pos.size()); }
  int64_t num_new(int64_t r) const { return token_begin[size_t(r) + 1] - token_begin[size_t(r)]; }
  std::span<const int32_t> pages(int64_t r) const {
    return std::span<const int32_t>(page_indices)
        .subspan(size_t(page_begin[size_t(r)]), size_t(page_begin[size_t(r) + 1] - page_begin[size_t(r)]));
  }

  // Appends a request: `tokens` at positions start_pos.. using `page_table` (which must cover
  // start_pos + tokens.size() positions). Computes positions and out_cache_loc. Throws on bad input.
  // `decoding`: the request's state (see `decoding` above); unset, one new token after a cached prefix
  // counts as a decode, so a caller that may schedule a one-token chunk of a prompt must say so.
  void add_request(std::span<const int32_t> tokens, int64_t start, std::span<const int32_t> page_table,
                   std::optional<bool> decoding = std::nullopt);
  // All requests are decoding (a decode or verify step; a 1-token prompt or chunk is not one).
  bool all_decoding() const;

  // Checks the invariants against a vocabulary and a pool of `num_pages` pages; throws dsaserve::Error.
  void validate(int64_t vocab_size, int64_t num_pages) const;
};

}  // namespace dsaserve::model
