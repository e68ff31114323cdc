#pragma once
// Device selection for the commands that run the model (serve, generate, score): `--device cpu|cuda` and
// `--kv-cache-dtype auto|bf16|fp8_e4m3|f32`. use_device() checks that the device exists and installs its
// operator backend; model_on_device() uploads a model's weights (dtypes kept) and gives it a backend of
// that device with the run's KernelOptions (the device context: kernel choices, GEMM precision), so that
// Model::forward, the KV cache it makes and everything the engine runs live on that device. Everything above
// the model runner is device-agnostic: the engine only moves page ids, never KV storage.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/tensor.h"
#include "kernels/kernel_options.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace dsaserve::runtime {

// "cpu" or "cuda"; anything else is an error naming the flag.
Device parse_device(const std::string& name);  // (its name: core/tensor.h's device_name)

// Makes `d` usable: nothing for the CPU; for CUDA checks that a device is present (dsaserve::Error
// "no CUDA device ..." otherwise, also when this build has no CUDA) and installs the CUDA backend.
void use_device(Device d);
// "NVIDIA H200, sm_90, 139.8 GiB, 132 SMs" for CUDA, "cpu" for the CPU.
std::string device_description(Device d);

// A backend of its own for device `d` running with `options` (use_device(d) first for CUDA).
std::shared_ptr<kernels::Backend> make_backend(Device d, const kernels::KernelOptions& options);

// The model with its weights on `d` (the same object when they already are, the options are the
// defaults and no kv_dtype is given), its forward running on make_backend(d, options) and its make_cache
// making kv_dtype caches (unset: KvCache::create's default). The returned model keeps no checkpoint
// mapping for a CUDA upload: the host copy can go once this returns. Synchronous.
std::shared_ptr<model::Model> model_on_device(std::shared_ptr<model::Model> m, Device d,
                                              const kernels::KernelOptions& options = {},
                                              std::optional<model::KvCacheDtype> kv_dtype = std::nullopt);

// Whether the sm_90a attention kernels (bf16 / FP8 latent cache) serve this model's shapes
// (kv_lora_rank 512, qk_rope_head_dim 64, index_head_dim 128); otherwise CUDA runs f32 caches only.
bool sm90_kv_shapes(const model::ModelConfig& cfg);
// --kv-cache-dtype: auto is bf16 on CUDA when the sm_90a kernels fit the model (else f32, the stand-in
// kernels) and f32 on the CPU; bf16 / fp8_e4m3 need CUDA and those shapes, fp8_e4m3 also
// kv_lora_rank % 128 == 0. Clear errors otherwise.
model::KvCacheDtype resolve_kv_cache_dtype(const std::string& name, Device d, const model::ModelConfig& cfg);
const char* kv_cache_dtype_name(model::KvCacheDtype d);

struct DeviceMemory {
  int64_t free = 0;   // bytes the device can still hand out (cudaMemGetInfo), RAM for the CPU
  int64_t total = 0;  // device memory size (physical RAM for the CPU)
};
DeviceMemory device_memory(Device d);

// Gives the caching allocator's free blocks back to the device (CUDA; nothing on the CPU), so that
// device_memory() then reports what the next steps can allocate.
void release_cached_memory(Device d);

// Runs one prefill of `prompt_tokens` tokens and one decode step on a throwaway cache (then frees it), so
// that the first request does not pay for kernel loading, cuBLASLt heuristics and allocator growth.
// Returns the seconds it took. `base`: the forward options (a sharded model's ranks: every rank warms up
// with the same ones, ForwardOptions::dist its groups); only all_logits is changed.
double warm_up(const model::Model& m, model::KvCacheDtype kv_dtype, int64_t prompt_tokens,
               const model::ForwardOptions& base = {});

}  // namespace dsaserve::runtime
