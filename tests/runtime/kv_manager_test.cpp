// KvManager: reserve / commit / rollback / release of a request's pages, with pool integrity (no page
// leaked or double-freed) after each edit, rollbacks across page boundaries and of reserved tokens that
// were never committed, and a cached prefix that a rollback never cuts into.
#include "runtime/kv/kv_manager.h"

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"

namespace dsaserve::runtime {
namespace {

// A pool of `pages` pages of 4 tokens (no tensors: the manager only moves page ids).
KvPool make_pool(int64_t pages) {
  model::KvCache c;
  c.num_pages = pages;
  c.page_size = 4;
  return KvPool(std::move(c));
}

// The pool and the manager agree: used pages = pages held by sequences + `elsewhere` (e.g. a cache).
void expect_integrity(const KvPool& pool, const KvManager& kv, int64_t elsewhere = 0) {
  pool.check_integrity();
  EXPECT_EQ(pool.num_pages() - pool.free_pages(), kv.held_pages() + elsewhere);
}

TEST(KvManager, ReserveCommitAndTwoPhaseChecks) {
  KvPool pool = make_pool(4);
  KvManager kv(pool);
  KvSeq s;
  EXPECT_EQ(kv.pages_needed(s, 5), 2);
  EXPECT_TRUE(kv.can_reserve(s, 16));
  EXPECT_FALSE(kv.can_reserve(s, 17));
  kv.reserve(s, 5);
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_EQ(s.reserved, 5);
  EXPECT_EQ(s.len, 0);
  kv.commit(s, 5);
  EXPECT_EQ(s.len, 5);
  EXPECT_THROW(kv.commit(s, 1), Error);  // nothing reserved past 5
  kv.reserve(s, 3);                      // 8 tokens: still two pages
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_EQ(s.reserved, 8);
  EXPECT_EQ(kv.pages_needed(s, 4), 1);
  try {
    kv.reserve(s, 100);
    FAIL() << "reserving past the pool must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV pool too small"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.pages.size(), 2u);  // a failed reserve changes nothing
  EXPECT_THROW(kv.pages_needed(s, -1), Error);
  kv.check(s);
  expect_integrity(pool, kv);
  EXPECT_EQ(kv.release(s).size(), 1u);  // 5 committed tokens: one full page
  EXPECT_TRUE(s.empty());
}

// An MTP verify: 1 + 4 draft tokens committed after 6, 2 accepted; the pages past the accepted length
// go back, the kept ones are the same page ids (a page-table edit, nothing moved).
TEST(KvManager, RollbackAcrossAPageBoundaryFreesThePagesPastTheNewLength) {
  KvPool pool = make_pool(8);
  KvManager kv(pool);
  KvSeq s;
  kv.reserve(s, 6);
  kv.commit(s, 6);
  kv.reserve(s, 5);  // 11 tokens: 3 pages
  kv.commit(s, 5);
  ASSERT_EQ(s.pages.size(), 3u);
  const std::vector<int32_t> before = s.pages;
  expect_integrity(pool, kv);
  EXPECT_EQ(kv.rollback(s, 8), 1);  // 8 tokens: exactly 2 pages
  EXPECT_EQ(s.len, 8);
  EXPECT_EQ(s.reserved, 8);
  EXPECT_EQ(s.pages, std::vector<int32_t>(before.begin(), before.begin() + 2));
  expect_integrity(pool, kv);
  EXPECT_EQ(pool.free_pages(), 6);
  EXPECT_EQ(kv.rollback(s, 5), 0);  // 5 tokens still need page 2 (the partial page is kept)
  EXPECT_EQ(s.pages.size(), 2u);
  EXPECT_EQ(kv.rollback(s, 4), 1);  // across the boundary: page 2 goes
  EXPECT_EQ(s.pages, std::vector<int32_t>(before.begin(), before.begin() + 1));
  EXPECT_EQ(kv.rollback(s, 0), 1);
  EXPECT_TRUE(s.pages.empty());
  EXPECT_THROW(kv.rollback(s, 1), Error);  // past what is reserved
  expect_integrity(pool, kv);
  EXPECT_EQ(pool.free_pages(), 8);
  // Growing again after a rollback reuses pages from the pool.
  kv.reserve(s, 9);
  kv.commit(s, 9);
  EXPECT_EQ(s.pages.size(), 3u);
  expect_integrity(pool, kv);
}

TEST(KvManager, RollbackOfReservedTokensThatWereNeverCommitted) {
  KvPool pool = make_pool(8);
  KvManager kv(pool);
  KvSeq s;
  kv.reserve(s, 3);
  kv.commit(s, 3);
  kv.reserve(s, 6);  // draft room: 9 tokens, 3 pages, nothing committed past 3
  ASSERT_EQ(s.pages.size(), 3u);
  EXPECT_EQ(kv.rollback(s, 3), 2);  // back to the committed length
  EXPECT_EQ(s.len, 3);
  EXPECT_EQ(s.reserved, 3);
  EXPECT_EQ(s.pages.size(), 1u);
  EXPECT_THROW(kv.commit(s, 1), Error);  // the reservation is gone
  // Rolling back into the reserved part only (committed tokens stay).
  kv.reserve(s, 9);  // 12 tokens, 3 pages
  EXPECT_EQ(kv.rollback(s, 7), 1);
  EXPECT_EQ(s.len, 3);
  EXPECT_EQ(s.reserved, 7);
  kv.commit(s, 4);
  EXPECT_EQ(s.len, 7);
  kv.check(s);
  expect_integrity(pool, kv);
  kv.release(s);
  expect_integrity(pool, kv, 1);  // its full page went to the caller
}

// The cached prefix (pages the RadixCache owns) is never freed by a rollback nor by release.
TEST(KvManager, CachedPrefixPagesStayWithTheirOwner) {
  KvPool pool = make_pool(8);
  KvManager kv(pool);
  const std::vector<int32_t> prefix = pool.allocate(2);  // as if the cache held them
  KvSeq s;
  kv.adopt_prefix(s, prefix, 8);
  EXPECT_EQ(s.len, 8);
  EXPECT_EQ(s.prefix_pages, 2);
  EXPECT_EQ(kv.held_pages(), 0);
  EXPECT_THROW(kv.adopt_prefix(s, prefix, 8), Error);  // not empty
  kv.reserve(s, 6);
  kv.commit(s, 6);
  EXPECT_EQ(kv.held_pages(), 2);
  EXPECT_THROW(kv.rollback(s, 7), Error);  // into the shared prefix
  EXPECT_EQ(kv.rollback(s, 8), 2);
  EXPECT_EQ(s.pages, prefix);
  expect_integrity(pool, kv, 2);
  kv.reserve(s, 5);
  kv.commit(s, 5);  // 13 tokens: 3 full pages
  const std::vector<int32_t> full = kv.release(s);
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(std::vector<int32_t>(full.begin(), full.begin() + 2), prefix);
  EXPECT_EQ(kv.held_pages(), 0);
  expect_integrity(pool, kv, 3);  // the prefix and the new full page belong to the caller now
  pool.free(full);
  EXPECT_EQ(pool.free_pages(), 8);
}

// Random edits of several sequences: after each one the pool's free list is consistent, every page is in
// exactly one place, and when all sequences are released (and their full pages returned) the pool is full.
TEST(KvManager, RandomEditsNeverLeakAPage) {
  KvPool pool = make_pool(32);
  KvManager kv(pool);
  std::vector<KvSeq> seqs(5);
  std::mt19937 rng(7);
  int64_t given = 0;  // full pages handed out by release() (returned below)
  std::vector<int32_t> returned;
  for (int round = 0; round < 2000; ++round) {
    KvSeq& s = seqs[rng() % seqs.size()];
    switch (rng() % 4) {
      case 0: {
        const int64_t n = int64_t(rng() % 9);
        if (kv.can_reserve(s, n)) kv.reserve(s, n);
        break;
      }
      case 1: kv.commit(s, int64_t(rng() % uint32_t(s.reserved - s.len + 1))); break;
      case 2: kv.rollback(s, int64_t(rng() % uint32_t(s.reserved + 1))); break;
      default:
        if (rng() % 4 == 0) {
          const std::vector<int32_t> full = kv.release(s);
          given += int64_t(full.size());
          pool.free(full);
        }
    }
    kv.check(s);
    int64_t held = 0;
    for (const KvSeq& q : seqs) held += q.own_pages();
    ASSERT_EQ(held, kv.held_pages()) << "round " << round;
    pool.check_integrity();
    ASSERT_EQ(pool.num_pages() - pool.free_pages(), held) << "round " << round;
  }
  for (KvSeq& s : seqs) pool.free(kv.release(s));
  EXPECT_GT(given, 0);
  EXPECT_EQ(pool.free_pages(), pool.num_pages());
  EXPECT_EQ(kv.held_pages(), 0);
}

}  // namespace
}  // namespace dsaserve::runtime
