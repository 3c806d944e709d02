/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Quantile Balancing (docs/router.md §19) on every enabled backend against the plain-loop oracle of QbOracle.hpp:
//  * router_qb/matches_oracle: seeded batches of the reference's sizes and smaller ones, every routing output (Bytemap,
//    BitmapU8, int16/int32/int64 indices), both histogram modes, FP32 and bf16 logits: routes exact; probs,
//    intermediate and cutoff bitwise where the backend shares the host's expf (host spaces), else within §16.1;
//    histogram counts exact there, else exactly the counts of the backend's own cutoff and intermediate (docs/router.md
//    §19.10); the histogram accumulates onto what it held.
//  * router_qb/edge_*: the twelve edge cases of §19.10 (the device-total aux loss, case 12, is router_aux's);
//  * router_qb/native_cutoff_equals_portable: the cutoff of the native forward (Cuda) bitwise the portable pass's,
//    on scores that share their upper key bits and on exact ties;
//  * router_qb/validation: every rule of §19.3, by its id, in its order;
//  * router_qb/same_as_topk_router: QB's routing, probs and intermediate are topk_router's bit for bit, and the
//    backward from QB's saved state is the Sigmoid backward (case 11);
//  * router_qb/token_functions: the per-token QB device functions (Serial, Team, TeamVector, ThreadVector) in a user
//    kernel give the oracle's routes, weights and cutoff, and the cutoff of topk_router_qb bit for bit;
//  * router_qb/cuda_graph_replays_new_logits (Cuda): unchecked QB calls (both modes, map and indices) captured once
//    in a CUDA graph, replayed with new logits and new bounds, equal the oracle and the eager calls.

#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_RouterQB.hpp>
#include <KokkosMoE_RouterToken.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include "QbOracle.hpp"
#include "RouterTestUtils.hpp"

using namespace KokkosMoETest;
using KokkosMoE::QbConfig;
using KokkosMoE::QbHistogramMode;
using KokkosMoE::RouterConfig;
using KokkosMoE::Rule;

namespace {

enum class Out { Bytemap, BitmapU8, Idx16, Idx32, Idx64 };
const Out kOuts[] = {Out::Bytemap, Out::BitmapU8, Out::Idx16, Out::Idx32, Out::Idx64};
const char* out_name(Out o) {
  switch (o) {
    case Out::Bytemap:
      return "Bytemap";
    case Out::BitmapU8:
      return "BitmapU8";
    case Out::Idx16:
      return "int16 indices";
    case Out::Idx32:
      return "int32 indices";
    case Out::Idx64:
      return "int64 indices";
  }
  return "?";
}

/// One QB problem: logits and bias as FP32 values already representable in the logits' type.
struct Problem {
  int T = 0, E = 0, k = 1, num_bins = 8;
  float sf = 1.0f, lower = -1.0f, upper = 1.0f;
  std::vector<float> x, b;
};

/// What a QB call returned: routes in slot order (maps: ascending expert order, compared as sets), probs as FP32.
struct Got {
  std::vector<std::vector<int>> routed;  // [T] the routed experts (indices: slot order; maps: ascending)
  std::vector<float> probs, intermediate, cutoff;
  std::vector<std::int32_t> hist;  // after the call (what it held before plus the counts)
};

template <class D, class S, class Index>
void run_indices(const RouterConfig& cfg, const QbConfig& qb, const V2<D, S>& logits, const V1<D, float>& bias,
                 const V1<D, float>& bounds, const V2<D, S>& probs, const V2<D, float>& inter,
                 const V1<D, float>& cutoff, const V2<D, std::int32_t>& hist, Got& g, int T, int k) {
  using Exec = typename D::execution_space;
  auto idx = make2<D, Index>("indices", T, k, Index(-7));
  KokkosMoE::topk_router_qb_indices(Exec(), cfg, qb, logits, bias, bounds, probs, idx, inter, cutoff, hist);
  const auto h = download(idx);
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < k; ++i) g.routed[t].push_back(static_cast<int>(h[static_cast<std::size_t>(t) * k + i]));
}

/// Runs one QB forward on DeviceType D with \p out and \p mode onto a histogram holding \p prefill.
template <class D, class S>
Got run_qb(const Problem& p, Out out, QbHistogramMode mode, const std::vector<std::int32_t>& prefill,
           bool validate = true, KokkosMoE::Implementation impl = KokkosMoE::Implementation::Auto) {
  using Exec = typename D::execution_space;
  RouterConfig cfg;
  cfg.topk = p.k;
  cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  cfg.scaling_factor = p.sf;
  cfg.map_format = out == Out::BitmapU8 ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
  QbConfig qb;
  qb.histogram_mode = mode;
  qb.validate_bin_bounds = validate;
  qb.implementation = impl;
  std::vector<double> xd(p.x.begin(), p.x.end()), bd(p.b.begin(), p.b.end());
  auto logits = device_values<D, S>("logits", p.T, p.E, xd);
  auto bias = device_vector<D, float>("bias", bd);
  auto bounds = device_vector<D, float>("bounds", {p.lower, p.upper});
  auto probs = make2<D, S>("probs", p.T, p.E, Num<S>::make(-3.0));
  auto inter = make2<D, float>("intermediate", p.T, p.E, -3.0f);
  auto cutoff = make1<D, float>("cutoff", p.T, -3.0f);
  V2<D, std::int32_t> hist(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("histogram")), p.E, p.num_bins);
  upload(hist, prefill);
  Got g;
  g.routed.resize(p.T);
  if (out == Out::Bytemap || out == Out::BitmapU8) {
    const std::int64_t cols = out == Out::BitmapU8 ? (p.E + 7) / 8 : p.E;
    auto map = make2<D, std::uint8_t>("routing_map", p.T, cols, std::uint8_t(0xA5));
    KokkosMoE::topk_router_qb(Exec(), cfg, qb, logits, bias, bounds, probs, map, inter, cutoff, hist);
    const auto m = download(map);
    for (int t = 0; t < p.T; ++t)
      for (int e = 0; e < p.E; ++e) {
        const bool on = out == Out::Bytemap ? m[static_cast<std::size_t>(t) * cols + e] != 0
                                            : ((m[static_cast<std::size_t>(t) * cols + e / 8] >> (e % 8)) & 1) != 0;
        if (on) g.routed[t].push_back(e);
      }
  } else if (out == Out::Idx16) {
    run_indices<D, S, std::int16_t>(cfg, qb, logits, bias, bounds, probs, inter, cutoff, hist, g, p.T, p.k);
  } else if (out == Out::Idx32) {
    run_indices<D, S, std::int32_t>(cfg, qb, logits, bias, bounds, probs, inter, cutoff, hist, g, p.T, p.k);
  } else {
    run_indices<D, S, std::int64_t>(cfg, qb, logits, bias, bounds, probs, inter, cutoff, hist, g, p.T, p.k);
  }
  const auto hp = download(probs);
  g.probs.resize(hp.size());
  for (std::size_t i = 0; i < hp.size(); ++i) g.probs[i] = static_cast<float>(Num<S>::value(hp[i]));
  g.intermediate = download(inter);
  g.cutoff = download(cutoff);
  g.hist = download(hist);
  return g;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

