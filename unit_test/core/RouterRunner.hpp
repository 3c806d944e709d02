/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_ROUTERRUNNER_HPP
#define KOKKOSMOE_TEST_ROUTERRUNNER_HPP

// Runs one router case through every output kind (Bytemap, BitmapU8, int16/int32/int64 indices, compact) and both
// implementations (Auto, Portable), checks every output against the oracle, and optionally runs and checks the
// backward of every variant.

#include "RouterTestUtils.hpp"

namespace KokkosMoETest {

enum class Out { Bytemap, Bitmap, I16, I32, I64, Compact };
inline const char* out_name(Out o) {
  switch (o) {
    case Out::Bytemap:
      return "bytemap";
    case Out::Bitmap:
      return "bitmap";
    case Out::I16:
      return "int16";
    case Out::I32:
      return "int32";
    case Out::I64:
      return "int64";
    default:
      return "compact";
  }
}
constexpr float kSentinel = -7.0f;  // written into outputs before a call: detects unwritten elements
constexpr std::uint8_t kMapSentinel = 0xA5;

/// Device outputs of one forward call (the ones of the call's output kind are allocated).
template <class D, class S>
struct FwdOutputs {
  Out out = Out::Bytemap;
  V2<D, S> probs;
  V2<D, float> inter;
  V2<D, std::uint8_t> map;
  V2<D, std::int16_t> i16;
  V2<D, std::int32_t> i32;
  V2<D, std::int64_t> i64;
  V2<D, std::int32_t> ids;
  V2<D, float> weights;
};

/// Host copies of a forward call's outputs.
template <class S>
struct FwdHost {
  std::vector<S> probs;
  std::vector<float> inter;
  std::vector<std::uint8_t> map;
  std::vector<std::int64_t> idx;  ///< dense indices or compact ids, widened
  std::vector<float> weights;
};

template <class D, class S, class B>
FwdOutputs<D, S> run_forward(KokkosMoE::RouterConfig cfg, Out out, const V2<D, const S>& logits,
                             const V1<D, const B>& bias) {
  using Exec = typename D::execution_space;
  const std::int64_t T = logits.extent(0), E = logits.extent(1);
  const int k = cfg.topk;
  FwdOutputs<D, S> o;
  o.out = out;
  Exec exec{};
  if (out == Out::Compact) {
    o.ids = make2<D, std::int32_t>("ids", T, k, -3);
    o.weights = make2<D, float>("weights", T, k, kSentinel);
    KokkosMoE::topk_router_compact(exec, cfg, logits, bias, o.ids, o.weights);
  } else {
    o.probs = make2<D, S>("probs", T, E, Num<S>::make(kSentinel));
    o.inter = make2<D, float>("intermediate", T, E, kSentinel);
    if (out == Out::Bytemap || out == Out::Bitmap) {
      cfg.map_format =
          out == Out::Bitmap ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
      o.map = make2<D, std::uint8_t>("map", T, out == Out::Bitmap ? (E + 7) / 8 : E, kMapSentinel);
      KokkosMoE::topk_router(exec, cfg, logits, bias, o.probs, o.map, o.inter);
    } else if (out == Out::I16) {
      o.i16 = make2<D, std::int16_t>("indices", T, k, -3);
      KokkosMoE::topk_router_indices(exec, cfg, logits, bias, o.probs, o.i16, o.inter);
    } else if (out == Out::I32) {
      o.i32 = make2<D, std::int32_t>("indices", T, k, -3);
      KokkosMoE::topk_router_indices(exec, cfg, logits, bias, o.probs, o.i32, o.inter);
    } else {
      o.i64 = make2<D, std::int64_t>("indices", T, k, -3);
      KokkosMoE::topk_router_indices(exec, cfg, logits, bias, o.probs, o.i64, o.inter);
    }
  }
  exec.fence();
  return o;
}

template <class T>
std::vector<std::int64_t> widen(const std::vector<T>& v) {
  return std::vector<std::int64_t>(v.begin(), v.end());
}

template <class D, class S>
FwdHost<S> fetch(const FwdOutputs<D, S>& o) {
  FwdHost<S> h;
  switch (o.out) {
    case Out::Compact:
      h.idx = widen(download(o.ids));
      h.weights = download(o.weights);
      return h;
    case Out::Bytemap:
    case Out::Bitmap:
      h.map = download(o.map);
      break;
    case Out::I16:
      h.idx = widen(download(o.i16));
      break;
    case Out::I32:
      h.idx = widen(download(o.i32));
      break;
    case Out::I64:
      h.idx = widen(download(o.i64));
      break;
  }
  h.probs = download(o.probs);
  h.inter = download(o.inter);
  return h;
}

/// probs and intermediate of a dense forward against the oracle.
template <class S>
void check_probs_inter(const std::string& what, const FwdHost<S>& h, const std::vector<Oracle::FwdRow>& ref, int T,
                       int E) {
  const Tol tol = fp32_tol(E);
  Mismatches probs(what + " probs"), zeros(what + " non-routed probs must be +0.0"), inter(what + " intermediate");
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      const std::size_t i = static_cast<std::size_t>(t) * E + e;
      const Oracle::FwdRow& r = ref[t];
      if (r.routed[e]) {
        if (!value_ok(h.probs[i], r.probs[e], tol))
          probs.add([&](std::ostream& os) {
            os << "(t=" << t << ", e=" << e << ") got " << Num<S>::value(h.probs[i]) << " expected " << r.probs[e];
          });
      } else if (!is_plus_zero(h.probs[i])) {
        zeros.add([&](std::ostream& os) { os << "(t=" << t << ", e=" << e << ") got " << Num<S>::value(h.probs[i]); });
      }
      if (!close(h.inter[i], r.inter[e], tol))
        inter.add([&](std::ostream& os) {
          os << "(t=" << t << ", e=" << e << ") got " << h.inter[i] << " expected " << r.inter[e];
        });
    }
  probs.report();
  zeros.report();
  inter.report();
}

