/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Self-tests of the oracle (RouterOracle.hpp) before anything is compared against it: its own RNE conversions
// against the library's storage types (exhaustive decode, special values, ties, random patterns), hand-worked
// examples from docs/router.md, and central finite differences in double of its forward against its backward
// formulas (§9, §10) — the oracle's backward is the spec's formula, validated here against the spec's forward.

#include <boost/test/unit_test.hpp>

#include "RouterTestUtils.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {
float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(oracle_selftest)

BOOST_AUTO_TEST_CASE(half_and_bfloat_decode_exhaustive) {
  int bad_h = 0, bad_b = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const double mine_h = Oracle::from_half_bits(static_cast<std::uint16_t>(b));
    const float lib_h = static_cast<float>(fp16_t::from_bits(static_cast<std::uint16_t>(b)));
    if (!(mine_h == lib_h || (std::isnan(mine_h) && std::isnan(lib_h))) || std::signbit(mine_h) != std::signbit(lib_h))
      ++bad_h;
    const double mine_b = Oracle::from_bf16_bits(static_cast<std::uint16_t>(b));
    const float lib_b = static_cast<float>(bf16_t::from_bits(static_cast<std::uint16_t>(b)));
    if (!(mine_b == lib_b || (std::isnan(mine_b) && std::isnan(lib_b))) || std::signbit(mine_b) != std::signbit(lib_b))
      ++bad_b;
  }
  BOOST_TEST(bad_h == 0);
  BOOST_TEST(bad_b == 0);
}

BOOST_AUTO_TEST_CASE(rne_rounding_against_storage_types) {
  // hand-picked values: ties to even, overflow thresholds, subnormal boundaries, signed zeros, infinities
  const double h_cases[][2] = {{1.0, 0x3c00},
                               {1.0 + 0x1p-11, 0x3c00},      // tie -> even (down)
                               {1.0 + 3 * 0x1p-11, 0x3c02},  // tie -> even (up)
                               {65504.0, 0x7bff},
                               {65519.99, 0x7bff},
                               {65520.0, 0x7c00},
                               {0x1p-24, 0x0001},
                               {0x1p-25, 0x0000},  // tie between 0 and the smallest subnormal -> 0
                               {1.5 * 0x1p-25, 0x0001},
                               {0x1p-14, 0x0400},
                               {0x1p-14 - 0x1p-25, 0x0400},
                               {-0.0, 0x8000},
                               {-2.0, 0xc000}};
  for (const auto& c : h_cases) {
    BOOST_TEST(Oracle::to_half_bits(c[0]) == static_cast<std::uint16_t>(c[1]), "half(" << c[0] << ")");
    BOOST_TEST(fp16_t(static_cast<float>(c[0])).bits == static_cast<std::uint16_t>(c[1]),
               "library half(" << c[0] << ")");
  }
  const double b_cases[][2] = {{1.0, 0x3f80},
                               {1.0 + 0x1p-8, 0x3f80},  // tie -> even
                               {1.0 + 3 * 0x1p-8, 0x3f82},
                               {-0.0, 0x8000},
                               {0x1p-133, 0x0001},
                               {3.0e38, 0x7f62},
                               {std::ldexp(2.0 - 0x1p-8, 127), 0x7f80}};
  for (const auto& c : b_cases) {
    BOOST_TEST(Oracle::to_bf16_bits(c[0]) == static_cast<std::uint16_t>(c[1]), "bf16(" << c[0] << ")");
    BOOST_TEST(bf16_t(static_cast<float>(c[0])).bits == static_cast<std::uint16_t>(c[1]),
               "library bf16(" << c[0] << ")");
  }
  BOOST_TEST(std::isnan(Oracle::from_half_bits(Oracle::to_half_bits(Oracle::qnan()))));
  BOOST_TEST(std::isnan(Oracle::from_bf16_bits(Oracle::to_bf16_bits(Oracle::qnan()))));
  BOOST_TEST(Oracle::to_half_bits(Oracle::inf()) == 0x7c00);
  BOOST_TEST(Oracle::to_bf16_bits(-Oracle::inf()) == 0xff80);
  // random float bit patterns (all exponents), the oracle's double rounding against the library's float rounding
  Rng rng(2024);
  int bad_h = 0, bad_b = 0;
  for (int i = 0; i < 400000; ++i) {
    const float f = bits_to_float(static_cast<std::uint32_t>(rng.next()));
    const std::uint16_t lh = fp16_t(f).bits, lb = bf16_t(f).bits;
    if (std::isnan(f)) {
      bad_h += (lh & 0x7c00) != 0x7c00 || (lh & 0x3ff) == 0;
      bad_b += (lb & 0x7f80) != 0x7f80 || (lb & 0x7f) == 0;
      continue;
    }
    bad_h += Oracle::to_half_bits(f) != lh;
    bad_b += Oracle::to_bf16_bits(f) != lb;
  }
  BOOST_TEST(bad_h == 0);
  BOOST_TEST(bad_b == 0);
  // the fp16 range densely (every float near the half grid, incl. exact midpoints)
  bad_h = 0;
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = Oracle::from_half_bits(static_cast<std::uint16_t>(h));
    const double next = Oracle::from_half_bits(static_cast<std::uint16_t>(h + 1));
    for (double x :
         {v, 0.5 * (v + next), std::nextafter(0.5 * (v + next), 0.0), std::nextafter(0.5 * (v + next), 1e9)}) {
      const float f = static_cast<float>(x);
      bad_h += Oracle::to_half_bits(f) != fp16_t(f).bits;
      bad_h += Oracle::to_half_bits(-f) != fp16_t(-f).bits;
    }
  }
  BOOST_TEST(bad_h == 0);
}

