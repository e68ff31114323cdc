// The MLA fused / batched CUDA ops (kernels/cuda/kv_write/ops_kv_write.cpp, ops_absorb.cpp) at GLM-5.3 shapes
// (kv_lora 512, rope 64, index_head_dim 128, nope 192, v 256; heads 64 and the per-rank 16 / 8):
// - mla_kv_write / indexer_k_write: every cache row bit-equal to the unfused CUDA sequence (RMSNorm or
//   LayerNorm, RoPE, copy, paged store), bf16 and FP8 latent caches, T in {1, 7, 256, 4096}, slots
//   scattered over pages; untouched rows stay as they were; and within the cache format's rounding of the
//   CPU op (f32 cache): bf16 8e-3, FP8 7e-2 of the row's largest value.
// - absorb_q / absorb_v: one batched GEMM (the batched path is asserted to apply), per row L2 error vs
//   the CPU op within 1e-2 (bf16 products; FP8 kv_b as its bf16 dequantisation), 1e-4 in fp32 precision,
//   where the absorb projections and the linears share one f32 copy of kv_b.
// Each case prints a RESULT line.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "core/dtype.h"
#include "gpu_test.h"
#include "kernels/cpu/indexer_key_fp8.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/allocator.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/indexer/indexer_kernels.h"
#include "op_test_util.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace testing;

constexpr int64_t kL = 512, kRope = 64, kIdx = 128, kNope = 192, kV = 256, kPage = 64;
constexpr int64_t kTokens[] = {1, 7, 256, 4096};

class CudaMlaFused : public testing::GpuTest {
 protected:
  Backend& gpu() { return cuda_backend(); }
  Backend& ref() { return backend(Device::cpu); }
};

