/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include "route_report.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>

namespace KokkosMoE {
namespace App {
namespace {

struct Stats {
  double mean = 0, cv = 0, imbalance = 0;
  std::int64_t min = 0, max = 0, empty = 0;
  std::vector<int> most, least;
  std::vector<std::int64_t> group_load;
  std::vector<std::int64_t> hist;  // experts per relative-load bin
};

// Experts by relative load (tokens / mean): upper bin edges and labels.
const std::vector<std::pair<double, const char*>>& bins() {
  static const std::vector<std::pair<double, const char*>> b = {
      {0.5, "< 0.50"},     {0.8, "0.50-0.80"},
      {0.9, "0.80-0.90"},  {1.1, "0.90-1.10"},
      {1.25, "1.10-1.25"}, {1.5, "1.25-1.50"},
      {2.0, "1.50-2.00"},  {std::numeric_limits<double>::infinity(), ">= 2.00"}};
  return b;
}

Stats stats(const RouteReport& r) {
  Stats s;
  const auto& c = r.tokens_per_expert;
  const int E = static_cast<int>(c.size());
  if (E == 0) return s;
  s.mean = static_cast<double>(r.tokens) * r.topk / E;
  const auto [mn, mx] = std::minmax_element(c.begin(), c.end());
  s.min = *mn;
  s.max = *mx;
  s.empty = std::count(c.begin(), c.end(), std::int64_t(0));
  double var = 0;
  for (auto v : c) var += (v - s.mean) * (v - s.mean);
  s.cv = s.mean > 0 ? std::sqrt(var / E) / s.mean : 0.0;
  s.imbalance = s.mean > 0 ? s.max / s.mean : 0.0;
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[a] > c[b]; });
  const int top = std::min(5, E);
  s.most.assign(order.begin(), order.begin() + top);
  s.least.assign(order.rbegin(), order.rbegin() + top);
  s.hist.assign(bins().size(), 0);
  for (auto v : c) {
    const double rel = s.mean > 0 ? v / s.mean : 0.0;
    std::size_t b = 0;
    while (rel >= bins()[b].first) ++b;
    ++s.hist[b];
  }
  if (r.group_topk > 0 && r.num_groups > 0) {
    const int gs = E / r.num_groups;
    for (int g = 0; g < r.num_groups; ++g)
      s.group_load.push_back(std::accumulate(c.begin() + g * gs, c.begin() + (g + 1) * gs, std::int64_t(0)));
  }
  return s;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string si(double v) {  // 1.23 M, 45.6 k, ...
  const char* units[] = {"", " k", " M", " G", " T"};
  int u = 0;
  while (std::fabs(v) >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  return fmt(v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v) + units[u];
}

std::string check_text(const RouteReport& r) {
  if (r.pass())
    return "PASS (every token routed to exactly " + std::to_string(r.topk) + " experts" +
           (r.group_topk > 0 ? " in <= " + std::to_string(r.group_topk) + " groups" : std::string()) +
           "; probs zero off the map; outputs and aux loss finite" +
           (r.qb.on ? "; every cutoff finite, one histogram count per token and expert" : "") + ")";
  return "FAIL (" + std::to_string(r.bad_rows) + " tokens without exactly k experts, " +
         std::to_string(r.group_violations) + " over the group limit, " + std::to_string(r.nonzero_off_map) +
         " non-zero probs off the map, " + std::to_string(r.non_finite) + " non-finite values, aux loss " +
         fmt("%g", r.aux_loss) +
         (r.qb.on
              ? ", " + std::to_string(r.qb.cutoff_non_finite) + " non-finite cutoffs, " + std::to_string(r.qb.counts) +
                    " histogram counts for " + std::to_string(r.tokens * r.num_experts) + " pairs"
              : std::string()) +
         ")";
}

}  // namespace

bool RouteReport::pass() const {
  const bool qb_ok = !qb.on || (qb.counts == tokens * num_experts && qb.cutoff_non_finite == 0);
  return bad_rows == 0 && group_violations == 0 && nonzero_off_map == 0 && non_finite == 0 && std::isfinite(aux_loss) &&
         qb_ok;
}

void print_text(std::ostream& out, const RouteReport& r) {
  const Stats s = stats(r);
  const bool grouped = r.group_topk > 0;
  std::ostringstream o;
  o << "KokkosMoE route: " << r.preset << " (" << r.model << "), " << r.tokens << " tokens, " << r.dtype << "\n";
  o << "config    E=" << r.num_experts << "  k=" << r.topk << "  " << r.score_function;
  if (grouped)
    o << "  groups " << r.num_groups << ", top-" << r.group_topk << " groups (group score = top-"
      << r.topk / r.group_topk << " sum)";
  o << "  scale " << r.scaling_factor << "\n          expert bias " << r.bias << "; map " << r.map_format << "; seed "
    << r.seed << "; logits ~N(0, 1) per element\n";
  o << "backend   Kokkos " << r.kokkos_version << ", " << r.backend << "; " << r.implementation << "\n";
  o << "routing   tokens per expert: min " << s.min << " / mean " << fmt("%.1f", s.mean) << " / max " << s.max
    << "; imbalance (max/mean) " << fmt("%.3f", s.imbalance) << "; cv " << fmt("%.3f", s.cv)
    << "; experts without tokens: " << s.empty << "\n";
  o << "          most loaded :";
  for (int e : s.most) o << " " << e << " (" << r.tokens_per_expert[e] << ")";
  o << "\n          least loaded:";
  for (int e : s.least) o << " " << e << " (" << r.tokens_per_expert[e] << ")";
  o << "\n";
  if (!s.group_load.empty()) {
    const auto [gmin, gmax] = std::minmax_element(s.group_load.begin(), s.group_load.end());
    o << "          expert slots per group: min " << *gmin << " / max " << *gmax << "\n";
  }
  if (r.num_experts <= 16) {
    o << "          tokens per expert:\n";
    for (int e = 0; e < r.num_experts; ++e) {
      const std::int64_t c = r.tokens_per_expert[e];
      const int w = s.max > 0 ? static_cast<int>(std::lround(40.0 * c / s.max)) : 0;
      char line[64];
      std::snprintf(line, sizeof(line), "            %4d %9lld ", e, static_cast<long long>(c));
      o << line << std::string(w, '#') << "\n";
    }
  } else {
    o << "          experts by load / mean:\n";
    const std::int64_t hmax = *std::max_element(s.hist.begin(), s.hist.end());
    for (std::size_t b = 0; b < s.hist.size(); ++b) {
      if (s.hist[b] == 0) continue;
      const int w = std::max(1, static_cast<int>(std::lround(40.0 * s.hist[b] / hmax)));
      char line[64];
      std::snprintf(line, sizeof(line), "            %-9s %6lld ", bins()[b].second, static_cast<long long>(s.hist[b]));
      o << line << std::string(w, '#') << "\n";
    }
  }
  o << "aux loss  " << fmt("%.6g", r.aux_loss) << " (coeff " << r.aux_coeff << ", Const " << fmt("%.4g", r.aux_const)
    << "); grad_logits L2 norm " << fmt("%.6g", r.grad_logits_l2) << "\n";
  if (r.qb.on) {
    const auto [mlo, mhi] = std::minmax_element(r.qb.median_bias.begin(), r.qb.median_bias.end());
    double mean = 0;
    for (double v : r.qb.median_bias) mean += v;
    mean /= std::max<std::size_t>(1, r.qb.median_bias.size());
    o << "QB        cutoff (biased score of the (k+1)-th expert): min " << fmt("%.4f", r.qb.cutoff_min) << " / mean "
      << fmt("%.4f", r.qb.cutoff_mean) << " / max " << fmt("%.4f", r.qb.cutoff_max) << "; non-finite "
      << r.qb.cutoff_non_finite << "\n";
    o << "          histogram " << r.num_experts << " x " << r.qb.bins << " bins over [" << r.qb.lower << ", "
      << r.qb.upper << "] (" << r.qb.mode << "): " << r.qb.counts << " counts (" << r.tokens * r.num_experts
      << " expected), " << r.qb.first_bin << " in the first bin, " << r.qb.last_bin << " in the last\n";
    o << "          required bias at each expert's median: min " << fmt("%.4f", *mlo) << " / mean " << fmt("%.4f", mean)
      << " / max " << fmt("%.4f", *mhi) << "\n";
  }
  o << "timing    median of " << r.repeats << " fenced calls after one warm-up\n";
  for (const auto& t : r.timings) {
    const double sec = t.median_us * 1e-6;
    char line[256];
    std::snprintf(line, sizeof(line), "          %-18s %10.1f us  %9stokens/s  %8.2f GB/s   (%s; %.0f B/token)\n",
                  t.name.c_str(), t.median_us, si(r.tokens / sec).c_str(), t.bytes_per_token * r.tokens / sec / 1e9,
                  t.what.c_str(), t.bytes_per_token);
    o << line;
  }
  o << "routing check: " << check_text(r) << "\n";
  out << o.str() << std::flush;
}

void print_json(std::ostream& out, const RouteReport& r) {
  const Stats s = stats(r);
  nlohmann::json j;
  j["preset"] = r.preset;
  j["model"] = r.model;
  j["config"] = {{"num_experts", r.num_experts},
                 {"topk", r.topk},
                 {"score_function", r.score_function},
                 {"num_groups", r.num_groups},
                 {"group_topk", r.group_topk},
                 {"scaling_factor", r.scaling_factor},
                 {"expert_bias", r.bias},
                 {"dtype", r.dtype},
                 {"map_format", r.map_format},
                 {"tokens", r.tokens},
                 {"seed", r.seed}};
  j["backend"] = {{"kokkos_version", r.kokkos_version},
                  {"execution_space", r.execution_space},
                  {"description", r.backend},
                  {"concurrency", r.concurrency},
                  {"implementation", r.implementation}};
  j["routing"] = {{"tokens_per_expert", r.tokens_per_expert},
                  {"min", s.min},
                  {"mean", s.mean},
                  {"max", s.max},
                  {"imbalance", s.imbalance},
                  {"cv", s.cv},
                  {"experts_without_tokens", s.empty},
                  {"most_loaded", s.most},
                  {"least_loaded", s.least},
                  {"mean_routed_prob_sum", r.tokens > 0 ? r.routed_prob_sum / r.tokens : 0.0},
                  {"grad_logits_l2", r.grad_logits_l2}};
  if (!s.group_load.empty()) j["routing"]["expert_slots_per_group"] = s.group_load;
  j["aux_loss"] = {{"loss", r.aux_loss}, {"const", r.aux_const}, {"coeff", r.aux_coeff}};
  nlohmann::json tj = nlohmann::json::array();
  for (const auto& t : r.timings) {
    const double sec = t.median_us * 1e-6;
    tj.push_back({{"name", t.name},
                  {"what", t.what},
                  {"median_us", t.median_us},
                  {"min_us", t.min_us},
                  {"repeats", r.repeats},
                  {"tokens_per_s", r.tokens / sec},
                  {"bytes_per_token", t.bytes_per_token},
                  {"GBps", t.bytes_per_token * r.tokens / sec / 1e9}});
  }
  j["timing"] = tj;
  if (r.qb.on) {
    nlohmann::json q;
    q["bins"] = r.qb.bins;
    q["bounds"] = {r.qb.lower, r.qb.upper};
    q["mode"] = r.qb.mode;
    q["cutoff"] = {{"min", r.qb.cutoff_min},
                   {"mean", r.qb.cutoff_mean},
                   {"max", r.qb.cutoff_max},
                   {"non_finite", r.qb.cutoff_non_finite}};
    q["histogram"] = {{"counts", r.qb.counts},
                      {"expected", r.tokens * r.num_experts},
                      {"first_bin", r.qb.first_bin},
                      {"last_bin", r.qb.last_bin}};
    q["median_required_bias"] = r.qb.median_bias;
    j["qb"] = q;
  }
  j["routing_check"] = r.pass() ? "PASS" : "FAIL";
  j["routing_check_detail"] = check_text(r);
  out << j.dump(2) << std::endl;
}

}  // namespace App
}  // namespace KokkosMoE