/// Compares a QB call with the oracle: bitwise where the backend shares the host's expf, else within §16.1 and the
/// counts exactly those of the call's own cutoff and intermediate.
template <class D, class S>
void expect_oracle(const Problem& p, const Got& g, const std::vector<std::int32_t>& prefill, Out out,
                   QbOracle::TieRule rule = QbOracle::TieRule::LowerIndexFirst) {
  constexpr bool exact = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename D::memory_space>::accessible;
  const QbOracle::Result o = QbOracle::route(p.x, p.b, p.T, p.E, p.k, p.sf, p.lower, p.upper, p.num_bins, rule);
  const Tol tol = fp32_tol(p.E);
  Mismatches routes("routes"), probs("probs"), inter("intermediate"), cut("cutoff");
  for (int t = 0; t < p.T; ++t) {
    std::vector<int> want(o.routes.begin() + static_cast<std::ptrdiff_t>(t) * p.k,
                          o.routes.begin() + static_cast<std::ptrdiff_t>(t + 1) * p.k);
    if (out == Out::Bytemap || out == Out::BitmapU8) std::sort(want.begin(), want.end());
    if (g.routed[t] != want) routes.add([&](std::ostream& os) { os << "token " << t; });
    std::vector<float> want_probs(p.E, 0.0f);
    for (int i = 0; i < p.k; ++i)
      want_probs[o.routes[static_cast<std::size_t>(t) * p.k + i]] =
          static_cast<float>(Num<S>::value(Num<S>::make(o.weights[static_cast<std::size_t>(t) * p.k + i])));
    for (int e = 0; e < p.E; ++e) {
      const std::size_t i = static_cast<std::size_t>(t) * p.E + e;
      const bool pok = exact ? same_float(g.probs[i], want_probs[e]) : close(g.probs[i], want_probs[e], tol);
      if (!pok)
        probs.add(
            [&](std::ostream& os) { os << "(" << t << ", " << e << "): " << g.probs[i] << " vs " << want_probs[e]; });
      const bool iok =
          exact ? same_float(g.intermediate[i], o.intermediate[i]) : close(g.intermediate[i], o.intermediate[i], tol);
      if (!iok) inter.add([&](std::ostream& os) { os << "(" << t << ", " << e << ")"; });
    }
    const bool cok = exact ? same_float(g.cutoff[t], o.cutoff[t]) : close(g.cutoff[t], o.cutoff[t], tol);
    if (!cok) cut.add([&](std::ostream& os) { os << "token " << t << ": " << g.cutoff[t] << " vs " << o.cutoff[t]; });
  }
  routes.report();
  probs.report();
  inter.report();
  cut.report();
  std::vector<std::int32_t> counts(g.hist.size());
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] = g.hist[i] - prefill[i];
  if (exact) {
    BOOST_TEST(counts == o.hist, boost::test_tools::per_element());
  } else {
    BOOST_TEST(counts == QbOracle::recount(g.cutoff, g.intermediate, p.T, p.E, p.lower, p.upper, p.num_bins),
               boost::test_tools::per_element());
  }
}

/// A seeded problem: logits in [-4, 4] rounded to S, bias linspace(-0.2, 0.2, E), bounds covering every r.
template <class S>
Problem random_problem(int T, int E, int k, int num_bins, std::uint64_t seed) {
  Problem p;
  p.T = T;
  p.E = E;
  p.k = k;
  p.num_bins = num_bins;
  Rng rng(seed);
  p.x.resize(static_cast<std::size_t>(T) * E);
  for (auto& v : p.x) v = static_cast<float>(Num<S>::value(Num<S>::make(8.0 * rng.uniform() - 4.0)));
  p.b.resize(E);
  for (int e = 0; e < E; ++e) p.b[e] = E > 1 ? -0.2f + 0.4f * static_cast<float>(e) / static_cast<float>(E - 1) : 0.0f;
  p.lower = -0.2f - 1.0f;
  p.upper = 0.2f + 1.0f;
  return p;
}

std::vector<std::int32_t> pattern(int E, int num_bins) {
  std::vector<std::int32_t> h(static_cast<std::size_t>(E) * num_bins);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::int32_t>((i * 7919u) % 13u);
  return h;
}

/// An edge-case problem with FP32 logits from the text.
Problem edge(int E, int k, std::vector<float> x, std::vector<float> b, float lower, float upper, int num_bins) {
  Problem p;
  p.E = E;
  p.k = k;
  p.T = static_cast<int>(x.size()) / E;
  p.x = std::move(x);
  p.b = std::move(b);
  p.lower = lower;
  p.upper = upper;
  p.num_bins = num_bins;
  return p;
}

/// Every output kind and both modes of one edge problem against the oracle; returns the Bytemap/FusedAtomic result.
template <class D>
Got edge_all(const Problem& p) {
  const std::vector<std::int32_t> zero(static_cast<std::size_t>(p.E) * p.num_bins, 0);
  Got first;
  for (Out out : kOuts)
    for (QbHistogramMode mode : {QbHistogramMode::FusedAtomic, QbHistogramMode::TwoPass}) {
      BOOST_TEST_CONTEXT(out_name(out) << (mode == QbHistogramMode::TwoPass ? ", TwoPass" : ", FusedAtomic")) {
        Got g = run_qb<D, float>(p, out, mode, zero);
        expect_oracle<D, float>(p, g, zero, out);
        if (out == Out::Bytemap && mode == QbHistogramMode::FusedAtomic) first = g;
      }
    }
  return first;
}

std::int32_t count(const Got& g, int num_bins, int e, int bin) {
  return g.hist[static_cast<std::size_t>(e) * num_bins + bin];
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_qb)