Tensor i32(const std::vector<int32_t>& v, Device d = Device::cpu) {
  Tensor t = Tensor::empty({int64_t(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return d == Device::cpu ? t : t.to(d);
}

// T tokens at distinct slots spread over the pages of a pool (pages shuffled), positions up to 128K.
struct Batch {
  int64_t pool = 0;
  std::vector<int32_t> slots, positions;
};
Batch scattered(int64_t T, uint64_t seed) {
  Batch b;
  const int64_t pages = T / kPage + 9;
  b.pool = pages * kPage;
  std::vector<int32_t> all(static_cast<size_t>(b.pool));
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 r(static_cast<uint32_t>(seed));
  std::shuffle(all.begin(), all.end(), r);
  b.slots.assign(all.begin(), all.begin() + T);
  b.positions.resize(size_t(T));
  for (auto& p : b.positions) p = int32_t(r() % 131072);
  return b;
}

// Rows of two same-shaped caches whose bytes differ.
int64_t differing_rows(const Tensor& a, const Tensor& b) {
  const Tensor x = cpu(a).contiguous(), y = cpu(b).contiguous();
  const int64_t rows = x.size(0), bytes = int64_t(x.nbytes()) / std::max<int64_t>(rows, 1);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    bad += std::memcmp(static_cast<const char*>(x.raw_data()) + r * bytes,
                       static_cast<const char*>(y.raw_data()) + r * bytes, size_t(bytes)) != 0;
  }
  return bad;
}

// The given slots of a kernel-format latent cache (bf16 [*, 576] or FP8 [*, 656]) decoded to f32 [T, 576].
Tensor decode_latent(const Tensor& cache_d, const std::vector<int32_t>& slots) {
  const Tensor c = cpu(cache_d);
  Tensor out = Tensor::empty({int64_t(slots.size()), kL + kRope}, DType::f32);
  for (size_t i = 0; i < slots.size(); ++i) {
    float* o = out.data<float>() + i * size_t(kL + kRope);
    if (c.dtype() == DType::bf16) {
      const uint16_t* s = c.data_u16() + size_t(slots[i]) * size_t(kL + kRope);
      for (int64_t j = 0; j < kL + kRope; ++j) o[j] = bf16_to_f32(s[j]);
      continue;
    }
    const uint8_t* s = c.data_u8() + size_t(slots[i]) * size_t(kMlaFp8RowBytes);
    float scale[4];
    std::memcpy(scale, s + kL, sizeof scale);
    for (int64_t j = 0; j < kL; ++j) o[j] = f8e4m3fn_to_f32(s[j]) * scale[j / 128];
    uint16_t rope[kRope];
    std::memcpy(rope, s + kL + 16, sizeof rope);
    for (int64_t j = 0; j < kRope; ++j) o[kL + j] = bf16_to_f32(rope[j]);
  }
  return out;
}

RopeParams glm_rope(bool interleaved) {
  RopeParams p;
  p.dim = kRope;
  p.theta = 1e6;
  p.interleaved = interleaved;
  return p;
}

TEST_F(CudaMlaFused, KvWriteEqualsUnfusedBf16AndFp8) {
  for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
    const char* name = f == MlaKvFormat::bf16 ? "bf16" : "fp8";
    for (int64_t T : kTokens) {
      const Batch b = scattered(T, 10 + T);
      const Tensor ckv = rand_f32({T, kL + kRope}, 20 + T, 3.0f), ckv_d = ckv.to(Device::cuda);
      const Tensor w = rand_bf16({kL}, 30 + T), w_d = w.to(Device::cuda);
      const Tensor pos = i32(b.positions), pos_d = pos.to(Device::cuda);
      const Tensor sl = i32(b.slots), sl_d = sl.to(Device::cuda);
      const RopeParams rp = glm_rope(true);
      Tensor fused = mla_kv_cache_empty(b.pool, f), unfused = mla_kv_cache_empty(b.pool, f);
      cudaMemset(fused.raw_data(), 0x5a, fused.nbytes());
      cudaMemset(unfused.raw_data(), 0x5a, unfused.nbytes());
      ASSERT_TRUE(mla_kv_write_fused(ckv_d, w_d, 1e-6, pos_d, rp, fused, sl_d, {})) << name;
      {  // the sequence the forward ran before, on the GPU
        Tensor c2 = ckv_d.clone();
        const Tensor kv = gpu().rms_norm(c2.slice(1, 0, kL), w_d, 1e-6);
        Tensor k_pe = c2.view({T, 1, kL + kRope}).slice(2, kL, kL + kRope);
        gpu().rope_inplace(k_pe, pos_d, rp);
        Tensor lat = c2.slice(1, 0, kL);
        gpu().copy_rows(lat, kv);
        gpu().paged_store(unfused, sl_d, c2);
      }
      const int64_t bad = differing_rows(fused, unfused);
      fmt::print("RESULT op=mla_kv_write {:<4} T={:<5} rows_differing_from_unfused={} of {} slots\n", name, T,
                 bad, b.pool);
      EXPECT_EQ(bad, 0) << name << " T " << T;
      Tensor blank = mla_kv_cache_empty(b.pool, f);
      cudaMemset(blank.raw_data(), 0x5a, blank.nbytes());
      EXPECT_EQ(differing_rows(fused, blank), T) << "exactly the T slots are written";
      // The input is not modified; the CPU op (f32 cache) within the format's rounding.
      EXPECT_EQ(row_rel_error(ckv_d, ckv), 0.0);
      Tensor cache_ref = Tensor::zeros({b.pool, kL + kRope}, DType::f32);
      ref().mla_kv_write(ckv, w, 1e-6, pos, rp, cache_ref, sl);
      report(fmt::format("mla_kv_write {} vs cpu", name), fmt::format("[{}, {}]", T, kL + kRope),
             row_rel_error(decode_latent(fused, b.slots), ref().gather_rows(cache_ref, sl)),
             f == MlaKvFormat::bf16 ? 8e-3 : 7e-2);
    }
  }
}

TEST_F(CudaMlaFused, KvWriteThroughTheOpAndF32Fallback) {
  // ops::mla_kv_write on a bf16 cache takes the fused kernel; on an f32 cache the unfused sequence.
  const int64_t T = 33;
  const Batch b = scattered(T, 5);
  const Tensor ckv = rand_f32({T, kL + kRope}, 6, 3.0f), w = rand_bf16({kL}, 7);
  const Tensor pos = i32(b.positions), sl = i32(b.slots);
  const RopeParams rp = glm_rope(true);
  Tensor f32_d = Tensor::zeros({b.pool, kL + kRope}, DType::f32, Device::cuda);
  EXPECT_FALSE(mla_kv_write_fused(ckv.to(Device::cuda), w.to(Device::cuda), 1e-6, pos.to(Device::cuda), rp,
                                  f32_d, sl.to(Device::cuda), {}));
  kernels::mla_kv_write(ckv.to(Device::cuda), w.to(Device::cuda), 1e-6, pos.to(Device::cuda), rp, f32_d,
                        sl.to(Device::cuda));
  Tensor f32_ref = Tensor::zeros({b.pool, kL + kRope}, DType::f32);
  kernels::mla_kv_write(ckv, w, 1e-6, pos, rp, f32_ref, sl);
  report("mla_kv_write f32 cache", fmt::format("[{}, {}]", T, kL + kRope), row_rel_error(f32_d, f32_ref),
         1e-5);
  // Kernel formats: slots outside the cache are skipped on the device (no host check), the rest written.
  for (MlaKvFormat f : {MlaKvFormat::bf16, MlaKvFormat::fp8_e4m3}) {
    Tensor c = mla_kv_cache_empty(128, f), blank = mla_kv_cache_empty(128, f);
    cudaMemset(c.raw_data(), 0, c.nbytes());
    cudaMemset(blank.raw_data(), 0, blank.nbytes());
    kernels::mla_kv_write(ckv.slice(0, 0, 3).contiguous().to(Device::cuda), w.to(Device::cuda), 1e-6,
                          i32({1, 2, 3}, Device::cuda), rp, c, i32({-1, 128, 3}, Device::cuda));
    EXPECT_EQ(differing_rows(c, blank), 1) << "only slot 3 is in the cache";
  }
}

TEST_F(CudaMlaFused, IndexerKWriteEqualsUnfusedBf16AndFp8) {
  for (IndexerKeyFormat f : {IndexerKeyFormat::bf16, IndexerKeyFormat::fp8_e4m3}) {
    const bool fp8 = f == IndexerKeyFormat::fp8_e4m3;
    for (bool interleaved : {true, false}) {
      for (int64_t T : kTokens) {
        const Batch b = scattered(T, 40 + T);
        const Tensor k = rand_f32({T, kIdx}, 50 + T, 2.0f), k_d = k.to(Device::cuda);
        const Tensor w = rand_bf16({kIdx}, 60 + T), bias = rand_bf16({kIdx}, 61 + T, 0.1f);
        const Tensor w_d = w.to(Device::cuda), bias_d = bias.to(Device::cuda);
        const Tensor pos = i32(b.positions), pos_d = pos.to(Device::cuda);
        const Tensor sl = i32(b.slots), sl_d = sl.to(Device::cuda);
        const RopeParams rp = glm_rope(interleaved);
        Tensor fused = indexer_key_cache_empty(b.pool, f), unfused = indexer_key_cache_empty(b.pool, f);
        cudaMemset(fused.raw_data(), 0x3c, fused.nbytes());
        cudaMemset(unfused.raw_data(), 0x3c, unfused.nbytes());
        ASSERT_TRUE(indexer_k_write_fused(k_d, w_d, bias_d, 1e-6, pos_d, rp, fused, sl_d, {}));
        {
          const Tensor ki = gpu().layer_norm(k_d, w_d, bias_d, 1e-6);
          Tensor ki_pe = ki.view({T, 1, kIdx}).slice(2, 0, kRope);
          gpu().rope_inplace(ki_pe, pos_d, rp);
          gpu().paged_store(unfused, sl_d, ki);
        }
        const int64_t bad = differing_rows(fused, unfused);
        fmt::print("RESULT op=indexer_k_write {} {} T={:<5} rows_differing_from_unfused={} of {}\n",
                   fp8 ? "fp8" : "bf16", interleaved ? "interleaved" : "neox", T, bad, b.pool);
        EXPECT_EQ(bad, 0) << "T " << T;
        // The slots' keys as f32 (FP8: codes times the key's scale) against the CPU op's f32 keys.
        const Tensor keys = fp8 ? cpu::indexer_key_fp8_decode(cpu(fused)) : Tensor();
        if (!fp8) {
          Tensor blank = indexer_key_cache_empty(b.pool, f);
          cudaMemset(blank.raw_data(), 0x3c, blank.nbytes());
          EXPECT_EQ(differing_rows(fused, blank), T) << "exactly the T slots are written";
        }
        Tensor cache_ref = Tensor::zeros({b.pool, kIdx}, DType::f32);
        ref().indexer_k_write(k, w, bias, 1e-6, pos, rp, cache_ref, sl);
        Tensor got = Tensor::empty({T, kIdx}, DType::f32);
        const Tensor fc = cpu(fused);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t s = b.slots[size_t(t)];
          for (int64_t j = 0; j < kIdx; ++j) {
            got.data<float>()[t * kIdx + j] =
                fp8 ? keys.data<float>()[s * kIdx + j] : bf16_to_f32(fc.data_u16()[s * kIdx + j]);
          }
        }
        report(fmt::format("indexer_k_write {} vs cpu", fp8 ? "fp8" : "bf16"),
               fmt::format("[{}, {}]", T, kIdx), row_rel_error(got, ref().gather_rows(cache_ref, sl)),
               fp8 ? 7e-2 : 8e-3);
      }
    }
  }
}

