/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The aux-loss score helper (docs/router.md §10) and the aux loss (§11) against the oracle: aux_scores forward/backward
// over functions, shapes, logits types and both map formats (bit-exact between them), finite differences of the
// library's scores; aux_loss forward/backward with every tokens_per_expert type, sequence aux loss (C = m*E, m = 2),
// the host-total and device-total overloads (bitwise equal; the device total re-read on every launch), R = 0,
// non-finite propagation and run-to-run bitwise determinism.

#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterRunner.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {

template <class D, class S>
void aux_scores_case(Score f, int T, int E, int k, std::uint64_t seed) {
  using Exec = typename D::execution_space;
  // conditioning: the selection order of s = y / sum(y) is that of y (Softmax: of the probabilities)
  const Oracle::Attr a = make_attr(f, f == Score::Softmax, k);
  const RouterInputs in = generate_router_inputs<S>(a, T, E, false, seed);
  std::vector<Oracle::AuxRow> ref(T);
  for (int t = 0; t < T; ++t) ref[t] = Oracle::aux_scores_row(f, k, in.x.data() + static_cast<std::size_t>(t) * E, E);
  const std::vector<double> gs = random_values<float>(static_cast<std::size_t>(T) * E, seed ^ 0x55);
  std::vector<std::vector<double>> gref(T);
  for (int t = 0; t < T; ++t)
    gref[t] = Oracle::aux_scores_backward_row(f, ref[t].inter, gs.data() + static_cast<std::size_t>(t) * E);
  const auto logits = device_values<D, S>("logits", T, E, in.x);
  const auto gsd = device_values<D, float>("grad_scores", T, E, gs);
  const Tol tol = fp32_tol(E);
  const std::string name = std::string(score_name(f, false)) + " T=" + std::to_string(T) + " E=" + std::to_string(E) +
                           " k=" + std::to_string(k) + " " + Num<S>::name + " [" + Exec::name() + "]";
  std::vector<std::uint8_t> maps_by_impl[2];
  for (int ii = 0; ii < 2; ++ii) {
    BOOST_TEST_CONTEXT("aux_scores " << name << " " << impl_name(kImpls[ii])) {
      Exec exec{};
      std::vector<float> scores[2], inter[2];
      std::vector<std::uint8_t> map[2];
      V2<D, float> inter_dev;
      for (int fmt = 0; fmt < 2; ++fmt) {
        KokkosMoE::AuxScoresConfig cfg;
        cfg.topk = k;
        cfg.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(f));
        cfg.map_format = fmt ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
        cfg.implementation = kImpls[ii];
        auto s = make2<D, float>("scores", T, E, kSentinel), i = make2<D, float>("inter", T, E, kSentinel);
        auto m = make2<D, std::uint8_t>("map", T, fmt ? (E + 7) / 8 : E, kMapSentinel);
        KokkosMoE::aux_scores(exec, cfg, logits, s, m, i);
        exec.fence();
        scores[fmt] = download(s);
        inter[fmt] = download(i);
        map[fmt] = download(m);
        if (!fmt) inter_dev = i;
      }
      Mismatches ms("scores"), mi("intermediate"), mm("bytemap"), mb("bitmap");
      for (int t = 0; t < T; ++t) {
        const auto packed = Oracle::pack_bits(ref[t].routed);
        for (int b = 0; b < (E + 7) / 8; ++b)
          if (map[1][static_cast<std::size_t>(t) * ((E + 7) / 8) + b] != packed[b])
            mb.add([&](std::ostream& os) { os << "(t=" << t << ", byte " << b << ")"; });
        for (int e = 0; e < E; ++e) {
          const std::size_t j = static_cast<std::size_t>(t) * E + e;
          if (!close(scores[0][j], ref[t].scores[e], tol))
            ms.add([&](std::ostream& os) {
              os << "(t=" << t << ", e=" << e << ") got " << scores[0][j] << " expected " << ref[t].scores[e];
            });
          if (!close(inter[0][j], ref[t].inter[e], tol))
            mi.add([&](std::ostream& os) {
              os << "(t=" << t << ", e=" << e << ") got " << inter[0][j] << " expected " << ref[t].inter[e];
            });
          if (map[0][j] != static_cast<std::uint8_t>(ref[t].routed[e]))
            mm.add([&](std::ostream& os) { os << "(t=" << t << ", e=" << e << ") got " << int(map[0][j]); });
        }
      }
      ms.report();
      mi.report();
      mm.report();
      mb.report();
      BOOST_TEST(bytes_equal(scores[0], scores[1]), "bitmap run: scores differ from the bytemap run");
      BOOST_TEST(bytes_equal(inter[0], inter[1]), "bitmap run: intermediate differs from the bytemap run");
      maps_by_impl[ii] = map[0];
      // backward in the logits type
      KokkosMoE::AuxScoresConfig cfg;
      cfg.topk = k;
      cfg.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(f));
      cfg.implementation = kImpls[ii];
      auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
      KokkosMoE::aux_scores_backward(exec, cfg, inter_dev, gsd, gl);
      exec.fence();
      const std::vector<S> g = download(gl);
      Mismatches mg("aux_scores_backward");
      for (int t = 0; t < T; ++t)
        for (int e = 0; e < E; ++e) {
          const std::size_t j = static_cast<std::size_t>(t) * E + e;
          if (!value_ok(g[j], gref[t][e], tol, true))
            mg.add([&](std::ostream& os) {
              os << "(t=" << t << ", e=" << e << ") got " << Num<S>::value(g[j]) << " expected " << gref[t][e];
            });
        }
      mg.report();
    }
  }
  BOOST_TEST(bytes_equal(maps_by_impl[0], maps_by_impl[1]), "aux_scores " << name << ": Auto vs Portable maps differ");
}

