/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe-route: the main job of the README. Routes a batch of synthetic tokens for a named model preset forward
// and backward (plus the load-balancing aux loss) on the default execution space, i.e. the best backend the Kokkos
// build has, and prints a readable summary: configuration, backend, routing statistics, aux loss, time and
// throughput.
//
//   kokkosmoe-route [--preset deepseek-v3] [--tokens N] [--dtype float|bf16] [--seed S] [--format bytemap|bitmap]
//                   [--repeats R] [--aux-coeff C] [--implementation auto|portable] [--json]
//                   [--qb [--qb-bins N] [--qb-bounds L,U] [--qb-mode fused|two-pass]]
// --qb routes with the Quantile Balancing router (docs/router.md §19; preset kimi-k2 unless --preset names another
// Sigmoid preset with a bias and no grouping) and adds the cutoff and histogram summaries.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_RouterQB.hpp>

#include <Kokkos_Core.hpp>

#include <unistd.h>

#include "KokkosMoE_Cli.hpp"
#include "route_report.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

namespace {

using namespace KokkosMoE;
using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
template <class T>
using View0 = Kokkos::View<T, MemSpace>;
template <class T>
using View1 = Kokkos::View<T*, MemSpace>;
template <class T>
using View2 = Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>;

// --- command line -----------------------------------------------------------------------------------------------

struct Args {
  std::string preset = "deepseek-v3";
  std::int64_t tokens = 16384;
  std::string dtype = "float";
  std::uint64_t seed = 42;
  std::string format = "bytemap";
  int repeats = 5;
  double aux_coeff = 1e-2;
  std::string implementation = "auto";
  bool json = false;
  bool qb = false;                   // Quantile Balancing (docs/router.md §19)
  int qb_bins = 1000;                // histogram bins per expert
  bool qb_bounds_given = false;      // else [min bias - 1, max bias + 1]: every required bias inside
  float qb_lower = 0, qb_upper = 0;  // --qb-bounds L,U
  std::string qb_mode = "fused";     // fused | two-pass
};

void print_usage(std::FILE* out) {
  std::string presets;
  for (const auto& n : router_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  std::fprintf(out,
               "Usage: kokkosmoe-route [options] [Kokkos options]\n"
               "Routes a batch of synthetic tokens (seeded random logits) through a model's MoE router forward and\n"
               "backward, plus the aux loss, on the best available Kokkos backend, and prints a summary.\n\n"
               "  --preset NAME          router preset (default deepseek-v3); one of: %s\n"
               "  --tokens N             tokens in the batch, 1 <= N < 2^31 (default 16384)\n"
               "  --dtype float|bf16     logits / probs / gradient type (default float)\n"
               "  --seed S               seed of the synthetic logits, bias and gradients, 0 <= S < 2^63 (default 42)\n"
               "  --format bytemap|bitmap  routing-map format (default bytemap)\n"
               "  --repeats R            timed repeats after one warm-up, median reported, 1..1000 (default 5)\n"
               "  --aux-coeff C          aux-loss coefficient, finite in FP32 (default 0.01)\n"
               "  --implementation auto|portable  auto: the backend's specialization if any (default)\n"
               "  --json                 print the summary as JSON\n"
               "  --qb                   Quantile Balancing router (docs/router.md §19): cutoff and required-bias\n"
               "                         histogram; preset kimi-k2 unless --preset names another Sigmoid preset with\n"
               "                         an expert bias and no grouping\n"
               "  --qb-bins N            histogram bins per expert, 1..1048576 (default 1000)\n"
               "  --qb-bounds L,U        histogram range, finite, L < U (default [min bias - 1, max bias + 1])\n"
               "  --qb-mode fused|two-pass  the reference's histogram mode; both run the same passes (default fused)\n"
               "  -h, --help             this text\n"
               "Kokkos options (validated here, then passed to Kokkos in the spelling it understands):\n"
               "  --kokkos-num-threads=N (alias --kokkos-threads, 1..1024), --kokkos-device-id=N (0..1023),\n"
               "  --kokkos-num-devices=N[,K], --kokkos-disable-warnings, --kokkos-tune-internals,\n"
               "  --kokkos-tools-libs=PATH, --kokkos-tools-args=ARGS, --kokkos-tools-help, --kokkos-help\n"
               "exit status: 0 routing check passed, 1 error or failed check, 2 usage error\n",
               presets.c_str());
}

const std::vector<Impl::CliFlag> kFlags = {
    {"--preset", true, ""},    {"--tokens", true, ""},  {"--dtype", true, ""},     {"--seed", true, ""},
    {"--format", true, ""},    {"--repeats", true, ""}, {"--aux-coeff", true, ""}, {"--implementation", true, ""},
    {"--json", false, ""},     {"--help", false, "-h"}, {"--qb", false, ""},       {"--qb-bins", true, ""},
    {"--qb-bounds", true, ""}, {"--qb-mode", true, ""},
};

/// One finite FP32 number of a comma-separated flag value, or a usage error naming the flag.
float bound_value(const std::string& flag, const std::string& all, const std::string& part) {
  const char* b = part.c_str();
  char* end = nullptr;
  errno = 0;
  const float v = part.empty() ? 0.0f : std::strtof(b, &end);
  if (part.empty() || end != b + part.size() || errno == ERANGE || !std::isfinite(v) ||
      std::isspace(static_cast<unsigned char>(part[0])))
    throw Impl::CliUsageError(flag + " expects two finite numbers L,U with L < U, got '" + all + "'");
  return v;
}

Args parse_args(const Impl::CliArgs& c) {
  Args a;
  a.preset = c.choice("--preset", router_preset_names(), a.preset);
  a.tokens = c.integer("--tokens", 1, (std::int64_t(1) << 31) - 1, a.tokens);
  const std::string dtype = c.choice("--dtype", {"float", "fp32", "float32", "bf16", "bfloat16"}, a.dtype);
  a.dtype = (dtype == "bf16" || dtype == "bfloat16") ? "bf16" : "float";
  a.seed = static_cast<std::uint64_t>(c.integer("--seed", 0, INT64_MAX, static_cast<std::int64_t>(a.seed)));
  a.format = c.choice("--format", {"bytemap", "bitmap"}, a.format);
  a.repeats = static_cast<int>(c.integer("--repeats", 1, 1000, a.repeats));
  const double fp32_max = static_cast<double>(std::numeric_limits<float>::max());
  a.aux_coeff = c.number("--aux-coeff", -fp32_max, fp32_max, false, false, a.aux_coeff);
  a.implementation = c.choice("--implementation", {"auto", "portable"}, a.implementation);
  a.json = c.has("--json");
  a.qb = c.has("--qb");
  for (const char* f : {"--qb-bins", "--qb-bounds", "--qb-mode"})
    if (c.has(f) && !a.qb) throw Impl::CliUsageError(std::string(f) + " needs --qb");
  if (a.qb && !c.has("--preset")) a.preset = "kimi-k2";
  a.qb_bins = static_cast<int>(c.integer("--qb-bins", 1, 1 << 20, a.qb_bins));
  if (const std::string* v = c.raw("--qb-bounds")) {
    const std::size_t comma = v->find(',');
    if (comma == std::string::npos || v->find(',', comma + 1) != std::string::npos)
      throw Impl::CliUsageError("--qb-bounds expects two finite numbers L,U with L < U, got '" + *v + "'");
    a.qb_lower = bound_value("--qb-bounds", *v, v->substr(0, comma));
    a.qb_upper = bound_value("--qb-bounds", *v, v->substr(comma + 1));
    if (!(a.qb_lower < a.qb_upper))
      throw Impl::CliUsageError("--qb-bounds expects two finite numbers L,U with L < U, got '" + *v + "'");
    a.qb_bounds_given = true;
  }
  a.qb_mode = c.choice("--qb-mode", {"fused", "two-pass"}, a.qb_mode);
  if (a.qb) {
    const RouterPreset p = router_preset(a.preset);
    if (p.config.score_function != ScoreFunction::Sigmoid || !p.has_bias || p.config.group_topk > 0)
      throw Impl::CliUsageError(
          "--qb needs a Sigmoid preset with an expert bias and no grouping (kimi-k2), not --preset " + a.preset);
  }
  return a;
}

/// Bytes route allocates for T tokens of E experts (every View of run<>()), to refuse a batch that cannot fit
/// before allocating it (an over-committed allocation would otherwise end in the OOM killer, not an error).
double route_bytes(std::int64_t T, std::int64_t E, bool bitmap, double scalar_bytes) {
  const double t = static_cast<double>(T), e = static_cast<double>(E);
  const double map = bitmap ? std::ceil(e / 8) : e;
  // logits, probs, grad_probs, grad_logits, aux_grad_logits (Scalar); intermediate, scores, aux_inter, grad_scores
  // (float); routing_map, aux_map (uint8); the host mirrors of map, probs and grad_logits.
  return t * (5 * e * scalar_bytes + 4 * e * 4 + map + e + map + 2 * e * scalar_bytes) + e * 64;
}

// --- synthetic inputs -------------------------------------------------------------------------------------------

KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t x) {  // splitmix64: counter-based, thread-count independent
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

KOKKOS_INLINE_FUNCTION float uniform01(std::uint64_t stream, std::uint64_t j) {  // 24 random bits in [0, 1)
  return static_cast<float>(mix64(stream ^ j) >> 40) * (1.0f / 16777216.0f);
}

/// Every element independently uniform in [lo, hi) (normal = false) or approximately normal with mean lo and
/// standard deviation hi (normal = true: Irwin-Hall sum of four uniforms, within +-3.46 sigma). Every token's row
/// differs, so tokens pick different experts.
template <class View>
void fill_random(const View& v, std::uint64_t seed, float lo, float hi, bool normal = false) {
  using T = typename View::non_const_value_type;
  T* p = v.data();
  const std::uint64_t s = mix64(seed);
  Kokkos::parallel_for(
      "kokkosmoe-route::fill", Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(0, v.span()),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::uint64_t j = 4 * static_cast<std::uint64_t>(i);
        if (normal) {
          const float z = uniform01(s, j) + uniform01(s, j + 1) + uniform01(s, j + 2) + uniform01(s, j + 3);
          p[i] = static_cast<T>(lo + hi * 1.7320508f * (z - 2.0f));
        } else {
          p[i] = static_cast<T>(lo + (hi - lo) * uniform01(s, j));
        }
      });
}

// --- timing -----------------------------------------------------------------------------------------------------

using App::TimingRow;

/// One warm-up, then `repeats` fenced calls; median and minimum in microseconds.
template <class F>
void time_op(TimingRow& t, int repeats, F&& f) {
  ExecSpace exec;
  f();
  exec.fence();
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    exec.fence();
    Kokkos::Timer timer;
    f();
    exec.fence();
    us.push_back(timer.seconds() * 1e6);
  }
  std::sort(us.begin(), us.end());
  const std::size_t n = us.size();
  t.median_us = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  t.min_us = us.front();
}

