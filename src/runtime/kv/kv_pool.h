#pragma once
// KvPool: page allocation over a model::KvCache. Pages are page_size tokens (64 by default) and one page
// id covers every layer's latent KV and indexer keys. Two-phase API: can_allocate(n) then allocate(n);
// free() returns pages; check_integrity() verifies the free list (tests and debug builds). Requests
// hold their pages through a KvManager (kv_manager.h).
#include <cstdint>
#include <span>
#include <vector>

#include "model/kv_cache.h"

namespace dsaserve::runtime {

class KvPool {
 public:
  // The cache's last `reserved` pages stay outside the pool (no request ever gets them; the CUDA graph
  // runner's padding rows write there): num_pages() is the cache's pages less those.
  explicit KvPool(model::KvCache cache, int64_t reserved = 0);

  int64_t page_size() const { return cache_.page_size; }
  int64_t num_pages() const { return cache_.num_pages - reserved_; }
  // The cache page id of reserved page i (0 <= i < reserved).
  int32_t reserved_page(int64_t i) const;
  int64_t free_pages() const { return int64_t(free_.size()); }
  // Pages needed to hold `tokens` positions.
  int64_t pages_for(int64_t tokens) const { return (tokens + page_size() - 1) / page_size(); }

  bool can_allocate(int64_t n) const { return n >= 0 && n <= free_pages(); }
  // Takes n free pages; throws dsaserve::Error ("KV pool too small ...") when fewer are free.
  std::vector<int32_t> allocate(int64_t n);
  // Returns pages to the pool; throws on a page that is not allocated (double free, foreign id).
  void free(std::span<const int32_t> pages);
  // Throws when the free list and the allocation flags disagree.
  void check_integrity() const;

  model::KvCache& cache() { return cache_; }
  const model::KvCache& cache() const { return cache_; }

 private:
  model::KvCache cache_;
  int64_t reserved_ = 0;
  std::vector<int32_t> free_;  // a stack; the lowest ids are handed out first
  std::vector<bool> used_;
};

}  // namespace dsaserve::runtime