BOOST_AUTO_TEST_CASE_TEMPLATE(matches_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  struct Shape {
    int T, E, k, bins;
  };
  // The reference's test sizes (T = 257, E = 896, 1000 bins, k = 8 and 16) and its smaller ones.
  for (const Shape sh : {Shape{257, 896, 8, 1000}, Shape{257, 896, 16, 1000}, Shape{64, 64, 8, 1000},
                         Shape{33, 32, 4, 64}, Shape{40, 16, 4, 32}, Shape{17, 9, 1, 5}, Shape{5, 12, 11, 3},
                         // a histogram of 3000 bins (experts sliced 4 to a team) and one too wide for team scratch
                         Shape{2100, 13, 3, 3000}, Shape{9, 5, 2, 20000}})
    for (Out out : kOuts)
      for (QbHistogramMode mode : {QbHistogramMode::FusedAtomic, QbHistogramMode::TwoPass}) {
        BOOST_TEST_CONTEXT("T " << sh.T << " E " << sh.E << " k " << sh.k << " bins " << sh.bins << ", "
                                << out_name(out)
                                << (mode == QbHistogramMode::TwoPass ? ", TwoPass" : ", FusedAtomic")) {
          const auto pre = pattern(sh.E, sh.bins);
          {
            const Problem p = random_problem<float>(sh.T, sh.E, sh.k, sh.bins, 1000u * sh.E + sh.k);
            expect_oracle<DeviceType, float>(p, run_qb<DeviceType, float>(p, out, mode, pre), pre, out);
          }
          if (sh.E <= 64) {  // bf16 logits on the smaller shapes
            const Problem p = random_problem<bf16_t>(sh.T, sh.E, sh.k, sh.bins, 2000u * sh.E + sh.k);
            expect_oracle<DeviceType, bf16_t>(p, run_qb<DeviceType, bf16_t>(p, out, mode, pre), pre, out);
          }
        }
      }
  // The generic Kokkos QB pass where a native one is the default (Kokkos::Cuda): the float4 and the scalar slices,
  // and the global-atomic pass of a histogram too wide for shared memory.
  for (const Shape sh : {Shape{257, 896, 8, 1000}, Shape{2100, 13, 3, 3000}, Shape{9, 5, 2, 20000}})
    for (Out out : {Out::Bytemap, Out::Idx32})
      for (QbHistogramMode mode : {QbHistogramMode::FusedAtomic, QbHistogramMode::TwoPass}) {
        BOOST_TEST_CONTEXT("Portable, T " << sh.T << " E " << sh.E << " k " << sh.k << " bins " << sh.bins << ", "
                                          << out_name(out)
                                          << (mode == QbHistogramMode::TwoPass ? ", TwoPass" : ", FusedAtomic")) {
          const auto pre = pattern(sh.E, sh.bins);
          const Problem p = random_problem<float>(sh.T, sh.E, sh.k, sh.bins, 3000u * sh.E + sh.k);
          expect_oracle<DeviceType, float>(
              p, run_qb<DeviceType, float>(p, out, mode, pre, true, KokkosMoE::Implementation::Portable), pre, out);
        }
      }
}

// §19.10 case 1: exactly k + 1 tied at the boundary (the reference's pinned rows).
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_tie_of_k_plus_one, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const Problem p = edge(8, 2, {3, 3, 3, -1, -2, -3, -4, -5, 5, 4, 3, 2, -2, -3, -4, -5}, std::vector<float>(8, 0.0f),
                         -0.05f, 0.05f, 8);
  const Got g = edge_all<DeviceType>(p);
  BOOST_TEST((g.routed[0] == std::vector<int>{0, 1}));
  BOOST_TEST((g.routed[1] == std::vector<int>{0, 1}));
  const float s3 = 1.0f / (1.0f + std::exp(-3.0f));
  BOOST_TEST(g.cutoff[0] == s3);
  BOOST_TEST(g.cutoff[1] == s3);
  std::int32_t first = 0, last = 0;
  for (int e = 0; e < 8; ++e) {
    first += count(g, 8, e, 0);
    last += count(g, 8, e, 7);
  }
  BOOST_TEST(first > 0);
  BOOST_TEST(last > 0);
  // The same rows under the other tie rule route {0, 2} or {1, 2}: the oracle comparison must notice.
  const QbOracle::Result wrong =
      QbOracle::route(p.x, p.b, p.T, p.E, p.k, p.sf, p.lower, p.upper, p.num_bins, QbOracle::TieRule::HigherIndexFirst);
  BOOST_TEST((std::vector<int>(wrong.routes.begin(), wrong.routes.begin() + 2) != std::vector<int>{0, 1}));
}

// Case 2: more ties than k + 1: routed {0, 1}, cutoff 0.5, every count in bin 4.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_more_ties, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const Problem p = edge(8, 2, std::vector<float>(8, 0.0f), std::vector<float>(8, 0.0f), -1.0f, 1.0f, 8);
  const Got g = edge_all<DeviceType>(p);
  BOOST_TEST((g.routed[0] == std::vector<int>{0, 1}));
  BOOST_TEST(g.cutoff[0] == 0.5f);
  BOOST_TEST(g.probs[0] == 0.5f);
  BOOST_TEST(g.probs[1] == 0.5f);
  for (int e = 0; e < 8; ++e) BOOST_TEST(count(g, 8, e, 4) == 1);
}

// Case 3: k = E - 1 is valid, the cutoff is the row's smallest biased score.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_k_is_e_minus_one, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const Problem p = edge(4, 3, {0.5f, -1.0f, 2.0f, 0.25f}, {0.0f, 0.125f, -0.25f, 0.0f}, -1.0f, 1.0f, 16);
  const Got g = edge_all<DeviceType>(p);
  const float s1 = 1.0f / (1.0f + std::exp(1.0f)) + 0.125f;
  BOOST_TEST(g.cutoff[0] == s1);
}

