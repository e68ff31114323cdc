// The CPU forward with the GPU's FP8 activation arithmetic emulated (kernels::make_fp8_emulation_backend:
// per token, per 128-column group, e4m3 with scale amax / 448, saturating; for the linears the CUDA
// backend runs in FP8) on the realdims_fp8 fixture, against its float64 goldens.
//
// - Fp8EmulationStudy prints a table ("RESULT op=fp8emu ...") of the error against the goldens for the
//   fp32 path, the full emulation and ablations (only the attention projections, only the dense MLP, only
//   the routed + shared experts; per-token and per-tensor scales instead of per-128-group ones), with the
//   top-k decisions (expert routing, indexer selection, argmax) that differ from the fp32 path and the
//   fp32 path's margin at those decisions.
// - Fp8EmulationGuard asserts the full emulation's numbers (median / max row error, argmax agreement, MTP)
//   at the measured values with a small margin: a regression guard of the emulation, and the figures the
//   GPU's FP8 path is compared with (tests/kernels/cuda/forward/goldens_test.cpp); and, alike, those of the
//   FP8 KV cache's values alone (Fp8Emulation::fp8_kv_cache).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "common/fixtures.h"
#include "golden_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/score.h"

namespace dsaserve::model {
namespace {

namespace cpu = kernels::cpu;

// One top-k decision call as the observer saw it: scores [rows, n] and chosen [rows, k].
struct Decision {
  std::string op;
  int64_t rows = 0, n = 0, k = 0;
  std::vector<float> scores;
  std::vector<int32_t> chosen;
};

// What one configuration measured over every sequence of the fixture (one prefill, MTP too).
struct EmuRun {
  std::vector<double> err, err_mtp;  // per logits row
  std::vector<int32_t> argmax;       // per logits row, all sequences concatenated
  std::vector<int32_t> ref_argmax;   // the goldens'
  std::vector<double> ref_gap;       // the goldens' top-1 minus top-2 logit per row
  std::vector<Decision> decisions;   // in call order
  std::vector<Tensor> logits, mtp;   // per sequence
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return v[v.size() / 2];
}
double maxof(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

// Per row of ours vs ref: relative error, our argmax, ref's argmax and ref's top-1 minus top-2 gap.
void compare_rows(const Tensor& ours, const Tensor& ref, std::vector<double>& err, std::vector<int32_t>* am,
                  std::vector<int32_t>* ref_am, std::vector<double>* gap) {
  const std::vector<float> a = ours.to_f32_vector(), b = ref.to_f32_vector();
  const int64_t rows = ref.size(0), cols = ref.size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = a.data() + r * cols;
    const float* y = b.data() + r * cols;
    double num = 0.0, den = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      num = std::max(num, std::isnan(x[c]) ? INFINITY : std::fabs(double(x[c]) - double(y[c])));
      den = std::max(den, std::fabs(double(y[c])));
    }
    err.push_back(den > 0 ? num / den : num);
    if (am) am->push_back(int32_t(std::max_element(x, x + cols) - x));
    if (ref_am) {
      const int64_t top = std::max_element(y, y + cols) - y;
      ref_am->push_back(int32_t(top));
      double second = -INFINITY;
      for (int64_t c = 0; c < cols; ++c)
        if (c != top) second = std::max(second, double(y[c]));
      gap->push_back(double(y[top]) - second);
    }
  }
}

struct Fixture {
  std::shared_ptr<Model> model;
  io::Checkpoint gold;
  nlohmann::json meta;
  int nseq = 0;
};

const Fixture* fixture() {
  static const Fixture* f = []() -> const Fixture* {
    const auto dir = dsaserve::testing::fixtures_dir() / "models" / "realdims_fp8";
    if (!std::filesystem::exists(dir)) return nullptr;
    auto* fx = new Fixture{Model::load(dir), io::Checkpoint::open(dir / "goldens.safetensors"), {}, 0};
    std::ifstream in(dir / "goldens.json");
    fx->meta = nlohmann::json::parse(in);
    fx->nseq = int(fx->meta["sequences"].size());
    return fx;
  }();
  return f;
}

EmuRun run_all(const Fixture& fx, const cpu::Fp8Emulation& emu, ScoreOptions o = {},
               bool half_decode = false) {
  EmuRun run;
  // The emulating backend records every top-k decision it makes.
  cpu::TopkObserver observer = [&run](std::string_view op, const Tensor& scores, const Tensor& chosen) {
    Decision d;
    d.op = std::string(op);
    d.rows = scores.size(0);
    d.n = scores.size(1);
    d.k = chosen.size(1);
    d.scores = scores.to_f32_vector();
    const int32_t* c = chosen.data<int32_t>();
    d.chosen.assign(c, c + chosen.numel());
    run.decisions.push_back(std::move(d));
  };
  // The same model on the emulating CPU backend.
  const std::shared_ptr<Model> model =
      fx.model->with_backend(kernels::make_fp8_emulation_backend(emu, std::move(observer)));
  for (int i = 0; i < fx.nseq; ++i) {
    const auto ids = dsaserve::testing::ids_of(fx.gold.get(fmt::format("seq{}.input_ids", i)));
    o.mtp = !half_decode;
    if (half_decode) o.decode_from = int64_t(ids.size()) / 2;
    const ScoreResult r = score_sequence(*model, ids, o);
    run.logits.push_back(r.logits);
    run.mtp.push_back(r.mtp_logits);
    compare_rows(r.logits, fx.gold.get(fmt::format("seq{}.logits", i)), run.err, &run.argmax, &run.ref_argmax,
                 &run.ref_gap);
    if (o.mtp && ids.size() >= 2)
      compare_rows(r.mtp_logits, fx.gold.get(fmt::format("seq{}.mtp_logits", i)), run.err_mtp, nullptr,
                   nullptr, nullptr);
  }
  return run;
}

// Decisions of one op that differ between a run and the fp32 run, and the fp32 run's margins there.
struct Flips {
  int64_t total = 0, flipped = 0;
  std::vector<double> flipped_margin;  // fp32 run: k-th minus (k+1)-th score at each flipped decision
  std::vector<double> all_margin;      // the same at every decision
  std::vector<double> shift;           // per decision: max |score - fp32 score| over the row
};

Flips flips(const EmuRun& base, const EmuRun& run, const std::string& op) {
  Flips f;
  std::vector<const Decision*> a, b;
  for (const Decision& d : base.decisions)
    if (d.op == op) a.push_back(&d);
  for (const Decision& d : run.decisions)
    if (d.op == op) b.push_back(&d);
  EXPECT_EQ(a.size(), b.size()) << op << ": a different number of decision calls";
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const Decision &x = *a[i], &y = *b[i];
    EXPECT_TRUE(x.rows == y.rows && x.n == y.n && x.k == y.k) << op << " call " << i;
    if (!(x.rows == y.rows && x.n == y.n && x.k == y.k)) continue;
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* s = x.scores.data() + r * x.n;
      std::vector<float> ranked;
      double shift = 0.0;
      for (int64_t j = 0; j < x.n; ++j) {
        if (std::isnan(s[j])) continue;
        ranked.push_back(s[j]);
        shift = std::max(shift, std::fabs(double(y.scores[size_t(r * x.n + j)]) - double(s[j])));
      }
      if (int64_t(ranked.size()) <= x.k) continue;  // every visible candidate is chosen: no decision
      std::sort(ranked.begin(), ranked.end(), std::greater<>());
      const double margin = double(ranked[size_t(x.k - 1)]) - double(ranked[size_t(x.k)]);
      const std::set<int32_t> sa(x.chosen.begin() + r * x.k, x.chosen.begin() + (r + 1) * x.k);
      const std::set<int32_t> sb(y.chosen.begin() + r * y.k, y.chosen.begin() + (r + 1) * y.k);
      ++f.total;
      f.all_margin.push_back(margin);
      f.shift.push_back(shift);
      if (sa != sb) {
        ++f.flipped;
        f.flipped_margin.push_back(margin);
      }
    }
  }
  return f;
}