template <class P>
struct TpeName;
template <>
struct TpeName<std::int16_t> {
  static constexpr const char* name = "int16_t";
};
template <>
struct TpeName<std::int32_t> {
  static constexpr const char* name = "int32_t";
};
template <>
struct TpeName<std::int64_t> {
  static constexpr const char* name = "int64_t";
};
template <>
struct TpeName<bf16_t> {
  static constexpr const char* name = "bf16_t";
};
template <>
struct TpeName<float> {
  static constexpr const char* name = "float";
};

template <class Tpe>
Tpe make_tpe(double v) {
  if constexpr (std::is_integral_v<Tpe>)
    return static_cast<Tpe>(v);
  else
    return Num<Tpe>::make(Num<Tpe>::quantize(v));
}
template <class Tpe>
double tpe_value(Tpe v) {
  if constexpr (std::is_integral_v<Tpe>)
    return static_cast<double>(v);
  else
    return Num<Tpe>::value(v);
}

/// One aux-loss case: forward (host and device total) and backward against the oracle, with both implementations.
template <class D, class P, class Tpe>
void aux_loss_case(int R, int E, int k, int m, std::int64_t total, std::uint64_t seed, bool arange = false) {
  using Exec = typename D::execution_space;
  const int C = m * E;
  const float coeff = 0.01f;
  std::vector<double> probs(static_cast<std::size_t>(R) * C);
  Rng rng(seed);
  for (std::size_t i = 0; i < probs.size(); ++i)
    probs[i] = Num<P>::quantize(arange ? (static_cast<double>(i) - probs.size() / 2.0) * 1e-4 : rng.uniform());
  std::vector<Tpe> tpe_h(C);
  std::vector<double> tpe(C);
  for (int c = 0; c < C; ++c) {
    tpe_h[c] = make_tpe<Tpe>(static_cast<double>(1 + rng.below(999)));
    tpe[c] = tpe_value(tpe_h[c]);
  }
  const double cst_ref = Oracle::aux_loss_const(E, k, static_cast<double>(coeff), static_cast<double>(total));
  const double loss_ref = Oracle::aux_loss(probs, R, C, tpe, cst_ref);
  const float cst_fp32 =
      ((static_cast<float>(E) * coeff) / static_cast<float>(k)) / static_cast<float>(total) / static_cast<float>(total);
  const auto probs_d = device_values<D, P>("probs", R, C, probs);
  V1<D, Tpe> tpe_d("tpe", C);
  upload(tpe_d, tpe_h);
  V0<D, std::int64_t> total_d("total");
  upload(total_d, std::vector<std::int64_t>{total});
  const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(R, C)), 123.f);
  const std::string name = "aux_loss R=" + std::to_string(R) + " E=" + std::to_string(E) + " k=" + std::to_string(k) +
                           " m=" + std::to_string(m) + " total=" + std::to_string(total) + " probs " + Num<P>::name +
                           " tpe " + TpeName<Tpe>::name + (arange ? " arange" : "") + " [" + Exec::name() + "]";
  for (const auto impl : kImpls) {
    BOOST_TEST_CONTEXT(name << " " << impl_name(impl)) {
      KokkosMoE::AuxLossConfig cfg;
      cfg.num_experts = E;
      cfg.topk = k;
      cfg.coeff = coeff;
      cfg.implementation = impl;
      Exec exec{};
      std::vector<P> loss_h[3];
      std::vector<float> cb_h[3];
      for (int run = 0; run < 3; ++run) {  // host total twice (determinism), then the device total
        V0<D, P> loss("loss");
        upload(loss, std::vector<P>{Num<P>::make(kSentinel)});
        const auto cbuf = make1<D, float>("const_buf", 2, kSentinel);
        if (run < 2)
          KokkosMoE::aux_loss(exec, cfg, probs_d, tpe_d, total, loss, cbuf, ws);
        else
          KokkosMoE::aux_loss(exec, cfg, probs_d, tpe_d, total_d, loss, cbuf, ws);
        exec.fence();
        loss_h[run] = download(loss);
        cb_h[run] = download(cbuf);
      }
      const float cst = cb_h[0][0], acc = cb_h[0][1];
      BOOST_TEST(cst == cst_fp32, "Const " << cst << " vs FP32 formula " << cst_fp32);
      BOOST_TEST(std::fabs(cst - cst_ref) <= 1e-6 * std::fabs(cst_ref), "Const " << cst << " vs oracle " << cst_ref);
      const double rel = std::max(2e-5, 4e-7 * C);
      if (std::isnan(loss_ref)) {
        BOOST_TEST(std::isnan(acc));
      } else {
        BOOST_TEST(std::fabs(acc - loss_ref) <= rel * std::fabs(loss_ref) + 1e-30,
                   "loss " << acc << " vs oracle " << loss_ref);
        BOOST_TEST(close(acc, loss_ref, fp32_tol(C)));
      }
      // the loss output is const_buf[1] cast once to the probs type
      if constexpr (Num<P>::is16)
        BOOST_TEST(Num<P>::raw(loss_h[0][0]) == Num<P>::round_bits(acc));
      else
        BOOST_TEST(Num<P>::raw(loss_h[0][0]) == Num<float>::raw(acc));
      BOOST_TEST(bytes_equal(cb_h[0], cb_h[1]), "two runs differ");
      BOOST_TEST(bytes_equal(loss_h[0], loss_h[1]), "two runs differ");
      BOOST_TEST(bytes_equal(cb_h[0], cb_h[2]), "device-total overload differs from the host-total overload");
      BOOST_TEST(bytes_equal(loss_h[0], loss_h[2]), "device-total overload differs from the host-total overload");
      // backward: grad_probs[r, c] = Const * tpe[c] * grad_loss (FP32, one cast), grad_loss float or the grad type
      V1<D, float> cbuf("const_buf", 2);
      upload(cbuf, cb_h[0]);
      for (int gtype = 0; gtype < 2; ++gtype) {
        const double g = gtype ? 1.5 : -0.75;
        auto gp = make2<D, P>("grad_probs", R, C, Num<P>::make(kSentinel));
        if (gtype) {
          V0<D, P> gl("grad_loss");
          upload(gl, std::vector<P>{Num<P>::make(g)});
          KokkosMoE::aux_loss_backward(exec, cfg, cbuf, tpe_d, gl, gp);
        } else {
          V0<D, float> gl("grad_loss");
          upload(gl, std::vector<float>{static_cast<float>(g)});
          KokkosMoE::aux_loss_backward(exec, cfg, cbuf, tpe_d, gl, gp);
        }
        exec.fence();
        const std::vector<P> got = download(gp);
        Mismatches mg(std::string("aux_loss_backward, grad_loss ") + (gtype ? Num<P>::name : "float"));
        for (int r = 0; r < R; ++r)
          for (int c = 0; c < C; ++c) {
            const double ref = static_cast<double>(cst) * tpe[c] * g;
            const P v = got[static_cast<std::size_t>(r) * C + c];
            if (!value_ok(v, ref, Tol{0.0, 1e-6}))
              mg.add([&](std::ostream& os) {
                os << "(r=" << r << ", c=" << c << ") got " << Num<P>::value(v) << " expected " << ref;
              });
          }
        mg.report();
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(aux_scores)

BOOST_AUTO_TEST_CASE_TEMPLATE(forward_backward_grid, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  static const int shapes[][3] = {{97, 32, 1},  {64, 32, 4},   {128, 32, 4},   {97, 128, 8},
                                  {64, 130, 4}, {64, 256, 16}, {37, 1024, 32}, {33, 1, 1}};
  std::uint64_t seed = 0xA0;
  for (const Score f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax})
    for (const auto& s : shapes) {
      aux_scores_case<DeviceType, float>(f, s[0], s[1], s[2], ++seed);
      if (s[1] <= 256) {
        aux_scores_case<DeviceType, bf16_t>(f, s[0], s[1], s[2], ++seed);
        aux_scores_case<DeviceType, fp16_t>(f, s[0], s[1], s[2], ++seed);
      }
    }
}

// Central differences of the library's FP32 scores against its backward (dense: no routing involved).
BOOST_AUTO_TEST_CASE_TEMPLATE(finite_differences, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 3, E = 12;
  for (const Score f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax}) {
    std::vector<double> x = random_values<float>(static_cast<std::size_t>(T) * E, 17 + static_cast<int>(f), -3, 3);
    if (f == Score::SqrtSoftplus)
      for (std::size_t i = 0; i < x.size(); i += 4) x[i] = Num<float>::quantize(x[i] + 24.0);  // the x > 20 branch
    const std::vector<double> gs = random_values<float>(x.size(), 3);
    KokkosMoE::AuxScoresConfig cfg;
    cfg.topk = 3;
    cfg.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(f));
    Exec exec{};
    auto scores_at = [&](const std::vector<double>& xx, V2<D, float>* inter_out) {
      const auto l = device_values<D, float>("logits", T, E, xx);
      auto s = make2<D, float>("s", T, E, 0.f), i = make2<D, float>("i", T, E, 0.f);
      KokkosMoE::aux_scores(exec, cfg, l, s, make2<D, std::uint8_t>("m", T, E, 0), i);
      exec.fence();
      if (inter_out) *inter_out = i;
      return download(s);
    };
    V2<D, float> inter;
    scores_at(x, &inter);
    auto gl = make2<D, float>("gl", T, E, 0.f);
    KokkosMoE::aux_scores_backward(exec, cfg, inter, device_values<D, float>("gs", T, E, gs), gl);
    exec.fence();
    const auto an = download(gl);
    Mismatches m(std::string("aux_scores finite differences, ") + score_name(f, false));
    for (int e = 0; e < E; ++e) {
      std::vector<double> xp = x, xm = x;
      for (int t = 0; t < T; ++t) {
        xp[t * E + e] = static_cast<float>(x[t * E + e] + 1e-2);
        xm[t * E + e] = static_cast<float>(x[t * E + e] - 1e-2);
      }
      const auto sp = scores_at(xp, nullptr), sm = scores_at(xm, nullptr);
      for (int t = 0; t < T; ++t) {
        double fd = 0;
        for (int j = 0; j < E; ++j) fd += gs[t * E + j] * (sp[t * E + j] - sm[t * E + j]);
        fd /= xp[t * E + e] - xm[t * E + e];
        const double g = an[t * E + e];
        if (std::fabs(fd - g) > 2e-4 + 2e-2 * std::fabs(g))
          m.add([&](std::ostream& os) { os << "(t=" << t << ", e=" << e << ") fd " << fd << " backward " << g; });
      }
    }
    m.report();
  }
}