// Case 4: NaN logits and a NaN bias.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_nan, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {  // (a) NaN outside the top 3: routing and cutoff unaffected, its counts in bin 0
    const Problem p = edge(8, 2, {4, 3, 2, 1, 0, -1, nan, -2}, std::vector<float>(8, 0.0f), -1.0f, 1.0f, 8);
    const Got g = edge_all<DeviceType>(p);
    BOOST_TEST((g.routed[0] == std::vector<int>{0, 1}));
    BOOST_TEST(g.cutoff[0] == 1.0f / (1.0f + std::exp(-2.0f)));
    BOOST_TEST(count(g, 8, 6, 0) == 1);
  }
  {  // (b) k = 3 of 4 with one NaN logit: the NaN is order[3], the cutoff NaN, every count in bin 0
    const Problem p = edge(4, 3, {1, nan, 0, -1}, std::vector<float>(4, 0.0f), -1.0f, 1.0f, 8);
    const Got g = edge_all<DeviceType>(p);
    BOOST_TEST(std::isnan(g.cutoff[0]));
    for (int e = 0; e < 4; ++e) BOOST_TEST(count(g, 8, e, 0) == 1);
  }
  {  // (c) the same with a NaN bias
    const Problem p = edge(4, 3, {1, 2, 0, -1}, {0.0f, nan, 0.0f, 0.0f}, -1.0f, 1.0f, 8);
    const Got g = edge_all<DeviceType>(p);
    BOOST_TEST(std::isnan(g.cutoff[0]));
    for (int e = 0; e < 4; ++e) BOOST_TEST(count(g, 8, e, 0) == 1);
  }
}

// Cases 5 and 6: exact bin edges and out-of-range required biases.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_exact_edges_and_clamps, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const std::vector<float> x(4, 0.0f), b = {0.5f, 0.25f, 0.0f, -0.25f};
  struct Bounds {
    float lower, upper;
    int bins, bin;
  };
  for (const Bounds bd : {Bounds{-1.0f, 1.0f, 8, 5}, Bounds{-0.75f, 0.25f, 4, 3}, Bounds{0.25f, 1.25f, 4, 0},
                          Bounds{1.0f, 2.0f, 10, 0}, Bounds{-2.0f, -1.0f, 10, 9}}) {
    BOOST_TEST_CONTEXT("bounds [" << bd.lower << ", " << bd.upper << "], " << bd.bins << " bins") {
      const Problem p = edge(4, 1, x, b, bd.lower, bd.upper, bd.bins);
      const Got g = edge_all<DeviceType>(p);
      BOOST_TEST((g.routed[0] == std::vector<int>{0}));
      BOOST_TEST(g.probs[0] == 0.5f);
      BOOST_TEST(g.cutoff[0] == 0.75f);
      for (int e = 0; e < 4; ++e) BOOST_TEST(count(g, bd.bins, e, bd.bin) == 1);
    }
  }
}

// Case 7: all experts equal with equal biases: routed 0..k-1, r = 0, one bin per expert holding T.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_all_equal, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int T = 5, E = 6, k = 3;
  const Problem p = edge(E, k, std::vector<float>(T * E, 1.5f), std::vector<float>(E, 0.125f), -1.0f, 1.0f, 10);
  const Got g = edge_all<DeviceType>(p);
  for (int t = 0; t < T; ++t) BOOST_TEST((g.routed[t] == std::vector<int>{0, 1, 2}));
  for (int e = 0; e < E; ++e) BOOST_TEST(count(g, 10, e, 5) == T);
}

// Case 8: T = 0 leaves the histogram bitwise unchanged; invalid bounds still raise when validating.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_no_tokens, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  Problem p = edge(8, 2, {}, std::vector<float>(8, 0.0f), -1.0f, 1.0f, 4);
  const auto pre = pattern(8, 4);
  for (Out out : kOuts) {
    const Got g = run_qb<DeviceType, float>(p, out, QbHistogramMode::FusedAtomic, pre);
    BOOST_TEST(g.hist == pre, boost::test_tools::per_element());
  }
  p.lower = 1.0f;
  try {
    run_qb<DeviceType, float>(p, Out::Bytemap, QbHistogramMode::FusedAtomic, pre);
    BOOST_TEST(false, "T = 0 with bounds [1, 1] did not throw");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::QbBinBounds));
  }
}

// Case 9: accumulation over micro-batches, the modes bitwise equal, qb_histogram_accumulate from the saved state.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_accumulation_and_modes, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int E = 64, k = 8, bins = 1000;
  const Problem all = random_problem<float>(320, E, k, bins, 99);
  Problem a = all, b = all;
  a.T = 127;
  a.x.resize(static_cast<std::size_t>(127) * E);
  b.T = 193;
  b.x.assign(all.x.begin() + static_cast<std::ptrdiff_t>(127) * E, all.x.end());
  const auto pre = pattern(E, bins);
  const Got one = run_qb<D, float>(all, Out::Idx32, QbHistogramMode::FusedAtomic, pre);
  const Got first = run_qb<D, float>(a, Out::Idx32, QbHistogramMode::TwoPass, pre);
  const Got second = run_qb<D, float>(b, Out::Bytemap, QbHistogramMode::FusedAtomic, first.hist);
  BOOST_TEST(second.hist == one.hist, boost::test_tools::per_element());
  const Got two = run_qb<D, float>(all, Out::Idx32, QbHistogramMode::TwoPass, pre);
  BOOST_TEST(two.hist == one.hist, boost::test_tools::per_element());
  // The standalone accumulation on the saved intermediate and cutoff.
  auto inter = make2<D, float>("intermediate", all.T, E, 0.0f);
  auto cutoff = make1<D, float>("cutoff", all.T, 0.0f);
  upload(inter, one.intermediate);
  upload(cutoff, one.cutoff);
  auto bounds = device_vector<D, float>("bounds", {all.lower, all.upper});
  V2<D, std::int32_t> hist(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("histogram")), E, bins);
  upload(hist, pre);
  KokkosMoE::qb_histogram_accumulate(Exec(), QbConfig{}, inter, cutoff, bounds, hist);
  BOOST_TEST(download(hist) == one.hist, boost::test_tools::per_element());
  // The generic Kokkos pass adds the same counts; a QbConfig whose implementation is no enumerator is refused.
  QbConfig portable;
  portable.implementation = KokkosMoE::Implementation::Portable;
  upload(hist, pre);
  KokkosMoE::qb_histogram_accumulate(Exec(), portable, inter, cutoff, bounds, hist);
  BOOST_TEST(download(hist) == one.hist, boost::test_tools::per_element());
  QbConfig bad = portable;
  bad.implementation = static_cast<KokkosMoE::Implementation>(2);
  try {
    KokkosMoE::qb_histogram_accumulate(Exec(), bad, inter, cutoff, bounds, hist);
    BOOST_TEST(false, "no error");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::ConfigValue), e.what());
  }
}

