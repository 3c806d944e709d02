/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Tie-breaking (docs/router.md §6) and non-finite values (§7), the explicit cases of §16.4. Every expectation here is
// derived by hand from the spec and asserted against both the oracle and the library (all output kinds, both
// implementations, forward and backward), plus the config.check_finite debug check (NonFiniteInput naming (t, e)).

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>

#include "RouterRunner.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

/// Runs a hand-made case: the oracle must select `expect` (per row; one entry = every row), the library must agree
/// with the oracle on every output kind and implementation (forward and backward), and its int32 indices must equal
/// `expect` directly.
template <class D, class S = float>
RouterCase<D, S> hand_case(const std::string& what, const Oracle::Attr& a, int E, const std::vector<double>& x,
                           const std::vector<double>& b, const std::vector<std::vector<int>>& expect) {
  RouterInputs in;
  in.E = E;
  in.T = static_cast<int>(x.size()) / E;
  for (double v : x) in.x.push_back(Num<S>::quantize(v));
  for (double v : b) in.b.push_back(Num<S>::quantize(v));
  auto c = make_case<D, S>(a, in);
  BOOST_TEST_CONTEXT(what << ": " << c.name) {
    for (int t = 0; t < in.T; ++t) {
      const std::vector<int>& ex = expect.size() == 1 ? expect[0] : expect[t];
      BOOST_TEST(c.ref[t].idx == ex, "oracle selection of row " << t);
    }
    for (const auto impl : kImpls) {
      KokkosMoE::RouterConfig cfg = to_config(a);
      cfg.implementation = impl;
      const auto idx = download(run_forward<D, S, S>(cfg, Out::I32, c.logits, c.bias).i32);
      for (int t = 0; t < in.T; ++t) {
        const std::vector<int>& ex = expect.size() == 1 ? expect[0] : expect[t];
        const std::vector<int> got(idx.begin() + t * a.topk, idx.begin() + (t + 1) * a.topk);
        BOOST_TEST(got == ex, impl_name(impl) << " library selection of row " << t);
      }
    }
    run_router_case(c, RunFlags{true, true});
  }
  return c;
}

std::vector<int> iota_vec(int n, int start = 0) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

struct ModeT {
  Score f;
  bool pre;
};
const ModeT kAllModes[] = {
    {Score::Sigmoid, false}, {Score::SqrtSoftplus, false}, {Score::Softmax, false}, {Score::Softmax, true}};

}  // namespace

BOOST_AUTO_TEST_SUITE(router_ties)

// A constant row selects experts 0..k-1 in that slot order, for every function, with bias, with grouping.
BOOST_AUTO_TEST_CASE_TEMPLATE(constant_row_selects_lowest_indices, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  for (const ModeT& m : kAllModes)
    for (int grouped = 0; grouped < 2; ++grouped)
      for (int E : {32, 130}) {
        if (grouped && E % 8) continue;
        const int k = 8;
        const Oracle::Attr a = make_attr(m.f, m.pre, k, grouped ? 8 : 0, grouped ? 4 : 0, 1.2);
        std::vector<double> x;
        for (double v : {0.7, -2.0, 0.0, 3.5}) x.insert(x.end(), E, v);
        std::vector<double> b;
        if (m.f != Score::Softmax) b.assign(E, 0.25);
        hand_case<DeviceType, float>("constant row", a, E, x, b, {iota_vec(k)});
        hand_case<DeviceType, bf16_t>("constant row", a, E, x, b, {iota_vec(k)});
      }
}

