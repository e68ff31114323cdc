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
// Bytes of one latent row / one index-key row in a cache of `d`.
int64_t latent_row_bytes(const ModelConfig& cfg, KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::f32: return cfg.kv_cache_dim() * 4;
    case KvCacheDtype::bf16: return cfg.kv_cache_dim() * 2;
    case KvCacheDtype::fp8_e4m3:
      return cfg.kv_lora_rank + cfg.kv_lora_rank / 128 * 4 + cfg.qk_rope_head_dim * 2;
  }
  return 0;
}
int64_t index_row_bytes(const ModelConfig& cfg, KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::f32: return cfg.index_head_dim * 4;
    case KvCacheDtype::bf16: return cfg.index_head_dim * 2;
    case KvCacheDtype::fp8_e4m3: return cfg.index_head_dim + 4;  // e4m3 codes + one f32 scale
  }
  return 0;
}
// An empty index-key tensor of `slots` slots in the format of `d` (see kv_cache.h).
Tensor index_keys(const ModelConfig& cfg, int64_t slots, KvCacheDtype d, Device device) {
  switch (d) {
    case KvCacheDtype::f32: return Tensor::zeros({slots, cfg.index_head_dim}, DType::f32, device);
    case KvCacheDtype::bf16: return Tensor::zeros({slots, cfg.index_head_dim}, DType::bf16, device);
    case KvCacheDtype::fp8_e4m3: return Tensor::zeros({slots, index_row_bytes(cfg, d)}, DType::u8, device);
  }
  return Tensor();
}
}  // namespace

int64_t KvCache::bytes() const {
  int64_t b = 0;
  for (const Tensor& t : kv) b += int64_t(t.nbytes());
  for (const Tensor& t : index_k) b += t.defined() ? int64_t(t.nbytes()) : 0;
  return b;
}

int64_t KvCache::bytes_per_token(const ModelConfig& cfg, bool with_mtp, KvCacheDtype dtype) {
  int64_t n = 0;
  for (int64_t l = 0; l < num_kv_layers(cfg, with_mtp); ++l) {
    n += latent_row_bytes(cfg, dtype);
    if (has_own_indexer(cfg, l)) n += index_row_bytes(cfg, dtype);
  }
  return n;
}

KvCache KvCache::create(const ModelConfig& cfg, int64_t num_pages, int64_t page_size, bool with_mtp,
                        Device device, std::optional<KvCacheDtype> dtype) {
  DSA_CHECK(page_size > 0, "page size must be positive, got {}", page_size);
  DSA_CHECK(num_pages > 0, "the KV cache needs at least one page, got {}", num_pages);
  const KvCacheDtype d = dtype.value_or(device == Device::cpu ? KvCacheDtype::f32 : kDefaultCudaKvDtype);
  DSA_CHECK(d == KvCacheDtype::f32 || device != Device::cpu,
            "bf16 / fp8 KV caches need a CUDA device (the CPU backend keeps f32 caches)");
  DSA_CHECK(d != KvCacheDtype::fp8_e4m3 || cfg.kv_lora_rank % 128 == 0,
            "an FP8 KV cache needs kv_lora_rank a multiple of 128, got {}", cfg.kv_lora_rank);
  KvCache c;
  c.dtype = d;
  c.page_size = page_size;
  c.num_pages = num_pages;
  const int64_t slots = num_pages * page_size;
  for (int64_t l = 0; l < num_kv_layers(cfg, with_mtp); ++l) {
    c.kv.push_back(d == KvCacheDtype::fp8_e4m3
                       ? Tensor::zeros({slots, latent_row_bytes(cfg, d)}, DType::u8, device)
                       : Tensor::zeros({slots, cfg.kv_cache_dim()},
                                       d == KvCacheDtype::f32 ? DType::f32 : DType::bf16, device));
    c.index_k.push_back(has_own_indexer(cfg, l) ? index_keys(cfg, slots, d, device) : Tensor());
  }
  return c;
}

}  // namespace dsaserve::model
