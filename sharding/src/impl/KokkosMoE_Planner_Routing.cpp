/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Routing statistics of the planner (docs/planner.md §3): the probability that a token sends to a given EP rank,
// exactly, for uniform and group-limited top-k. No sampling: closed forms and small DPs over the groups that
// overlap a rank. Binomial ratios are products of k ratios (or log-gamma differences), never factorials.

#include <impl/KokkosMoE_Planner_Internal.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace KokkosMoE {

const char* to_string(TokenDType t) noexcept {
  switch (t) {
    case TokenDType::BF16:
      return "bf16";
    case TokenDType::FP16:
      return "fp16";
    case TokenDType::FP32:
      return "fp32";
    case TokenDType::FP8:
      return "fp8";
  }
  return "unknown";
}

std::optional<TokenDType> token_dtype_from_string(std::string_view s) {
  for (int i = 0; i <= 3; ++i)
    if (s == to_string(static_cast<TokenDType>(i))) return static_cast<TokenDType>(i);
  return std::nullopt;
}

double token_row_bytes(TokenDType t, int hidden) { return static_cast<double>(Impl::token_row_bytes_exact(t, hidden)); }

namespace Impl {

std::int64_t token_row_bytes_exact(TokenDType t, int hidden) {
  const std::int64_t H = hidden;  // 64 bits: 4 * H and H + 127 overflow int for hidden near 2^31
  switch (t) {
    case TokenDType::BF16:
    case TokenDType::FP16:
      return 2 * H;
    case TokenDType::FP32:
      return 4 * H;
    case TokenDType::FP8:
      return H + 4 * ((H + 127) / 128);  // e4m3 data + one FP32 scale per 128 elements
  }
  return 0;
}

std::optional<std::int64_t> checked_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

}  // namespace Impl

const char* to_string(RoutingModel m) noexcept {
  switch (m) {
    case RoutingModel::Auto:
      return "auto";
    case RoutingModel::Uniform:
      return "uniform";
    case RoutingModel::GroupQuota:
      return "group-quota";
    case RoutingModel::GroupUniformExperts:
      return "group-uniform-experts";
  }
  return "unknown";
}

std::optional<RoutingModel> routing_model_from_string(std::string_view s) {
  for (int i = 0; i <= 3; ++i)
    if (s == to_string(static_cast<RoutingModel>(i))) return static_cast<RoutingModel>(i);
  return std::nullopt;
}

double binomial_ratio(std::int64_t a, std::int64_t b, std::int64_t k) {
  if (a < 0 || a > b || k < 0 || k > b)
    throw InvalidArgument("binomial_ratio", "a, b, k", Rule::ConfigValue,
                          "C(a, k) / C(b, k) needs 0 <= a <= b and 0 <= k <= b; got a = " + std::to_string(a) +
                              ", b = " + std::to_string(b) + ", k = " + std::to_string(k));
  if (k > a) return 0.0;
  double r = 1.0;
  for (std::int64_t i = 0; i < k && r != 0.0; ++i) r *= static_cast<double>(a - i) / static_cast<double>(b - i);
  return r;
}