// Duplicated values resolve to the lower index: x = [1, 3, 3, 2, 3, 0.5, 2, ...]
BOOST_AUTO_TEST_CASE_TEMPLATE(duplicates_resolve_to_lower_index, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 12;
  const std::vector<double> row = {1, 3, 3, 2, 3, 0.5, 2, -1, 3, 0, 2, -2};
  for (const ModeT& m : kAllModes) {
    hand_case<DeviceType, float>("duplicates k=2", make_attr(m.f, m.pre, 2), E, row, {}, {{1, 2}});
    hand_case<DeviceType, float>("duplicates k=5", make_attr(m.f, m.pre, 5), E, row, {}, {{1, 2, 4, 8, 3}});
    hand_case<DeviceType, fp16_t>("duplicates k=7", make_attr(m.f, m.pre, 7), E, row, {}, {{1, 2, 4, 8, 3, 6, 10}});
  }
  // ties in the biased selection score: experts 1 and 5 have equal logits and equal bias
  const std::vector<double> x = {-3, 0, -3, -3, -3, 0, -3, -3};
  const std::vector<double> b = {0, 0.5, 0, 0, 0, 0.5, 0, 0.25};
  hand_case<DeviceType, float>("bias ties", make_attr(Score::Sigmoid, false, 2), 8, x, b, {{1, 5}});
  hand_case<DeviceType, float>("bias ties", make_attr(Score::SqrtSoftplus, false, 3), 8, x, b, {{1, 5, 7}});
}

// -0.0 and +0.0 are a tie (docs/router.md §7.2): the lower index wins whichever sign it has.
BOOST_AUTO_TEST_CASE_TEMPLATE(signed_zeros_tie, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const Oracle::Attr a1 = make_attr(Score::Softmax, false, 1), a2 = make_attr(Score::Softmax, false, 2);
  const std::vector<double> r1 = {-1.0, -0.0, 0.0, -2.0, -0.5, -3.0};
  const std::vector<double> r2 = {-1.0, 0.0, -0.0, -2.0, -0.5, -3.0};
  hand_case<DeviceType, float>("-0 before +0", a1, 6, r1, {}, {{1}});
  hand_case<DeviceType, float>("+0 before -0", a1, 6, r2, {}, {{1}});
  hand_case<DeviceType, float>("-0 before +0", a2, 6, r1, {}, {{1, 2}});
  hand_case<DeviceType, float>("+0 before -0", a2, 6, r2, {}, {{1, 2}});
  hand_case<DeviceType, bf16_t>("-0 before +0 (bf16)", a2, 6, r1, {}, {{1, 2}});
  hand_case<DeviceType, fp16_t>("+0 before -0 (fp16)", a2, 6, r2, {}, {{1, 2}});
  // -0.0 and +0.0 in the group scores: groups {-0, -1} and {+0, -1} tie on their top-1 score; lower group wins
  const Oracle::Attr g = make_attr(Score::Softmax, false, 1, 3, 1);
  hand_case<DeviceType, float>("signed-zero group tie", g, 6, {-1.0, -5.0, 0.0, -1.0, -0.0, -1.0}, {}, {{2}});
  hand_case<DeviceType, float>("signed-zero group tie", g, 6, {-1.0, -5.0, -0.0, -1.0, 0.0, -1.0}, {}, {{2}});
}

// Ties across a group boundary and ties between group scores (docs/router.md §5.3, §6).
BOOST_AUTO_TEST_CASE_TEMPLATE(group_ties, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // E = 16, G = 4 (gs = 4), gk = 2, k = 4 (kg = 2). Group ranking g1 > g0 > g2 > g3 under every score function
  // (raw: 6, 5, -2, -4); experts 3 and 4 tie across the group boundary -> 3 first.
  const std::vector<double> boundary = {0, 0, 0, 5, 5, 1, 0, 0, -1, -1, -1, -1, -2, -2, -2, -2};
  for (const ModeT& m : kAllModes)
    hand_case<DeviceType, float>("tie across group boundary", make_attr(m.f, m.pre, 4, 4, 2), 16, boundary, {},
                                 {{3, 4, 5, 0}});
  // group scores tie: g1 = g2 = 4 (g0 = 2, g3 = 3); gk = 1 -> g1 (lower index), experts 5, 7
  const std::vector<double> gt = {1, 1, 0, 0, 0, 3, 0, 1, 1, 0, 3, 0, 2, 1, 0, 0};
  hand_case<DeviceType, float>("group-score tie, gk=1", make_attr(Score::Softmax, false, 2, 4, 1), 16, gt, {},
                               {{5, 7}});
  // gk = 2 -> g1, g2; experts 5 and 10 tie (3), 7 and 8 tie (1)
  hand_case<DeviceType, float>("group-score tie, gk=2", make_attr(Score::Softmax, false, 4, 4, 2), 16, gt, {},
                               {{5, 10, 7, 8}});
  // all groups tie (constant row with bias 0): groups 0..gk-1
  hand_case<DeviceType, float>("all groups tie", make_attr(Score::Sigmoid, false, 4, 4, 2), 16,
                               std::vector<double>(16, 0.3), std::vector<double>(16, 0.0), {{0, 1, 2, 3}});
}

