// KvPool: two-phase page allocation, frees, integrity and the too-small error.
#include "runtime/kv/kv_pool.h"

#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "model/config.h"

namespace dsaserve::runtime {
namespace {

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.num_hidden_layers = 3;
  c.kv_lora_rank = 8;
  c.qk_rope_head_dim = 4;
  c.index_n_heads = 2;
  c.index_head_dim = 6;
  c.num_nextn_predict_layers = 1;
  c.indexer_types = {model::IndexerType::full, model::IndexerType::shared, model::IndexerType::full};
  return c;
}

TEST(KvCache, LayoutPerLayerAndIndexerKeysOnlyWhereIndexed) {
  const auto c = small_config();
  const model::KvCache k = model::KvCache::create(c, 5, 4, true);
  ASSERT_EQ(k.kv.size(), 4u);  // 3 layers + the MTP layer
  EXPECT_EQ(k.kv[0].shape(), (Shape{20, 12}));
  EXPECT_TRUE(k.index_k[0].defined());
  EXPECT_FALSE(k.index_k[1].defined());  // shared layer: no indexer keys
  EXPECT_TRUE(k.index_k[3].defined());   // MTP layer indexes for itself
  EXPECT_EQ(k.index_k[2].shape(), (Shape{20, 6}));
  EXPECT_EQ(model::KvCache::bytes_per_token(c, true), (4 * 12 + 3 * 6) * 4);
  EXPECT_EQ(k.bytes(), 20 * model::KvCache::bytes_per_token(c, true));
  EXPECT_THROW(model::KvCache::create(c, 0, 4, true), Error);
}

TEST(KvPool, AllocateGrowFreeAndIntegrity) {
  KvPool pool(model::KvCache::create(small_config(), 6, 4, false));
  EXPECT_EQ(pool.free_pages(), 6);
  EXPECT_EQ(pool.pages_for(9), 3);
  std::vector<int32_t> a = pool.allocate(2);
  const std::vector<int32_t> b = pool.allocate(1);
  const std::vector<int32_t> more = pool.allocate(1);  // a third page for a, after b's
  a.insert(a.end(), more.begin(), more.end());
  ASSERT_EQ(a.size(), 3u);
  std::set<int32_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), 4u);
  EXPECT_EQ(pool.free_pages(), 2);
  pool.check_integrity();
  EXPECT_TRUE(pool.can_allocate(2));
  EXPECT_FALSE(pool.can_allocate(3));
  try {
    pool.allocate(3);
    FAIL() << "allocating more pages than are free must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV pool too small"), std::string::npos) << e.what();
  }
  pool.free(a);
  EXPECT_EQ(pool.free_pages(), 5);
  EXPECT_THROW(pool.free(a), Error);  // double free
  const std::vector<int32_t> foreign{17};
  EXPECT_THROW(pool.free(foreign), Error);
  pool.free(b);
  pool.check_integrity();
  EXPECT_EQ(pool.free_pages(), 6);
}

// The CUDA graph runner's scratch page: the cache's last page, outside the pool.
TEST(KvPool, ReservedPagesStayOutsideThePool) {
  KvPool pool(model::KvCache::create(small_config(), 6, 4, false), 1);
  EXPECT_EQ(pool.num_pages(), 5);
  EXPECT_EQ(pool.cache().num_pages, 6);
  EXPECT_EQ(pool.reserved_page(0), 5);
  EXPECT_THROW(pool.reserved_page(1), Error);
  const std::vector<int32_t> all = pool.allocate(5);
  EXPECT_EQ(std::set<int32_t>(all.begin(), all.end()), (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(pool.can_allocate(1));
  const std::vector<int32_t> scratch{5};
  EXPECT_THROW(pool.free(scratch), Error);  // never the pool's to take back
  pool.free(all);
  pool.check_integrity();
  EXPECT_THROW(KvPool(model::KvCache::create(small_config(), 2, 4, false), 2), Error);
}

}  // namespace
}  // namespace dsaserve::runtime
