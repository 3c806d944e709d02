/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTE_REPORT_HPP
#define KOKKOSMOE_ROUTE_REPORT_HPP

// kokkosmoe-route's report: what route.cpp measured, and the text / JSON summaries. Plain C++ (no Kokkos), so
// route_report.cpp is compiled by the host compiler even in CUDA builds.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace KokkosMoE {
namespace App {

/// One timed operation: median and minimum of the fenced repeats, and the bytes per token it must move.
struct TimingRow {
  std::string name, what;
  double bytes_per_token = 0;
  double median_us = 0, min_us = 0;
};

/// The Quantile Balancing by-products of one call (kokkosmoe-route --qb, docs/router.md §19).
struct QbSummary {
  bool on = false;
  int bins = 0;
  float lower = 0, upper = 0;
  std::string mode;
  double cutoff_min = 0, cutoff_mean = 0, cutoff_max = 0;  // over the finite cutoffs
  std::int64_t cutoff_non_finite = 0;
  std::int64_t counts = 0;                   // the histogram's total after one call: tokens * experts
  std::int64_t first_bin = 0, last_bin = 0;  // counts in bin 0 and in the last bin (out-of-range values clamp there)
  std::vector<double> median_bias;           // per expert: the centre of the bin holding its median count
};

/// Everything the summary prints. Derived statistics (min/mean/max, imbalance, histogram) are computed when printed.
struct RouteReport {
  // configuration
  std::string preset, model, score_function, dtype, map_format, bias;
  std::int64_t tokens = 0;
  int num_experts = 0, topk = 0, num_groups = 0, group_topk = 0;
  float scaling_factor = 1.0f;
  std::uint64_t seed = 0;
  // backend
  std::string kokkos_version, execution_space, backend, implementation;
  int concurrency = 0;
  // routing
  std::vector<std::int64_t> tokens_per_expert;
  std::int64_t bad_rows = 0, group_violations = 0, nonzero_off_map = 0, non_finite = 0;
  double routed_prob_sum = 0, grad_logits_l2 = 0;
  // aux loss
  float aux_loss = 0, aux_const = 0;
  double aux_coeff = 0;  // as given on the command line (the kernels use it as FP32)
  // timing
  int repeats = 0;
  std::vector<TimingRow> timings;
  // Quantile Balancing
  QbSummary qb;

  bool pass() const;
};

/// The human-readable summary; its last line is "routing check: PASS (...)" or "routing check: FAIL (...)".
void print_text(std::ostream& out, const RouteReport& r);
/// The same as one JSON object ("routing_check": "PASS" | "FAIL").
void print_json(std::ostream& out, const RouteReport& r);

}  // namespace App
}  // namespace KokkosMoE

#endif