BOOST_AUTO_TEST_CASE(total_order) {
  const double nan = Oracle::qnan(), inf = Oracle::inf();
  BOOST_TEST(Oracle::same_rank(-0.0, 0.0));
  BOOST_TEST(Oracle::precedes(-0.0, 1, 0.0, 2));
  BOOST_TEST(!Oracle::precedes(0.0, 2, -0.0, 1));
  BOOST_TEST(Oracle::precedes(inf, 5, 1e300, 0));
  BOOST_TEST(Oracle::precedes(-1e300, 5, -inf, 0));
  BOOST_TEST(Oracle::precedes(-inf, 5, nan, 0));
  BOOST_TEST(Oracle::precedes(nan, 0, -nan, 1));
  BOOST_TEST(!Oracle::precedes(-nan, 1, nan, 0));
}

BOOST_AUTO_TEST_CASE(hand_worked_examples) {
  // docs/router.md §5.4: E = 10, selected {0, 3, 9} -> bytes 0x09, 0x02
  std::vector<char> routed(10, 0);
  routed[0] = routed[3] = routed[9] = 1;
  const auto bytes = Oracle::pack_bits(routed);
  BOOST_TEST(bytes.size() == 2u);
  BOOST_TEST(bytes[0] == 0x09);
  BOOST_TEST(bytes[1] == 0x02);
  // Sigmoid, k = 2, scale 2: y = {0.5, 0.75, 0.25, 0.8} -> picks {3, 1}; weights 2*{0.8, 0.75}/1.55
  const double x[] = {0.0, std::log(3.0), -std::log(3.0), std::log(4.0)};
  Oracle::Attr a = make_attr(Score::Sigmoid, false, 2, 0, 0, 2.0);
  auto r = Oracle::forward_row(a, x, 4, nullptr);
  BOOST_TEST(r.idx == (std::vector<int>{3, 1}));
  BOOST_TEST(std::fabs(r.weight[0] - 2 * 0.8 / 1.55) < 1e-12);
  BOOST_TEST(std::fabs(r.weight[1] - 2 * 0.75 / 1.55) < 1e-12);
  // the same with a bias that promotes expert 2 (selection only); k = 1 leaves the weight unnormalized
  const double b[] = {0.0, 0.0, 0.6, 0.0};
  a.topk = 1;
  r = Oracle::forward_row(a, x, 4, b);
  BOOST_TEST(r.idx == (std::vector<int>{2}));
  BOOST_TEST(std::fabs(r.weight[0] - 2 * 0.25) < 1e-12);
  // Softmax post, k = 2: softmax over the two selected logits
  const double z[] = {1.0, 3.0, 2.0};
  a = make_attr(Score::Softmax, false, 2);
  r = Oracle::forward_row(a, z, 3, nullptr);
  BOOST_TEST(r.idx == (std::vector<int>{1, 2}));
  BOOST_TEST(std::fabs(r.weight[0] - 1.0 / (1.0 + std::exp(-1.0))) < 1e-12);
  BOOST_TEST(r.inter[0] == -Oracle::inf());
  // Softmax pre returns the full-row probabilities, not renormalized
  a.pre = true;
  r = Oracle::forward_row(a, z, 3, nullptr);
  const double s = std::exp(1.0) + std::exp(3.0) + std::exp(2.0);
  BOOST_TEST(std::fabs(r.weight[0] - std::exp(3.0) / s) < 1e-12);
  BOOST_TEST(std::fabs(r.weight[1] - std::exp(2.0) / s) < 1e-12);
  // grouping: E = 8, G = 4 (gs = 2), gk = 2, k = 2 (kg = 1): group maxima 1, 7, 6.5, 3 -> groups 1, 2
  const double g[] = {1, 0, 7, 2, 5, 6.5, 3, 0};
  a = make_attr(Score::Softmax, false, 2, 4, 2);
  r = Oracle::forward_row(a, g, 8, nullptr);
  BOOST_TEST(r.group_order[0] == 1);
  BOOST_TEST(r.group_order[1] == 2);
  BOOST_TEST(r.idx == (std::vector<int>{2, 5}));
  // kg = 2 changes the ranking: group sums 1, 9, 11.5, 3 -> groups 2, 1; top-2 overall {2, 5}
  a = make_attr(Score::Softmax, false, 4, 4, 2);
  r = Oracle::forward_row(a, g, 8, nullptr);
  BOOST_TEST(r.group_order[0] == 2);
  BOOST_TEST(r.idx == (std::vector<int>{2, 5, 4, 3}));
  // softmax rules of §5.1/§7: a leading -inf is fine; NaN, +inf, all -inf give NaN rows
  const auto p = Oracle::softmax({-Oracle::inf(), 0.0, 0.0});
  BOOST_TEST(p[0] == 0.0);
  BOOST_TEST(p[1] == 0.5);
  BOOST_TEST(std::isnan(Oracle::softmax({1.0, Oracle::inf()})[0]));
  BOOST_TEST(std::isnan(Oracle::softmax({-Oracle::inf(), -Oracle::inf()})[1]));
  BOOST_TEST(std::isnan(Oracle::softmax({1.0, Oracle::qnan()})[0]));
  // aux loss constant: ((E * coeff) / topk) / T / T
  BOOST_TEST(Oracle::aux_loss_const(128, 4, 0.01, 2048.0) == ((128 * 0.01) / 4) / 2048.0 / 2048.0);
}

