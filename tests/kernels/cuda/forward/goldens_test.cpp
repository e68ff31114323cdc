// The model forward on the GPU (weights uploaded as stored, KV cache on the GPU, every operator on the CUDA
// backend) against the reference logits of the realdims and realdims_fp8 fixtures: FIXTURES.md's GPU
// tolerances (bf16 activations: <= 2e-2 relative per row and >= 99% argmax agreement; FP8 weights +
// activations: <= 5e-2), for one prefill in each attention form, chunked prefill (with the MTP head
// through score_sequence), prefill then decode, and the MTP head. Each fixture runs with an f32 KV cache
// (the plain stand-in attention kernels) and a bf16 one (the sm_90a indexer top-k and MLA decode kernels);
// realdims_fp8 also with the FP8 latent cache. Prints "RESULT" lines with the measured numbers.
//
// realdims_fp8 with fast (FP8) GEMMs is also run on the CPU with the GPU's FP8 activation arithmetic
// emulated (kernels::make_fp8_emulation_backend), mode for mode: on this fixture that arithmetic itself is
// ~0.13 median from the float64 goldens (tests/model/fp8_emulation_test.cpp: FP8 rounding flips about
// half of the index top-k and a quarter of the routing choices, whose float64 margins are ~1e-2), so
// FIXTURES.md's 5e-2 cannot hold; the GPU is asserted to land where its arithmetic does (median within
// 1.5x of the emulation's, argmax agreement within 15 points, plus the KV cache rounding's own error
// measured by the fp32 pass, which runs first), and the GPU-vs-emulation distance is
// printed, not asserted: the FP8 path amplifies any bf16-level difference to a ~0.1 median (one bf16
// rounding of the products alone moves the emulation that far). That the GPU computes the emulated
// arithmetic is checked op by op in fp8_emulation_test.cpp (CudaFp8Emulation.*).
//
// With the FP8 KV cache the fp32 pass is held to a CPU forward whose cache holds the same FP8 values
// (Fp8Emulation::fp8_kv_cache: latent rows and index keys rounded by the store kernels' rules), not to
// the goldens, whose index top-k choices the cache's rounding flips (see the fp32 comment below).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <span>
#include <tuple>

#include "common/fixtures.h"
#include "gpu_test.h"
#include "io/safetensors.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/backend.h"
#include "kernels/cuda/common/runtime.h"
#include "kernels/cuda/gemm/gemm.h"
#include "model/model.h"
#include "model/score.h"

namespace dsaserve::model {
namespace {

std::vector<int32_t> ids_of(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// Per row: max|a - b| / max|b|; and the number of rows whose argmax agrees.
std::pair<std::vector<double>, int64_t> compare(const Tensor& ours, const Tensor& ref) {
  const std::vector<float> a = ours.to_f32_vector(), b = ref.to_f32_vector();
  const int64_t rows = ref.size(0), cols = ref.size(1);
  std::vector<double> err;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double num = 0.0, den = 0.0;
    int64_t ia = 0, ib = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = a[size_t(r * cols + c)], y = b[size_t(r * cols + c)];
      num = std::max(num, std::isnan(x) ? INFINITY : std::fabs(x - y));
      den = std::max(den, std::fabs(y));
      if (x > a[size_t(r * cols + ia)]) ia = c;
      if (y > b[size_t(r * cols + ib)]) ib = c;
    }
    err.push_back(den > 0 ? num / den : num);
    agree += ia == ib;
  }
  return {err, agree};
}

// One prefill of the whole sequence, then the MTP head over its final hidden states (kept on the GPU);
// returns the logits and the MTP logits on the CPU.
std::pair<Tensor, Tensor> prefill_with_mtp(const Model& m, const std::vector<int32_t>& ids) {
  const int64_t n = int64_t(ids.size()), ps = 64, pages = (n + ps - 1) / ps;
  KvCache cache = m.make_cache(pages, ps);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.rbegin(), table.rend(), 0);
  ForwardOptions fo;
  fo.keep_hidden = true;
  ForwardBatch b;
  b.page_size = ps;
  b.add_request(ids, 0, table);
  const ForwardOutput out = m.forward(b, cache, fo);
  Tensor mtp;
  if (n >= 2) {
    ForwardBatch mb;
    mb.page_size = ps;
    mb.add_request(std::span<const int32_t>(ids).subspan(1), 0, table);
    mtp = m.forward_mtp(mb, out.hidden.slice(0, 0, n - 1), cache, fo, 0).logits.to(Device::cpu);
  }
  return {out.logits.to(Device::cpu), mtp};
}

