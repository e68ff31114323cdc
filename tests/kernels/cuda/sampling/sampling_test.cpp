// The GPU sampler (kernels/cuda/sampling/sampling.h) against the CPU sampler (runtime/sampler) on random
// logits at the real vocabulary sizes (GLM-5.3 154,880; DeepSeek 129,280) in ragged batches (1, 3, 64 rows).
// Every row draws with its own seeded SamplerState: the GPU gets the uniform the CPU's sample() then takes.
// Greedy must agree exactly; a draw may differ only where the CPU's cumulative probability lies within
// 1e-8 of the uniform (a float tie: printed and counted), at most 0.1% of draws; log-probabilities within
// 1e-5 and the same top_logprobs ids. Half the logit rows are rounded to bf16 (many exact ties: checks
// the lower-id tie rule of the sort, top-k and top_logprobs). Each case prints a "RESULT" line.
#include "kernels/cuda/sampling/sampling.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "gpu_test.h"
#include "kernels/cuda/common/runtime.h"
#include "op_test_util.h"
#include "runtime/sampler/sampler.h"

namespace dsaserve::kernels::cuda {
namespace {

using runtime::SamplerState;
using runtime::SamplingParams;
using testing::Rng;

constexpr int64_t kVocabs[] = {154880, 129280};
constexpr int64_t kPoolRows = 64;
constexpr double kTieTol = 1e-8, kLogprobTol = 1e-5;

// `rows` (default kPoolRows) logit rows per vocabulary: uniform noise in [-6, 6) plus 40 "head" tokens
// lifted by 4..12 (a peaked distribution with a long tail, like a model's); odd rows rounded to bf16.
// Coarse pools round every logit to an integer instead: thousands of exact ties at every level (more
// than the GPU's top-k candidate buffer holds, so its radix-select fallback runs).
struct Pool {
  int64_t V = 0, rows = 0;
  std::vector<float> host;                 // [rows, V]
  std::vector<std::vector<int32_t>> head;  // per row: the lifted tokens
  Tensor dev;                              // [rows, V] on the GPU
};

const Pool& pool(int64_t V, int64_t rows = kPoolRows, bool coarse = false) {
  using Key = std::tuple<int64_t, int64_t, bool>;
  static std::map<Key, Pool*>* pools = new std::map<Key, Pool*>();  // never freed (CUDA teardown)
  auto it = pools->find(Key{V, rows, coarse});
  if (it != pools->end()) return *it->second;
  Pool* p = new Pool();
  p->V = V;
  p->rows = rows;
  p->host.resize(size_t(rows * V));
  p->head.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) {
    Rng rng(uint64_t(V * 1000 + r));
    float* x = p->host.data() + r * V;
    for (int64_t i = 0; i < V; ++i) x[i] = rng.uniform() * 6.0f;
    for (int j = 0; j < 40; ++j) {
      const int32_t t = int32_t(rng.below(V));
      x[t] += 4.0f + 8.0f * (rng.uniform() * 0.5f + 0.5f);
      p->head[size_t(r)].push_back(t);
    }
    if (coarse) {
      for (int64_t i = 0; i < V; ++i) x[i] = std::round(x[i]);
    } else if (r % 2 == 1) {
      for (int64_t i = 0; i < V; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    }
  }
  Tensor t = Tensor::empty({rows, V}, DType::f32);
  std::copy(p->host.begin(), p->host.end(), t.data<float>());
  p->dev = t.to(Device::cuda);
  pools->emplace(Key{V, rows, coarse}, p);
  return *p;
}

// One row of a batch: the CPU request and its state before the step.
struct Draw {
  int64_t row = 0;  // pool row
  SamplingParams params;
  SamplerState state;
  std::vector<int32_t> seen;
  std::vector<std::pair<int32_t, int32_t>> counts;
};

// A prompt and output history drawing on the row's head tokens (so the penalties change the pick).
SamplerState with_history(uint64_t seed, Rng& rng, const std::vector<int32_t>& head, int64_t V) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 250; ++i) prompt.push_back(int32_t(rng.below(V)));
  for (int i = 0; i < 50; ++i) prompt.push_back(head[size_t(rng.below(int64_t(head.size())))]);
  SamplerState st(seed, prompt);
  for (int i = 0; i < 40; ++i) {
    st.record(i % 2 == 0 ? head[size_t(rng.below(int64_t(head.size())))] : int32_t(rng.below(V)));
  }
  return st;
}

using ParamsFn = std::function<void(Rng&, SamplingParams&)>;

struct Stats {
  int64_t draws = 0, same = 0, ties = 0, unexplained = 0, lp_checked = 0;
  double lp_err = 0.0;
  int64_t top_bad = 0;
};

