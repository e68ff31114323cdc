// RadixCache: matching whole pages, insertion with duplicates, lock/unlock, LRU eviction of leaves.
#include "runtime/radix/radix_cache.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace dsaserve::runtime {
namespace {

model::KvCache page_only_cache(int64_t pages, int64_t page_size) {
  model::KvCache c;  // KvPool only needs the geometry
  c.num_pages = pages;
  c.page_size = page_size;
  return c;
}

std::vector<int32_t> seq(int32_t from, int32_t n) {
  std::vector<int32_t> v;
  for (int32_t i = 0; i < n; ++i) v.push_back(from + i);
  return v;
}

TEST(RadixCache, MatchesWholePagesOnly) {
  KvPool pool(page_only_cache(16, 4));
  RadixCache cache(pool);
  const std::vector<int32_t> toks = seq(100, 10);
  const std::vector<int32_t> pages = pool.allocate(2);  // covers 8 tokens
  cache.insert(toks, pages);
  cache.check_integrity();
  EXPECT_EQ(cache.cached_pages(), 2);

  auto m = cache.match_prefix(toks, 10);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.pages, pages);
  m = cache.match_prefix(toks, 7);  // the limit cuts the second page
  EXPECT_EQ(m.num_tokens, 4);
  std::vector<int32_t> other = toks;
  other[5] = 0;  // differs in the second page
  m = cache.match_prefix(other, 10);
  EXPECT_EQ(m.num_tokens, 4);
  other[0] = 0;
  EXPECT_EQ(cache.match_prefix(other, 10).num_tokens, 0);
}

TEST(RadixCache, InsertFreesDuplicatePages) {
  KvPool pool(page_only_cache(16, 4));
  RadixCache cache(pool);
  const std::vector<int32_t> toks = seq(0, 12);
  cache.insert(toks, pool.allocate(3));
  EXPECT_EQ(pool.free_pages(), 13);
  // A second request computed the same 3 pages plus one more on its own.
  const std::vector<int32_t> longer = seq(0, 16);
  cache.insert(longer, pool.allocate(4));
  EXPECT_EQ(cache.cached_pages(), 4);
  EXPECT_EQ(pool.free_pages(), 12);  // the 3 duplicates came back
  cache.check_integrity();
  pool.check_integrity();
}

TEST(RadixCache, LockedPagesAreNotEvictedAndLruGoesFirst) {
  KvPool pool(page_only_cache(16, 2));
  RadixCache cache(pool);
  const std::vector<int32_t> a = {1, 1, 2, 2}, b = {1, 1, 3, 3}, c = {5, 5, 6, 6};
  cache.insert(a, pool.allocate(2));
  cache.insert(b, pool.allocate(1 + 1));  // shares the first page with a: one duplicate freed
  cache.insert(c, pool.allocate(2));
  EXPECT_EQ(cache.cached_pages(), 5);
  // Touch c, then a; b is least recently used.
  cache.match_prefix(c, 4);
  auto ma = cache.match_prefix(a, 4);
  cache.lock(ma.node);
  EXPECT_EQ(cache.locked_pages(), 2);
  EXPECT_EQ(cache.evictable_pages(), 3);
  EXPECT_EQ(cache.evict(1), 1);  // b's leaf
  EXPECT_EQ(cache.match_prefix(b, 4).num_tokens, 2);
  EXPECT_EQ(cache.match_prefix(c, 4).num_tokens, 4);
  EXPECT_EQ(cache.evict(100), 2);  // c's two pages; a is locked
  EXPECT_EQ(cache.match_prefix(a, 4).num_tokens, 4);
  cache.check_integrity();
  cache.unlock(ma.node);
  EXPECT_EQ(cache.evict(100), 2);
  EXPECT_EQ(cache.cached_pages(), 0);
  EXPECT_EQ(pool.free_pages(), 16);
  cache.check_integrity();
  EXPECT_THROW(cache.unlock(ma.node), Error);
}

TEST(RadixCache, DisabledNeverMatches) {
  KvPool pool(page_only_cache(8, 2));
  RadixCache cache(pool, false);
  const std::vector<int32_t> t = {1, 2, 3, 4};
  cache.insert(t, pool.allocate(2));
  EXPECT_EQ(pool.free_pages(), 8);
  EXPECT_EQ(cache.match_prefix(t, 4).num_tokens, 0);
}

}  // namespace
}  // namespace dsaserve::runtime