const char* kv_name(KvCacheDtype d) {
  return d == KvCacheDtype::f32 ? "f32(stand-in)" : d == KvCacheDtype::bf16 ? "bf16(sm90)" : "fp8(sm90)";
}

// The CPU forward of sequence `i` in mode `mi` (cached; the CPU cache is f32) with, when asked, the GPU's
// FP8 activation arithmetic emulated (`gemm`) and / or the values its FP8 KV cache holds (`fp8_kv`,
// Fp8Emulation::fp8_kv_cache).
const ScoreResult& cpu_reference(const std::filesystem::path& dir, size_t mi, int i,
                                 const std::vector<int32_t>& ids, const ScoreOptions& opt, bool gemm,
                                 bool fp8_kv) {
  static std::map<std::string, std::shared_ptr<Model>> models;
  static std::map<std::tuple<std::string, size_t, int, bool, bool>, ScoreResult> cache;
  const auto key = std::make_tuple(dir.string(), mi, i, gemm, fp8_kv);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto& model = models[dir.string()];
  if (!model) model = Model::load(dir);
  kernels::cpu::Fp8Emulation e;
  e.enabled = gemm;
  e.fp8_kv_cache = fp8_kv;
  const std::shared_ptr<Model> emulated = model->with_backend(kernels::make_fp8_emulation_backend(e));
  return cache.emplace(key, score_sequence(*emulated, ids, opt)).first->second;
}

class CudaGoldens : public ::testing::TestWithParam<std::tuple<const char*, KvCacheDtype>> {};