// Case 10: the bound rules, unchecked calls, extreme bounds.
BOOST_AUTO_TEST_CASE_TEMPLATE(edge_bin_bounds, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Problem p = random_problem<float>(9, 8, 2, 6, 5);
  const auto pre = pattern(8, 6);
  struct B {
    float lower, upper;
  };
  for (const B bd : {B{1, 1}, B{1, -1}, B{nan, 1}, B{-inf, 0}, B{0, inf}}) {
    BOOST_TEST_CONTEXT("bounds [" << bd.lower << ", " << bd.upper << "]") {
      p.lower = bd.lower;
      p.upper = bd.upper;
      for (Out out : {Out::Bytemap, Out::Idx32}) {
        try {
          run_qb<DeviceType, float>(p, out, QbHistogramMode::FusedAtomic, pre);
          BOOST_TEST(false, "no error");
        } catch (const KokkosMoE::InvalidArgument& e) {
          BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::QbBinBounds));
          BOOST_TEST(e.parameter() == "bin_bounds");
        }
      }
      using Exec = typename DeviceType::execution_space;
      auto bounds = device_vector<DeviceType, float>("bounds", {bd.lower, bd.upper});
      try {
        KokkosMoE::validate_qb_bin_bounds(Exec(), bounds);
        BOOST_TEST(false, "validate_qb_bin_bounds: no error");
      } catch (const KokkosMoE::InvalidArgument& e) {
        BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::QbBinBounds));
      }
    }
  }
  // Unchecked with [1, 1]: runs, every count inside the histogram (T * E of them), none outside (the View's size).
  p.lower = 1.0f;
  p.upper = 1.0f;
  for (QbHistogramMode mode : {QbHistogramMode::FusedAtomic, QbHistogramMode::TwoPass}) {
    const Got g = run_qb<DeviceType, float>(p, Out::Bytemap, mode, pre, /*validate=*/false);
    std::int64_t added = 0;
    for (std::size_t i = 0; i < pre.size(); ++i) added += g.hist[i] - pre[i];
    BOOST_TEST(added == static_cast<std::int64_t>(p.T) * p.E);
  }
  // [-3e38, 3e38] is valid; upper - lower overflows, the scale is 0 and every count lands in bin 0.
  p.lower = -3e38f;
  p.upper = 3e38f;
  const Got g = run_qb<DeviceType, float>(p, Out::Bytemap, QbHistogramMode::FusedAtomic, pre);
  for (int e = 0; e < p.E; ++e) BOOST_TEST(count(g, 6, e, 0) - pre[static_cast<std::size_t>(e) * 6] == p.T);
}

// Every rule of §19.3 by its id, the first broken one reported.
BOOST_AUTO_TEST_CASE_TEMPLATE(validation, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 4, E = 8;
  auto logits = make2<D, float>("logits", T, E, 0.0f);
  auto bias = make1<D, float>("bias", E, 0.0f);
  auto no_bias = V1<D, float>("no_bias", 0);
  auto bounds = device_vector<D, float>("bounds", {-1.0, 1.0});
  auto probs = make2<D, float>("probs", T, E, 0.0f);
  auto map = make2<D, std::uint8_t>("map", T, E, std::uint8_t(0));
  auto inter = make2<D, float>("inter", T, E, 0.0f);
  auto cutoff = make1<D, float>("cutoff", T, 0.0f);
  auto hist = make2<D, std::int32_t>("hist", E, 5, 0);
  auto expect = [&](const char* what, Rule rule, const RouterConfig& c, const QbConfig& qb, const auto& bias_v,
                    const auto& probs_v, const auto& cutoff_v, const auto& hist_v) {
    BOOST_TEST_CONTEXT(what) {
      try {
        KokkosMoE::topk_router_qb(Exec(), c, qb, logits, bias_v, bounds, probs_v, map, inter, cutoff_v, hist_v);
        BOOST_TEST(false, "no error");
      } catch (const KokkosMoE::InvalidArgument& e) {
        BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(rule), e.what());
      }
    }
  };
  RouterConfig ok;
  ok.topk = 2;
  ok.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  const QbConfig qb;
  RouterConfig c = ok;
  c.score_function = KokkosMoE::ScoreFunction::Softmax;
  // 1 before 2: a shape error wins over the score function.
  expect("cutoff of T + 1 with Softmax", Rule::ShapeMismatch, c, qb, bias, probs, make1<D, float>("c", T + 1, 0.0f),
         hist);
  expect("histogram of E + 1 rows", Rule::ShapeMismatch, ok, qb, bias, probs, cutoff,
         make2<D, std::int32_t>("h", E + 1, 5, 0));
  expect("Softmax", Rule::QbRequiresSigmoid, c, qb, bias, probs, cutoff, hist);
  c = ok;
  c.score_function = KokkosMoE::ScoreFunction::SqrtSoftplus;
  expect("SqrtSoftplus", Rule::QbRequiresSigmoid, c, qb, bias, probs, cutoff, hist);
  c = ok;
  c.use_pre_softmax = true;
  expect("pre-softmax", Rule::PreSoftmaxRequiresSoftmax, c, qb, bias, probs, cutoff, hist);
  c = ok;
  c.num_groups = 2;
  c.group_topk = 1;
  c.topk = 0;  // 4 before 5
  expect("grouping", Rule::QbGroupingUnsupported, c, qb, bias, probs, cutoff, hist);
  for (int k : {0, E, E + 1}) {
    c = ok;
    c.topk = k;
    expect("topk out of [1, E - 1]", Rule::QbTopkRange, c, qb, no_bias, probs, cutoff, hist);  // 5 before 6
  }
  expect("no bias", Rule::QbRequiresBias, ok, qb, no_bias, probs, cutoff, make2<D, std::int32_t>("h0", E, 0, 0));
  expect("no bins", Rule::QbBinCountPositive, ok, qb, bias, probs, cutoff, make2<D, std::int32_t>("h0", E, 0, 0));
  c = ok;
  c.scaling_factor = std::numeric_limits<float>::infinity();
  expect("scaling factor", Rule::ScalingFactorFinite, c, qb, bias, probs, cutoff, hist);
  expect("probs aliasing the histogram", Rule::Aliasing, ok, qb, bias, probs, cutoff,
         V2<D, std::int32_t>(reinterpret_cast<std::int32_t*>(probs.data()), E, 4));
  QbConfig bad_mode;
  bad_mode.histogram_mode = static_cast<QbHistogramMode>(7);
  expect("histogram mode", Rule::ConfigValue, ok, bad_mode, bias, probs, cutoff, hist);
  QbConfig bad_impl;
  bad_impl.implementation = static_cast<KokkosMoE::Implementation>(5);
  expect("QB implementation", Rule::ConfigValue, ok, bad_impl, bias, probs, cutoff, hist);
  // E = 1 is always refused.
  auto l1 = make2<D, float>("l1", T, 1, 0.0f);
  try {
    RouterConfig c1 = ok;
    c1.topk = 1;
    KokkosMoE::topk_router_qb(Exec(), c1, qb, l1, make1<D, float>("b1", 1, 0.0f), bounds,
                              make2<D, float>("p1", T, 1, 0.0f), make2<D, std::uint8_t>("m1", T, 1, std::uint8_t(0)),
                              make2<D, float>("i1", T, 1, 0.0f), cutoff, make2<D, std::int32_t>("h1", 1, 5, 0));
    BOOST_TEST(false, "E = 1: no error");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::QbTopkRange));
  }
  // int16 indices with E > 32767.
  const int big = 32768;
  try {
    RouterConfig cb = ok;
    KokkosMoE::topk_router_qb_indices(
        Exec(), cb, qb, make2<D, float>("lb", 1, big, 0.0f), make1<D, float>("bb", big, 0.0f), bounds,
        make2<D, float>("pb", 1, big, 0.0f), make2<D, std::int16_t>("ib", 1, 2, std::int16_t(0)),
        make2<D, float>("ib2", 1, big, 0.0f), make1<D, float>("cb", 1, 0.0f), make2<D, std::int32_t>("hb", big, 1, 0));
    BOOST_TEST(false, "int16 indices with E = 32768: no error");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::IndexTypeRange));
  }
}