// FP32 sigmoid saturates (docs/router.md §15): logits 17 (expert 1) and 20 (expert 3) both give exactly 1.0f, a tie the
// lower index wins although expert 3 has the larger logit. (A double oracle would pick 3: this is checked directly.)
BOOST_AUTO_TEST_CASE_TEMPLATE(sigmoid_saturation_ties_to_lower_index, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  const std::vector<double> x = {0, 17, 0, 20, -1, 16.0};
  for (const auto impl : kImpls) {
    KokkosMoE::RouterConfig cfg = to_config(make_attr(Score::Sigmoid, false, 1, 0, 0, 2.0));
    cfg.implementation = impl;
    const auto logits = device_values<D, float>("logits", 1, 6, x);
    const auto out = run_forward<D, float, float>(cfg, Out::I32, logits, V1<D, const float>());
    BOOST_TEST(download(out.i32)[0] == 1);
    BOOST_TEST(download(out.probs)[1] == 2.0f);
  }
}

// Scores that agree in all but their lowest mantissa bits, spread over every lane of a token. The CUDA lane kernel
// selects on 32-bit keys whose low bits are the inverted expert index (docs/design.md, "CUDA forward: packed keys and
// selection rounds"): where the scores rise with the index those keys order them wrongly, and its exactness check
// must redo the token on full keys. Softmax post selects on the logit itself, so the expected slots follow from the
// values alone (FP32 logits: with 16-bit ones the coarse key is the full key).
BOOST_AUTO_TEST_CASE_TEMPLATE(near_ties_below_the_packed_key_bits, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const double ulp = std::ldexp(1.0, -23);  // of values in [1, 2)
  for (const int E : {64, 256, 1024})
    for (const int k : {8, 32}) {
      std::vector<double> x;
      for (int e = 0; e < E; ++e) x.push_back(1.0 + e * ulp);                     // rising with the index
      for (int e = 0; e < E; ++e) x.push_back(1.0 + (E - 1 - e) * ulp);           // falling
      for (int e = 0; e < E; ++e) x.push_back(e % 5 == 0 ? 1.5 + e * ulp : 0.0);  // every fifth rising
      // §6 on the exact values: descending, equal values to the lower index
      std::vector<std::vector<int>> expect;
      for (int t = 0; t < 3; ++t) {
        std::vector<int> order = iota_vec(E);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[t * E + a] > x[t * E + b]; });
        expect.emplace_back(order.begin(), order.begin() + k);
      }
      hand_case<DeviceType, float>("near ties", make_attr(Score::Softmax, false, k), E, x, {}, expect);
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(router_nonfinite)

// All-NaN rows (any sign): experts 0..k-1; Sigmoid/SqrtSoftplus/Softmax weights NaN; non-routed probs +0.0.
BOOST_AUTO_TEST_CASE_TEMPLATE(all_nan_rows, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 16;
  std::vector<double> x(E, kNaN);
  for (int e = 0; e < E; e += 3) x[e] = -kNaN;
  for (const ModeT& m : kAllModes)
    for (int grouped = 0; grouped < 2; ++grouped) {
      const Oracle::Attr a = make_attr(m.f, m.pre, 4, grouped ? 4 : 0, grouped ? 2 : 0);
      const auto c = hand_case<DeviceType, float>("all NaN", a, E, x, {}, {{0, 1, 2, 3}});
      for (int i = 0; i < 4; ++i) BOOST_TEST(std::isnan(c.ref[0].probs[i]));
      hand_case<DeviceType, fp16_t>("all NaN", a, E, x, {}, {{0, 1, 2, 3}});
    }
}