// The weights (by data pointer) of each ablation group, over the target layers and the MTP layer.
struct Groups {
  std::unordered_set<const void*> attention, indexer, dense_mlp, experts;
};

Groups groups_of(const ModelWeights& w) {
  Groups g;
  std::vector<const LayerWeights*> layers;
  for (const LayerWeights& l : w.layers) layers.push_back(&l);
  for (const MtpWeights& m : w.mtp) layers.push_back(&m.layer);
  auto mlp = [](std::unordered_set<const void*>& s, const MlpWeights& m) {
    for (const Linear* l : {&m.gate, &m.up, &m.down}) s.insert(l->weight.raw_data());
  };
  for (const LayerWeights* l : layers) {
    const AttentionWeights& a = l->attn;
    for (const Linear* x : {&a.q_a_proj, &a.q_b_proj, &a.kv_a_proj, &a.kv_b_proj, &a.o_proj})
      g.attention.insert(x->weight.raw_data());
    if (a.indexer) {
      g.indexer.insert(a.indexer->wq_b.weight.raw_data());
      g.indexer.insert(a.indexer->wk.weight.raw_data());
      g.indexer.insert(a.indexer->weights_proj.weight.raw_data());
    }
    if (l->mlp) mlp(g.dense_mlp, *l->mlp);
    if (l->moe) {
      for (const MlpWeights& e : l->moe->experts) mlp(g.experts, e);
      if (l->moe->shared_experts) mlp(g.experts, *l->moe->shared_experts);
    }
  }
  return g;
}