template <class S>
void check_forward_output(const std::string& what, Out out, const FwdHost<S>& h, const std::vector<Oracle::FwdRow>& ref,
                          int T, int E, int k) {
  if (out == Out::Compact) {
    const Tol tol = fp32_tol(E);
    Mismatches ids(what + " ids"), w(what + " weights");
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) {
        const std::size_t j = static_cast<std::size_t>(t) * k + i;
        if (h.idx[j] != ref[t].idx[i])
          ids.add([&](std::ostream& os) {
            os << "(t=" << t << ", slot " << i << ") got " << h.idx[j] << " expected " << ref[t].idx[i];
          });
        if (!close(h.weights[j], ref[t].weight[i], tol))
          w.add([&](std::ostream& os) {
            os << "(t=" << t << ", slot " << i << ") got " << h.weights[j] << " expected " << ref[t].weight[i];
          });
      }
    ids.report();
    w.report();
    return;
  }
  if (out == Out::Bytemap) {
    Mismatches m(what + " bytemap");
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) {
        const std::uint8_t got = h.map[static_cast<std::size_t>(t) * E + e];
        if (got != static_cast<std::uint8_t>(ref[t].routed[e]))
          m.add([&](std::ostream& os) {
            os << "(t=" << t << ", e=" << e << ") got " << int(got) << " expected " << int(ref[t].routed[e]);
          });
      }
    m.report();
  } else if (out == Out::Bitmap) {
    const int nb = (E + 7) / 8;
    Mismatches m(what + " bitmap (LSB-first, zero padding)");
    for (int t = 0; t < T; ++t) {
      const std::vector<std::uint8_t> expect = Oracle::pack_bits(ref[t].routed);
      for (int b = 0; b < nb; ++b) {
        const std::uint8_t got = h.map[static_cast<std::size_t>(t) * nb + b];
        if (got != expect[b])
          m.add([&](std::ostream& os) {
            os << "(t=" << t << ", byte " << b << ") got 0x" << std::hex << int(got) << " expected 0x" << int(expect[b])
               << std::dec;
          });
      }
    }
    m.report();
  } else {
    Mismatches m(what + " dense indices (selection order)");
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < k; ++i) {
        const std::int64_t got = h.idx[static_cast<std::size_t>(t) * k + i];
        if (got != ref[t].idx[i])
          m.add([&](std::ostream& os) {
            os << "(t=" << t << ", slot " << i << ") got " << got << " expected " << ref[t].idx[i];
          });
      }
    m.report();
  }
  check_probs_inter(what, h, ref, T, E);
}