// All -inf rows: experts 0..k-1; Sigmoid/SqrtSoftplus give 0 (normalized 0/(0+eps) = 0), Softmax NaN.
BOOST_AUTO_TEST_CASE_TEMPLATE(all_neg_inf_rows, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 16;
  const std::vector<double> x(E, -kInf);
  for (const ModeT& m : kAllModes)
    for (int k : {1, 4}) {
      const auto c =
          hand_case<DeviceType, float>("all -inf", make_attr(m.f, m.pre, k, 0, 0, 1.5), E, x, {}, {iota_vec(k)});
      for (int i = 0; i < k; ++i) {
        if (m.f == Score::Softmax)
          BOOST_TEST(std::isnan(c.ref[0].probs[i]));
        else
          BOOST_TEST(c.ref[0].probs[i] == 0.0);
      }
      hand_case<DeviceType, bf16_t>("all -inf", make_attr(m.f, m.pre, k), E, x, {}, {iota_vec(k)});
    }
  // a row that starts with -inf followed by finite values is not NaN (docs/router.md §5.1)
  const std::vector<double> lead = {-kInf, -kInf, 1.0, 0.0, 2.0, -kInf, 0.5, -1.0};
  for (const bool pre : {false, true}) {
    const auto c =
        hand_case<DeviceType, float>("leading -inf", make_attr(Score::Softmax, pre, 3), 8, lead, {}, {{4, 2, 6}});
    for (int e = 0; e < 8; ++e) BOOST_TEST(!std::isnan(c.ref[0].probs[e]));
  }
}

// One +inf logit: Sigmoid -> 1 (selected first); SqrtSoftplus -> inf (first; normalization makes it NaN, the others
// 0); Softmax post -> first, all selected weights NaN (inf - inf); Softmax pre -> a NaN row, experts 0..k-1.
BOOST_AUTO_TEST_CASE_TEMPLATE(one_pos_inf, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 8;
  const std::vector<double> x = {0.5, -1.0, 2.0, 1.0, -2.0, kInf, 0.25, -0.5};
  hand_case<DeviceType, float>("+inf", make_attr(Score::Sigmoid, false, 3), E, x, {}, {{5, 2, 3}});
  const auto ssp =
      hand_case<DeviceType, float>("+inf", make_attr(Score::SqrtSoftplus, false, 3), E, x, {}, {{5, 2, 3}});
  BOOST_TEST(std::isnan(ssp.ref[0].probs[5]));
  BOOST_TEST(ssp.ref[0].probs[2] == 0.0);
  const auto post = hand_case<DeviceType, float>("+inf", make_attr(Score::Softmax, false, 3), E, x, {}, {{5, 2, 3}});
  BOOST_TEST(std::isnan(post.ref[0].probs[2]));
  const auto pre = hand_case<DeviceType, float>("+inf", make_attr(Score::Softmax, true, 3), E, x, {}, {{0, 1, 2}});
  BOOST_TEST(std::isnan(pre.ref[0].probs[0]));
  hand_case<DeviceType, fp16_t>("+inf", make_attr(Score::Sigmoid, false, 1), E, x, {}, {{5}});
  // with k = 1 the SqrtSoftplus weight is the raw activation: +inf
  const auto k1 = hand_case<DeviceType, float>("+inf k=1", make_attr(Score::SqrtSoftplus, false, 1), E, x, {}, {{5}});
  BOOST_TEST(k1.ref[0].probs[5] == kInf);
}

// NaN in the bias: that expert's selection score is NaN and ranks last, whatever its logit.
BOOST_AUTO_TEST_CASE_TEMPLATE(nan_in_bias, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const int E = 8;
  const std::vector<double> x = {0.5, -1.0, 3.0, 1.0, -2.0, 2.0, 0.25, -0.5};
  std::vector<double> b(E, 0.0);
  b[2] = kNaN;
  for (const Score f : {Score::Sigmoid, Score::SqrtSoftplus}) {
    hand_case<DeviceType, float>("NaN bias", make_attr(f, false, 3), E, x, b, {{5, 3, 0}});
    hand_case<DeviceType, float>("NaN bias, k=E", make_attr(f, false, 8), E, x, b, {{5, 3, 0, 6, 7, 1, 4, 2}});
    hand_case<DeviceType, bf16_t>("NaN bias", make_attr(f, false, 3), E, x, b, {{5, 3, 0}});
  }
}

