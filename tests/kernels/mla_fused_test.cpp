// The MLA fused / batched operators on the CPU (kernels/ops_mla.cpp): absorb_q / absorb_v equal the
// per-head loops of linear_t / linear bit for bit (and a float64 reference within fp32 rounding);
// mla_kv_write / indexer_k_write equal the unfused sequence the forward ran before (RMSNorm or LayerNorm,
// RoPE, copy, paged store) bit for bit at scattered slots, leave the other slots and their input alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"
#include "test_util.h"

namespace dsaserve::kernels {
namespace {

using testing::i32;
using testing::randn;
using testing::random_weight;

// Same shape and the same float bits everywhere.
void expect_bits_equal(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<float> a = got.contiguous().to_f32_vector(), b = want.contiguous().to_f32_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << a.size() << " values differ";
}

// Rows of two [rows, cols] f32 tensors that differ anywhere.
int64_t rows_differing(const Tensor& a, const Tensor& b) {
  int64_t n = 0;
  for (int64_t r = 0; r < a.size(0); ++r)
    n += std::memcmp(a.select(0, r).data<float>(), b.select(0, r).data<float>(), size_t(a.size(1)) * 4) != 0;
  return n;
}

struct Dims {
  int64_t heads, nope, dv, latent;
};
// GLM-5.3's per-head widths at 4 heads (the realdims fixture), and a small ragged set.
constexpr Dims kDims[] = {{4, 192, 256, 512}, {3, 32, 48, 64}};

TEST(MlaAbsorb, QEqualsPerHeadLinearT) {
  std::mt19937 rng(1);
  for (const Dims& d : kDims) {
    for (DType dt : {DType::bf16, DType::f32, DType::f8e4m3fn}) {
      const testing::TestWeight w = random_weight(d.heads * (d.nope + d.dv), d.latent, dt, rng);
      for (int64_t T : {1, 7}) {
        // q [T, heads, nope + rope]: the op reads the strided nope view.
        const Tensor q = randn({T, d.heads, d.nope + 16}, rng);
        const Tensor q_nope = q.slice(2, 0, d.nope);
        const Tensor got = absorb_q(q_nope, w.ref);
        ASSERT_EQ(got.shape(), (Shape{T, d.heads, d.latent}));
        Tensor want = Tensor::empty({T, d.heads, d.latent}, DType::f32);
        std::vector<double> exact(size_t(T * d.heads * d.latent));
        for (int64_t h = 0; h < d.heads; ++h) {
          const int64_t base = h * (d.nope + d.dv);
          linear_t(q_nope.select(1, h), w.ref, base, base + d.nope, want.select(1, h));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < d.latent; ++c) {
              double acc = 0;
              for (int64_t n = 0; n < d.nope; ++n)
                acc += double(q_nope.select(0, t).select(0, h).data<float>()[n]) *
                       w.value[size_t((base + n) * d.latent + c)];
              exact[size_t((t * d.heads + h) * d.latent + c)] = acc;
            }
        }
        expect_bits_equal(got, want, "absorb_q vs per-head linear_t");
        EXPECT_LT(testing::rel_error(got, exact), 1e-5) << dtype_name(dt) << " T " << T;
      }
    }
  }
}

TEST(MlaAbsorb, VEqualsPerHeadLinearIntoAView) {
  std::mt19937 rng(2);
  for (const Dims& d : kDims) {
    for (DType dt : {DType::bf16, DType::f32, DType::f8e4m3fn}) {
      const testing::TestWeight w = random_weight(d.heads * (d.nope + d.dv), d.latent, dt, rng);
      for (int64_t T : {1, 7}) {
        const Tensor lat = randn({T, d.heads, d.latent}, rng);
        // Into a column slice of a wider tensor: a strided [T, heads, dv] view.
        Tensor wide = Tensor::zeros({T, d.heads, d.dv + 8}, DType::f32);
        Tensor out = wide.slice(2, 4, 4 + d.dv);
        const Tensor got = absorb_v(lat, w.ref, d.dv, out);
        EXPECT_EQ(got.raw_data(), out.raw_data());
        const Tensor fresh = absorb_v(lat, w.ref, d.dv);
        Tensor want = Tensor::empty({T, d.heads, d.dv}, DType::f32);
        std::vector<double> exact(size_t(T * d.heads * d.dv));
        for (int64_t h = 0; h < d.heads; ++h) {
          const int64_t base = h * (d.nope + d.dv) + d.nope;
          linear(lat.select(1, h), w.ref, base, base + d.dv, want.select(1, h));
          for (int64_t t = 0; t < T; ++t)
            for (int64_t c = 0; c < d.dv; ++c) {
              double acc = 0;
              for (int64_t l = 0; l < d.latent; ++l)
                acc += double(lat.select(0, t).select(0, h).data<float>()[l]) *
                       w.value[size_t((base + c) * d.latent + l)];
              exact[size_t((t * d.heads + h) * d.dv + c)] = acc;
            }
        }
        expect_bits_equal(out, want, "absorb_v (view) vs per-head linear");
        expect_bits_equal(fresh, want, "absorb_v vs per-head linear");
        EXPECT_LT(testing::rel_error(fresh, exact), 1e-5) << dtype_name(dt) << " T " << T;
        // The padding columns around the view are untouched.
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < d.heads; ++h) {
            const float* r = wide.select(0, t).select(0, h).data<float>();
            for (int64_t c : {int64_t(0), int64_t(3), d.dv + 4, d.dv + 7}) EXPECT_EQ(r[c], 0.0f);
          }
      }
    }
  }
}