// Whether a GPU pick `g` that differs from the CPU's `c` is a float tie: in the CPU's candidate order
// (by id without filters, else by probability then id), the cumulative probability at the boundary
// between the two lies within kTieTol of u.
bool is_tie(const Pool& pl, const Draw& d, double u, int32_t c, int32_t g) {
  const int64_t V = pl.V;
  const std::vector<double> dist = runtime::sampling_distribution(
      std::span<const float>(pl.host.data() + d.row * V, size_t(V)), d.params, d.state);
  const SamplingParams& p = d.params;
  const bool filtered = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
  std::vector<int32_t> order;
  for (int32_t i = 0; i < int32_t(V); ++i) {
    if (dist[size_t(i)] > 0 || !filtered) order.push_back(i);
  }
  if (filtered) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return dist[size_t(a)] > dist[size_t(b)]; });
  }
  std::vector<double> cum(order.size() + 1, 0.0);  // cum[k]: mass before position k
  for (size_t k = 0; k < order.size(); ++k) cum[k + 1] = cum[k] + dist[size_t(order[k])];
  const auto pc = std::find(order.begin(), order.end(), c), pg = std::find(order.begin(), order.end(), g);
  if (pc == order.end() || pg == order.end()) return false;
  const size_t lo = size_t(std::min(pc, pg) - order.begin()), hi = size_t(std::max(pc, pg) - order.begin());
  return std::fabs(cum[lo + 1] - u) <= kTieTol && std::fabs(cum[hi] - u) <= kTieTol;
}

// Runs `batches` batches of `rows` rows through both samplers and accumulates the comparison.
void run_batches(const Pool& pl, int64_t rows, int batches, uint64_t seed0, bool history,
                 const ParamsFn& make, Stats& st) {
  const int64_t V = pl.V;
  Rng rng(seed0);
  for (int b = 0; b < batches; ++b) {
    const int64_t off = rows == pl.rows ? 0 : rng.below(pl.rows - rows + 1);
    std::vector<Draw> draws(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      Draw& d = draws[size_t(r)];
      d.row = off + r;
      make(rng, d.params);
      d.params.logprobs = rng.below(2) == 0;
      const int64_t tl[] = {0, 0, 1, 5, 20};
      d.params.top_logprobs = int32_t(tl[rng.below(5)]);
      const uint64_t seed = rng.next();
      d.state = history ? with_history(seed, rng, pl.head[size_t(d.row)], V) : SamplerState(seed, {});
      for (const auto& [t, n] : d.state.seen()) d.seen.push_back(t);
      for (const auto& [t, n] : d.state.output_counts()) d.counts.emplace_back(t, n);
      d.params.validate(V);
    }
    // CPU: the uniform its sample() takes, then the sample itself.
    std::vector<double> u(static_cast<size_t>(rows), 0.0);
    std::vector<runtime::SampleResult> want(static_cast<size_t>(rows));
    parallel_for(rows, 1, [&](int64_t lo, int64_t hi) {
      std::vector<float> scratch;
      for (int64_t r = lo; r < hi; ++r) {
        Draw& d = draws[size_t(r)];
        SamplerState s = d.state;
        if (d.params.temperature > 0.0f) u[size_t(r)] = SamplerState(s).uniform();
        want[size_t(r)] = runtime::sample(std::span<const float>(pl.host.data() + d.row * V, size_t(V)),
                                          d.params, s, scratch);
      }
    });
    std::vector<SampleRequest> req(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const Draw& d = draws[size_t(r)];
      SampleRequest& q = req[size_t(r)];
      q.temperature = d.params.temperature;
      q.top_p = d.params.top_p;
      q.top_k = d.params.top_k;
      q.min_p = d.params.min_p;
      q.presence_penalty = d.params.presence_penalty;
      q.frequency_penalty = d.params.frequency_penalty;
      q.repetition_penalty = d.params.repetition_penalty;
      q.logit_bias = d.params.logit_bias;
      q.seen_tokens = d.seen;
      q.output_counts = d.counts;
      q.uniform = u[size_t(r)];
      q.logprobs = d.params.logprobs;
      q.top_logprobs = d.params.top_logprobs;
    }
    const std::vector<SampleOutput> got = sample_rows(pl.dev.slice(0, off, off + rows), req);
    ASSERT_EQ(got.size(), size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const runtime::SampleResult& w = want[size_t(r)];
      const SampleOutput& g = got[size_t(r)];
      const Draw& d = draws[size_t(r)];
      ++st.draws;
      if (g.token == w.token) {
        ++st.same;
      } else if (d.params.temperature > 0.0f && is_tie(pl, d, u[size_t(r)], w.token, g.token)) {
        ++st.ties;
        fmt::print("  tie: vocab {} row {} u {:.17g}: cpu {} gpu {}\n", V, d.row, u[size_t(r)], w.token,
                   g.token);
      } else {
        ++st.unexplained;
        fmt::print("  MISMATCH: vocab {} row {} T {} top_k {} top_p {} min_p {} u {:.17g}: cpu {} gpu {}\n",
                   V, d.row, d.params.temperature, d.params.top_k, d.params.top_p, d.params.min_p,
                   u[size_t(r)], w.token, g.token);
      }
      if ((d.params.logprobs || d.params.top_logprobs > 0) && g.token == w.token) {
        ++st.lp_checked;
        st.lp_err = std::max(st.lp_err, double(std::fabs(g.logprob - w.logprob)));
      }
      bool top_ok = g.top.size() == w.top.size();
      for (size_t j = 0; top_ok && j < g.top.size(); ++j) {
        top_ok = g.top[j].token == w.top[j].token;
        st.lp_err = std::max(st.lp_err, double(std::fabs(g.top[j].logprob - w.top[j].logprob)));
      }
      st.top_bad += top_ok ? 0 : 1;
    }
  }
}

