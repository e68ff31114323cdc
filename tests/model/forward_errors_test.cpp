// Bad input to the forward is a clear dsaserve::Error: token ids out of range, empty requests, page
// tables or caches too small, mismatched page sizes, missing MTP inputs.
#include <gtest/gtest.h>

#include <numeric>

#include "common/fixtures.h"
#include "core/error.h"
#include "model/score.h"

namespace dsaserve::model {
namespace {

template <typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    FAIL() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(ForwardErrors, BadBatchesAreClearErrors) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = Model::load(dir);
  KvCache cache = m->make_cache(2, 16);
  const std::vector<int32_t> pages{1, 0};
  const std::vector<int32_t> ok{3, 4, 5}, bad{3, 512, 5}, neg{-1};

  ForwardBatch b;
  b.page_size = 16;
  expect_error([&] { b.add_request(std::span<const int32_t>(), 0, pages); }, "empty");
  expect_error([&] { b.add_request(ok, 30, pages); }, "page table");  // positions 30..32 need 3 pages

  ForwardBatch oor;
  oor.page_size = 16;
  oor.add_request(bad, 0, pages);
  expect_error([&] { m->forward(oor, cache); }, "out of range");
  ForwardBatch negb;
  negb.page_size = 16;
  negb.add_request(neg, 0, pages);
  expect_error([&] { m->forward(negb, cache); }, "out of range");

  ForwardBatch foreign;  // a page id the cache does not have
  foreign.page_size = 16;
  const std::vector<int32_t> far{7};
  foreign.add_request(ok, 0, far);
  expect_error([&] { m->forward(foreign, cache); }, "outside the pool");

  ForwardBatch other_size;
  other_size.page_size = 64;
  other_size.add_request(ok, 0, pages);
  expect_error([&] { m->forward(other_size, cache); }, "differs from the cache");

  ForwardBatch empty;
  empty.page_size = 16;
  expect_error([&] { m->forward(empty, cache); }, "empty batch");

  ForwardBatch good;
  good.page_size = 16;
  good.add_request(ok, 0, pages);
  EXPECT_EQ(m->forward(good, cache).logits.size(0), 3);
  expect_error([&] { m->forward_mtp(good, Tensor(), cache); }, "hidden");
  expect_error([&] { m->forward_mtp(good, Tensor(), cache, {}, 3); }, "MTP layer 3");

  expect_error([&] { score_sequence(*m, std::vector<int32_t>{}); }, "empty");
  expect_error([&] { greedy_generate(*m, std::vector<int32_t>{}, 3); }, "empty");
}

TEST(ForwardErrors, TooSmallCacheOrPageTable) {
  DSA_FIXTURE_PATH(dir, "models/tiny");
  const auto m = Model::load(dir, false);
  EXPECT_THROW(m->make_cache(0, 64), Error);
  KvCache cache = m->make_cache(1, 4);
  ForwardBatch b;
  b.page_size = 4;
  const std::vector<int32_t> pages{0, 0};  // two entries, but the pool has a single page
  const std::vector<int32_t> ids{1, 2, 3, 4, 5, 6};
  b.add_request(ids, 0, pages);
  expect_error([&] { m->forward(b, cache); }, "page twice");
}

}  // namespace
}  // namespace dsaserve::model