/// A router case: inputs on the device plus the oracle's forward.
template <class D, class S>
struct RouterCase {
  Oracle::Attr attr;
  RouterInputs in;
  std::vector<Oracle::FwdRow> ref;
  V2<D, const S> logits;
  V1<D, const S> bias;  ///< empty: no bias
  std::string name;
  int T() const { return in.T; }
  int E() const { return in.E; }
  int k() const { return attr.topk; }
};

template <class D, class S>
RouterCase<D, S> make_case(const Oracle::Attr& attr, RouterInputs in) {
  RouterCase<D, S> c;
  c.attr = attr;
  c.in = std::move(in);
  c.ref = oracle_forward(attr, c.in);
  c.logits = device_values<D, S>("logits", c.in.T, c.in.E, c.in.x);
  if (!c.in.b.empty()) c.bias = device_vector<D, S>("expert_bias", c.in.b);
  c.name = describe(attr, c.in.T, c.in.E, !c.in.b.empty(), Num<S>::name) + " [" + D::execution_space::name() + "]";
  return c;
}

template <class D, class S>
RouterCase<D, S> make_random_case(const Oracle::Attr& attr, int T, int E, bool with_bias, std::uint64_t seed) {
  return make_case<D, S>(attr, generate_router_inputs<S>(attr, T, E, with_bias, seed));
}

constexpr Out kAllOuts[] = {Out::Bytemap, Out::Bitmap, Out::I16, Out::I32, Out::I64, Out::Compact};

/// Gradient of the backward of one variant against a double reference; non-routed entries must be exactly +0.0
/// unless `pre` (Softmax pre).
template <class S>
void check_grad(const std::string& what, const std::vector<S>& got, const std::vector<std::vector<double>>& ref,
                const std::vector<Oracle::FwdRow>& fwd, bool pre, int T, int E) {
  const Tol tol = fp32_tol(E);
  Mismatches m(what), z(what + " non-routed must be +0.0");
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      const S g = got[static_cast<std::size_t>(t) * E + e];
      if (!pre && !fwd[t].routed[e]) {
        if (!is_plus_zero(g))
          z.add([&](std::ostream& os) { os << "(t=" << t << ", e=" << e << ") got " << Num<S>::value(g); });
        continue;
      }
      if (!value_ok(g, ref[t][e], tol, true))
        m.add([&](std::ostream& os) {
          os << "(t=" << t << ", e=" << e << ") got " << Num<S>::value(g) << " expected " << ref[t][e];
        });
    }
  m.report();
  z.report();
}

/// Two library results of type S within the tolerance of each other (reference = b).
template <class S>
void check_close_vectors(const std::string& what, const std::vector<S>& a, const std::vector<S>& b, int E) {
  const Tol tol = fp32_tol(E);
  Mismatches m(what);
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!value_ok(a[i], Num<S>::value(b[i]), tol, true))
      m.add([&](std::ostream& os) { os << "[" << i << "] " << Num<S>::value(a[i]) << " vs " << Num<S>::value(b[i]); });
  m.report();
}

struct RunFlags {
  bool forward = true;
  bool backward = false;
  bool portable = true;  ///< also run (and compare) Implementation::Portable
};