class CudaSampling : public testing::GpuTest {
 protected:
  // Every vocabulary, batches of 64 (x16), 3 (x8) and 1 (x8): ~1,060 draws per vocabulary.
  void check(const std::string& name, bool history, const ParamsFn& make, bool exact = false) {
    for (const int64_t V : kVocabs) {
      Stats st;
      uint64_t seed = std::hash<std::string>{}(name) ^ uint64_t(V);
      run_batches(pool(V), 64, 16, seed + 1, history, make, st);
      run_batches(pool(V), 3, 8, seed + 2, history, make, st);
      run_batches(pool(V), 1, 8, seed + 3, history, make, st);
      report(name, V, st, exact);
    }
  }

  // The candidate paths' edges: vocabularies that are no multiple of any tile (and one below the
  // candidate limit), a batch of 256 rows, and coarse rows whose ties overflow the candidate buffer.
  void check_shapes(const std::string& name, const ParamsFn& make) {
    const uint64_t seed = std::hash<std::string>{}(name);
    for (const int64_t V : {int64_t(1000), int64_t(50001)}) {
      Stats st;
      run_batches(pool(V), 64, 4, seed + uint64_t(V), false, make, st);
      run_batches(pool(V), 1, 8, seed + uint64_t(V) + 1, false, make, st);
      report(name + "_odd", V, st);
    }
    {
      const int64_t V = kVocabs[0];
      Stats st;
      run_batches(pool(V, 256), 256, 1, seed + 2, false, make, st);
      report(name + "_r256", V, st);
    }
    for (const int64_t V : kVocabs) {
      Stats st;
      run_batches(pool(V, 16, true), 16, 2, seed + 3, false, make, st);
      run_batches(pool(V, 16, true), 1, 8, seed + 4, false, make, st);
      report(name + "_coarse", V, st);
    }
  }

  static void report(const std::string& name, int64_t V, const Stats& st, bool exact = false) {
    fmt::print(
        "RESULT op=sample_{:<14} vocab={:<7} draws={:<5} same={:<5} float_ties={} unexplained={} "
        "top_logprobs_bad={} max_logprob_err={:.3g} ({} checked) {}\n",
        name, V, st.draws, st.same, st.ties, st.unexplained, st.top_bad, st.lp_err, st.lp_checked,
        st.unexplained == 0 && st.top_bad == 0 && st.lp_err <= kLogprobTol ? "ok" : "FAIL");
    EXPECT_EQ(st.unexplained, 0) << name << " vocab " << V;
    EXPECT_GE(double(st.same), 0.999 * double(st.draws)) << name << " vocab " << V;
    if (exact) {
      EXPECT_EQ(st.same, st.draws) << name << " vocab " << V;
    }
    EXPECT_EQ(st.top_bad, 0) << name << " vocab " << V;
    EXPECT_LE(st.lp_err, kLogprobTol) << name << " vocab " << V;
    EXPECT_GT(st.lp_checked, 0);
  }
};

float pick(Rng& rng, std::initializer_list<float> v) { return v.begin()[rng.below(int64_t(v.size()))]; }

TEST_F(CudaSampling, Greedy) {
  check(
      "greedy", false, [](Rng&, SamplingParams& p) { p.temperature = 0.0f; }, true);
}

TEST_F(CudaSampling, GreedyWithPenalties) {
  check(
      "greedy_penalty", true,
      [](Rng& rng, SamplingParams& p) {
        p.temperature = 0.0f;
        p.repetition_penalty = pick(rng, {1.0f, 1.3f});
        p.presence_penalty = pick(rng, {0.0f, 1.5f});
        p.frequency_penalty = pick(rng, {0.0f, 0.7f});
      },
      true);
}

TEST_F(CudaSampling, Temperature) {
  check("temperature", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.3f, 0.7f, 1.0f, 1.5f});
  });
}

