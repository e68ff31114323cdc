#pragma once
// KvCache: the storage of the paged KV cache, one page id covering every layer. Per token per attention
// layer it holds the normalised latent kv (kv_lora) followed by the rotated rope key (rope dims), and per
// layer with its own indexer ("full" layers and MTP layers) the indexer key (index_head_dim). Slots are
// page * page_size + offset. Page allocation is runtime/kv's job; this is only the memory.
//
// Cache dtypes: f32 everywhere on the CPU. On CUDA the latent cache is bf16 [slots, kv_lora + rope] or
// FP8 (u8 [slots, kv_lora + 16 + 2 * rope]: e4m3 latent codes, one f32 scale per 128 values, bf16 rope
// key: the layout of kernels/cuda/attention/mla_decode_params.h). Index keys follow the latent cache's dtype:
// bf16 [slots, index_head_dim], or FP8 as u8 [slots, index_head_dim + 4] holding e4m3 codes [slots, dim]
// followed by one f32 scale per slot (scale = amax / 448; kernels/cuda/indexer/indexer_topk_params.h; the CPU
// twin of the quantisation is kernels/cpu/indexer_key_fp8.h). The CUDA backend serves these formats with its
// sm_90a kernels; an f32 CUDA cache runs its plain stand-in kernels.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace dsaserve::model {

enum class KvCacheDtype { f32, bf16, fp8_e4m3 };

// The latent-cache dtype KvCache::create uses on CUDA when none is given (a model can carry its own:
// Model::with_backend).
inline constexpr KvCacheDtype kDefaultCudaKvDtype = KvCacheDtype::bf16;

struct KvCache {
  int64_t page_size = 64;
  int64_t num_pages = 0;
  KvCacheDtype dtype = KvCacheDtype::f32;  // of the latent cache and the index keys
  // [num_layers + num_mtp_layers] tensors of [num_pages * page_size, kv_lora + rope] f32 (or see above).
  std::vector<Tensor> kv;
  // Same indexing; [num_pages * page_size, index_head_dim] f32 (bf16; FP8: u8 [.., index_head_dim + 4]) for
  // layers with their own indexer, undefined for "shared" layers (and everywhere for models without one).
  std::vector<Tensor> index_k;

  int64_t num_slots() const { return num_pages * page_size; }
  // Bytes of all the cache tensors.
  int64_t bytes() const;
  // Bytes one token occupies across all layers (FP8: 656 latent + 132 index-key bytes per layer at GLM-5
  // widths).
  static int64_t bytes_per_token(const ModelConfig& cfg, bool with_mtp,
                                 KvCacheDtype dtype = KvCacheDtype::f32);

  // Allocates (zero-filled) storage for `num_pages` pages. MTP layers get layer indices L, L+1, ...
  // dtype: f32 when unset on the CPU, kDefaultCudaKvDtype when unset on CUDA; bf16 / fp8_e4m3 need
  // a CUDA device (fp8_e4m3 needs kv_lora a multiple of 128).
  static KvCache create(const ModelConfig& cfg, int64_t num_pages, int64_t page_size, bool with_mtp,
                        Device device = Device::cpu, std::optional<KvCacheDtype> dtype = std::nullopt);
};

}  // namespace dsaserve::model