TEST(MlaAbsorb, RejectsBadShapes) {
  std::mt19937 rng(3);
  const testing::TestWeight w = random_weight(3 * (32 + 48), 64, DType::bf16, rng);
  EXPECT_THROW(absorb_q(randn({2, 7, 32}, rng), w.ref), Error);      // 7 heads do not divide 240 rows
  EXPECT_THROW(absorb_q(randn({2, 3, 80}, rng), w.ref), Error);      // nope 80 leaves no v rows
  EXPECT_THROW(absorb_v(randn({2, 3, 63}, rng), w.ref, 48), Error);  // latent 63 != 64
  EXPECT_THROW(absorb_v(randn({2, 3, 64}, rng), w.ref, 80), Error);  // dv 80 > 80 rows per head - nope
  EXPECT_THROW(absorb_v(randn({2, 3, 64}, rng), w.ref, 48, Tensor::empty({2, 3, 40}, DType::f32)), Error);
  EXPECT_THROW(absorb_q(randn({6, 32}, rng), w.ref), Error);  // not [T, heads, nope]
}

RopeParams rope_of(int64_t dim, bool interleaved) {
  RopeParams p;
  p.dim = dim;
  p.theta = 1e6;
  p.interleaved = interleaved;
  return p;
}

// T tokens at scattered slots of a pool of `slots` rows, positions anywhere.
struct Batch {
  Tensor positions, slots;
};
Batch scattered(int64_t T, int64_t pool, std::mt19937& rng) {
  std::vector<int32_t> all(static_cast<size_t>(pool));
  for (int64_t i = 0; i < pool; ++i) all[size_t(i)] = int32_t(i);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int32_t> pos(static_cast<size_t>(T)), sl(all.begin(), all.begin() + T);
  for (auto& p : pos) p = int32_t(rng() % 200000);
  return {i32(pos), i32(sl)};
}