std::function<bool(const kernels::WeightRef&)> only(
    std::vector<const std::unordered_set<const void*>*> sets) {
  return [sets](const kernels::WeightRef& w) {
    for (const auto* s : sets)
      if (s->count(w.weight.raw_data())) return true;
    return false;
  };
}

std::string margins(const std::vector<double>& v) {
  if (v.empty()) return "-";
  return fmt::format("{:.2g}/{:.2g}", *std::min_element(v.begin(), v.end()), median(v));
}

// Prints how far run `a` is from run `b`: per-row relative error of a's logits against b's (median, max),
// argmax agreement, MTP, and the top-k decisions that differ.
void distance_line(const std::string& name, const EmuRun& a, const EmuRun& b, bool decisions = true) {
  std::vector<double> d, dm, unused_gap;
  std::vector<int32_t> am_a, am_b;
  for (size_t i = 0; i < a.logits.size(); ++i) {
    compare_rows(a.logits[i], b.logits[i], d, &am_a, &am_b, &unused_gap);
    if (a.mtp[i].defined()) compare_rows(a.mtp[i], b.mtp[i], dm, nullptr, nullptr, nullptr);
  }
  int64_t same = 0;
  for (size_t i = 0; i < am_a.size(); ++i) same += am_a[i] == am_b[i];
  std::string flipped;
  if (decisions) {  // the same decision calls in both runs (the same schedule)
    const Flips fr = flips(b, a, "moe_route"), fi = flips(b, a, "indexer_topk");
    flipped = fmt::format(" route_flips={}/{} index_flips={}/{}", fr.flipped, fr.total, fi.flipped, fi.total);
  }
  fmt::print(
      "RESULT op=fp8emu_sensitivity pair=\"{}\" median={:.3g} max={:.3g} argmax_agree={:.1f}%{}{}\n", name,
      median(d), maxof(d), 100.0 * double(same) / double(am_a.size()),
      dm.empty() ? std::string() : fmt::format(" mtp_median={:.3g} mtp_max={:.3g}", median(dm), maxof(dm)),
      flipped);
}