// Non-finite logits propagate (docs/router.md §7.5): a NaN row gives NaN scores; the map stays well formed.
BOOST_AUTO_TEST_CASE_TEMPLATE(non_finite_rows, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int T = 3, E = 8;
  const double nan = Oracle::qnan(), inf = Oracle::inf();
  const std::vector<double> x = {nan,  nan,  nan,  nan,  nan,  nan,  nan,  nan,   // all NaN
                                 -inf, -inf, -inf, -inf, -inf, -inf, -inf, -inf,  // all -inf
                                 0.5,  inf,  -1,   2,    0,    1,    -2,   3};    // one +inf
  for (const Score f : {Score::Sigmoid, Score::SqrtSoftplus, Score::Softmax}) {
    KokkosMoE::AuxScoresConfig cfg;
    cfg.topk = 2;
    cfg.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(f));
    for (const auto impl : kImpls) {
      cfg.implementation = impl;
      Exec exec{};
      auto s = make2<D, float>("s", T, E, kSentinel), i = make2<D, float>("i", T, E, kSentinel);
      auto m = make2<D, std::uint8_t>("m", T, E, kMapSentinel);
      KokkosMoE::aux_scores(exec, cfg, device_values<D, float>("logits", T, E, x), s, m, i);
      exec.fence();
      const auto sh = download(s);
      const auto mh = download(m);
      for (int t = 0; t < T; ++t) {
        const auto r = Oracle::aux_scores_row(f, 2, x.data() + t * E, E);
        for (int e = 0; e < E; ++e) {
          BOOST_TEST(close(sh[t * E + e], r.scores[e], fp32_tol(E)), score_name(f, false)
                                                                         << " (t=" << t << ", e=" << e << ") "
                                                                         << sh[t * E + e] << " vs " << r.scores[e]);
          BOOST_TEST(mh[t * E + e] == r.routed[e]);
        }
      }
      // by hand: NaN and all -inf rows select experts 0, 1 under every function
      BOOST_TEST((mh[0] == 1 && mh[1] == 1 && mh[2] == 0));
      BOOST_TEST((mh[8] == 1 && mh[9] == 1 && mh[10] == 0));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(aux_loss)

BOOST_AUTO_TEST_CASE_TEMPLATE(grid_float_int32, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // docs/router.md §16.3 aux-loss grid, scaled: E in {32, 128, 256, 1024}, k in {4, 32}, m in {1, 2}
  std::uint64_t seed = 1;
  for (int E : {32, 128, 256, 1024})
    for (int k : {4, 32})
      for (int m : {1, 2}) {
        if (k > E) continue;
        const int R = E >= 1024 ? 300 : 1000;
        aux_loss_case<DeviceType, float, std::int32_t>(R, E, k, m, 2 * R + 1, ++seed);
      }
  aux_loss_case<DeviceType, float, std::int32_t>(2048, 128, 4, 2, 2048, 99);     // quick-tier shape, m = 2
  aux_loss_case<DeviceType, float, std::int32_t>(128, 32, 4, 1, 128, 98, true);  // the reference's arange pattern
}

BOOST_AUTO_TEST_CASE_TEMPLATE(tokens_per_expert_and_probs_types, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  // (R, E, k, m, total): a single row, several row chunks, sequence aux loss; rows that are not whole 16-byte vectors
  // of any element type (13 columns) or of the 16-bit ones only (12); rows wider than the 32 KB the CUDA gradient
  // kernel forms in shared memory (8200 and 8201 float columns, 16392 columns of any type), in vectors and not; more
  // elements than the CUDA gradient kernel's grid covers at once (325000 and 328040), where a thread's column moves
  // on by the grid's stride
  const int shapes[][5] = {{1, 32, 4, 1, 1},     {300, 64, 4, 2, 600}, {777, 128, 8, 2, 777},
                           {50, 13, 2, 1, 50},   {41, 6, 2, 2, 82},    {5, 8200, 2, 1, 5},
                           {40, 8201, 2, 1, 40}, {3, 16392, 2, 1, 3},  {25000, 13, 2, 1, 25000}};
  std::uint64_t seed = 500;
  for (const auto& s : shapes) {
    aux_loss_case<D, float, std::int16_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, float, std::int64_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, float, bf16_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, float, float>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, bf16_t, std::int32_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, bf16_t, std::int16_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, fp16_t, std::int64_t>(s[0], s[1], s[2], s[3], s[4], ++seed);
    aux_loss_case<D, fp16_t, float>(s[0], s[1], s[2], s[3], s[4], ++seed);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_rows_write_loss_and_const, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  aux_loss_case<DeviceType, float, std::int32_t>(0, 32, 4, 1, 128, 7);
  aux_loss_case<DeviceType, fp16_t, bf16_t>(0, 64, 8, 2, 1, 8);
}

// The device total is read on every launch (the CUDA-graph use case): changing it between calls on the same
// Views changes Const; a total of 0 makes Const non-finite (documented, docs/router.md §4.3).
BOOST_AUTO_TEST_CASE_TEMPLATE(device_total_changes_between_calls, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int R = 64, E = 128, k = 4;
  const auto probs = device_values<D, float>("probs", R, E, random_values<float>(R * E, 3, 0.0, 1.0));
  const auto tpe = make1<D, std::int32_t>("tpe", E, 7);
  V0<D, std::int64_t> total("total");
  V0<D, float> loss("loss");
  const auto cbuf = make1<D, float>("cb", 2, 0.f);
  const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(R, E)), 0.f);
  KokkosMoE::AuxLossConfig cfg;
  cfg.num_experts = E;
  cfg.topk = k;
  cfg.coeff = 0.01f;
  Exec exec{};
  for (std::int64_t tot : {4096, 2048, 8175}) {
    upload(total, std::vector<std::int64_t>{tot});
    KokkosMoE::aux_loss(exec, cfg, probs, tpe, total, loss, cbuf, ws);
    exec.fence();
    const float expect = ((static_cast<float>(E) * 0.01f) / k) / static_cast<float>(tot) / static_cast<float>(tot);
    BOOST_TEST(download(cbuf)[0] == expect, "total " << tot);
  }
  upload(total, std::vector<std::int64_t>{0});
  KokkosMoE::aux_loss(exec, cfg, probs, tpe, total, loss, cbuf, ws);
  exec.fence();
  BOOST_TEST(!std::isfinite(download(cbuf)[0]));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(non_finite_probs_propagate, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using D = DeviceType;
  using Exec = typename D::execution_space;
  const int R = 300, E = 16;
  std::vector<double> p = random_values<float>(R * E, 4, 0.0, 1.0);
  p[299 * E + 5] = Oracle::qnan();
  const auto probs = device_values<D, float>("probs", R, E, p);
  const auto tpe = make1<D, std::int32_t>("tpe", E, 2);
  V0<D, float> loss("loss");
  const auto cbuf = make1<D, float>("cb", 2, 0.f);
  const auto ws = make1<D, float>("ws", static_cast<std::int64_t>(KokkosMoE::aux_loss_workspace_size(R, E)), 0.f);
  KokkosMoE::AuxLossConfig cfg;
  cfg.num_experts = E;
  cfg.topk = 2;
  cfg.coeff = 0.01f;
  Exec exec{};
  KokkosMoE::aux_loss(exec, cfg, probs, tpe, std::int64_t(R), loss, cbuf, ws);
  exec.fence();
  BOOST_TEST(std::isnan(download(loss)[0]));
  BOOST_TEST(std::isfinite(download(cbuf)[0]));
}

BOOST_AUTO_TEST_SUITE_END()