TEST_F(CudaMlaFused, AbsorbBatchedMatchesCpu) {
  constexpr int64_t kT[] = {1, 7, 33, 257};
  for (int64_t nh : {int64_t(64), int64_t(16), int64_t(8)}) {
    for (DType dt : {DType::bf16, DType::f8e4m3fn}) {
      const WeightRef w = rand_weight(nh * (kNope + kV), kL, dt, 70 + uint64_t(nh));
      const WeightRef w_d = to_cuda(w);
      for (int64_t T : kT) {
        // q [T, nh, nope + rope]: the op reads the strided nope view. out_lat [T, nh, L].
        const Tensor q = rand_f32({T, nh, kNope + kRope}, 80 + T), q_d = q.to(Device::cuda);
        const Tensor lat = rand_f32({T, nh, kL}, 90 + T), lat_d = lat.to(Device::cuda);
        const Tensor q_lat = ref().absorb_q(q.slice(2, 0, kNope), w, Tensor());
        const Tensor o = ref().absorb_v(lat, w, kV, Tensor());
        for (bool fp32 : {false, true}) {
          const GemmPrecision prec = fp32 ? GemmPrecision::fp32 : GemmPrecision::fast;
          KernelOptions ko;
          ko.gemm = prec;
          const std::shared_ptr<Backend> be = make_backend(ko);  // the op through a backend with `prec`
          const double tol = fp32 ? 1e-4 : 1e-2;
          const std::string mode =
              fmt::format("{}{}", dt == DType::bf16 ? "bf16" : "fp8", fp32 ? "/fp32" : "");
          Tensor q_lat_d = Tensor::empty({T, nh, kL}, DType::f32, Device::cuda);
          ASSERT_TRUE(absorb_q_batched(q_d.slice(2, 0, kNope), w_d, q_lat_d, ko)) << nh << " " << mode;
          report_gemm("absorb_q " + mode, fmt::format("{} x [{}, {}] x [{}, {}]", nh, T, kNope, kNope, kL),
                      q_lat_d, q_lat, tol);
          // Into a [T, nh, dv] view of a wider output: the padding must stay zero.
          Tensor wide_d = Tensor::zeros({T, nh, kV + 32}, DType::f32, Device::cuda);
          Tensor o_d = wide_d.slice(2, 16, 16 + kV);
          ASSERT_TRUE(absorb_v_batched(lat_d, w_d, kV, o_d, ko)) << nh << " " << mode;
          const Tensor wide = cpu(wide_d);  // (a strided CUDA view cannot be copied to the host directly)
          report_gemm("absorb_v " + mode, fmt::format("{} x [{}, {}] x [{}, {}]", nh, T, kL, kL, kV),
                      wide.slice(2, 16, 16 + kV).contiguous(), o, tol);
          const Tensor pad = Tensor::zeros({T, nh, 16}, DType::f32);
          EXPECT_EQ(row_rel_error(wide.slice(2, 0, 16).contiguous(), pad), 0.0) << "absorb_v wrote outside";
          EXPECT_EQ(row_rel_error(wide.slice(2, 16 + kV, 32 + kV).contiguous(), pad), 0.0)
              << "absorb_v wrote outside";
          // Through the op (dispatch and the backend's own output).
          report_gemm("absorb_q op " + mode, fmt::format("{} heads T {}", nh, T),
                      Ops(be.get()).absorb_q(q_d.slice(2, 0, kNope), w_d), q_lat, tol);
        }
      }
    }
  }
}