// NaN inside a group (docs/router.md §7.3): outside the group's top kg it does not matter; inside, the group score is
// NaN and the group ranks last. Raw logits (Softmax post) keep the arithmetic exact.
BOOST_AUTO_TEST_CASE_TEMPLATE(nan_inside_groups, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const std::vector<double> x = {1, 1, 1, 1, 5, 4, kNaN, 1, 3, 3, 0, 0, 0, 0, 0, 0};
  // kg = 2: g1 = 9 (NaN not among its top 2), g2 = 6, g0 = 2, g3 = 0 -> groups 1, 2
  hand_case<DeviceType, float>("NaN in a selected group", make_attr(Score::Softmax, false, 4, 4, 2), 16, x, {},
                               {{4, 5, 8, 9}});
  // kg = 4 = gs: g1's score is NaN -> last; g2 = 6, g0 = 4 -> groups 2, 0
  hand_case<DeviceType, float>("NaN group score", make_attr(Score::Softmax, false, 8, 4, 2), 16, x, {},
                               {{8, 9, 0, 1, 2, 3, 10, 11}});
  // +inf and -inf in one group's top kg: inf + -inf = NaN -> last
  // (g0 = inf + -inf = NaN -> last; g1 = g2 = 1 tie -> g1, g2)
  const std::vector<double> y = {kInf, -kInf, -kInf, -kInf, 1, 0, -1, -1, 0.5, 0.5, -2, -2, 2, -9, -9, -9};
  hand_case<DeviceType, float>("inf - inf group", make_attr(Score::Softmax, false, 4, 4, 2), 16, y, {}, {{4, 8, 9, 5}});
  // Sigmoid with a NaN logit inside the best group (the oracle gives the values; the selection is by hand)
  hand_case<DeviceType, float>("sigmoid NaN in group", make_attr(Score::Sigmoid, false, 4, 4, 2), 16, x, {},
                               {{4, 5, 8, 9}});
}

// config.check_finite: NonFiniteInput names the first non-finite (t, e) in row-major order; nothing is thrown for
// finite logits, and the flag does not change the results.
BOOST_AUTO_TEST_CASE_TEMPLATE(check_finite_names_first_offender, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 6, E = 10;
  std::vector<double> x = random_values<float>(T * E, 3, -2, 2);
  auto expect_nonfinite = [&](const std::vector<double>& vals, int row, int col, auto tag) {
    using S = typename decltype(tag)::type;
    const auto logits = device_values<D, S>("logits", T, E, vals);
    const V2<D, const S> cl(logits);
    KokkosMoE::RouterConfig cfg = to_config(make_attr(Score::Softmax, false, 2));
    cfg.check_finite = true;
    for (const Out out : {Out::Bytemap, Out::I16, Out::Compact}) {
      try {
        run_forward<D, S, float>(cfg, out, cl, V1<D, const float>());
        BOOST_TEST(false, "no NonFiniteInput for " << out_name(out));
      } catch (const KokkosMoE::NonFiniteInput& e) {
        BOOST_TEST(e.row() == row, out_name(out) << ": " << e.what());
        BOOST_TEST(e.col() == col, out_name(out) << ": " << e.what());
      }
    }
    try {
      KokkosMoE::check_finite(Exec{}, cl);
      BOOST_TEST(false, "check_finite() did not throw");
    } catch (const KokkosMoE::NonFiniteInput& e) {
      BOOST_TEST(e.row() == row);
      BOOST_TEST(e.col() == col);
    }
  };
  struct Float {
    using type = float;
  };
  struct Half {
    using type = fp16_t;
  };
  struct BFloat {
    using type = bf16_t;
  };
  std::vector<double> y = x;
  y[3 * E + 7] = kNaN;
  y[4 * E + 1] = kInf;
  expect_nonfinite(y, 3, 7, Float{});
  expect_nonfinite(y, 3, 7, Half{});
  expect_nonfinite(y, 3, 7, BFloat{});
  y = x;
  y[5 * E + 0] = -kInf;
  expect_nonfinite(y, 5, 0, Float{});
  y = x;
  y[0] = -kNaN;
  expect_nonfinite(y, 0, 0, BFloat{});
  y = x;
  y[T * E - 1] = kInf;
  expect_nonfinite(y, T - 1, E - 1, Half{});
  // fp16 overflow is not the library's business: a finite 16-bit value passes; so do finite float logits
  const auto logits = device_values<D, float>("logits", T, E, x);
  KokkosMoE::RouterConfig cfg = to_config(make_attr(Score::Softmax, false, 2));
  const auto plain = fetch(run_forward<D, float, float>(cfg, Out::Bytemap, logits, V1<D, const float>()));
  cfg.check_finite = true;
  FwdHost<float> checked;
  try {
    checked = fetch(run_forward<D, float, float>(cfg, Out::Bytemap, logits, V1<D, const float>()));
  } catch (const std::exception& e) {
    BOOST_TEST(false, "finite logits rejected: " << e.what());
  }
  BOOST_TEST(bytes_equal(plain.probs, checked.probs));
  BOOST_TEST(bytes_equal(plain.map, checked.map));
  // without the flag, non-finite logits are routed per §7 (no scan, no throw)
  y = x;
  y[2 * E + 2] = kNaN;
  cfg.check_finite = false;
  const auto nl = device_values<D, float>("logits", T, E, y);
  try {
    run_forward<D, float, float>(cfg, Out::Bytemap, nl, V1<D, const float>());
  } catch (const std::exception& e) {
    BOOST_TEST(false, "check_finite = false must not scan: " << e.what());
  }
}

