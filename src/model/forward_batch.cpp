#include "model/forward_batch.h"

#include <algorithm>

#include "core/error.h"

namespace dsaserve::model {

void ForwardBatch::add_request(std::span<const int32_t> tokens, int64_t start,
                               std::span<const int32_t> page_table, std::optional<bool> decode) {
  DSA_CHECK(!tokens.empty(), "request {} has no new tokens (empty sequence)", num_requests());
  DSA_CHECK(start >= 0, "request {}: negative start position {}", num_requests(), start);
  DSA_CHECK(page_size > 0, "page size must be positive, got {}", page_size);
  const int64_t end = start + int64_t(tokens.size());
  const int64_t need = (end + page_size - 1) / page_size;
  DSA_CHECK(int64_t(page_table.size()) >= need,
            "request {}: {} positions need {} pages of {}, its page table has {}", num_requests(), end, need,
            page_size, page_table.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t pos = start + int64_t(i);
    input_ids.push_back(tokens[i]);
    positions.push_back(int32_t(pos));
    out_cache_loc.push_back(
        int32_t(int64_t(page_table[size_t(pos / page_size)]) * page_size + pos % page_size));
  }
  token_begin.push_back(int64_t(input_ids.size()));
  start_pos.push_back(start);
  decoding.push_back(uint8_t(decode.value_or(tokens.size() == 1 && start > 0) ? 1 : 0));
  page_indices.insert(page_indices.end(), page_table.begin(), page_table.end());
  page_begin.push_back(int64_t(page_indices.size()));
}

bool ForwardBatch::all_decoding() const {
  return !decoding.empty() && std::all_of(decoding.begin(), decoding.end(), [](uint8_t d) { return d != 0; });
}

void ForwardBatch::validate(int64_t vocab_size, int64_t num_pages) const {
  const int64_t R = num_requests(), T = num_tokens();
  DSA_CHECK(R > 0 && T > 0, "empty batch: {} requests, {} tokens", R, T);
  DSA_CHECK(int64_t(token_begin.size()) == R + 1 && int64_t(page_begin.size()) == R + 1 &&
                int64_t(decoding.size()) == R && int64_t(positions.size()) == T &&
                int64_t(out_cache_loc.size()) == T && token_begin[0] == 0 && token_begin[size_t(R)] == T,
            "inconsistent batch layout ({} requests, {} tokens)", R, T);
  for (int64_t t = 0; t < T; ++t) {
    DSA_CHECK(input_ids[size_t(t)] >= 0 && input_ids[size_t(t)] < vocab_size,
              "token id {} at batch index {} is out of range [0, {})", input_ids[size_t(t)], t, vocab_size);
  }
  for (int32_t t : extra_logit_rows) {
    DSA_CHECK(t >= 0 && t < T, "extra logits row {} outside the batch's {} tokens", t, T);
  }
  for (int64_t p : page_indices) {
    DSA_CHECK(p >= 0 && p < num_pages, "page id {} outside the pool of {} pages", p, num_pages);
  }
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = num_new(r);
    DSA_CHECK(n > 0, "request {} has no new tokens", r);
    const auto pt = pages(r);
    const int64_t used = (start_pos[size_t(r)] + n + page_size - 1) / page_size;
    std::vector<int32_t> seen(pt.begin(), pt.begin() + std::min<int64_t>(used, int64_t(pt.size())));
    std::sort(seen.begin(), seen.end());
    DSA_CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end(),
              "request {}: its page table lists a page twice", r);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = token_begin[size_t(r)] + i, pos = start_pos[size_t(r)] + i;
      DSA_CHECK(positions[size_t(t)] == pos, "request {}: token {} at position {}, expected {}", r, i,
                positions[size_t(t)], pos);
      DSA_CHECK(pos / page_size < int64_t(pt.size()), "request {}: position {} beyond its {} pages", r, pos,
                pt.size());
      const int64_t slot = int64_t(pt[size_t(pos / page_size)]) * page_size + pos % page_size;
      DSA_CHECK(out_cache_loc[size_t(t)] == slot, "request {}: out_cache_loc {} of position {} should be {}",
                r, out_cache_loc[size_t(t)], pos, slot);
    }
  }
}

}  // namespace dsaserve::model