// The cutoff the native forward writes (the lane kernel on Kokkos::Cuda) is the portable QB pass's bit for bit, also
// where packed keys cannot decide order[k]: logits in a band of 1e-4 (many scores share the upper key bits, some
// differ in the last ones) and rows of exact duplicates (ties broken by the lower index). On host spaces both are
// the same pass; there the oracle comparison is bitwise.
BOOST_AUTO_TEST_CASE_TEMPLATE(native_cutoff_equals_portable, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename DeviceType::memory_space>::accessible;
  struct Shape {
    int T, E, k;
  };
  for (const Shape sh : {Shape{300, 384, 8}, Shape{200, 896, 16}, Shape{300, 64, 8}, Shape{300, 16, 3}})
    for (int pattern_kind = 0; pattern_kind < 2; ++pattern_kind) {
      BOOST_TEST_CONTEXT("T " << sh.T << " E " << sh.E << " k " << sh.k
                              << (pattern_kind == 0 ? ", band of 1e-4" : ", duplicates")) {
        Problem p;
        p.T = sh.T;
        p.E = sh.E;
        p.k = sh.k;
        p.num_bins = 1000;
        p.lower = -0.5f;
        p.upper = 0.5f;
        Rng rng(17u * sh.E + sh.k + pattern_kind);
        p.x.resize(static_cast<std::size_t>(p.T) * p.E);
        for (auto& v : p.x)
          v = pattern_kind == 0 ? static_cast<float>(0.5 + 1e-4 * rng.uniform())
                                : static_cast<float>(0.25 * static_cast<int>(4 * rng.uniform()));
        p.b.assign(p.E, 0.0f);
        for (int e = 0; e < p.E; e += 7) p.b[e] = 1e-7f;  // some keys one ulp up
        const auto pre = pattern(p.E, p.num_bins);
        for (Out out : {Out::Bytemap, Out::Idx32}) {
          const Got native = run_qb<DeviceType, float>(p, out, QbHistogramMode::TwoPass, pre);
          const Got portable = run_qb<DeviceType, float>(p, out, QbHistogramMode::TwoPass, pre, true,
                                                         KokkosMoE::Implementation::Portable);
          BOOST_TEST(bytes_equal(native.cutoff, portable.cutoff));
          BOOST_TEST(native.hist == portable.hist, boost::test_tools::per_element());
          // Off the host's expf, scores 1 ulp apart may order differently from the oracle's: the band is compared
          // with the portable pass only there.
          if (pattern_kind == 1 || host) expect_oracle<DeviceType, float>(p, native, pre, out);
        }
      }
    }
}

// QB's routing, probs and intermediate are topk_router's bit for bit (the same implementation), and the backward
// from QB's saved state is the Sigmoid backward of topk_router's (§19.10 case 11).
BOOST_AUTO_TEST_CASE_TEMPLATE(same_as_topk_router, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const Problem p = random_problem<float>(97, 48, 6, 100, 7);
  RouterConfig cfg;
  cfg.topk = p.k;
  cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  cfg.scaling_factor = 2.5f;
  std::vector<double> xd(p.x.begin(), p.x.end()), bd(p.b.begin(), p.b.end());
  auto logits = device_values<D, float>("logits", p.T, p.E, xd);
  auto bias = device_vector<D, float>("bias", bd);
  auto bounds = device_vector<D, float>("bounds", {p.lower, p.upper});
  auto probs_qb = make2<D, float>("probs_qb", p.T, p.E, 0.0f), probs = make2<D, float>("probs", p.T, p.E, 0.0f);
  auto map_qb = make2<D, std::uint8_t>("map_qb", p.T, p.E, std::uint8_t(0));
  auto map = make2<D, std::uint8_t>("map", p.T, p.E, std::uint8_t(0));
  auto inter_qb = make2<D, float>("inter_qb", p.T, p.E, 0.0f), inter = make2<D, float>("inter", p.T, p.E, 0.0f);
  auto cutoff = make1<D, float>("cutoff", p.T, 0.0f);
  auto hist = make2<D, std::int32_t>("hist", p.E, p.num_bins, 0);
  KokkosMoE::topk_router_qb(Exec(), cfg, QbConfig{}, logits, bias, bounds, probs_qb, map_qb, inter_qb, cutoff, hist);
  KokkosMoE::topk_router(Exec(), cfg, logits, bias, probs, map, inter);
  BOOST_TEST(bytes_equal(download(probs_qb), download(probs)));
  BOOST_TEST(bytes_equal(download(map_qb), download(map)));
  BOOST_TEST(bytes_equal(download(inter_qb), download(inter)));
  std::vector<double> gd(static_cast<std::size_t>(p.T) * p.E);
  Rng rng(11);
  for (auto& v : gd) v = rng.uniform() - 0.5;
  auto grad = device_values<D, float>("grad_probs", p.T, p.E, gd);
  auto gl_qb = make2<D, float>("grad_logits_qb", p.T, p.E, 0.0f), gl = make2<D, float>("grad_logits", p.T, p.E, 0.0f);
  KokkosMoE::topk_router_backward(Exec(), cfg, map_qb, inter_qb, grad, gl_qb);
  KokkosMoE::topk_router_backward(Exec(), cfg, map, inter, grad, gl);
  BOOST_TEST(bytes_equal(download(gl_qb), download(gl)));
}

