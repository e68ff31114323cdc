#include "runtime/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/random.h"

namespace dsaserve::runtime {

void SamplingParams::validate(int64_t vocab_size) const {
  DSA_CHECK(std::isfinite(temperature) && temperature >= 0.0f && temperature <= 100.0f,
            "temperature must be in [0, 100], got {}", temperature);
  DSA_CHECK(std::isfinite(top_p) && top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got {}", top_p);
  DSA_CHECK(top_k >= -1, "top_k must be -1, 0 or positive, got {}", top_k);
  DSA_CHECK(std::isfinite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got {}", min_p);
  DSA_CHECK(std::isfinite(presence_penalty) && std::fabs(presence_penalty) <= 2.0f,
            "presence_penalty must be in [-2, 2], got {}", presence_penalty);
  DSA_CHECK(std::isfinite(frequency_penalty) && std::fabs(frequency_penalty) <= 2.0f,
            "frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  DSA_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f && repetition_penalty <= 2.0f,
            "repetition_penalty must be in (0, 2], got {}", repetition_penalty);
  for (const auto& [tok, bias] : logit_bias) {
    DSA_CHECK(tok >= 0 && tok < vocab_size, "logit_bias: token id {} is outside the vocabulary [0, {})", tok,
              vocab_size);
    DSA_CHECK(std::isfinite(bias) && std::fabs(bias) <= 100.0f, "logit_bias: bias {} must be in [-100, 100]",
              bias);
  }
  DSA_CHECK(top_logprobs >= 0 && top_logprobs <= 20, "top_logprobs must be in [0, 20], got {}", top_logprobs);
  DSA_CHECK(prompt_logprobs >= -1 && prompt_logprobs <= 20, "prompt_logprobs must be in [0, 20], got {}",
            prompt_logprobs);
  DSA_CHECK(max_new_tokens >= 0, "max_tokens must be >= 0, got {}", max_new_tokens);
  for (int32_t t : stop_token_ids) {
    DSA_CHECK(t >= 0 && t < vocab_size, "stop_token_ids: id {} is outside the vocabulary [0, {})", t,
              vocab_size);
  }
}

namespace {

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Penalties and bias applied to a copy of the logits.
void process_logits(std::span<const float> logits, const SamplingParams& p, const SamplerState& st,
                    std::vector<float>& out) {
  out.assign(logits.begin(), logits.end());
  const int64_t V = int64_t(out.size());
  for (const auto& [tok, bias] : p.logit_bias) {
    if (tok >= 0 && tok < V) out[size_t(tok)] += bias;
  }
  if (p.repetition_penalty != 1.0f) {
    for (const auto& [tok, n] : st.seen()) {
      if (tok < 0 || tok >= V || n <= 0) continue;
      float& l = out[size_t(tok)];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [tok, n] : st.output_counts()) {
      if (tok < 0 || tok >= V || n <= 0) continue;
      out[size_t(tok)] -= p.presence_penalty + p.frequency_penalty * float(n);
    }
  }
}

// Masks `x` with the constraint or the mask snapshot (either may be null, not both); at least one token
// must stay (a -inf maximum would make every probability NaN).
void apply_constraint(TokenConstraint* c, const TokenMask* m, std::vector<float>& x) {
  if (c != nullptr) {
    c->mask_logits(x);
  } else {
    m->apply(x);
  }
  bool any = false;
  for (float v : x) any = any || v > -std::numeric_limits<float>::infinity();
  DSA_CHECK(any, "sampler: the request's grammar allows no next token");
}

// The first index of the largest value (NaNs never win, except x[0] = NaN, which returns 0: the result
// of a scan that moves on only to a strictly larger value). Two passes that the compiler vectorises: the
// maximum in kLanes independent lanes, then the first index holding it.
int32_t argmax(std::span<const float> x) {
  const size_t n = x.size();
  if (n == 0 || std::isnan(x[0])) return 0;
  constexpr size_t kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = -std::numeric_limits<float>::infinity();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float m = x[0];
  for (float l : lane) m = l > m ? l : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (size_t k = 0; k < n; ++k) {
    if (x[k] == m) return int32_t(k);
  }
  return 0;  // not reached: m is one of the values
}

// No logit_bias and no penalty that changes a logit: the raw row is the processed one.
bool no_processing(const SamplingParams& p) {
  return p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
         p.frequency_penalty == 0.0f;
}

bool filtered(std::span<const float> x, const SamplingParams& p) {
  return (p.top_k > 0 && p.top_k < int64_t(x.size())) || p.top_p < 1.0f || p.min_p > 0.0f;
}

// A temperature draw over every token (no top_k / top_p / min_p) with the uniform `u`: the token
// candidates() + the cumulative scan in sample() pick, computed the same way (each probability is
// exp((x - max) / T) / sum in double, accumulated in id order) without the [vocab] candidate list: the
// exponentials go to a per-thread buffer, reused between calls.
int32_t draw_unfiltered(std::span<const float> x, const SamplingParams& p, double u) {
  thread_local std::vector<double> e;
  const size_t V = x.size();
  const double inv_t = 1.0 / double(p.temperature);
  const float mx = x[size_t(argmax(x))];
  e.resize(V);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) {
    e[i] = std::exp((double(x[i]) - mx) * inv_t);
    sum += e[i];
  }
  double cum = 0;
  for (size_t i = 0; i < V; ++i) {
    cum += e[i] / sum;
    if (u < cum) return int32_t(i);
  }
  return int32_t(V - 1);
}

// The candidates a temperature draw chooses from, most likely first, with normalised probabilities.
// Without top_k / top_p / min_p every token is a candidate (in id order, no sort needed).
std::vector<std::pair<int32_t, double>> candidates(std::span<const float> x, const SamplingParams& p) {
  const int64_t V = int64_t(x.size());
  const double inv_t = 1.0 / double(p.temperature);
  const float mx = x[size_t(argmax(x))];
  std::vector<std::pair<int32_t, double>> c;
  const bool filtered = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!filtered) {
    c.resize(size_t(V));
    double sum = 0;
    for (int64_t i = 0; i < V; ++i) {
      const double e = std::exp((double(x[size_t(i)]) - mx) * inv_t);
      c[size_t(i)] = {int32_t(i), e};
      sum += e;
    }
    for (auto& [t, pr] : c) pr /= sum;
    return c;
  }
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
  };
  int64_t k = V;
  if (p.top_k > 0 && p.top_k < V) {
    k = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  } else {
    std::sort(idx.begin(), idx.end(), by_logit);
  }
  c.reserve(size_t(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) {
    const double e = std::exp((double(x[size_t(idx[size_t(i)])]) - mx) * inv_t);
    c.emplace_back(idx[size_t(i)], e);
    sum += e;
  }
  for (auto& [t, pr] : c) pr /= sum;
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double cum = 0;
    size_t keep = 0;
    while (keep < c.size()) {
      cum += c[keep].second;
      ++keep;
      if (cum >= double(p.top_p)) break;
    }
    c.resize(keep);
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * c.front().second;
    size_t keep = 1;
    while (keep < c.size() && c[keep].second >= floor) ++keep;
    c.resize(keep);
  }
  sum = 0;
  for (const auto& [t, pr] : c) sum += pr;
  for (auto& [t, pr] : c) pr /= sum;
  return c;
}

void fill_logprobs(std::span<const float> logits, const SamplingParams& p, SampleResult& r) {
  const float mx = logits[size_t(argmax(logits))];
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const double lse = double(mx) + std::log(sum);
  r.logprob = float(double(logits[size_t(r.token)]) - lse);
  if (p.top_logprobs <= 0) return;
  const int64_t k = std::min<int64_t>(p.top_logprobs, int64_t(logits.size()));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) {
    r.top.push_back({idx[size_t(i)], float(double(logits[size_t(idx[size_t(i)])]) - lse)});
  }
}

}  // namespace

