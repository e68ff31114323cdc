#pragma once
// Chi-square tests for the sampling tests: goodness of fit of observed counts against exact
// probabilities, and homogeneity of two samples (the same distribution?). Bins whose expected count is
// below `min_expected` are pooled into one bin (the approximation needs about 5 per bin).
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

namespace dsaserve::testing {

struct ChiSquare {
  double stat = 0;
  int64_t df = 0;
  double p_value = 1;  // upper tail
};

// Upper tail of the chi-square distribution with `df` degrees of freedom (Wilson-Hilferty: accurate to
// ~1e-3 in p for df >= 3, enough to tell 1e-3 from 1e-20).
inline double chi_square_upper_tail(double stat, int64_t df) {
  if (df <= 0) return 1.0;
  const double k = double(df);
  const double z = (std::cbrt(stat / k) - (1.0 - 2.0 / (9.0 * k))) / std::sqrt(2.0 / (9.0 * k));
  return 0.5 * std::erfc(z / std::sqrt(2.0));
}

// `counts[i]` observed for a category of probability `probs[i]`.
inline ChiSquare chi_square_fit(const std::vector<int64_t>& counts, const std::vector<double>& probs,
                                double min_expected = 5.0) {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  ChiSquare r;
  double pool_obs = 0, pool_exp = 0;
  int64_t bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * double(n);
    if (e < min_expected) {
      pool_obs += double(counts[i]);
      pool_exp += e;
      continue;
    }
    r.stat += (double(counts[i]) - e) * (double(counts[i]) - e) / e;
    ++bins;
  }
  if (pool_exp > 0) {
    r.stat += (pool_obs - pool_exp) * (pool_obs - pool_exp) / pool_exp;
    ++bins;
  }
  r.df = bins - 1;
  r.p_value = chi_square_upper_tail(r.stat, r.df);
  return r;
}

// Two samples of categories (any key): are they drawn from one distribution?
template <class K>
ChiSquare chi_square_homogeneity(const std::map<K, int64_t>& a, const std::map<K, int64_t>& b,
                                 double min_expected = 5.0) {
  double na = 0, nb = 0;
  std::map<K, std::pair<double, double>> both;
  for (const auto& [k, c] : a) {
    both[k].first += double(c);
    na += double(c);
  }
  for (const auto& [k, c] : b) {
    both[k].second += double(c);
    nb += double(c);
  }
  ChiSquare r;
  const double n = na + nb;
  double pa = 0, pb = 0;
  int64_t bins = 0;
  auto add = [&](double x, double y) {
    const double t = x + y;
    const double ea = na * t / n, eb = nb * t / n;
    r.stat += (x - ea) * (x - ea) / ea + (y - eb) * (y - eb) / eb;
    ++bins;
  };
  for (const auto& [k, xy] : both) {
    const double t = xy.first + xy.second;
    if (std::min(na, nb) * t / n < min_expected) {
      pa += xy.first;
      pb += xy.second;
      continue;
    }
    add(xy.first, xy.second);
  }
  if (pa + pb > 0) add(pa, pb);
  r.df = bins - 1;
  r.p_value = chi_square_upper_tail(r.stat, r.df);
  return r;
}

}  // namespace dsaserve::testing
