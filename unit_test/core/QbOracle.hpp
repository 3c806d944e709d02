/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_QBORACLE_HPP
#define KOKKOSMOE_TEST_QBORACLE_HPP

// The Quantile Balancing oracle (docs/router.md §19.4, §19.5): plain loops in FP32 with the contract's operation
// order, written from the text alone (no library header). The expert order is a stable sort by the biased score,
// larger first, -0.0 equal to +0.0, every NaN after every number, lower index first on equal scores (§6, §7).
// `tie_rule` exists to show that the edge-case tests can fail: HigherIndexFirst breaks equal scores the other way.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace KokkosMoETest::QbOracle {

enum class TieRule { LowerIndexFirst, HigherIndexFirst };

struct Result {
  std::vector<int> routes;          ///< [T, k] slot order
  std::vector<float> weights;       ///< [T, k] scaling_factor * v[i] in FP32, before the rounding to the output type
  std::vector<float> intermediate;  ///< [T, E]
  std::vector<float> cutoff;        ///< [T]
  std::vector<std::int32_t> hist;   ///< [E, num_bins]: the counts of this batch only
  std::vector<double> z;            ///< [T, E] the bin coordinate of every pair (for the bounded histogram check)
};

/// \p x [T, E] logits as FP32, \p b [E] bias as FP32, \p lower / \p upper the bin bounds.
inline Result route(const std::vector<float>& x, const std::vector<float>& b, int T, int E, int k, float sf,
                    float lower, float upper, int num_bins, TieRule tie_rule = TieRule::LowerIndexFirst) {
  Result r;
  r.routes.assign(static_cast<std::size_t>(T) * k, -1);
  r.weights.assign(static_cast<std::size_t>(T) * k, 0.0f);
  r.intermediate.assign(static_cast<std::size_t>(T) * E, 0.0f);
  r.cutoff.assign(T, 0.0f);
  r.hist.assign(static_cast<std::size_t>(E) * num_bins, 0);
  r.z.assign(static_cast<std::size_t>(T) * E, 0.0);
  const float scale = static_cast<float>(num_bins) / (upper - lower);
  std::vector<float> y(E), s(E);
  std::vector<int> order(E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      y[e] = 1.0f / (1.0f + std::exp(-x[static_cast<std::size_t>(t) * E + e]));
      s[e] = y[e] + b[e];
      r.intermediate[static_cast<std::size_t>(t) * E + e] = y[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int i, int j) {
      const bool ni = std::isnan(s[i]), nj = std::isnan(s[j]);
      if (ni != nj) return nj;                      // numbers before NaN
      if (!ni && s[i] != s[j]) return s[i] > s[j];  // -0.0 == +0.0 here
      return tie_rule == TieRule::LowerIndexFirst ? i < j : i > j;
    });
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += y[order[i]];
    for (int i = 0; i < k; ++i) {
      float v = y[order[i]];
      if (k > 1) v = v / (sum + 1e-20f);
      r.routes[static_cast<std::size_t>(t) * k + i] = order[i];
      r.weights[static_cast<std::size_t>(t) * k + i] = sf * v;
    }
    const float c = s[order[k]];
    r.cutoff[t] = c;
    for (int e = 0; e < E; ++e) {
      const float z = ((c - y[e]) - lower) * scale;
      r.z[static_cast<std::size_t>(t) * E + e] = z;
      int bin = 0;
      if (!(z >= 0.0f))
        bin = 0;
      else if (z >= static_cast<float>(num_bins))
        bin = num_bins - 1;
      else
        bin = static_cast<int>(std::floor(z));
      ++r.hist[static_cast<std::size_t>(e) * num_bins + bin];
    }
  }
  return r;
}

/// §19.10's bounded check, for an implementation whose expf may differ from the oracle's: per expert equal totals,
/// and every cumulative count between the one with the ambiguous pairs (z within 1e-4 of an integer) in their upper
/// bin and the one with them in their lower bin. Returns the first expert that fails, or -1.
inline int bounded_histogram_mismatch(const Result& o, const std::vector<std::int32_t>& got, int T, int E,
                                      int num_bins) {
  std::vector<std::int64_t> lo(static_cast<std::size_t>(E) * num_bins, 0), hi(lo.size(), 0);
  auto bin_of = [&](double z) {
    if (!(z >= 0.0)) return 0;
    if (z >= num_bins) return num_bins - 1;
    return static_cast<int>(std::floor(z));
  };
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      const double z = o.z[static_cast<std::size_t>(t) * E + e];
      const double near = std::nearbyint(z);
      const bool ambiguous = std::isfinite(z) && std::fabs(z - near) <= 1e-4;
      const int b_lo = ambiguous ? bin_of(near - 0.5) : bin_of(z), b_hi = ambiguous ? bin_of(near + 0.5) : bin_of(z);
      ++lo[static_cast<std::size_t>(e) * num_bins + b_lo];
      ++hi[static_cast<std::size_t>(e) * num_bins + b_hi];
    }
  for (int e = 0; e < E; ++e) {
    std::int64_t c_got = 0, c_lo = 0, c_hi = 0;
    for (int j = 0; j < num_bins; ++j) {
      const std::size_t i = static_cast<std::size_t>(e) * num_bins + j;
      c_got += got[i];
      c_lo += lo[i];
      c_hi += hi[i];
      if (c_got < c_hi || c_got > c_lo) return e;
    }
    if (c_got != T) return e;
  }
  return -1;
}

}  // namespace KokkosMoETest::QbOracle

#endif
