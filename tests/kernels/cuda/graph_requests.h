#pragma once
// The request layout the CUDA-graph decode tests share (cuda_graph_test, spec_graph_test, pdl_test): a
// deterministic token per (request, position) and page tables that interleave the requests in the pool.
#include <cstdint>
#include <vector>

namespace dsaserve::testing {

// The prompt / decode token of request r at position pos, in [0, vocab).
inline int32_t graph_token(int64_t r, int64_t pos, int64_t vocab) {
  return int32_t((r * 7919 + pos * 104729 + 13) % vocab);
}

// B requests of `pages_per_req` pages each, interleaved: request r owns pages r, r + B, r + 2B, ...; the
// pool's page B * pages_per_req (the first past them) is left for the graphs' scratch.
inline std::vector<std::vector<int32_t>> interleaved_page_tables(int64_t B, int64_t pages_per_req) {
  std::vector<std::vector<int32_t>> t(static_cast<size_t>(B));
  for (int64_t r = 0; r < B; ++r)
    for (int64_t i = 0; i < pages_per_req; ++i) t[size_t(r)].push_back(int32_t(i * B + r));
  return t;
}

}  // namespace dsaserve::testing