TEST_F(CudaSampling, TopK) {
  check("top_k", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.7f, 1.0f, 2.0f});
    p.top_k = int32_t(pick(rng, {1.0f, 2.0f, 20.0f, 50.0f, 1000.0f, 20000.0f}));
  });
}

TEST_F(CudaSampling, TopP) {
  check("top_p", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.7f, 1.0f, 2.0f});
    p.top_p = pick(rng, {0.3f, 0.8f, 0.95f, 0.999f});
  });
}

TEST_F(CudaSampling, MinP) {
  check("min_p", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.7f, 1.0f, 2.0f});
    p.min_p = pick(rng, {0.001f, 0.05f, 0.3f, 1.0f});
  });
}

TEST_F(CudaSampling, AllFilters) {
  check("all", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.6f, 1.0f, 1.3f});
    p.top_k = int32_t(pick(rng, {5.0f, 40.0f, 500.0f}));
    p.top_p = pick(rng, {0.5f, 0.9f, 0.99f});
    p.min_p = pick(rng, {0.0f, 0.01f, 0.1f});
  });
}

TEST_F(CudaSampling, Penalties) {
  check("penalties", true, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.7f, 1.0f});
    p.repetition_penalty = pick(rng, {1.0f, 0.8f, 1.3f, 2.0f});
    p.presence_penalty = pick(rng, {0.0f, -0.5f, 1.0f});
    p.frequency_penalty = pick(rng, {0.0f, 0.4f, 2.0f});
    p.top_p = pick(rng, {1.0f, 0.9f});
    p.top_k = int32_t(pick(rng, {0.0f, 100.0f}));
  });
}

TEST_F(CudaSampling, LogitBias) {
  check("logit_bias", false, [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.0f, 0.8f, 1.0f});
    p.top_k = int32_t(pick(rng, {0.0f, 30.0f}));
    const int32_t V = int32_t(kVocabs[1]);  // ids valid for both vocabularies
    for (int j = 0; j < 8; ++j) {
      p.logit_bias.emplace_back(int32_t(rng.below(V)),
                                pick(rng, {-100.0f, -3.5f, 2.25f, 7.0f, 15.0f, 100.0f}));
    }
    p.logit_bias.emplace_back(p.logit_bias[0].first, 1.1f);  // a repeated token: added in order
  });
}

// top_k up to the candidate limit (1024) and past it (the radix select), with top_p / min_p.
TEST_F(CudaSampling, ShapesTopK) {
  check_shapes("shape_top_k", [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.7f, 1.0f, 2.0f});
    p.top_k = int32_t(pick(rng, {1.0f, 50.0f, 999.0f, 1024.0f, 1025.0f, 5000.0f}));
    p.top_p = pick(rng, {1.0f, 0.9f, 0.999f});
    p.min_p = pick(rng, {0.0f, 0.05f});
  });
}

// top_p alone (its crossing among the 1024 largest, or past them), plain temperature and greedy.
TEST_F(CudaSampling, ShapesTopPTemperature) {
  check_shapes("shape_top_p", [](Rng& rng, SamplingParams& p) {
    p.temperature = pick(rng, {0.0f, 0.5f, 1.0f, 3.0f});
    p.top_p = pick(rng, {1.0f, 0.5f, 0.95f, 0.9999f});
  });
}

TEST_F(CudaSampling, RejectsBadInput) {
  const Pool& pl = pool(kVocabs[1]);
  const Tensor two = pl.dev.slice(0, 0, 2);
  std::vector<SampleRequest> req(2);
  EXPECT_THROW(sample_rows(two, std::span<const SampleRequest>(req.data(), 1)), Error);  // row count
  req[1].top_p = 0.0f;
  EXPECT_THROW(sample_rows(two, req), Error);
  req[1].top_p = 1.0f;
  req[1].uniform = 1.0;
  EXPECT_THROW(sample_rows(two, req), Error);
  req[1].uniform = 0.5;
  const std::vector<std::pair<int32_t, float>> bias{{int32_t(kVocabs[1]), 1.0f}};
  req[0].logit_bias = bias;
  EXPECT_THROW(sample_rows(two, req), Error);
  req[0].logit_bias = {};
  const std::vector<int32_t> dup{5, 7, 5};
  req[0].seen_tokens = dup;
  req[0].repetition_penalty = 1.2f;
  EXPECT_THROW(sample_rows(two, req), Error);
  req[0].seen_tokens = {};
  req[0].top_logprobs = 21;
  EXPECT_THROW(sample_rows(two, req), Error);
  req[0].top_logprobs = 20;
  EXPECT_THROW(sample_rows(Tensor::empty({2, 16}, DType::f32), req), Error);  // CPU logits
  EXPECT_EQ(sample_rows(two, req).size(), 2u);
}

}  // namespace
}  // namespace dsaserve::kernels::cuda