// Op level, without the forward's amplification: layer 0's first linears (q_a_proj, kv_a_proj, in 256)
// on real activations (every vocabulary embedding, RMS-normed as the layer's input) and o_proj (in 1024,
// 8 groups) on the same rows tiled with a few outliers per row, per scale granularity: the median over rows
// of ||y(q(x)) - y(x)||_2 / ||y(x)||_2.
TEST(Fp8EmulationStudy, OpLevelGranularity) {
  const Fixture* fx = fixture();
  if (!fx)
    GTEST_SKIP() << "fixture realdims_fp8 missing: set DSASERVE_FIXTURES to the shared fixtures folder";
  const ModelWeights& w = fx->model->weights();
  const LayerWeights& l0 = w.layers[0];
  const int64_t V = fx->model->config().vocab_size, H = fx->model->config().hidden_size;
  std::vector<int32_t> all(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) all[size_t(i)] = int32_t(i);
  Tensor ids = Tensor::empty({V}, DType::i32);
  std::copy(all.begin(), all.end(), ids.data<int32_t>());
  const Tensor h = kernels::rms_norm(kernels::embedding(w.embed_tokens, ids), l0.input_layernorm,
                                     fx->model->config().rms_norm_eps);  // [V, H]
  // o_proj's input: four normed embeddings side by side, with 4 outliers (x 30) per row.
  const int64_t K = l0.attn.o_proj.in_features();
  Tensor wide = Tensor::empty({V, K}, DType::f32);
  for (int64_t t = 0; t < V; ++t) {
    for (int64_t c = 0; c < K; ++c)
      wide.data<float>()[t * K + c] = h.data<float>()[((t + c / H) % V) * H + c % H];
    for (int j = 0; j < 4; ++j) wide.data<float>()[t * K + (t * 37 + j * 251) % K] *= 30.0f;
  }
  using S = cpu::Fp8ActScale;
  struct Op {
    const char* name;
    const Linear* lin;
    const Tensor* x;
  };
  for (const Op& op : {Op{"q_a_proj", &l0.attn.q_a_proj, &h}, Op{"kv_a_proj", &l0.attn.kv_a_proj, &h},
                       Op{"o_proj (outliers)", &l0.attn.o_proj, &wide}}) {
    const kernels::WeightRef ref{op.lin->weight, op.lin->scale_inv, 128, 128};
    const std::vector<float> exact = cpu::linear(*op.x, ref, 0, -1, {}).to_f32_vector();
    const int64_t N = ref.rows();
    std::string line;
    std::map<S, double> med;
    for (S s : {S::group128, S::token, S::tensor}) {
      const std::vector<float> q =
          cpu::linear(cpu::fp8_quant_dequant(*op.x, s), ref, 0, -1, {}).to_f32_vector();
      std::vector<double> rel;
      for (int64_t t = 0; t < op.x->size(0); ++t) {
        double num = 0, den = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double d = double(q[size_t(t * N + n)]) - double(exact[size_t(t * N + n)]);
          num += d * d;
          den += double(exact[size_t(t * N + n)]) * double(exact[size_t(t * N + n)]);
        }
        rel.push_back(std::sqrt(num / den));
      }
      med[s] = median(rel);
      line += fmt::format(" {}={:.3g}",
                          s == S::group128 ? "per128"
                          : s == S::token  ? "per_token"
                                           : "per_tensor",
                          med[s]);
    }
    fmt::print("RESULT op=fp8emu_granularity linear={:<18} rows={} median_l2_rel_err:{}\n", op.name,
               op.x->size(0), line);
    EXPECT_LE(med[S::group128], med[S::token] * 1.02) << op.name;
    EXPECT_LE(med[S::token], med[S::tensor] * 1.02) << op.name;
  }
}