SampleResult token_logprobs(std::span<const float> logits, int32_t token, int32_t top) {
  SampleResult r;
  r.token = token;
  SamplingParams p;
  p.top_logprobs = top;
  fill_logprobs(logits, p, r);
  return r;
}

SamplerState::SamplerState(uint64_t seed, std::span<const int32_t> prompt, bool track_tokens)
    : track_(track_tokens) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
  if (!track_) return;
  for (int32_t t : prompt) ++seen_[t];
}

void SamplerState::record(int32_t token) {
  if (!track_) return;
  ++output_counts_[token];
  ++seen_[token];
}

double SamplerState::uniform() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return double(result >> 11) * 0x1.0p-53;
}

namespace {

SampleResult sample_masked(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                           std::vector<float>& scratch, TokenConstraint* constraint, const TokenMask* mask) {
  DSA_CHECK(!logits.empty(), "sampler: empty logits");
  // Without bias, penalties or a constraint the raw row is read in place (no copy of [vocab] floats).
  std::span<const float> x = logits;
  const bool masked = constraint != nullptr || mask != nullptr;
  if (masked || !no_processing(params)) {
    process_logits(logits, params, state, scratch);
    if (masked) apply_constraint(constraint, mask, scratch);
    x = scratch;
  }
  SampleResult r;
  if (params.temperature <= 0.0f) {
    r.token = argmax(x);
  } else if (!filtered(x, params)) {
    r.token = draw_unfiltered(x, params, state.uniform());
  } else {
    const auto c = candidates(x, params);
    const double u = state.uniform();
    double cum = 0;
    r.token = c.back().first;
    for (const auto& [t, pr] : c) {
      cum += pr;
      if (u < cum) {
        r.token = t;
        break;
      }
    }
  }
  if (params.logprobs || params.top_logprobs > 0) fill_logprobs(logits, params, r);
  return r;
}

std::vector<double> distribution_masked(std::span<const float> logits, const SamplingParams& params,
                                        const SamplerState& state, TokenConstraint* constraint,
                                        const TokenMask* mask) {
  std::vector<float> x;
  process_logits(logits, params, state, x);
  if (constraint != nullptr || mask != nullptr) apply_constraint(constraint, mask, x);
  std::vector<double> dist(logits.size(), 0.0);
  if (params.temperature <= 0.0f) {
    dist[size_t(argmax(x))] = 1.0;
    return dist;
  }
  for (const auto& [t, pr] : candidates(x, params)) dist[size_t(t)] = pr;
  return dist;
}

}  // namespace

SampleResult sample(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                    std::vector<float>& scratch, TokenConstraint* constraint) {
  return sample_masked(logits, params, state, scratch, constraint, nullptr);
}

SampleResult sample(std::span<const float> logits, const SamplingParams& params, SamplerState& state,
                    std::vector<float>& scratch, const TokenMask* mask) {
  return sample_masked(logits, params, state, scratch, nullptr, mask);
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          const SamplerState& state, TokenConstraint* constraint) {
  return distribution_masked(logits, params, state, constraint, nullptr);
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          const SamplerState& state, const TokenMask* mask) {
  return distribution_masked(logits, params, state, nullptr, mask);
}

}  // namespace dsaserve::runtime