/// Forward (and backward) of every output kind with both implementations, against the oracle.
template <class D, class S>
void run_router_case(const RouterCase<D, S>& c, RunFlags flags) {
  using Exec = typename D::execution_space;
  const int T = c.T(), E = c.E(), k = c.k();
  const bool pre = c.attr.f == Oracle::Score::Softmax && c.attr.pre;
  BOOST_TEST_CONTEXT(c.name) {
    // upstream gradient: random at routed positions, NaN at every non-routed one (never read, docs/router.md §9)
    std::vector<double> gp = random_values<S>(static_cast<std::size_t>(T) * E, mix_seed(0x6EAD, T * 131 + E));
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e)
        if (!c.ref[t].routed[e]) gp[static_cast<std::size_t>(t) * E + e] = Oracle::qnan();
    std::vector<std::vector<double>> gref(T), cref(T);
    std::vector<double> gw;  // compact grad_weights
    if (flags.backward) {
      gw = random_values<float>(static_cast<std::size_t>(T) * k, mix_seed(0x6A11, T * 7 + k));
      for (int t = 0; t < T; ++t) {
        gref[t] =
            Oracle::backward_row(c.attr, c.ref[t].routed, c.ref[t].inter, gp.data() + static_cast<std::size_t>(t) * E);
        std::vector<int> ids(c.ref[t].idx);
        cref[t] = Oracle::compact_backward_row(c.attr, c.in.x.data() + static_cast<std::size_t>(t) * E, E, ids.data(),
                                               gw.data() + static_cast<std::size_t>(t) * k);
      }
    }
    const auto grad_probs = device_values<D, S>("grad_probs", T, E, gp);
    std::vector<FwdHost<S>> routing_by_impl[2];
    std::vector<S> grads_by_impl[2];
    const int nimpl = flags.portable ? 2 : 1;
    for (int ii = 0; ii < nimpl; ++ii) {
      KokkosMoE::RouterConfig cfg = to_config(c.attr);
      cfg.implementation = kImpls[ii];
      const std::string ctx = std::string(impl_name(kImpls[ii])) + " ";
      FwdOutputs<D, S> dev[6];
      FwdHost<S> host[6];
      for (int oi = 0; oi < 6; ++oi) {
        const Out out = kAllOuts[oi];
        dev[oi] = run_forward<D, S, S>(cfg, out, c.logits, c.bias);
        host[oi] = fetch(dev[oi]);
        if (flags.forward) check_forward_output(ctx + out_name(out), out, host[oi], c.ref, T, E, k);
      }
      // Bytemap vs BitmapU8: probs and intermediate bit-identical, a NaN equal to any NaN (docs/router.md §16.1)
      BOOST_TEST(values_equal(host[0].probs, host[1].probs), ctx << "bitmap probs differ from bytemap probs");
      BOOST_TEST(values_equal(host[0].inter, host[1].inter), ctx << "bitmap intermediate differs from bytemap");
      for (int oi = 0; oi < 6; ++oi) routing_by_impl[ii].push_back(host[oi]);

      if (!flags.backward) continue;
      Exec exec{};
      // map backward: Bytemap and BitmapU8 decode to bit-identical gradients
      std::vector<S> gmap[2];
      for (int f = 0; f < 2; ++f) {
        KokkosMoE::RouterConfig bc = cfg;
        bc.map_format = f ? KokkosMoE::RoutingMapFormat::BitmapU8 : KokkosMoE::RoutingMapFormat::Bytemap;
        auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
        KokkosMoE::topk_router_backward(exec, bc, V2<D, const std::uint8_t>(dev[f].map),
                                        V2<D, const float>(dev[f].inter), V2<D, const S>(grad_probs), gl);
        exec.fence();
        gmap[f] = download(gl);
      }
      check_grad(ctx + "backward (bytemap)", gmap[0], gref, c.ref, pre, T, E);
      BOOST_TEST(bytes_equal(gmap[0], gmap[1]), ctx << "bitmap gradients differ from bytemap gradients");
      grads_by_impl[ii] = gmap[0];
      // dense indices backward (sums over slots: within tolerance)
      for (int oi = 2; oi < 5; ++oi) {
        auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
        const V2<D, const float> inter(dev[oi].inter);
        const V2<D, const S> g(grad_probs);
        if (kAllOuts[oi] == Out::I16)
          KokkosMoE::topk_router_indices_backward(exec, cfg, V2<D, const std::int16_t>(dev[oi].i16), inter, g, gl);
        else if (kAllOuts[oi] == Out::I32)
          KokkosMoE::topk_router_indices_backward(exec, cfg, V2<D, const std::int32_t>(dev[oi].i32), inter, g, gl);
        else
          KokkosMoE::topk_router_indices_backward(exec, cfg, V2<D, const std::int64_t>(dev[oi].i64), inter, g, gl);
        exec.fence();
        const std::vector<S> gi = download(gl);
        check_grad(ctx + "backward (" + out_name(kAllOuts[oi]) + ")", gi, gref, c.ref, pre, T, E);
        check_close_vectors(ctx + "indices vs map backward", gi, gmap[0], E);
      }
      // compact backward, FP32 grad_weights: against the oracle
      {
        auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
        const auto gwd = device_values<D, float>("grad_weights", T, k, gw);
        KokkosMoE::topk_router_compact_backward(exec, cfg, c.logits, V2<D, const std::int32_t>(dev[5].ids),
                                                V2<D, const float>(gwd), gl);
        exec.fence();
        check_grad(ctx + "compact backward (float grad_weights)", download(gl), cref, c.ref, pre, T, E);
      }
      // compact backward with grad_weights in the logits type == dense backward of the scattered dense gradient
      {
        std::vector<double> gw_s(gw.size()), dense(static_cast<std::size_t>(T) * E, 0.0);
        for (std::size_t i = 0; i < gw.size(); ++i) gw_s[i] = Num<S>::quantize(gw[i]);
        for (int t = 0; t < T; ++t)
          for (int i = 0; i < k; ++i)
            dense[static_cast<std::size_t>(t) * E + c.ref[t].idx[i]] = gw_s[static_cast<std::size_t>(t) * k + i];
        auto gl = make2<D, S>("grad_logits", T, E, Num<S>::make(kSentinel));
        const auto gwd = device_values<D, S>("grad_weights", T, k, gw_s);
        KokkosMoE::topk_router_compact_backward(exec, cfg, c.logits, V2<D, const std::int32_t>(dev[5].ids),
                                                V2<D, const S>(gwd), gl);
        auto gd = make2<D, S>("grad_logits_dense", T, E, Num<S>::make(kSentinel));
        const auto dense_d = device_values<D, S>("grad_probs_dense", T, E, dense);
        KokkosMoE::topk_router_backward(exec, cfg, V2<D, const std::uint8_t>(dev[0].map),
                                        V2<D, const float>(dev[0].inter), V2<D, const S>(dense_d), gd);
        exec.fence();
        check_close_vectors(ctx + "compact backward vs dense backward", download(gl), download(gd), E);
      }
    }
    // Auto vs Portable: routing outputs identical (tie-free or exactly tied rows), both checked against the oracle
    for (int oi = 0; oi < 6 && nimpl == 2; ++oi) {
      BOOST_TEST(bytes_equal(routing_by_impl[0][oi].map, routing_by_impl[1][oi].map),
                 "Auto vs Portable: routing map differs (" << out_name(kAllOuts[oi]) << ")");
      BOOST_TEST(bytes_equal(routing_by_impl[0][oi].idx, routing_by_impl[1][oi].idx),
                 "Auto vs Portable: indices differ (" << out_name(kAllOuts[oi]) << ")");
    }
  }
}

