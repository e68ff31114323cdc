#pragma once
// KvManager: each request's KV pages over the KvPool. A request's pages are a KvSeq: a page table whose
// first prefix_pages entries are a cached prefix (owned by the RadixCache; the caller keeps it locked and
// this class never frees them) followed by pages the request owns. Three lengths, in tokens:
//   len       committed: the KV of tokens [0, len) is written (or being written by a launched step)
//   reserved  room promised to the next steps: len <= reserved <= pages.size() * page_size
// Rules:
// - Two-phase growth: pages_needed() / can_reserve(), then reserve(n) makes room for len + n tokens.
// - commit(n) advances len by n within what was reserved (a step launched over those tokens).
// - rollback(to) cuts the sequence back to `to` tokens (committed ones, e.g. rejected draft tokens, or
//   reserved ones never committed): the pages past the new length return to the pool. It is a page-table
//   edit: no KV moves, the kept pages keep their data. It never cuts into the cached prefix (those pages
//   are shared with other requests).
// - release() ends the sequence (finish, abort, retraction): its full committed pages go to the caller
//   (for the prefix cache), the rest of its own pages return to the pool.
// held_pages() counts the pages owned by live sequences, so that pool used == cache + held (no leak).
#include <cstdint>
#include <vector>

#include "runtime/kv/kv_pool.h"

namespace dsaserve::runtime {

struct KvSeq {
  std::vector<int32_t> pages;  // page table: prefix_pages cached pages, then the request's own
  int64_t prefix_pages = 0;
  int64_t len = 0;       // committed tokens
  int64_t reserved = 0;  // tokens with room in `pages` (>= len)

  bool empty() const { return pages.empty() && len == 0; }
  int64_t own_pages() const { return int64_t(pages.size()) - prefix_pages; }
};

class KvManager {
 public:
  explicit KvManager(KvPool& pool) : pool_(pool) {}

  int64_t page_size() const { return pool_.page_size(); }
  int64_t num_pages() const { return pool_.num_pages(); }
  int64_t free_pages() const { return pool_.free_pages(); }
  int64_t pages_for(int64_t tokens) const { return pool_.pages_for(tokens); }
  // Pages held by live sequences (their own pages, not the cached prefixes).
  int64_t held_pages() const { return held_; }

  // Starts `s` (empty) on a cached prefix of `tokens` tokens in `pages` (whole pages, locked by the
  // caller): len = reserved = tokens.
  void adopt_prefix(KvSeq& s, std::vector<int32_t> pages, int64_t tokens);
  // Pages reserve(s, n) would take from the pool.
  int64_t pages_needed(const KvSeq& s, int64_t n) const;
  bool can_reserve(const KvSeq& s, int64_t n) const { return pool_.can_allocate(pages_needed(s, n)); }
  // Room for len + n tokens (allocating the missing pages; reserved grows, never shrinks here). Throws
  // dsaserve::Error ("KV pool too small ...") when the pool has fewer free pages than needed.
  void reserve(KvSeq& s, int64_t n);
  // len += n; throws when len + n exceeds what was reserved.
  void commit(KvSeq& s, int64_t n);
  // Cuts `s` back to `to` tokens (prefix tokens <= to <= reserved): len = min(len, to), reserved = to,
  // and the pages past pages_for(to) return to the pool. Returns the number of pages freed.
  int64_t rollback(KvSeq& s, int64_t to);
  // Ends `s`: returns the page table's full committed pages (min(len / page_size, pages)), the prefix's
  // first (still the cache's) and then the request's own (now the caller's: hand them to the RadixCache);
  // the request's other pages return to the pool. `s` is empty afterwards.
  std::vector<int32_t> release(KvSeq& s);
  // Throws dsaserve::Error when `s` breaks the rules above (lengths, page counts).
  void check(const KvSeq& s) const;
  // The pool's own check (KvPool::check_integrity).
  void check_pool() const { pool_.check_integrity(); }

 private:
  KvPool& pool_;
  int64_t held_ = 0;
};

}  // namespace dsaserve::runtime