namespace {
enum class Variant { Serial, Team, TeamVector, ThreadVector };

/// A user kernel around the per-token QB functions: one team per token (ThreadVector: one token per team thread),
/// the workspace in scratch, the cutoff written by one thread.
template <class D>
struct QbTokenKernel {
  using Exec = typename D::execution_space;
  using member_type = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Work = KokkosMoE::TokenRouterWorkspace<typename Exec::scratch_memory_space>;
  Variant variant;
  KokkosMoE::TokenRouterParams p;
  V2<D, const float> logits;
  V1<D, const float> bias;
  V2<D, std::int32_t> ids;
  V2<D, float> weights;
  V1<D, float> cutoff;
  int tokens_per_team;
  bool tagged = false;  // TokenRouteQB<member_type, Mode::...> instead of the variant's own name

  template <class V>
  KOKKOS_INLINE_FUNCTION static auto row(const V& v, int t) {
    return Kokkos::subview(v, t, Kokkos::ALL);
  }
  template <class ArgMode>
  KOKKOS_INLINE_FUNCTION float by_mode(const member_type& m, int t, const Work& w) const {
    return KokkosMoE::TokenRouteQB<member_type, ArgMode>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                                 row(weights, t));
  }
  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    using KokkosMoE::Mode;
    if (variant == Variant::ThreadVector) {
      const int t = m.league_rank() * tokens_per_team + m.team_rank();
      if (t >= static_cast<int>(logits.extent(0))) return;
      const Work w(m.thread_scratch(0), p);
      const float c = tagged ? by_mode<Mode::ThreadVector>(m, t, w)
                             : KokkosMoE::ThreadVectorTokenRouteQB<member_type>::invoke(m, p, row(logits, t), bias, w,
                                                                                        row(ids, t), row(weights, t));
      Kokkos::single(Kokkos::PerThread(m), [&]() { cutoff(t) = c; });
      return;
    }
    const int t = m.league_rank();
    const Work w(m.team_scratch(0), p);
    if (variant == Variant::Serial) {
      Kokkos::single(Kokkos::PerTeam(m), [&]() {
        cutoff(t) =
            tagged ? by_mode<Mode::Serial>(m, t, w)
                   : KokkosMoE::SerialTokenRouteQB::invoke(p, row(logits, t), bias, w, row(ids, t), row(weights, t));
      });
      return;
    }
    float c = 0.0f;
    if (tagged) {
      c = variant == Variant::Team ? by_mode<Mode::Team>(m, t, w) : by_mode<Mode::TeamVector>(m, t, w);
    } else {
      c = variant == Variant::Team ? KokkosMoE::TeamTokenRouteQB<member_type>::invoke(m, p, row(logits, t), bias, w,
                                                                                      row(ids, t), row(weights, t))
                                   : KokkosMoE::TeamVectorTokenRouteQB<member_type>::invoke(
                                         m, p, row(logits, t), bias, w, row(ids, t), row(weights, t));
    }
    Kokkos::single(Kokkos::PerTeam(m), [&]() { cutoff(t) = c; });
  }
};
}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(token_functions, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename D::memory_space>::accessible;
  struct Shape {
    int T, E, k;
  };
  for (const Shape sh : {Shape{70, 384, 8}, Shape{33, 16, 15}, Shape{40, 9, 1}}) {
    const Problem p = random_problem<float>(sh.T, sh.E, sh.k, 10, 300u + sh.E);
    RouterConfig cfg;
    cfg.topk = p.k;
    cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
    const KokkosMoE::TokenRouterParams params = KokkosMoE::make_token_router_qb_params(cfg, p.E);
    std::vector<double> xd(p.x.begin(), p.x.end()), bd(p.b.begin(), p.b.end());
    const auto logits = device_values<D, float>("logits", p.T, p.E, xd);
    const auto bias = device_vector<D, float>("bias", bd);
    const QbOracle::Result o = QbOracle::route(p.x, p.b, p.T, p.E, p.k, p.sf, p.lower, p.upper, p.num_bins);
    // The library's own cutoff of the same batch.
    const Got api = run_qb<D, float>(p, Out::Idx32, QbHistogramMode::FusedAtomic,
                                     std::vector<std::int32_t>(static_cast<std::size_t>(p.E) * p.num_bins, 0));
    const std::size_t bytes = KokkosMoE::TokenRouterWorkspace<typename Exec::scratch_memory_space>::shmem_size(params);
    for (const Variant v : {Variant::Serial, Variant::Team, Variant::TeamVector, Variant::ThreadVector})
      for (const bool tagged : {false, true}) {
        BOOST_TEST_CONTEXT("variant " << static_cast<int>(v) << (tagged ? " (Mode tag)" : "") << ", T " << p.T << " E "
                                      << p.E << " k " << p.k) {
          auto ids = make2<D, std::int32_t>("ids", p.T, p.k, -1);
          auto weights = make2<D, float>("weights", p.T, p.k, -1.0f);
          auto cutoff = make1<D, float>("cutoff", p.T, -3.0f);
          QbTokenKernel<D> kernel{v, params, logits, bias, ids, weights, cutoff, 1, tagged};
          if (v == Variant::ThreadVector) {
            const int vl = host ? 1 : 8, tpt = host ? 1 : 4;
            kernel.tokens_per_team = tpt;
            Kokkos::TeamPolicy<Exec> policy(Exec{}, (p.T + tpt - 1) / tpt, tpt, vl);
            policy.set_scratch_size(0, Kokkos::PerThread(bytes));
            Kokkos::parallel_for("test::qb_thread_vector", policy, kernel);
          } else {
            const int ts = (host || v == Variant::Serial) ? 1 : (v == Variant::TeamVector ? 8 : 32);
            Kokkos::TeamPolicy<Exec> policy(Exec{}, p.T, ts, (!host && v == Variant::TeamVector) ? 4 : 1);
            policy.set_scratch_size(0, Kokkos::PerTeam(bytes));
            Kokkos::parallel_for("test::qb_team", policy, kernel);
          }
          Exec{}.fence();
          const auto got_ids = download(ids);
          const auto got_w = download(weights);
          const auto got_c = download(cutoff);
          const Tol tol = fp32_tol(p.E);
          Mismatches log("per-token QB vs oracle");
          for (int t = 0; t < p.T; ++t) {
            for (int i = 0; i < p.k; ++i) {
              const std::size_t j = static_cast<std::size_t>(t) * p.k + i;
              const bool w_ok = host ? same_float(got_w[j], o.weights[j]) : close(got_w[j], o.weights[j], tol);
              if (got_ids[j] != o.routes[j] || !w_ok)
                log.add([&](std::ostream& os) { os << "token " << t << " slot " << i << ": id " << got_ids[j]; });
            }
            const bool c_ok = host ? same_float(got_c[t], o.cutoff[t]) : close(got_c[t], o.cutoff[t], tol);
            if (!c_ok || !same_float(got_c[t], api.cutoff[t]))
              log.add([&](std::ostream& os) {
                os << "token " << t << ": cutoff " << got_c[t] << " (oracle " << o.cutoff[t] << ", topk_router_qb "
                   << api.cutoff[t] << ")";
              });
          }
          log.report();
        }
      }
  }
  // The QB rules at the boundary of the device functions.
  RouterConfig bad;
  bad.topk = 8;
  bad.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  try {
    KokkosMoE::make_token_router_qb_params(bad, 8);
    BOOST_TEST(false, "topk = E: no error");
  } catch (const KokkosMoE::InvalidArgument& e) {
    BOOST_TEST(std::string(KokkosMoE::rule_name(e.rule())) == KokkosMoE::rule_name(Rule::QbTopkRange));
  }
}

