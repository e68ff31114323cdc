#include "runtime/engine/device.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "model/forward_batch.h"

#ifdef DSASERVE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/allocator.h"
#include "kernels/cuda/common/runtime.h"
#endif

namespace dsaserve::runtime {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  fail("--device '{}': expected cpu or cuda", name);
}

void use_device(Device d) {
  if (d == Device::cpu) return;
#ifdef DSASERVE_HAVE_CUDA
  if (kernels::cuda::device_count() == 0) fail("--device cuda: no CUDA device (no driver or no GPU visible)");
  kernels::cuda::install_backend();
#else
  fail("--device cuda: no CUDA device (this dsaserve was built without CUDA)");
#endif
}

std::string device_description(Device d) {
#ifdef DSASERVE_HAVE_CUDA
  if (d == Device::cuda) return kernels::cuda::device_summary();
#endif
  return std::string(device_name(d));
}

std::shared_ptr<kernels::Backend> make_backend(Device d, const kernels::KernelOptions& options) {
  if (d == Device::cpu) return kernels::make_cpu_backend(options);
#ifdef DSASERVE_HAVE_CUDA
  return kernels::cuda::make_backend(options);
#else
  fail("--device cuda: no CUDA device (this dsaserve was built without CUDA)");
#endif
}

std::shared_ptr<model::Model> model_on_device(std::shared_ptr<model::Model> m, Device d,
                                              const kernels::KernelOptions& options,
                                              std::optional<model::KvCacheDtype> kv_dtype) {
  DSA_CHECK(m != nullptr, "model_on_device: no model");
  if (m->weights().embed_tokens.device() == d) {
    if (options == kernels::KernelOptions{} && !kv_dtype) return m;
    return m->with_backend(make_backend(d, options), kv_dtype);
  }
  model::ModelWeights w = m->weights().to(d);
#ifdef DSASERVE_HAVE_CUDA
  if (d == Device::cuda) {
    const cudaError_t e = cudaDeviceSynchronize();
    DSA_CHECK(e == cudaSuccess, "uploading the weights: {}", cudaGetErrorString(e));
  }
#endif
  return std::make_shared<model::Model>(m->config(), io::Checkpoint{}, std::move(w), make_backend(d, options),
                                        kv_dtype, m->shard());
}

bool sm90_kv_shapes(const model::ModelConfig& cfg) {
  return cfg.kv_lora_rank == 512 && cfg.qk_rope_head_dim == 64 &&
         (!cfg.has_indexer() || cfg.index_head_dim == 128);
}

const char* kv_cache_dtype_name(model::KvCacheDtype d) {
  switch (d) {
    case model::KvCacheDtype::f32: return "f32";
    case model::KvCacheDtype::bf16: return "bf16";
    case model::KvCacheDtype::fp8_e4m3: return "fp8_e4m3";
  }
  return "?";
}

model::KvCacheDtype resolve_kv_cache_dtype(const std::string& name, Device d, const model::ModelConfig& cfg) {
  using model::KvCacheDtype;
  if (name == "auto" || name.empty()) {
    return d == Device::cuda && sm90_kv_shapes(cfg) ? KvCacheDtype::bf16 : KvCacheDtype::f32;
  }
  if (name == "f32") return KvCacheDtype::f32;
  DSA_CHECK(name == "bf16" || name == "fp8_e4m3",
            "--kv-cache-dtype '{}': expected auto, bf16, fp8_e4m3 or f32", name);
  DSA_CHECK(d == Device::cuda, "--kv-cache-dtype {} needs --device cuda (the CPU keeps f32 KV caches)", name);
  if (name == "fp8_e4m3") {
    DSA_CHECK(
        cfg.kv_lora_rank % 128 == 0,
        "--kv-cache-dtype fp8_e4m3 needs kv_lora_rank a multiple of 128 (one scale per 128 values); this "
        "model has {}",
        cfg.kv_lora_rank);
  }
  DSA_CHECK(
      sm90_kv_shapes(cfg),
      "--kv-cache-dtype {}: the sm_90a attention kernels need kv_lora_rank 512, qk_rope_head_dim 64 and "
      "index_head_dim 128; this model has {}, {}, {}: use --kv-cache-dtype f32",
      name, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.index_head_dim);
  return name == "bf16" ? KvCacheDtype::bf16 : KvCacheDtype::fp8_e4m3;
}

DeviceMemory device_memory(Device d) {
  DeviceMemory m;
#ifdef DSASERVE_HAVE_CUDA
  if (d == Device::cuda) {
    size_t free = 0, total = 0;
    const cudaError_t e = cudaMemGetInfo(&free, &total);
    DSA_CHECK(e == cudaSuccess, "cudaMemGetInfo: {}", cudaGetErrorString(e));
    m.free = int64_t(free);
    m.total = int64_t(total);
    return m;
  }
#endif
  (void)d;
  m.total = int64_t(::sysconf(_SC_PHYS_PAGES)) * int64_t(::sysconf(_SC_PAGE_SIZE));
  m.free = int64_t(::sysconf(_SC_AVPHYS_PAGES)) * int64_t(::sysconf(_SC_PAGE_SIZE));
  return m;
}

void release_cached_memory(Device d) {
#ifdef DSASERVE_HAVE_CUDA
  if (d == Device::cuda) kernels::cuda::release_cached_memory();
#endif
  (void)d;
}

double warm_up(const model::Model& m, model::KvCacheDtype kv_dtype, int64_t prompt_tokens,
               const model::ForwardOptions& base) {
  const auto t0 = std::chrono::steady_clock::now();
  const model::ModelConfig& c = m.config();
  const int64_t n = std::max<int64_t>(prompt_tokens, 1), ps = 64, pages = (n + 1 + ps - 1) / ps;
  model::KvCache cache = model::KvCache::create(c, pages, ps, m.num_mtp_layers() > 0,
                                                m.weights().embed_tokens.device(), kv_dtype);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t((i * 7 + 3) % c.vocab_size);
  model::ForwardOptions fo = base;
  fo.all_logits = false;
  {
    model::ForwardBatch b;
    b.page_size = ps;
    b.add_request(ids, 0, table);
    (void)m.forward(b, cache, fo).logits.to(Device::cpu);
  }
  {
    model::ForwardBatch b;
    b.page_size = ps;
    const std::vector<int32_t> next = {ids.back()};
    b.add_request(next, n, table);
    (void)m.forward(b, cache, fo).logits.to(Device::cpu);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace dsaserve::runtime