TEST(MlaKvWrite, EqualsTheUnfusedSequence) {
  std::mt19937 rng(4);
  constexpr int64_t L = 512, R = 64, kPool = 64 * 8;
  for (bool yarn : {false, true}) {
    for (int64_t T : {1, 7, 256}) {
      RopeParams rp = rope_of(R, true);
      if (yarn) {
        rp.yarn = true;
        rp.factor = 40;
        rp.original_max_position_embeddings = 4096;
        rp.attention_factor = 1.1;
      }
      const Tensor ckv = randn({T, L + R}, rng, 3.0f), ckv_before = ckv.clone();
      const Tensor w = randn({L}, rng).to(DType::bf16);
      const Batch b = scattered(T, kPool, rng);
      const Tensor init = randn({kPool, L + R}, rng);
      Tensor got = init.clone(), want = init.clone();
      mla_kv_write(ckv, w, 1e-6, b.positions, rp, got, b.slots);
      // The sequence the forward ran before: RoPE of k_pe in place, RMSNorm, copy, paged_store.
      Tensor c2 = ckv.clone();
      const Tensor kv = rms_norm(c2.slice(1, 0, L), w, 1e-6);
      Tensor k_pe = c2.view({T, 1, L + R}).slice(2, L, L + R);
      rope_inplace(k_pe, b.positions, rp);
      Tensor lat = c2.slice(1, 0, L);
      copy_rows(lat, kv);
      paged_store(want, b.slots, c2);
      expect_bits_equal(got, want, "mla_kv_write cache");
      EXPECT_EQ(rows_differing(got, init), T);  // exactly the T slots were written
      expect_bits_equal(ckv, ckv_before, "mla_kv_write input");
    }
  }
}

TEST(IndexerKWrite, EqualsTheUnfusedSequence) {
  std::mt19937 rng(5);
  constexpr int64_t D = 128, R = 64, kPool = 64 * 8;
  for (bool interleaved : {true, false}) {
    for (int64_t T : {1, 7, 256}) {
      const RopeParams rp = rope_of(R, interleaved);
      const Tensor k = randn({T, D}, rng, 2.0f), k_before = k.clone();
      const Tensor w = randn({D}, rng).to(DType::bf16), bias = randn({D}, rng, 0.1f).to(DType::bf16);
      const Batch b = scattered(T, kPool, rng);
      const Tensor init = randn({kPool, D}, rng);
      Tensor got = init.clone(), want = init.clone();
      indexer_k_write(k, w, bias, 1e-6, b.positions, rp, got, b.slots);
      const Tensor ki = layer_norm(k, w, bias, 1e-6);
      Tensor ki_pe = ki.view({T, 1, D}).slice(2, 0, R);
      rope_inplace(ki_pe, b.positions, rp);
      paged_store(want, b.slots, ki);
      expect_bits_equal(got, want, "indexer_k_write cache");
      EXPECT_EQ(rows_differing(got, init), T);
      expect_bits_equal(k, k_before, "indexer_k_write input");
    }
  }
}

TEST(MlaKvWrite, RejectsBadInput) {
  std::mt19937 rng(6);
  const Tensor ckv = randn({4, 576}, rng), w = randn({512}, rng);
  Tensor cache = Tensor::zeros({64, 576}, DType::f32);
  const Tensor pos = i32({0, 1, 2, 3}), slots = i32({5, 6, 7, 8});
  const RopeParams rp = rope_of(64, true);
  EXPECT_THROW(mla_kv_write(ckv, w, 1e-6, i32({0, 1, 2}), rp, cache, slots), Error);  // positions
  EXPECT_THROW(mla_kv_write(ckv, w, 1e-6, pos, rp, cache, i32({1, 2})), Error);       // slots
  EXPECT_THROW(mla_kv_write(ckv, w, 1e-6, pos, rope_of(63, true), cache, slots), Error);
  EXPECT_THROW(mla_kv_write(ckv, w, 1e-6, pos, rp, cache, i32({5, 6, 7, 64})), Error);  // slot out of range
  Tensor narrow = Tensor::zeros({64, 500}, DType::f32);
  EXPECT_THROW(mla_kv_write(ckv, w, 1e-6, pos, rp, narrow, slots), Error);  // cache width
  Tensor icache = Tensor::zeros({64, 128}, DType::f32);
  EXPECT_THROW(indexer_k_write(randn({4, 128}, rng), randn({127}, rng), randn({128}, rng), 1e-6, pos, rp,
                               icache, slots),
               Error);  // norm weight width
}

}  // namespace
}  // namespace dsaserve::kernels