namespace Impl {

void validate_layer(const char* fn, const MoeLayerConfig& l) {
  auto fail = [fn](const char* param, Rule rule, const std::string& msg) {
    throw InvalidArgument(fn, param, rule, msg);
  };
  const std::string E = std::to_string(l.num_experts);
  if (l.num_experts < 1) fail("num_experts", Rule::NumExpertsPositive, "num_experts (" + E + ") must be >= 1");
  if (l.num_experts > kMaxPlanExperts)
    fail("num_experts", Rule::ConfigValue,
         "num_experts (" + E + ") exceeds the planner's limit of " + std::to_string(kMaxPlanExperts) + " experts");
  if (l.topk < 1 || l.topk > l.num_experts)
    fail("topk", Rule::TopkRange, "topk (" + std::to_string(l.topk) + ") must be in [1, num_experts = " + E + "]");
  if (l.grouped()) {
    const std::string G = std::to_string(l.num_groups), gk = std::to_string(l.group_topk);
    if (l.num_groups < 1)
      fail("num_groups", Rule::GroupCountPositive,
           "group-limited routing (group_topk = " + gk + ") needs num_groups >= 1; got " + G);
    if (l.group_topk > l.num_groups)
      fail("group_topk", Rule::GroupTopkRange, "group_topk (" + gk + ") must be <= num_groups (" + G + ")");
    if (l.num_experts % l.num_groups != 0)
      fail("num_groups", Rule::GroupDivisibility,
           "num_experts (" + E + ") must be a multiple of num_groups (" + G + ")");
    if (l.topk % l.group_topk != 0)
      fail("group_topk", Rule::TopkGroupDivisibility,
           "topk (" + std::to_string(l.topk) + ") must be a multiple of group_topk (" + gk + ")");
    if (l.topk / l.group_topk > l.num_experts / l.num_groups)
      fail("group_topk", Rule::TopkPerGroupRange,
           "topk / group_topk (" + std::to_string(l.topk / l.group_topk) + ") must be <= num_experts / num_groups (" +
               std::to_string(l.num_experts / l.num_groups) + ")");
  }
  if (l.hidden_size < 1)
    fail("hidden_size", Rule::ConfigValue, "hidden_size (" + std::to_string(l.hidden_size) + ") must be >= 1");
  if (l.tokens_per_rank < 0)
    fail("tokens_per_rank", Rule::ConfigValue,
         "tokens_per_rank (" + std::to_string(l.tokens_per_rank) + ") must be >= 0");
  for (TokenDType t : {l.dispatch_dtype, l.combine_dtype})
    if (static_cast<int>(t) < 0 || static_cast<int>(t) > 3)
      fail("dispatch_dtype", Rule::ConfigValue,
           "token dtype value " + std::to_string(static_cast<int>(t)) + " is not bf16, fp16, fp32 or fp8");
  if (static_cast<int>(l.routing_model) < 0 || static_cast<int>(l.routing_model) > 3)
    fail("routing_model", Rule::ConfigValue,
         "routing_model value " + std::to_string(static_cast<int>(l.routing_model)) + " is unknown");
}

RoutingModel resolve_model(const MoeLayerConfig& l) {
  if (!l.grouped()) return RoutingModel::Uniform;  // the group models need groups
  return l.routing_model == RoutingModel::Auto ? RoutingModel::GroupQuota : l.routing_model;
}

namespace {

// ln n! without std::lgamma, which writes the global `signgam` (a data race when two threads plan at once):
// exact products up to 20! (every one is a double), the Stirling series beyond (its first omitted term,
// 691 / (360360 n^11), is below 1e-17 there). Pure function of n: thread-safe and the same on every platform.
double log_factorial(std::int64_t n) {
  if (n <= 20) {
    double f = 1.0;
    for (std::int64_t k = 2; k <= n; ++k) f *= static_cast<double>(k);
    return std::log(f);
  }
  const double x = static_cast<double>(n), inv = 1.0 / x, inv2 = inv * inv;
  const double series = inv * (1.0 / 12 - inv2 * (1.0 / 360 - inv2 * (1.0 / 1260 - inv2 * (1.0 / 1680 - inv2 / 1188))));
  return x * std::log(x) - x + 0.5 * std::log(2.0 * 3.14159265358979323846 * x) + series;
}

// ln C(n, r) for 0 <= r <= n.
double log_choose(std::int64_t n, std::int64_t r) { return log_factorial(n) - log_factorial(r) - log_factorial(n - r); }

// The group DPs cost o * (jmax + 1) steps (GroupQuota) or o * (jmax + 1) * (M + 1) steps and (jmax + 1) * (M + 1)
// doubles (GroupUniformExperts); layers beyond these bounds are refused rather than planned for minutes.
constexpr double kMaxGroupDpSteps = double(1 << 26);
constexpr double kMaxGroupDpCells = double(1 << 22);

// P(a uniformly random gk-subset of G groups meets the o groups overlapping a rank in one given j-subset exactly):
// C(G - o, gk - j) / C(G, gk), through log-gamma (G can be large; the value can be tiny).
double subset_weight(int G, int gk, int o, int j) {
  if (j > gk || gk - j > G - o) return 0.0;
  return std::exp(log_choose(G - o, gk - j) - log_choose(G, gk));
}

// P(rank not hit) for the group models. `overlap` lists, per group overlapping the rank, how many of the group's
// experts live on the rank.
double miss_probability_grouped(const MoeLayerConfig& l, RoutingModel model, const std::vector<int>& overlap) {
  const int G = l.num_groups, gk = l.group_topk, gs = l.num_experts / G, o = static_cast<int>(overlap.size());
  const int jmax = std::min(o, gk);
  const double cells = model == RoutingModel::GroupQuota ? double(jmax + 1) : double(jmax + 1) * (double(gk) * gs + 1);
  if (double(o) * cells > kMaxGroupDpSteps || cells > kMaxGroupDpCells)
    throw InvalidArgument("rank_hit_probabilities", "routing_model", Rule::ConfigValue,
                          std::string("the ") + to_string(model) + " statistics of num_groups = " + std::to_string(G) +
                              ", group_topk = " + std::to_string(gk) + " over " + std::to_string(l.num_experts) +
                              " experts need more than 2^26 steps; choose routing_model uniform (or group-quota)");
  if (model == RoutingModel::GroupQuota) {
    // Each selected group contributes kg = k/gk experts uniform within the group: the group misses the rank with
    // probability C(gs - c, kg) / C(gs, kg). dp[j] = sum over j-subsets A of the overlapping groups of prod q(A).
    const int kg = l.topk / gk;
    std::vector<double> dp(jmax + 1, 0.0);
    dp[0] = 1.0;
    for (int c : overlap) {
      const double q = binomial_ratio(gs - c, gs, kg);
      for (int j = jmax; j >= 1; --j) dp[j] += dp[j - 1] * q;
    }
    double miss = 0.0;
    for (int j = 0; j <= jmax; ++j) miss += dp[j] * subset_weight(G, gk, o, j);
    return miss;
  }
  // GroupUniformExperts: k experts uniform among the M = gk*gs eligible ones; with m of them on the rank, the rank
  // is missed with probability C(M - m, k) / C(M, k). cnt[j][m] counts j-subsets of overlapping groups holding m.
  const int M = gk * gs;
  std::vector<std::vector<double>> cnt(jmax + 1, std::vector<double>(M + 1, 0.0));
  cnt[0][0] = 1.0;
  for (int c : overlap)
    for (int j = jmax; j >= 1; --j)
      for (int m = M; m >= c; --m) cnt[j][m] += cnt[j - 1][m - c];
  double miss = 0.0;
  for (int j = 0; j <= jmax; ++j) {
    const double w = subset_weight(G, gk, o, j);
    if (w == 0.0) continue;
    for (int m = 0; m <= M; ++m)
      if (cnt[j][m] != 0.0) miss += cnt[j][m] * w * binomial_ratio(M - m, M, l.topk);
  }
  return miss;
}

}  // namespace
}  // namespace Impl

