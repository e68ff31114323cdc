// The tensor-core MHA-form prefill attention (kernels/cuda/attention/sm90_mha_prefill.cu) through the
// attention_mha operator against the CPU operator: random bf16-exact inputs laid out as the model passes
// them (k_nope / v slices of one kv_b expansion, k_rope a slice of the gathered latents), GLM-5.3 and
// DeepSeek-V3.2 head dims, 8-128 heads, chunks of 1-4096 tokens at ragged start positions. The CPU
// reference runs on windows of rows (the first, those around the 128-row query tiles' edges, the last) and
// on the first and last heads. Every case prints a "RESULT " line. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "gpu_test.h"
#include "indexer_test_util.h"
#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/attention/mha_prefill_params.h"
#include "kernels/cuda/common/device_cache.h"
#include "kernels/cuda/common/views.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"

namespace dsaserve::kernels::cuda {
namespace {

using namespace test_util;

struct Dims {
  const char* model;
  int64_t nope, rope, dv;
};
constexpr Dims kGlm{"glm-5.3", 192, 64, 256};
constexpr Dims kDeepseek{"deepseek-v3.2", 128, 64, 128};
constexpr int64_t kLatent = 512;

// One request's MHA inputs on the CPU (bf16-exact f32) and on the GPU.
struct MhaInputs {
  Tensor q, kvx, lat;  // [T, nh, nope + rope], [S, nh, nope + dv], [S, 512 + rope]
  Tensor q_d, kvx_d, lat_d;
};
MhaInputs make_inputs(const Dims& d, int64_t nh, int64_t T, int64_t S, uint64_t seed) {
  Rng r(seed);
  MhaInputs in;
  in.q = rand_bf16_values({T, nh, d.nope + d.rope}, r, 2.0f);
  in.kvx = rand_bf16_values({S, nh, d.nope + d.dv}, r, 1.0f);
  in.lat = rand_bf16_values({S, kLatent + d.rope}, r, 1.0f);
  in.q_d = in.q.to(Device::cuda);
  in.kvx_d = in.kvx.to(Device::cuda);
  in.lat_d = in.lat.to(Device::cuda);
  return in;
}

// The operator as the model calls it, rows t0 .. t1 of the chunk and heads h0 .. h1 (all on `dev`).
Tensor run_mha(Backend& b, const Dims& d, const Tensor& q, const Tensor& kvx, const Tensor& lat,
               int64_t start, int64_t t0, int64_t t1, int64_t h0, int64_t h1, const Tensor& sel,
               double scale) {
  const Tensor kh = kvx.slice(1, h0, h1);
  return b.attention_mha(q.slice(0, t0, t1).slice(1, h0, h1), kh.slice(2, 0, d.nope),
                         lat.slice(1, kLatent, kLatent + d.rope), kh.slice(2, d.nope, d.nope + d.dv),
                         start + t0, sel.defined() ? sel.slice(0, t0, t1) : Tensor(), scale);
}

// Max over (row, head) of max |got - want| / max |want| in that row (the op table's row measure).
double row_rel_error(const Tensor& got, const Tensor& want) {
  const int64_t rows = want.size(0) * want.size(1), n = want.size(2);
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double diff = 0, ref = 0;
    for (int64_t c = 0; c < n; ++c) {
      const float w = want.data<float>()[i * n + c], g = got.data<float>()[i * n + c];
      diff = std::max(diff, double(std::fabs(g - w)));
      ref = std::max(ref, double(std::fabs(w)));
    }
    worst = std::max(worst, ref > 0 ? diff / ref : diff);
  }
  return worst;
}

// Row windows checked against the CPU: the first rows, both sides of each query-tile edge up to 3 tiles,
// and the last rows.
std::vector<std::pair<int64_t, int64_t>> windows(int64_t T) {
  std::vector<std::pair<int64_t, int64_t>> w;
  auto add = [&](int64_t a, int64_t b) {
    a = std::max<int64_t>(0, a);
    b = std::min(T, b);
    if (a < b) w.push_back({a, b});
  };
  add(0, 6);
  for (int64_t e = 128; e < T && e <= 384; e += 128) add(e - 3, e + 3);
  if (T > 6) add(T - 5, T);
  return w;
}

constexpr double kTol = 1e-2;  // bf16 inputs and P, f32 accumulation (the absorbed kernels' tolerance)

// tile_rows 0: through the attention_mha operator (the automatic choice); 64 / 128: mha_prefill on bf16
// copies with that query tile forced.
void check_case(const Dims& d, int64_t nh, int64_t T, int64_t start, uint64_t seed, int tile_rows = 0) {
  const int64_t S = start + T + 3;  // a few cached positions past the chunk (never attended)
  const MhaInputs in = make_inputs(d, nh, T, S, seed);
  const double scale = 1.0 / std::sqrt(double(d.nope + d.rope));
  Backend& gpu = kernels::backend(Device::cuda);
  Backend& cpu = kernels::backend(Device::cpu);
  ASSERT_EQ(select_mha_kernel(gpu.options().mha, true, mha_prefill_supported(d.nope, d.rope, d.dv)),
            MhaKernel::mma);
  Tensor got;
  if (tile_rows == 0) {
    got = run_mha(gpu, d, in.q_d, in.kvx_d, in.lat_d, start, 0, T, 0, nh, {}, scale).to(Device::cpu);
  } else {
    const Tensor kn = mha_bf16_copy(in.kvx_d.slice(2, 0, d.nope));
    const Tensor kr = mha_bf16_copy(in.lat_d.slice(1, kLatent, kLatent + d.rope));
    const Tensor v = mha_bf16_copy(in.kvx_d.slice(2, d.nope, d.nope + d.dv));
    got = mha_prefill(in.q_d, kn, kr, v, start, scale, op_stream(), tile_rows).to(Device::cpu);
  }
  ASSERT_EQ(got.size(0), T);
  const int64_t hk = std::min<int64_t>(2, nh);  // heads checked: 0 .. hk and nh - hk .. nh
  double worst = 0;
  for (const auto& [t0, t1] : windows(T)) {
    for (int64_t h0 : {int64_t(0), nh - hk}) {
      const Tensor want = run_mha(cpu, d, in.q, in.kvx, in.lat, start, t0, t1, h0, h0 + hk, {}, scale);
      const Tensor g = got.slice(0, t0, t1).slice(1, h0, h0 + hk).contiguous();
      const double e = row_rel_error(g, want);
      worst = std::max(worst, e);
      EXPECT_LE(e, kTol) << d.model << " heads " << nh << " T " << T << " start " << start << " rows " << t0
                         << ".." << t1 << " heads " << h0 << "..";
    }
  }
  const int rows = tile_rows != 0 ? tile_rows : mha_prefill_tile_rows(nh, T, device_sm_count());
  std::printf(
      "RESULT mha_prefill kernel=mma tile_rows=%d%s dims=%s heads=%lld T=%lld start=%lld row_rel=%.3g "
      "tol=%.0e "
      "%s\n",
      rows, tile_rows == 0 ? " (auto, op)" : "", d.model, (long long)nh, (long long)T, (long long)start,
      worst, kTol, worst <= kTol ? "ok" : "FAIL");
}

class CudaMhaPrefill : public testing::GpuTest {};

// Chunks of 1, 17, 128, 1000 and 4096 tokens at ragged starts, for 8, 16, 64 and 128 heads.
TEST_F(CudaMhaPrefill, GlmDims) {
  check_case(kGlm, 8, 1, 0, 1);
  check_case(kGlm, 8, 17, 5, 2);
  check_case(kGlm, 16, 128, 300, 3);
  check_case(kGlm, 16, 1000, 77, 4);
  check_case(kGlm, 64, 17, 2049, 5);
  check_case(kGlm, 64, 1000, 1000, 6);
  check_case(kGlm, 64, 4096, 0, 7);
  check_case(kGlm, 128, 128, 0, 8);
  check_case(kGlm, 128, 1, 4000, 9);
}
TEST_F(CudaMhaPrefill, DeepseekDims) {
  check_case(kDeepseek, 8, 1, 63, 11);
  check_case(kDeepseek, 8, 1000, 0, 12);
  check_case(kDeepseek, 16, 17, 130, 13);
  check_case(kDeepseek, 64, 128, 64, 14);
  check_case(kDeepseek, 64, 4096, 129, 15);
  check_case(kDeepseek, 128, 17, 0, 16);
  check_case(kDeepseek, 128, 1000, 2500, 17);
  check_case(kDeepseek, 128, 4096, 0, 18);
}

// Both query-tile shapes forced, whatever the grid would pick, at both dims.
TEST_F(CudaMhaPrefill, BothTileShapes) {
  for (int rows : {64, 128}) {
    check_case(kGlm, 8, 17, 3, 41, rows);
    check_case(kGlm, 64, 1000, 129, 42, rows);
    check_case(kDeepseek, 16, 300, 0, 43, rows);
    check_case(kDeepseek, 128, 1000, 64, 44, rows);
  }
}

// The operator is the kernel on its bf16 copies (bit for bit), and a chunk past the cached keys is an error.
TEST_F(CudaMhaPrefill, DirectCallMatchesOperator) {
  const Dims d = kGlm;
  const int64_t nh = 16, T = 200, start = 40, S = start + T;
  const MhaInputs in = make_inputs(d, nh, T, S, 21);
  const double scale = 0.0625;
  const Tensor kn = mha_bf16_copy(in.kvx_d.slice(2, 0, d.nope));
  const Tensor kr = mha_bf16_copy(in.lat_d.slice(1, kLatent, kLatent + d.rope));
  const Tensor v = mha_bf16_copy(in.kvx_d.slice(2, d.nope, d.nope + d.dv));
  const Tensor direct = mha_prefill(in.q_d, kn, kr, v, start, scale, op_stream()).to(Device::cpu);
  const Tensor op =
      run_mha(kernels::backend(Device::cuda), d, in.q_d, in.kvx_d, in.lat_d, start, 0, T, 0, nh, {}, scale)
          .to(Device::cpu);
  EXPECT_EQ(row_rel_error(direct, op), 0.0);
  EXPECT_THROW(mha_prefill(in.q_d, kn, kr, v, start + 1, scale, op_stream()), Error);
  EXPECT_THROW(mha_prefill(in.q_d, kn, kr, v, start, scale, op_stream(), 32), Error);
}

// What the tensor-core kernel does not take runs the plain kernel: a selection, other head dims, or
// MhaKernel::plain asked for. Those stay at the f32 tolerance of the op table (1e-4).
TEST_F(CudaMhaPrefill, OthersRunThePlainKernel) {
  EXPECT_EQ(select_mha_kernel(MhaKernel::automatic, false, true), MhaKernel::plain);
  EXPECT_EQ(select_mha_kernel(MhaKernel::automatic, true, false), MhaKernel::plain);
  EXPECT_EQ(select_mha_kernel(MhaKernel::mma, true, false), MhaKernel::plain);
  EXPECT_EQ(select_mha_kernel(MhaKernel::plain, true, true), MhaKernel::plain);
  EXPECT_FALSE(mha_prefill_supported(32, 16, 48));  // the tiny fixture's dims
  const Dims d = kGlm;
  const int64_t nh = 8, T = 20, start = 30, S = start + T;
  const MhaInputs in = make_inputs(d, nh, T, S, 31);
  const double scale = 0.0625;
  Rng r(32);
  Tensor sel = Tensor::empty({T, 5}, DType::i32);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < 5; ++j)
      sel.data<int32_t>()[t * 5 + j] = j == 4 ? -1 : int32_t(r.below(start + t + 1));
  Backend& cpu = kernels::backend(Device::cpu);
  const Tensor want_sel = run_mha(cpu, d, in.q, in.kvx, in.lat, start, 0, T, 0, nh, sel, scale);
  const Tensor got_sel = run_mha(kernels::backend(Device::cuda), d, in.q_d, in.kvx_d, in.lat_d, start, 0, T,
                                 0, nh, sel.to(Device::cuda), scale)
                             .to(Device::cpu);
  EXPECT_LE(row_rel_error(got_sel, want_sel), 1e-4);
  KernelOptions plain;
  plain.mha = MhaKernel::plain;
  const Tensor got_plain =
      attention_mha(in.q_d, in.kvx_d.slice(2, 0, d.nope), in.lat_d.slice(1, kLatent, kLatent + d.rope),
                    in.kvx_d.slice(2, d.nope, d.nope + d.dv), start, {}, scale, plain)
          .to(Device::cpu);
  const Tensor want = run_mha(cpu, d, in.q, in.kvx, in.lat, start, 0, T, 0, nh, {}, scale);
  EXPECT_LE(row_rel_error(got_plain, want), 1e-4);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
