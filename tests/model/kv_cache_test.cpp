// KvCache sizes per dtype at GLM-5 widths: bytes_per_token (the serve KV sizing uses it) for f32, bf16 and
// the FP8 format (656-byte latent rows, 132-byte index-key rows on layers with their own indexer).
#include "model/kv_cache.h"

#include <gtest/gtest.h>

namespace dsaserve::model {
namespace {

ModelConfig glm_like() {
  ModelConfig c;
  c.num_hidden_layers = 4;
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  c.index_n_heads = 32;
  c.index_head_dim = 128;
  c.num_nextn_predict_layers = 1;
  c.indexer_types = {IndexerType::full, IndexerType::shared, IndexerType::shared, IndexerType::full};
  return c;
}

TEST(KvCacheBytes, PerTokenForEachDtype) {
  const ModelConfig c = glm_like();
  // 5 latent layers (4 + MTP), 3 with their own indexer (layers 0, 3 and the MTP layer).
  EXPECT_EQ(KvCache::bytes_per_token(c, true, KvCacheDtype::f32), 5 * 576 * 4 + 3 * 128 * 4);
  EXPECT_EQ(KvCache::bytes_per_token(c, true, KvCacheDtype::bf16), 5 * 576 * 2 + 3 * 128 * 2);
  EXPECT_EQ(KvCache::bytes_per_token(c, true, KvCacheDtype::fp8_e4m3), 5 * 656 + 3 * 132);
  EXPECT_EQ(KvCache::bytes_per_token(c, false, KvCacheDtype::fp8_e4m3), 4 * 656 + 2 * 132);
}

TEST(KvCacheBytes, Fp8NeedsCuda) {
  EXPECT_THROW(KvCache::create(glm_like(), 2, 64, false, Device::cpu, KvCacheDtype::fp8_e4m3), Error);
}

}  // namespace
}  // namespace dsaserve::model