// GemmPrecision::fp32: the absorb projections multiply gemm_weight_f32's copy of kv_b, the one the fp32
// linears use (the MHA form's kv_b_proj): the f32 copy the backend derived at load (WeightUse::absorb) is
// all the device memory kv_b holds beyond itself; the calls hold nothing more.
TEST_F(CudaMlaFused, Fp32ModeHoldsOneF32CopyOfKvB) {
  const int64_t nh = 8, T = 5;
  WeightRef w_d = to_cuda(rand_weight(nh * (kNope + kV), kL, DType::f8e4m3fn, 75));
  const Tensor lat_d = rand_f32({T, nh, kL}, 76).to(Device::cuda);
  Tensor o_d = Tensor::empty({T, nh, kV}, DType::f32, Device::cuda);
  // Warm-up (fast mode, a bf16 weight): the GEMM libraries' own state exists before the measurement.
  const WeightRef bf16_d = to_cuda(rand_weight(nh * (kNope + kV), kL, DType::bf16, 74));
  ASSERT_TRUE(absorb_v_batched(lat_d, bf16_d, kV, o_d, KernelOptions{}));
  (void)kernels::linear(lat_d.view({T * nh, kL}), bf16_d);
  KernelOptions ko;
  ko.gemm = GemmPrecision::fp32;
  const std::shared_ptr<Backend> be = make_backend(ko);
  const Ops fp32_ops(be.get());
  const WeightRef warm_d = to_cuda(rand_weight(nh * (kNope + kV), kL, DType::bf16, 73));
  ASSERT_TRUE(absorb_v_batched(lat_d, warm_d, kV, o_d, ko));
  (void)fp32_ops.linear(lat_d.view({T * nh, kL}), warm_d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t before = allocator_stats().bytes_in_use;
  w_d.derived = be->derive_weight(w_d, WeightUse::absorb);  // model load
  ASSERT_TRUE(w_d.derived && w_d.derived->f32.defined());
  ASSERT_TRUE(absorb_v_batched(lat_d, w_d, kV, o_d, ko));
  (void)fp32_ops.linear(lat_d.view({T * nh, kL}), w_d);  // the MHA form's kv_b_proj
  ASSERT_TRUE(absorb_v_batched(lat_d, w_d, kV, o_d, ko));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t held = allocator_stats().bytes_in_use - before;
  const int64_t copy = int64_t(allocation_size_class(size_t(w_d.weight.numel()) * 4));
  fmt::print("RESULT op=absorb_fp32_kv_b held_bytes={} one_f32_copy={} {}\n", held, copy,
             held == copy ? "ok" : "FAIL");
  EXPECT_EQ(held, copy) << "fp32 mode should hold kv_b in f32 once";
  const Tensor f32 = gemm_weight_f32(w_d);
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_EQ(f32.shape(), w_d.weight.shape());
  EXPECT_EQ(f32.raw_data(), w_d.derived->f32.raw_data());
  const WeightRef f32_w = to_cuda(rand_weight(64, kL, DType::f32, 77));
  EXPECT_EQ(gemm_weight_f32(f32_w).raw_data(), f32_w.weight.raw_data());
  EXPECT_EQ(be->derive_weight(f32_w, WeightUse::absorb), nullptr) << "an f32 weight is multiplied as it is";
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