const char* function_name(ScoreFunction f, bool pre) {
  switch (f) {
    case ScoreFunction::Sigmoid:
      return "sigmoid";
    case ScoreFunction::SqrtSoftplus:
      return "sqrtsoftplus";
    default:
      return pre ? "softmax (pre-top-k)" : "softmax (post-top-k, renormalized)";
  }
}

// The device is the instance's (the one the run's kernels go to), not whichever is current on this thread.
std::string backend_description(const ExecSpace& exec, int& concurrency) {
  concurrency = exec.concurrency();
  std::string s = ExecSpace::name();
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
    const int dev = exec.cuda_device();
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      return s + " on " + prop.name + " (device " + std::to_string(dev) + ", " +
             std::to_string(prop.multiProcessorCount) + " SMs)";
  }
#endif
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible)
    s += " (" + std::to_string(concurrency) + (concurrency == 1 ? " thread)" : " threads)");
  return s;
}

#if defined(KOKKOS_ENABLE_CUDA)
// Free memory of the instance's device: cudaMemGetInfo reports the current device's, so that one is made the
// instance's for the query and the caller's current device is given back afterwards.
bool free_device_memory(const Kokkos::Cuda& exec, std::size_t& free_bytes) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) return false;
  const int dev = exec.cuda_device();
  if (dev != current && cudaSetDevice(dev) != cudaSuccess) return false;
  std::size_t total = 0;
  const bool ok = cudaMemGetInfo(&free_bytes, &total) == cudaSuccess;
  if (dev != current) cudaSetDevice(current);
  return ok;
}
#endif