// Fewer finite scores than k: k distinct experts are still selected, in the total order of §7 (finite, then -inf by
// index, then NaN by index); the reference's small-k path may pick an expert twice here.
BOOST_AUTO_TEST_CASE_TEMPLATE(fewer_finite_scores_than_k, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  const std::vector<double> x = {-kInf, 2.0, kNaN, -kInf, kNaN, 1.0};
  for (const ModeT& m : kAllModes) {
    if (m.f == Score::Softmax && m.pre) continue;  // a NaN logit makes the whole pre-softmax row NaN
    hand_case<DeviceType, float>("fewer finite than k", make_attr(m.f, m.pre, 5), 6, x, {}, {{1, 5, 0, 3, 2}});
    hand_case<DeviceType, float>("fewer finite than k", make_attr(m.f, m.pre, 6), 6, x, {}, {{1, 5, 0, 3, 2, 4}});
  }
  hand_case<DeviceType, float>("pre-softmax NaN row", make_attr(Score::Softmax, true, 5), 6, x, {}, {{0, 1, 2, 3, 4}});
  // finite scores and -inf only: Softmax post gives the -inf experts weight exactly 0
  const auto c = hand_case<DeviceType, float>("-inf in the selection", make_attr(Score::Softmax, false, 3), 4,
                                              {1.0, -kInf, -kInf, -kInf}, {}, {{0, 1, 2}});
  BOOST_TEST(c.ref[0].probs[0] == 1.0);
  BOOST_TEST(c.ref[0].probs[1] == 0.0);
}

// docs/conventions.md §5: exception messages name the function. NonFiniteInput from config.check_finite must name the
// entry point that was called (topk_router, topk_router_indices, topk_router_compact).
BOOST_AUTO_TEST_CASE_TEMPLATE(check_finite_message_names_entry_point, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  std::vector<double> x(2 * 4, 0.5);
  x[5] = kNaN;
  const auto logits = device_values<D, float>("logits", 2, 4, x);
  KokkosMoE::RouterConfig cfg = to_config(make_attr(Score::Softmax, false, 2));
  cfg.check_finite = true;
  const std::pair<Out, const char*> calls[] = {{Out::Bytemap, "KokkosMoE::topk_router:"},
                                               {Out::I32, "KokkosMoE::topk_router_indices:"},
                                               {Out::Compact, "KokkosMoE::topk_router_compact:"}};
  for (const auto& [out, prefix] : calls) {
    try {
      run_forward<D, float, float>(cfg, out, logits, V1<D, const float>());
      BOOST_TEST(false, "no NonFiniteInput");
    } catch (const KokkosMoE::NonFiniteInput& e) {
      BOOST_TEST((e.row() == 1 && e.col() == 1));
      BOOST_TEST(std::string(e.what()).rfind(prefix, 0) == 0u,
                 out_name(out) << ": the message must start with '" << prefix << "': " << e.what());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