// Explicit instantiation of the runner for the three logits types on every enabled backend: these are the bulk of
// each test source's compile time, so RouterRunner.cpp compiles them once and every other source only declares them.
// X-macros: PREFIX is `extern` (declaration) or empty (definition).
#define KOKKOSMOE_TEST_RUNNER_ETI_S(PREFIX, S)                                                                         \
  PREFIX template void check_probs_inter<S>(const std::string&, const FwdHost<S>&, const std::vector<Oracle::FwdRow>&, \
                                            int, int);                                                                 \
  PREFIX template void check_forward_output<S>(const std::string&, Out, const FwdHost<S>&,                             \
                                               const std::vector<Oracle::FwdRow>&, int, int, int);                     \
  PREFIX template void check_grad<S>(const std::string&, const std::vector<S>&,                                        \
                                     const std::vector<std::vector<double>>&, const std::vector<Oracle::FwdRow>&,      \
                                     bool, int, int);                                                                  \
  PREFIX template void check_close_vectors<S>(const std::string&, const std::vector<S>&, const std::vector<S>&, int);
#define KOKKOSMOE_TEST_RUNNER_ETI_DS(PREFIX, S, D)                                                             \
  PREFIX template FwdOutputs<D, S> run_forward<D, S, S>(KokkosMoE::RouterConfig, Out, const V2<D, const S>&,   \
                                                        const V1<D, const S>&);                                \
  PREFIX template FwdHost<S> fetch<D, S>(const FwdOutputs<D, S>&);                                             \
  PREFIX template RouterCase<D, S> make_case<D, S>(const Oracle::Attr&, RouterInputs);                         \
  PREFIX template RouterCase<D, S> make_random_case<D, S>(const Oracle::Attr&, int, int, bool, std::uint64_t); \
  PREFIX template void run_router_case<D, S>(const RouterCase<D, S>&, RunFlags);
#define KOKKOSMOE_TEST_RUNNER_ETI(PREFIX, S) \
  KOKKOSMOE_TEST_RUNNER_ETI_S(PREFIX, S)     \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_RUNNER_ETI_DS, PREFIX, S)

KOKKOSMOE_TEST_RUNNER_ETI(extern, float)
KOKKOSMOE_TEST_RUNNER_ETI(extern, fp16_t)
KOKKOSMOE_TEST_RUNNER_ETI(extern, bf16_t)

}  // namespace KokkosMoETest

#endif