// d/dx of L(x) = sum_e gp[e] * probs[e](x), central differences in double, against backward_row.
BOOST_AUTO_TEST_CASE(backward_formula_matches_finite_differences) {
  const int E = 16;
  int checked = 0;
  for (const auto f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax})
    for (int pre = 0; pre < (f == Score::Softmax ? 2 : 1); ++pre)
      for (int bias = 0; bias < (f == Score::Softmax ? 1 : 2); ++bias)
        for (int k : {1, 2, 4})
          for (int grouped = 0; grouped < 2; ++grouped)
            for (double scale : {1.0, 1.2}) {
              const Oracle::Attr a = make_attr(f, pre, k, grouped ? 4 : 0, grouped ? 2 : 0, scale);
              if (!grouping_valid(E, k, a.G, a.gk)) continue;
              RouterInputs in = generate_router_inputs<double>(a, 3, E, bias, 99 + k);
              const double* bp = in.b.empty() ? nullptr : in.b.data();
              const std::vector<double> gp = random_values<double>(E, 7 + k);
              for (int t = 0; t < 3; ++t) {
                std::vector<double> x(in.x.begin() + t * E, in.x.begin() + (t + 1) * E);
                const auto r = Oracle::forward_row(a, x.data(), E, bp);
                const auto an = Oracle::backward_row(a, r.routed, r.inter, gp.data());
                const auto ids = r.idx;
                const auto cb = Oracle::compact_backward_row(a, x.data(), E, ids.data(), gp.data());
                auto L = [&](const std::vector<double>& xx) {
                  const auto rr = Oracle::forward_row(a, xx.data(), E, bp);
                  BOOST_TEST_REQUIRE(rr.idx == r.idx);  // the step must not change the routing
                  double l = 0.0;
                  for (int e = 0; e < E; ++e) l += gp[e] * rr.probs[e];
                  return l;
                };
                auto Lc = [&](const std::vector<double>& xx) {  // compact: L = sum_i gw[i] * weight[i]
                  const auto rr = Oracle::forward_row(a, xx.data(), E, bp);
                  double l = 0.0;
                  for (int i = 0; i < k; ++i) l += gp[i] * rr.weight[i];
                  return l;
                };
                for (int e = 0; e < E; ++e) {
                  const double h = 1e-6;
                  auto xp = x, xm = x;
                  xp[e] += h;
                  xm[e] -= h;
                  const double fd = (L(xp) - L(xm)) / (2 * h);
                  BOOST_TEST(std::fabs(fd - an[e]) <= 1e-7 + 1e-6 * std::fabs(an[e]),
                             describe(a, 3, E, bias, "double")
                                 << " t=" << t << " e=" << e << " fd " << fd << " formula " << an[e]);
                  const double fdc = (Lc(xp) - Lc(xm)) / (2 * h);
                  BOOST_TEST(std::fabs(fdc - cb[e]) <= 1e-7 + 1e-6 * std::fabs(cb[e]),
                             "compact " << describe(a, 3, E, bias, "double") << " t=" << t << " e=" << e);
                  ++checked;
                }
              }
            }
  BOOST_TEST(checked > 1000);
}