TEST(Fp8EmulationStudy, AblationTable) {
  const Fixture* fx = fixture();
  if (!fx)
    GTEST_SKIP() << "fixture realdims_fp8 missing: set DSASERVE_FIXTURES to the shared fixtures folder";
  const Groups g = groups_of(fx->model->weights());
  struct Config {
    const char* name;
    cpu::Fp8Emulation emu;
  };
  auto emu = [](cpu::Fp8ActScale scale, bool bf16_out, std::function<bool(const kernels::WeightRef&)> sel) {
    cpu::Fp8Emulation e;
    e.enabled = true;
    e.scale = scale;
    e.bf16_output = bf16_out;
    e.select = std::move(sel);
    return e;
  };
  using S = cpu::Fp8ActScale;
  const std::vector<Config> configs = {
      {"fp32 (no emulation)", {}},
      {"fp8 all (GPU rule)", emu(S::group128, true, nullptr)},
      {"fp8 all, f32 output", emu(S::group128, false, nullptr)},
      {"fp8 attention proj", emu(S::group128, true, only({&g.attention}))},
      {"fp8 indexer wq_b", emu(S::group128, true, only({&g.indexer}))},
      {"fp8 attn + indexer", emu(S::group128, true, only({&g.attention, &g.indexer}))},
      {"fp8 dense MLP", emu(S::group128, true, only({&g.dense_mlp}))},
      {"fp8 experts", emu(S::group128, true, only({&g.experts}))},
      {"fp8 all, per-token", emu(S::token, true, nullptr)},
      {"fp8 all, per-tensor", emu(S::tensor, true, nullptr)},
      {"bf16 products, no fp8", emu(S::none, true, nullptr)},
  };
  const EmuRun base = run_all(*fx, configs[0].emu);
  std::vector<EmuRun> runs;
  fmt::print("goldens.json smallest gaps: index top-k {:.3g}, expert route {:.3g}, argmax {:.3g}\n",
             fx->meta.value("index_topk_margin_min", 0.0), fx->meta.value("expert_route_margin_min", 0.0),
             fx->meta.value("argmax_margin_min", 0.0));
  fmt::print(
      "columns: median/max row rel err, argmax agreement with the goldens, MTP median/max; decisions that "
      "differ from the fp32 path (route: tokens x MoE layers, index: ranked query rows x indexer layers, "
      "argmax: rows), with the fp32 path's margin at the flipped ones (min/median) and the median "
      "score shift\n");
  for (const Config& c : configs) {
    const EmuRun r = &c == &configs[0] ? base : run_all(*fx, c.emu);
    int64_t agree = 0, am_flip = 0;
    std::vector<double> am_flip_gap;
    for (size_t i = 0; i < r.argmax.size(); ++i) {
      agree += r.argmax[i] == r.ref_argmax[i];
      if (r.argmax[i] != base.argmax[i]) {
        ++am_flip;
        am_flip_gap.push_back(r.ref_gap[i]);
      }
    }
    const Flips fr = flips(base, r, "moe_route"), fi = flips(base, r, "indexer_topk");
    fmt::print(
        "RESULT op=fp8emu config={:<22} median={:<9.3g} max={:<9.3g} argmax_agree={:5.1f}% "
        "mtp_median={:<9.3g} "
        "mtp_max={:<9.3g} route_flips={}/{} (margin {}, shift {:.2g}) index_flips={}/{} (margin {}, shift "
        "{:.2g}) argmax_flips={}/{} (golden gap {})\n",
        c.name, median(r.err), maxof(r.err), 100.0 * double(agree) / double(r.argmax.size()),
        median(r.err_mtp), maxof(r.err_mtp), fr.flipped, fr.total, margins(fr.flipped_margin),
        median(fr.shift), fi.flipped, fi.total, margins(fi.flipped_margin), median(fi.shift), am_flip,
        r.argmax.size(), margins(am_flip_gap));
    runs.push_back(r);
    if (&c == &configs[0]) {
      EXPECT_LE(maxof(r.err), 1e-4) << "the fp32 path (FIXTURES.md)";
      EXPECT_EQ(fr.flipped + fi.flipped + am_flip, 0);
      fmt::print("fp32 path margins (min/median): route {}, index {}, argmax (golden gap) {}\n",
                 margins(fr.all_margin), margins(fi.all_margin), margins(r.ref_gap));
    }
  }
  // Sensitivity: how far one bf16 rounding of every FP8-weight GEMM's product moves the fp32 path and
  // the FP8 path (the GPU-rule run against the same run with f32 products).
  distance_line("fp32 path: bf16 products vs f32", runs.back(), runs[0]);
  distance_line("fp8 path: bf16 products vs f32", runs[1], runs[2]);
  // The GPU golden test's other modes with the GPU rule: the same arithmetic up to fp32 summation order
  // (the MHA form also runs kv_b_proj in FP8), which the FP8 path amplifies as well.
  struct Mode {
    const char* name;
    ScoreOptions opt;
    bool half_decode;
  };
  ScoreOptions mha, chunks;
  mha.attention = AttentionForm::mha;
  chunks.chunk = 16;
  chunks.page_size = 16;
  for (const Mode& m : {Mode{"MHA form", mha, false}, Mode{"chunks of 16", chunks, false},
                        Mode{"half prefill then decode", {}, true}}) {
    const EmuRun r = run_all(*fx, configs[1].emu, m.opt, m.half_decode);
    int64_t agree = 0;
    for (size_t i = 0; i < r.argmax.size(); ++i) agree += r.argmax[i] == r.ref_argmax[i];
    fmt::print("RESULT op=fp8emu mode={:<24} median={:<9.3g} max={:<9.3g} argmax_agree={:5.1f}%{}\n", m.name,
               median(r.err), maxof(r.err), 100.0 * double(agree) / double(r.argmax.size()),
               r.err_mtp.empty()
                   ? std::string()
                   : fmt::format(" mtp_median={:.3g} mtp_max={:.3g}", median(r.err_mtp), maxof(r.err_mtp)));
    distance_line(fmt::format("fp8 path: {} vs one prefill", m.name), r, runs[1], false);
  }
}

