#include "model/kv_cache.h"

namespace dsaserve::model {

namespace {
bool has_own_indexer(const ModelConfig& cfg, int64_t layer) {
  if (!cfg.has_indexer()) return false;
  if (layer >= cfg.num_hidden_layers) return true;  // MTP layers index for themselves
  return cfg.indexer_types[size_t(layer)] == IndexerType::full;
}
int64_t num_kv_layers(const ModelConfig& cfg, bool with_mtp) {
  return cfg.num_hidden_layers + (with_mtp ? cfg.num_nextn_predict_layers : 0);
}
}  // namespace

int64_t KvCache::bytes() const {
  int64_t b = 0;
  for (const Tensor& t : kv) b += int64_t(t.nbytes());
  for (const Tensor& t : index_k) b += t.defined() ? int64_t(t.nbytes()) : 0;
  return b;
}

int64_t KvCache::bytes_per_token(const ModelConfig& cfg, bool with_mtp) {
  int64_t n = 0;
  for (int64_t l = 0; l < num_kv_layers(cfg, with_mtp); ++l) {
    n += cfg.kv_cache_dim();
    if (has_own_indexer(cfg, l)) n += cfg.index_head_dim;
  }
  return n * int64_t(sizeof(float));
}

KvCache KvCache::create(const ModelConfig& cfg, int64_t num_pages, int64_t page_size, bool with_mtp,
                        Device device) {
  DSA_CHECK(page_size > 0, "page size must be positive, got {}", page_size);
  DSA_CHECK(num_pages > 0, "the KV cache needs at least one page, got {}", num_pages);
  KvCache c;
  c.page_size = page_size;
  c.num_pages = num_pages;
  const int64_t slots = num_pages * page_size;
  for (int64_t l = 0; l < num_kv_layers(cfg, with_mtp); ++l) {
    c.kv.push_back(Tensor::zeros({slots, cfg.kv_cache_dim()}, DType::f32, device));
    c.index_k.push_back(
        has_own_indexer(cfg, l) ? Tensor::zeros({slots, cfg.index_head_dim}, DType::f32, device) : Tensor());
  }
  return c;
}

}  // namespace dsaserve::model