#if defined(KOKKOS_ENABLE_CUDA)
// The unchecked calls read the bounds on the device only: captured once, a replay routes the logits and uses the
// bounds that are in memory at replay time. Each replay adds its counts to the same histogram.
BOOST_AUTO_TEST_CASE(cuda_graph_replays_new_logits) {
  using D = Kokkos::Cuda::device_type;
  const int T = 300, E = 96, k = 8, bins = 200;
  Problem p = random_problem<float>(T, E, k, bins, 1);
  RouterConfig cfg;
  cfg.topk = k;
  cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  QbConfig fused, two_pass;
  fused.validate_bin_bounds = two_pass.validate_bin_bounds = false;
  two_pass.histogram_mode = QbHistogramMode::TwoPass;
  std::vector<double> bd(p.b.begin(), p.b.end());
  auto logits = make2<D, float>("logits", T, E, 0.0f);
  auto bias = device_vector<D, float>("bias", bd);
  auto bounds = device_vector<D, float>("bounds", {p.lower, p.upper});
  auto probs = make2<D, float>("probs", T, E, 0.0f), probs_i = make2<D, float>("probs_i", T, E, 0.0f);
  auto map = make2<D, std::uint8_t>("map", T, E, std::uint8_t(0));
  auto idx = make2<D, std::int32_t>("indices", T, k, 0);
  auto inter = make2<D, float>("inter", T, E, 0.0f), inter_i = make2<D, float>("inter_i", T, E, 0.0f);
  auto cutoff = make1<D, float>("cutoff", T, 0.0f), cutoff_i = make1<D, float>("cutoff_i", T, 0.0f);
  auto hist = make2<D, std::int32_t>("hist", E, bins, 0), hist_i = make2<D, std::int32_t>("hist_i", E, bins, 0);
  cudaStream_t stream;
  BOOST_REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  {
    const Kokkos::Cuda exec(stream);
    auto enqueue = [&] {
      KokkosMoE::topk_router_qb(exec, cfg, fused, logits, bias, bounds, probs, map, inter, cutoff, hist);
      KokkosMoE::topk_router_qb_indices(exec, cfg, two_pass, logits, bias, bounds, probs_i, idx, inter_i, cutoff_i,
                                        hist_i);
    };
    enqueue();  // warm-up outside the capture
    exec.fence();
    cudaGraph_t graph;
    BOOST_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
    enqueue();
    BOOST_REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
    cudaGraphExec_t instance;
    BOOST_REQUIRE(cudaGraphInstantiate(&instance, graph, 0) == cudaSuccess);
    for (int replay = 0; replay < 3; ++replay) {
      BOOST_TEST_CONTEXT("replay " << replay) {
        const Problem q = random_problem<float>(T, E, k, bins, 50 + replay);
        p.x = q.x;
        p.lower = -1.2f - 0.1f * replay;  // new bounds on the device, read at replay time
        p.upper = 1.2f + 0.2f * replay;
        upload(logits, p.x);
        upload(bounds, std::vector<float>{p.lower, p.upper});
        const std::vector<std::int32_t> zero(static_cast<std::size_t>(E) * bins, 0);
        upload(hist, zero);
        upload(hist_i, zero);
        Kokkos::fence();
        BOOST_REQUIRE(cudaGraphLaunch(instance, stream) == cudaSuccess);
        BOOST_REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
        Got g, gi;
        g.routed.resize(T);
        gi.routed.resize(T);
        const auto m = download(map);
        const auto ix = download(idx);
        for (int t = 0; t < T; ++t) {
          for (int e = 0; e < E; ++e)
            if (m[static_cast<std::size_t>(t) * E + e] != 0) g.routed[t].push_back(e);
          for (int i = 0; i < k; ++i) gi.routed[t].push_back(ix[static_cast<std::size_t>(t) * k + i]);
        }
        g.probs = download(probs);
        gi.probs = download(probs_i);
        g.intermediate = download(inter);
        gi.intermediate = download(inter_i);
        g.cutoff = download(cutoff);
        gi.cutoff = download(cutoff_i);
        g.hist = download(hist);
        gi.hist = download(hist_i);
        expect_oracle<D, float>(p, g, zero, Out::Bytemap);
        expect_oracle<D, float>(p, gi, zero, Out::Idx32);
        BOOST_TEST(g.hist == gi.hist, boost::test_tools::per_element());
      }
    }
    BOOST_TEST(cudaGraphExecDestroy(instance) == cudaSuccess);
    BOOST_TEST(cudaGraphDestroy(graph) == cudaSuccess);
  }
  BOOST_TEST(cudaStreamDestroy(stream) == cudaSuccess);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