// The full emulation (the GPU's rule) on every sequence, one prefill with MTP. Measured (x86-64, 2 cores):
// median 0.132, max 0.90, argmax agreement 70.4% (162/230), MTP median 0.224, max 1.07; the GPU's FP8
// path measured median 0.13 and 73.5% on the H200. The FP8 path amplifies any bf16-level change (e.g. a
// different libm's exp) to a different sample of the same distribution: variants of the study moved the
// median within 0.121-0.133 and the agreement within 70-75%, so the bounds are about twice that spread.
// Both sides are asserted: the emulation must neither drift nor silently stop quantising.
TEST(Fp8EmulationGuard, RealdimsFp8AgainstGoldens) {
  const Fixture* fx = fixture();
  if (!fx)
    GTEST_SKIP() << "fixture realdims_fp8 missing: set DSASERVE_FIXTURES to the shared fixtures folder";
  cpu::Fp8Emulation e;
  e.enabled = true;
  const EmuRun r = run_all(*fx, e);
  int64_t agree = 0;
  for (size_t i = 0; i < r.argmax.size(); ++i) agree += r.argmax[i] == r.ref_argmax[i];
  const double agreement = double(agree) / double(r.argmax.size());
  fmt::print(
      "RESULT op=fp8emu_guard fixture=realdims_fp8 mode=one_prefill median={:.4g} max={:.4g} "
      "argmax_agree={:.1f}% ({}/{}) mtp_median={:.4g} mtp_max={:.4g}\n",
      median(r.err), maxof(r.err), 100.0 * agreement, agree, r.argmax.size(), median(r.err_mtp),
      maxof(r.err_mtp));
  EXPECT_GE(median(r.err), 0.10);
  EXPECT_LE(median(r.err), 0.16);
  EXPECT_LE(maxof(r.err), 1.2);
  EXPECT_GE(agreement, 0.62);
  EXPECT_LE(agreement, 0.80);
  EXPECT_GE(median(r.err_mtp), 0.17);
  EXPECT_LE(median(r.err_mtp), 0.28);
  EXPECT_LE(maxof(r.err_mtp), 1.4);
  // Off again: the default path is back (FIXTURES.md's fp32 tolerance).
  const EmuRun off = run_all(*fx, {});
  EXPECT_LE(maxof(off.err), 1e-4);
  EXPECT_LE(maxof(off.err_mtp), 1e-4);
}

// The FP8 KV cache's values alone (Fp8Emulation::fp8_kv_cache, fp32 linears): the CPU reference of the
// GPU's fp32 pass with --kv-cache-dtype fp8_e4m3 (tests/kernels/cuda/forward/goldens_test.cpp). Measured
// median 0.076, argmax 190/230, MTP median 0.136 (the H200's fp32 pass with the FP8 cache: MTP 0.14); the
// bounds leave about half of that either way, so that the emulation neither drifts nor silently stops
// rounding.
TEST(Fp8EmulationGuard, Fp8KvCacheAgainstGoldens) {
  const Fixture* fx = fixture();
  if (!fx)
    GTEST_SKIP() << "fixture realdims_fp8 missing: set DSASERVE_FIXTURES to the shared fixtures folder";
  cpu::Fp8Emulation e;
  e.fp8_kv_cache = true;
  const EmuRun r = run_all(*fx, e);
  int64_t agree = 0;
  for (size_t i = 0; i < r.argmax.size(); ++i) agree += r.argmax[i] == r.ref_argmax[i];
  fmt::print(
      "RESULT op=fp8emu_guard fixture=realdims_fp8 mode=one_prefill fp8_kv_cache median={:.4g} max={:.4g} "
      "argmax_agree={}/{} mtp_median={:.4g} mtp_max={:.4g}\n",
      median(r.err), maxof(r.err), agree, r.argmax.size(), median(r.err_mtp), maxof(r.err_mtp));
  EXPECT_GE(median(r.err), 0.04);
  EXPECT_LE(median(r.err), 0.12);
  EXPECT_GE(median(r.err_mtp), 0.07);
  EXPECT_LE(median(r.err_mtp), 0.2);
}

}  // namespace
}  // namespace dsaserve::model