double expected_destinations_uniform(int num_experts, int topk, int ep_size) {
  if (num_experts < 1 || topk < 1 || topk > num_experts || ep_size < 1 || num_experts % ep_size != 0)
    throw InvalidArgument(
        "expected_destinations_uniform", "num_experts, topk, ep_size", Rule::PlanInfeasible,
        "needs 1 <= topk <= num_experts and ep_size dividing num_experts; got E = " + std::to_string(num_experts) +
            ", k = " + std::to_string(topk) + ", R = " + std::to_string(ep_size));
  const int L = num_experts / ep_size;
  return ep_size * (1.0 - binomial_ratio(num_experts - L, num_experts, topk));
}

std::vector<double> rank_hit_probabilities(const MoeLayerConfig& layer, int ep_size) {
  constexpr const char* fn = "rank_hit_probabilities";
  Impl::validate_layer(fn, layer);
  if (ep_size < 1 || layer.num_experts % ep_size != 0)
    throw InvalidArgument(fn, "ep_size", Rule::PlanInfeasible,
                          "ep_size (" + std::to_string(ep_size) + ") must divide num_experts (" +
                              std::to_string(layer.num_experts) + ") for a contiguous expert placement");
  const RoutingModel model = Impl::resolve_model(layer);
  const int E = layer.num_experts, L = E / ep_size;
  std::vector<double> p(ep_size, 1.0);
  if (L == E) return p;  // one rank holds every expert
  if (model == RoutingModel::Uniform) {
    const double hit = 1.0 - binomial_ratio(E - L, E, layer.topk);
    std::fill(p.begin(), p.end(), hit);
    return p;
  }
  const int gs = E / layer.num_groups;
  std::map<std::vector<int>, double> cache;  // overlap signature -> hit probability (ranks repeat with a period)
  for (int r = 0; r < ep_size; ++r) {
    std::vector<int> overlap;
    const int lo = r * L, hi = lo + L;
    for (int g = lo / gs; g * gs < hi; ++g) overlap.push_back(std::min(hi, (g + 1) * gs) - std::max(lo, g * gs));
    std::sort(overlap.begin(), overlap.end());
    auto it = cache.find(overlap);
    if (it == cache.end()) {
      const double hit = 1.0 - Impl::miss_probability_grouped(layer, model, overlap);
      it = cache.emplace(overlap, std::clamp(hit, 0.0, 1.0)).first;
    }
    p[r] = it->second;
  }
  return p;
}

}  // namespace KokkosMoE