BOOST_AUTO_TEST_CASE(aux_scores_backward_formula_matches_finite_differences) {
  const int E = 12;
  for (const auto f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax}) {
    Rng rng(5 + static_cast<int>(f));
    std::vector<double> x(E), g(E);
    for (int e = 0; e < E; ++e) {
      x[e] = rng.uniform(-4, 4) + (f == Score::SqrtSoftplus && e % 3 == 0 ? 22.0 : 0.0);
      g[e] = rng.uniform(-1, 1);
    }
    const auto r = Oracle::aux_scores_row(f, 3, x.data(), E);
    const auto an = Oracle::aux_scores_backward_row(f, r.inter, g.data());
    for (int e = 0; e < E; ++e) {
      const double h = 1e-6;
      auto xp = x, xm = x;
      xp[e] += h;
      xm[e] -= h;
      const auto rp = Oracle::aux_scores_row(f, 3, xp.data(), E), rm = Oracle::aux_scores_row(f, 3, xm.data(), E);
      double fd = 0.0;
      for (int j = 0; j < E; ++j) fd += g[j] * (rp.scores[j] - rm.scores[j]) / (2 * h);
      BOOST_TEST(std::fabs(fd - an[e]) <= 1e-8 + 1e-6 * std::fabs(an[e]), "f=" << int(f) << " e=" << e);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