// --- the run ----------------------------------------------------------------------------------------------------

template <class Scalar>
int run(const Args& args, const RouterPreset& preset) {
  ExecSpace exec;
  const std::int64_t T = args.tokens, E = preset.num_experts;
  RouterConfig cfg = preset.config;
  const int k = cfg.topk;
  const bool bitmap = args.format == "bitmap";
  cfg.map_format = bitmap ? RoutingMapFormat::BitmapU8 : RoutingMapFormat::Bytemap;
  cfg.implementation = args.implementation == "portable" ? Implementation::Portable : Implementation::Auto;
  const std::int64_t map_cols = bitmap ? (E + 7) / 8 : E;
  const double s = sizeof(Scalar);

  // Inputs: seeded random per-row logits; the preset's FP32 bias (score correction) random as well.
  auto wi = Kokkos::WithoutInitializing;
  View2<Scalar> logits(Kokkos::view_alloc(std::string("logits"), wi), T, E);
  fill_random(logits, args.seed, 0.0f, 1.0f, true);  // ~N(0, 1) logits
  View1<float> bias;
  if (preset.has_bias) {
    bias = View1<float>(Kokkos::view_alloc(std::string("expert_bias"), wi), E);
    fill_random(bias, args.seed + 1, -0.02f, 0.02f);
  }
  View2<Scalar> probs(Kokkos::view_alloc(std::string("probs"), wi), T, E);
  View2<std::uint8_t> map(Kokkos::view_alloc(std::string("routing_map"), wi), T, map_cols);
  View2<float> inter(Kokkos::view_alloc(std::string("intermediate"), wi), T, E);
  View2<Scalar> grad_probs(Kokkos::view_alloc(std::string("grad_probs"), wi), T, E);  // synthetic upstream gradient
  fill_random(grad_probs, args.seed + 2, -1.0f, 1.0f);
  View2<Scalar> grad_logits(Kokkos::view_alloc(std::string("grad_logits"), wi), T, E);

  // Quantile Balancing (--qb, docs/router.md §19): the bin bounds on the device, the cutoff, the histogram.
  QbConfig qbc;
  qbc.histogram_mode = args.qb_mode == "two-pass" ? QbHistogramMode::TwoPass : QbHistogramMode::FusedAtomic;
  float qb_lower = args.qb_lower, qb_upper = args.qb_upper;
  View1<float> bin_bounds, cutoff;
  View2<std::int32_t> histogram;
  if (args.qb) {
    if (!args.qb_bounds_given) {  // [min bias - 1, max bias + 1] holds every required bias cutoff - y
      auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bias);
      float lo = hb(0), hi = hb(0);
      for (std::int64_t e = 0; e < E; ++e) {
        lo = std::min(lo, hb(e));
        hi = std::max(hi, hb(e));
      }
      qb_lower = lo - 1.0f;
      qb_upper = hi + 1.0f;
    }
    bin_bounds = View1<float>("qb_bin_bounds", 2);
    auto hbounds = Kokkos::create_mirror_view(bin_bounds);
    hbounds(0) = qb_lower;
    hbounds(1) = qb_upper;
    Kokkos::deep_copy(bin_bounds, hbounds);
    cutoff = View1<float>(Kokkos::view_alloc(std::string("qb_cutoff"), wi), T);
    histogram = View2<std::int32_t>("qb_histogram", E, args.qb_bins);
  }
  auto forward = [&] {
    if (args.qb)
      topk_router_qb(exec, cfg, qbc, logits, bias, bin_bounds, probs, map, inter, cutoff, histogram);
    else
      topk_router(exec, cfg, logits, bias, probs, map, inter);
  };

  // Aux loss chain (docs/router.md §10-§11): scores over all experts, loss from the routed tokens per expert.
  AuxScoresConfig acfg;
  acfg.topk = k;
  acfg.score_function = cfg.score_function;
  acfg.implementation = cfg.implementation;
  AuxLossConfig lcfg;
  lcfg.num_experts = static_cast<int>(E);
  lcfg.topk = k;
  lcfg.coeff = static_cast<float>(args.aux_coeff);
  lcfg.implementation = cfg.implementation;
  View2<float> scores(Kokkos::view_alloc(std::string("aux_scores"), wi), T, E);
  View2<std::uint8_t> aux_map(Kokkos::view_alloc(std::string("aux_routing_map"), wi), T, E);
  View2<float> aux_inter(Kokkos::view_alloc(std::string("aux_intermediate"), wi), T, E);
  View1<std::int32_t> tpe("tokens_per_expert", E);
  View0<float> loss("aux_loss");
  View1<float> const_buf("aux_const", 2);
  View1<float> workspace("aux_workspace", aux_loss_workspace_size(T, E));
  View0<float> grad_loss("grad_aux_loss");
  Kokkos::deep_copy(exec, grad_loss, 1.0f);
  View2<float> grad_scores(Kokkos::view_alloc(std::string("grad_aux_scores"), wi), T, E);
  View2<Scalar> aux_grad_logits(Kokkos::view_alloc(std::string("aux_grad_logits"), wi), T, E);

  // 1. Route once, read the map back, count tokens per expert (the aux loss input) and check the outputs.
  forward();
  topk_router_backward(exec, cfg, map, inter, grad_probs, grad_logits);
  auto h_map = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), map);
  auto h_probs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), probs);
  auto h_grad = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_logits);
  std::vector<std::int64_t> count(E, 0);
  std::int64_t bad_rows = 0, nonzero_off_map = 0, non_finite = 0, group_violations = 0;
  double grad_sq = 0, prob_sum = 0;
  const bool grouped = cfg.group_topk > 0;
  const int G = grouped ? cfg.num_groups : 1;
  std::vector<char> group_used(G);
  for (std::int64_t t = 0; t < T; ++t) {
    int routed = 0;
    std::fill(group_used.begin(), group_used.end(), 0);
    for (std::int64_t e = 0; e < E; ++e) {
      const bool r = bitmap ? ((h_map(t, e / 8) >> (e % 8)) & 1u) : h_map(t, e) != 0;
      const float p = Impl::to_float(h_probs(t, e));
      const float g = Impl::to_float(h_grad(t, e));
      if (!std::isfinite(p) || !std::isfinite(g)) ++non_finite;
      if (r) {
        ++routed;
        ++count[e];
        prob_sum += p;
        if (grouped) group_used[e / (E / G)] = 1;
      } else if (p != 0.0f) {
        ++nonzero_off_map;
      }
      grad_sq += static_cast<double>(g) * g;
    }
    if (routed != k) ++bad_rows;
    if (grouped && std::count(group_used.begin(), group_used.end(), 1) > cfg.group_topk) ++group_violations;
  }
  {
    auto h_tpe = Kokkos::create_mirror_view(tpe);
    for (std::int64_t e = 0; e < E; ++e) h_tpe(e) = static_cast<std::int32_t>(count[e]);
    Kokkos::deep_copy(exec, tpe, h_tpe);
    exec.fence();
  }
  aux_scores(exec, acfg, logits, scores, aux_map, aux_inter);
  aux_loss(exec, lcfg, scores, tpe, T, loss, const_buf, workspace);
  aux_loss_backward(exec, lcfg, const_buf, tpe, grad_loss, grad_scores);
  aux_scores_backward(exec, acfg, aux_inter, grad_scores, aux_grad_logits);
  float h_loss = 0, h_const = 0;
  {
    auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
    auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), const_buf);
    h_loss = hl();
    h_const = hc(0);
  }

  // The QB by-products of that one call: the cutoff's range, the histogram's total (T * E), its end bins (where
  // out-of-range required biases are clamped) and, per expert, the required bias at its median count.
  App::QbSummary qs;
  if (args.qb) {
    qs.on = true;
    qs.bins = args.qb_bins;
    qs.lower = qb_lower;
    qs.upper = qb_upper;
    qs.mode = args.qb_mode;
    auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cutoff);
    auto hh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), histogram);
    double sum = 0;
    qs.cutoff_min = std::numeric_limits<double>::infinity();
    qs.cutoff_max = -qs.cutoff_min;
    for (std::int64_t t = 0; t < T; ++t) {
      if (!std::isfinite(hc(t))) {
        ++qs.cutoff_non_finite;
        continue;
      }
      qs.cutoff_min = std::min<double>(qs.cutoff_min, hc(t));
      qs.cutoff_max = std::max<double>(qs.cutoff_max, hc(t));
      sum += hc(t);
    }
    qs.cutoff_mean = T > qs.cutoff_non_finite ? sum / static_cast<double>(T - qs.cutoff_non_finite) : 0.0;
    const double width = (static_cast<double>(qb_upper) - qb_lower) / args.qb_bins;
    for (std::int64_t e = 0; e < E; ++e) {
      std::int64_t acc = 0, row = 0;
      for (int b = 0; b < args.qb_bins; ++b) row += hh(e, b);
      qs.counts += row;
      qs.first_bin += hh(e, 0);
      qs.last_bin += hh(e, args.qb_bins - 1);
      int median = 0;
      for (int b = 0; b < args.qb_bins; ++b) {
        acc += hh(e, b);
        if (2 * acc >= row) {
          median = b;
          break;
        }
      }
      qs.median_bias.push_back(qb_lower + (median + 0.5) * width);
    }
  }

  // 2. Timings: one warm-up, then the median of `repeats` fenced calls. Bytes per token as in perf_test
  // (docs/router.md §17): the minimum each operation must move.
  const double map_b = bitmap ? std::ceil(E / 8.0) : static_cast<double>(E);
  std::vector<TimingRow> timings(4);
  timings[0] = {"forward", "probs + routing map + FP32 intermediate", E * (2 * s + 4) + map_b};
  if (args.qb)
    timings[0] = {"QB forward", std::string("forward + cutoff + histogram (") + args.qb_mode + ")",
                  E * (2 * s + 4) + map_b + 4 + (args.qb_mode == "two-pass" ? 4.0 * E : 0.0)};
  timings[1] = {"backward", "grad_logits from map + intermediate", E * (2 * s + 4) + map_b};
  timings[2] = {"aux loss forward", "aux scores + loss", s * E + 8 * E + E + 4 * E};
  timings[3] = {"aux loss backward", "loss grad + aux-score backward", 4 * E + 8 * E + s * E};
  time_op(timings[0], args.repeats, forward);
  time_op(timings[1], args.repeats, [&] { topk_router_backward(exec, cfg, map, inter, grad_probs, grad_logits); });
  time_op(timings[2], args.repeats, [&] {
    aux_scores(exec, acfg, logits, scores, aux_map, aux_inter);
    aux_loss(exec, lcfg, scores, tpe, T, loss, const_buf, workspace);
  });
  time_op(timings[3], args.repeats, [&] {
    aux_loss_backward(exec, lcfg, const_buf, tpe, grad_loss, grad_scores);
    aux_scores_backward(exec, acfg, aux_inter, grad_scores, aux_grad_logits);
  });

  // 3. Report.
  App::RouteReport r;
  r.preset = preset.name;
  r.model = preset.model;
  r.score_function = function_name(cfg.score_function, cfg.use_pre_softmax);
  r.dtype = args.dtype;
  r.map_format = args.format;
  r.bias = preset.has_bias ? "FP32 [" + std::to_string(E) + "], uniform in [-0.02, 0.02)" : "none";
  r.tokens = T;
  r.num_experts = static_cast<int>(E);
  r.topk = k;
  r.num_groups = cfg.num_groups;
  r.group_topk = cfg.group_topk;
  r.scaling_factor = cfg.scaling_factor;
  r.seed = args.seed;
  r.kokkos_version = std::to_string(KOKKOS_VERSION / 10000) + "." + std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                     std::to_string(KOKKOS_VERSION % 100);
  r.execution_space = ExecSpace::name();
  r.backend = backend_description(exec, r.concurrency);
  const bool specialized = Impl::TopkSpec<ExecSpace>::is_specialized;
  r.implementation = cfg.implementation == Implementation::Portable
                         ? "portable Kokkos kernels (forced)"
                         : (specialized ? std::string("native ") + ExecSpace::name() + " kernels"
                                        : std::string("portable Kokkos kernels (no specialization)"));
  r.tokens_per_expert = count;
  r.bad_rows = bad_rows;
  r.group_violations = group_violations;
  r.nonzero_off_map = nonzero_off_map;
  r.non_finite = non_finite;
  r.routed_prob_sum = prob_sum;
  r.grad_logits_l2 = std::sqrt(grad_sq);
  r.aux_loss = h_loss;
  r.aux_const = h_const;
  r.aux_coeff = args.aux_coeff;
  r.repeats = args.repeats;
  r.timings = timings;
  r.qb = qs;
  if (args.json)
    App::print_json(std::cout, r);
  else
    App::print_text(std::cout, r);
  return r.pass() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return Impl::cli_main("kokkosmoe-route", [&]() -> int {
    // Everything the user typed is validated before Kokkos starts: Kokkos 3.4 throws from initialize() (or
    // aborts) on a bad --kokkos-* value and silently ignores spellings it does not know.
    const Impl::CliArgs cli = Impl::parse_command_line(argc, argv, kFlags, KOKKOS_VERSION);
    if (cli.has("--help")) {
      print_usage(stdout);
      return 0;
    }
    const Args args = parse_args(cli);
    Impl::cli_check_kokkos_environment(cli.kokkos());
    const RouterPreset preset = router_preset(args.preset);
    const double need =
        route_bytes(args.tokens, preset.num_experts, args.format == "bitmap", args.dtype == "bf16" ? 2.0 : 4.0) +
        (args.qb ? 8.0 * preset.num_experts * args.qb_bins + 8.0 * args.tokens : 0.0);  // histogram, cutoff + mirrors
    if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible) {
      const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
      const double have = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0;
      if (have > 0 && need > 0.9 * have)
        throw Impl::CliUsageError("--tokens " + std::to_string(args.tokens) + " needs about " +
                                  std::to_string(static_cast<long long>(need / 1e9)) + " GB for preset " + preset.name +
                                  "; this machine has " + std::to_string(static_cast<long long>(have / 1e9)) +
                                  " GB of memory");
    }

    std::vector<std::string> kargs =
        cli.kokkos().argv_for(argc > 0 && argv[0] ? argv[0] : "kokkosmoe-route", KOKKOS_VERSION);
    std::vector<char*> kargv;
    for (auto& s : kargs) kargv.push_back(s.data());
    kargv.push_back(nullptr);
    int kargc = static_cast<int>(kargs.size());
    Kokkos::ScopeGuard guard(kargc, kargv.data());
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda>) {
      std::size_t free_b = 0;
      if (free_device_memory(ExecSpace(), free_b) && need > 0.9 * static_cast<double>(free_b))
        throw Impl::CliUsageError("--tokens " + std::to_string(args.tokens) + " needs about " +
                                  std::to_string(static_cast<long long>(need / 1e9)) + " GB for preset " + preset.name +
                                  "; the device has " + std::to_string(static_cast<long long>(free_b / 1000000000ull)) +
                                  " GB free");
    }
#endif
    return args.dtype == "bf16" ? run<bf16_t>(args, preset) : run<float>(args, preset);
  });
}
