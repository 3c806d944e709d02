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
};

/// §19.5's count of one token: every expert's bin of `(c - y[e] - lower) * scale`, clamped, NaN into bin 0.
inline void count_token(float c, const float* y, int E, float lower, float scale, int num_bins,
                        std::vector<std::int32_t>& hist) {
  for (int e = 0; e < E; ++e) {
    const float z = ((c - y[e]) - lower) * scale;
    int bin = 0;
    if (!(z >= 0.0f))
      bin = 0;
    else if (z >= static_cast<float>(num_bins))
      bin = num_bins - 1;
    else
      bin = static_cast<int>(std::floor(z));
    ++hist[static_cast<std::size_t>(e) * num_bins + bin];
  }
}

/// \p x [T, E] logits as FP32, \p b [E] bias as FP32, \p lower / \p upper the bin bounds.
inline Result route(const std::vector<float>& x, const std::vector<float>& b, int T, int E, int k, float sf,
                    float lower, float upper, int num_bins, TieRule tie_rule = TieRule::LowerIndexFirst) {
  Result r;
  r.routes.assign(static_cast<std::size_t>(T) * k, -1);
  r.weights.assign(static_cast<std::size_t>(T) * k, 0.0f);
  r.intermediate.assign(static_cast<std::size_t>(T) * E, 0.0f);
  r.cutoff.assign(T, 0.0f);
  r.hist.assign(static_cast<std::size_t>(E) * num_bins, 0);
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
    count_token(c, y.data(), E, lower, scale, num_bins, r.hist);
  }
  return r;
}

/// The counts §19.5 gives for an implementation's own `cutoff` [T] and `intermediate` [T, E]. Binning is FP32
/// subtraction, subtraction, multiplication and floor: no `expf`, no contraction, so a backend whose `expf` differs
/// from the host's must still produce exactly these counts (its cutoff and intermediate are checked within §16.1).
inline std::vector<std::int32_t> recount(const std::vector<float>& cutoff, const std::vector<float>& intermediate,
                                         int T, int E, float lower, float upper, int num_bins) {
  std::vector<std::int32_t> hist(static_cast<std::size_t>(E) * num_bins, 0);
  const float scale = static_cast<float>(num_bins) / (upper - lower);
  for (int t = 0; t < T; ++t)
    count_token(cutoff[t], intermediate.data() + static_cast<std::size_t>(t) * E, E, lower, scale, num_bins, hist);
  return hist;
}

}  // namespace KokkosMoETest::QbOracle

#endif
