#pragma once
// KvCache: the storage of the paged KV cache, one page id covering every layer. Per token per attention
// layer it holds the normalised latent kv (kv_lora) followed by the rotated rope key (rope dims), and per
// layer with its own indexer ("full" layers and MTP layers) the indexer key (index_head_dim). Slots are
// page * page_size + offset. Page allocation is runtime/kv's job; this is only the memory.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace dsaserve::model {

struct KvCache {
  int64_t page_size = 64;
  int64_t num_pages = 0;
  // [num_layers + num_mtp_layers] tensors of [num_pages * page_size, kv_lora + rope] f32.
  std::vector<Tensor> kv;
  // Same indexing; [num_pages * page_size, index_head_dim] f32 for layers with their own indexer,
  // undefined for "shared" layers (and everywhere for models without an indexer).
  std::vector<Tensor> index_k;

  int64_t num_slots() const { return num_pages * page_size; }
  // Bytes of all the cache tensors.
  int64_t bytes() const;
  // Bytes one token occupies across all layers.
  static int64_t bytes_per_token(const ModelConfig& cfg, bool with_mtp);

  // Allocates (zero-filled) storage for `num_pages` pages. MTP layers get layer indices L, L+1, ...
  static KvCache create(const ModelConfig& cfg, int64_t num_pages, int64_t page_size, bool with_mtp,
                        Device device = Device::cpu);
};

}  // namespace dsaserve::model
