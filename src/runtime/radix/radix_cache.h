#pragma once
// RadixCache: the prefix cache. A tree over page-aligned token blocks: each node below the root is one
// KV page holding page_size tokens, keyed by those tokens, so a path from the root spells a cached
// prefix and lists its pages (latent KV and indexer K together, as a KvPool page holds both).
//
// Rules:
// - The tree owns the pages of its nodes; they return to the KvPool only through evict().
// - A request that uses a matched prefix must lock() its node before using the pages and unlock() it
//   when done; locked nodes (and their ancestors) are never evicted.
// - insert() hands a request's computed pages to the tree; pages whose block was already cached (by an
//   other request) are freed to the pool at once.
// - evict() frees unlocked leaves, least recently used first.
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "runtime/kv/kv_pool.h"

namespace dsaserve::runtime {

class RadixCache {
 public:
  using NodeId = int32_t;
  static constexpr NodeId kRoot = 0;

  // `enabled` false: match_prefix never matches and insert frees everything (--disable-radix-cache).
  explicit RadixCache(KvPool& pool, bool enabled = true);

  struct Match {
    NodeId node = kRoot;         // deepest matched node (kRoot: nothing)
    std::vector<int32_t> pages;  // one per matched block
    int64_t num_tokens = 0;      // pages.size() * page_size
  };
  // The longest cached prefix of tokens[0 .. max_tokens) in whole pages. Marks the path as used (LRU).
  Match match_prefix(std::span<const int32_t> tokens, int64_t max_tokens);

  void lock(NodeId node);
  void unlock(NodeId node);

  // Adds tokens[0 .. pages.size() * page_size) with their pages; takes ownership of `pages` (duplicates
  // of cached blocks are freed to the pool). Returns the node of the last block (kRoot when empty).
  NodeId insert(std::span<const int32_t> tokens, std::span<const int32_t> pages);

  // Frees up to `num_pages` pages of unlocked leaves (LRU first); returns how many were freed.
  int64_t evict(int64_t num_pages);

  int64_t page_size() const { return page_size_; }
  int64_t cached_pages() const { return num_pages_; }
  int64_t locked_pages() const { return locked_pages_; }
  int64_t evictable_pages() const { return num_pages_ - locked_pages_; }
  bool enabled() const { return enabled_; }
  // Whether `page` belongs to a node of the tree (for integrity checks).
  bool holds_page(int32_t page) const;

  // Throws dsaserve::Error when the tree and its counters disagree (pages unique and allocated in the
  // pool, lock counts of parents >= children, counters match a walk).
  void check_integrity() const;

 private:
  struct Node {
    NodeId parent = -1;
    std::vector<int32_t> key;  // page_size tokens
    int32_t page = -1;
    int32_t lock_ref = 0;
    uint64_t last_access = 0;
    std::map<std::vector<int32_t>, NodeId> children;
    bool alive = false;
  };
  NodeId new_node(NodeId parent, std::vector<int32_t> key, int32_t page);

  KvPool& pool_;
  int64_t page_size_;
  bool enabled_;
  std::vector<Node> nodes_;
  std::vector<NodeId> free_ids_;
  uint64_t clock_ = 0;
  int64_t num_pages_ = 0;
  int64_t locked_pages_ = 0;
  std::vector<int32_t> page_owner_;  // page -> node (or -1)
};

}  // namespace dsaserve::runtime