TEST_P(CudaGoldens, LogitsWithinGpuTolerance) {
  DSA_SKIP_WITHOUT_GPU();
  const auto [fixture, kv_dtype] = GetParam();
  DSA_FIXTURE_PATH(dir, std::string("models/") + fixture);
  const std::string label = fmt::format("{} kv={}", fixture, kv_name(kv_dtype));
  const bool fp8 = std::string(fixture).find("fp8") != std::string::npos;
  const bool real_kernels = kv_dtype != KvCacheDtype::f32;
  const double tol = fp8 ? 5e-2 : 2e-2;
  ModelConfig cfg = ModelConfig::from_file(dir / "config.json");
  io::Checkpoint ckpt = io::Checkpoint::open(dir);
  ModelWeights w = ModelWeights::bind(cfg, ckpt, true).to(Device::cuda);
  // The model on a CUDA backend with the pass's GEMM precision, its caches in kv_dtype.
  const Model base(cfg, std::move(ckpt), std::move(w));
  auto model_with = [&](kernels::GemmPrecision prec) {
    kernels::KernelOptions ko;
    ko.gemm = prec;
    return base.with_backend(kernels::cuda::make_backend(ko), kv_dtype);
  };
  const io::Checkpoint gold = io::Checkpoint::open(dir / "goldens.safetensors");
  std::ifstream f(dir / "goldens.json");
  const nlohmann::json meta = nlohmann::json::parse(f);
  const int nseq = int(meta["sequences"].size());

  struct Mode {
    const char* name;
    ScoreOptions opt;
    bool half_decode;
  };
  ScoreOptions one, mha, absorbed, chunks, decode;
  one.mtp = true;  // run by prefill_with_mtp (the MTP input stays on the GPU)
  mha.attention = AttentionForm::mha;
  absorbed.attention = AttentionForm::absorbed;
  chunks.chunk = 16;
  chunks.page_size = 16;
  chunks.mtp = true;  // score_sequence's MTP pass: the hidden states go back to the GPU model
  const std::vector<Mode> all = {Mode{"one prefill", one, false}, Mode{"prefill MHA form", mha, false},
                                 Mode{"prefill absorbed form", absorbed, false},
                                 Mode{"chunks of 16", chunks, false},
                                 Mode{"half prefill then decode", decode, true}};
  using kernels::GemmPrecision;
  // The fp32 pass runs first: on realdims_fp8 its one-prefill numbers (the attention kernels' KV-cache
  // rounding alone) are the allowance the fast pass gets on top of the CPU FP8 emulation.
  struct KvOnly {
    double median = 0.0, mtp_median = 0.0, disagreement = 0.0;
  } kv_only;
  for (GemmPrecision prec : {GemmPrecision::fp32, GemmPrecision::fast}) {
    const std::shared_ptr<Model> model = model_with(prec);
    const Model& m = *model;
    const bool exact = prec == GemmPrecision::fp32;
    // fast: FIXTURES.md's GPU tolerance holds for the typical (median) row; single rows may move further
    // where an expert-routing or index top-k decision has a margin below the activations' precision
    // (goldens.json lists the smallest margins), so the worst row and the argmax agreement are printed.
    // fp32 GEMMs (reference precision): every row within 1e-3 and >= 99% argmax agreement with f32
    // caches. The sm_90a kernels keep the cache in bf16 / FP8 and multiply in bf16 (fp32 accumulation),
    // so with them the fp32 mode isolates their attention error: the median row within the GPU tolerance
    // (FP8 KV: 1e-1, e4m3 rounds 16x coarser than bf16; measured 3.4e-2, MTP 8.8e-2). Their argmax
    // agreement is printed, not asserted: bf16 rounding of the indexer keys flips index top-k choices
    // at the fixtures' small margins (measured 96.5%, the flipped rows are the ones fast GEMMs move).
    const bool strict = exact && !real_kernels;
    const double row_tol = strict ? 1e-3 : kv_dtype == KvCacheDtype::fp8_e4m3 ? 1e-1 : tol;
    // An FP8 KV cache also stores the index keys in FP8 (128 e4m3 + one scale per token, the reference
    // deployment's layout). Their rounding moves indexer scores by more than the fixtures' decision margins
    // (~0.01), and the MTP layer, whose rows see the fewest keys, flips the most selections: its median row
    // error from the goldens with FP8 KV alone (fp32 GEMMs) went from 0.088 (bf16 index keys) to 0.14 on
    // the H200 (the CPU with the same FP8 cache values: 0.136, logits 0.076). So with FP8 KV the fp32
    // pass is held to the CPU forward whose cache holds the same FP8 values (latent and index keys rounded
    // by the store kernels' rules: Fp8Emulation::fp8_kv_cache). What separates them then is the kernels'
    // bf16 queries and products, which the FP8 cache amplifies (a bf16-level change of a key moves some of
    // its e4m3 codes a whole step): on the CPU, bf16-rounded attention queries and outputs moved the median
    // row 0.011 (MTP 0.038) from that reference, against 0.002 (0.005) with the f32 cache. Asserted:
    // median row within `tol`, MTP median within row_tol; the distance from the goldens is printed (the
    // logits' still asserted within row_tol).
    const bool fp8_kv_ref = exact && kv_dtype == KvCacheDtype::fp8_e4m3;
    for (size_t mi = 0; mi < all.size(); ++mi) {
      const Mode& mode = all[mi];
      if (exact && mi != 0 && mi != 4) continue;
      // realdims_fp8, fast: the CPU emulation of the same arithmetic, against the goldens and the GPU.
      const bool emulate = fp8 && !exact;
      std::vector<double> errs, errs_mtp, emu_errs, emu_errs_mtp, gpu_vs_emu, vs_kv_ref, vs_kv_ref_mtp;
      int64_t agree = 0, emu_agree = 0, gpu_emu_agree = 0, kv_ref_agree = 0;
      for (int i = 0; i < nseq; ++i) {
        const auto ids = ids_of(gold.get(fmt::format("seq{}.input_ids", i)));
        ScoreOptions o = mode.opt;
        if (mode.half_decode) o.decode_from = int64_t(ids.size()) / 2;
        ScoreResult r;
        if (mi == 0) {
          std::tie(r.logits, r.mtp_logits) = prefill_with_mtp(m, ids);
        } else {
          r = score_sequence(m, ids, o);
        }
        const auto [e, a] = compare(r.logits, gold.get(fmt::format("seq{}.logits", i)));
        errs.insert(errs.end(), e.begin(), e.end());
        agree += a;
        if (o.mtp && ids.size() >= 2) {
          const auto em = compare(r.mtp_logits, gold.get(fmt::format("seq{}.mtp_logits", i))).first;
          errs_mtp.insert(errs_mtp.end(), em.begin(), em.end());
        }
        ScoreOptions co = o;
        co.mtp = o.mtp || mi == 0;  // mode 0 runs the MTP head through prefill_with_mtp
        if (fp8_kv_ref) {
          const ScoreResult& c = cpu_reference(dir, mi, i, ids, co, false, true);
          const auto [ke, ka] = compare(r.logits, c.logits);
          vs_kv_ref.insert(vs_kv_ref.end(), ke.begin(), ke.end());
          kv_ref_agree += ka;
          if (co.mtp && ids.size() >= 2) {
            const auto km = compare(r.mtp_logits, c.mtp_logits).first;
            vs_kv_ref_mtp.insert(vs_kv_ref_mtp.end(), km.begin(), km.end());
          }
        }
        if (emulate) {
          const ScoreResult& c = cpu_reference(dir, mi, i, ids, co, true, false);
          const auto [ce, ca] = compare(c.logits, gold.get(fmt::format("seq{}.logits", i)));
          emu_errs.insert(emu_errs.end(), ce.begin(), ce.end());
          emu_agree += ca;
          const auto [ge, ga] = compare(r.logits, c.logits);
          gpu_vs_emu.insert(gpu_vs_emu.end(), ge.begin(), ge.end());
          gpu_emu_agree += ga;
          if (co.mtp && ids.size() >= 2) {
            const auto cm = compare(c.mtp_logits, gold.get(fmt::format("seq{}.mtp_logits", i))).first;
            emu_errs_mtp.insert(emu_errs_mtp.end(), cm.begin(), cm.end());
          }
        }
      }
      auto median = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
      };
      auto maxof = [](const std::vector<double>& v) {
        return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
      };
      const double worst = maxof(errs), med = median(errs), agreement = double(agree) / double(errs.size());
      int64_t over = 0;
      for (double e : errs) over += e > tol;
      fmt::print(
          "RESULT op=golden {:<27} gemm={:<4} mode={:<24} max_rel_err={:<9.3g} median={:<9.3g} "
          "rows_over_{:.0e}={}/{} "
          "argmax_agree={:.1f}%{}\n",
          label, exact ? "fp32" : "fast", mode.name, worst, med, tol, over, errs.size(), 100.0 * agreement,
          errs_mtp.empty()
              ? std::string()
              : fmt::format(" mtp_max={:.3g} mtp_median={:.3g}", maxof(errs_mtp), median(errs_mtp)));
      if (exact && mi == 0) kv_only = KvOnly{med, median(errs_mtp), 1.0 - agreement};
      if (fp8_kv_ref) {
        fmt::print(
            "RESULT op=golden {:<27} gemm=fp32 mode={:<24} vs_cpu_fp8_kv_cache: median={:<9.3g} "
            "max={:<9.3g} argmax_agree={:.1f}%{}\n",
            label, mode.name, median(vs_kv_ref), maxof(vs_kv_ref),
            100.0 * double(kv_ref_agree) / double(vs_kv_ref.size()),
            vs_kv_ref_mtp.empty() ? std::string()
                                  : fmt::format(" mtp_max={:.3g} mtp_median={:.3g}", maxof(vs_kv_ref_mtp),
                                                median(vs_kv_ref_mtp)));
        EXPECT_LE(median(vs_kv_ref), tol) << mode.name << " (vs the CPU with the FP8 KV cache's values)";
        if (!vs_kv_ref_mtp.empty()) {
          EXPECT_LE(median(vs_kv_ref_mtp), row_tol)
              << mode.name << " MTP (vs the CPU with the FP8 KV cache's values)";
        }
      }
      if (emulate) {
        const double emu_med = median(emu_errs), emu_agreement = double(emu_agree) / double(emu_errs.size());
        fmt::print(
            "RESULT op=golden {:<27} gemm=fast mode={:<24} cpu_fp8_emulation: median={:<9.3g} max={:<9.3g} "
            "argmax_agree={:.1f}% mtp_median={:.3g}; gpu_vs_emulation: median={:.3g} max={:.3g} "
            "argmax_agree={:.1f}%\n",
            label, mode.name, emu_med, maxof(emu_errs), 100.0 * emu_agreement, median(emu_errs_mtp),
            median(gpu_vs_emu), maxof(gpu_vs_emu), 100.0 * double(gpu_emu_agree) / double(gpu_vs_emu.size()));
        // The GPU lands where its arithmetic does: the emulation's median (x1.5) and argmax agreement
        // (-15 points), plus what the KV cache's rounding alone costs (the fp32 pass).
        EXPECT_LE(med, std::max(row_tol, 1.5 * emu_med + kv_only.median))
            << mode.name << " (CPU FP8 emulation: " << emu_med << ", KV rounding alone: " << kv_only.median
            << ")";
        EXPECT_GE(agreement, emu_agreement - 0.15 - kv_only.disagreement)
            << mode.name << " (CPU FP8 emulation: " << emu_agreement << ")";
        if (!errs_mtp.empty()) {
          EXPECT_LE(median(errs_mtp), std::max(row_tol, 1.5 * median(emu_errs_mtp) + kv_only.mtp_median))
              << mode.name << " MTP (CPU FP8 emulation: " << median(emu_errs_mtp) << ")";
        }
      } else if (strict) {
        EXPECT_LE(worst, row_tol) << mode.name;
        EXPECT_LE(maxof(errs_mtp), row_tol) << mode.name << " MTP";
        EXPECT_GE(agreement, 0.99) << mode.name;
      } else {
        EXPECT_LE(med, row_tol) << mode.name;
        if (!errs_mtp.empty() && !fp8_kv_ref) {  // FP8 KV: against its CPU reference above
          EXPECT_LE(median(errs_mtp), row_tol) << mode.name << " MTP";
        }
      }
    }
  }
  const std::shared_ptr<Model> fast_model = model_with(GemmPrecision::fast);
  const Model& m = *fast_model;
  // Greedy continuations (printed: a flip at a small argmax margin is expected at GPU precision).
  for (const auto& gm : meta["greedy"]) {
    const int j = gm["index"].get<int>();
    const auto prompt = ids_of(gold.get(fmt::format("greedy{}.prompt", j)));
    const auto expect = ids_of(gold.get(fmt::format("greedy{}.output", j)));
    const auto got = greedy_generate(m, prompt, int64_t(expect.size()));
    size_t same = 0;
    while (same < got.size() && same < expect.size() && got[same] == expect[same]) ++same;
    fmt::print("RESULT op=golden {:<27} mode=greedy{} first {}/{} tokens identical (argmax margin {:.3g})\n",
               label, j, same, expect.size(), gm.value("argmax_margin", 0.0));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGoldens,
                         ::testing::Values(std::make_tuple("realdims", KvCacheDtype::f32),
                                           std::make_tuple("realdims", KvCacheDtype::bf16),
                                           std::make_tuple("realdims_fp8", KvCacheDtype::f32),
                                           std::make_tuple("realdims_fp8", KvCacheDtype::bf16),
                                           std::make_tuple("realdims_fp8", KvCacheDtype::fp8_e4m3)),
                         [](const ::testing::TestParamInfo<CudaGoldens::ParamType>& i) {
                           const KvCacheDtype d = std::get<1>(i.param);
                           return std::string(std::get<0>(i.param)) + (d == KvCacheDtype::f32    ? "_f32kv"
                                                                       : d == KvCacheDtype::bf16 ? "_bf16kv"
                                                                                                 : "_fp8kv");
                         });

}  // namespace
}  // namespace dsaserve::model
