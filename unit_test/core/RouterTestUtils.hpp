/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_ROUTERTESTUTILS_HPP
#define KOKKOSMOE_TEST_ROUTERTESTUTILS_HPP

// Shared helpers of the router tests: numeric traits of the three logits types (the library's fp16_t / bf16_t are
// used as storage only, filled and read through the oracle's own conversions), a portable seeded RNG, the input
// generators of docs/router.md §16.2 (seeded, per-row varied, tie-free and well-conditioned by construction; plus the
// reference's patterns), device View transfer, the tolerances of §16.1 and a mismatch collector.

#include <KokkosMoE_AuxLoss.hpp>
#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "RouterOracle.hpp"

namespace KokkosMoETest {

using KokkosMoE::bf16_t;
using KokkosMoE::fp16_t;

// ------------------------------------------------------------------------------------------------------------------
// Numeric traits of the logits / probs / gradient element types
// ------------------------------------------------------------------------------------------------------------------
template <class S>
struct Num;
template <>
struct Num<float> {
  static constexpr const char* name = "float";
  static constexpr bool is16 = false;
  static double quantize(double v) { return static_cast<double>(static_cast<float>(v)); }
  static float make(double q) { return static_cast<float>(q); }
  static double value(float s) { return s; }
  static std::uint32_t raw(float s) {
    std::uint32_t u;
    std::memcpy(&u, &s, 4);
    return u;
  }
};
template <>
struct Num<double> {  // oracle-only experiments (no library type)
  static constexpr const char* name = "double";
  static constexpr bool is16 = false;
  static double quantize(double v) { return v; }
  static double value(double s) { return s; }
};
template <>
struct Num<fp16_t> {
  static constexpr const char* name = "fp16_t";
  static constexpr bool is16 = true;
  static std::uint16_t round_bits(double v) { return Oracle::to_half_bits(v); }
  static double quantize(double v) { return Oracle::from_half_bits(Oracle::to_half_bits(v)); }
  static fp16_t make(double q) { return fp16_t::from_bits(Oracle::to_half_bits(q)); }
  static double value(fp16_t s) { return Oracle::from_half_bits(s.bits); }
  static std::uint32_t raw(fp16_t s) { return s.bits; }
};
template <>
struct Num<bf16_t> {
  static constexpr const char* name = "bf16_t";
  static constexpr bool is16 = true;
  static std::uint16_t round_bits(double v) { return Oracle::to_bf16_bits(v); }
  static double quantize(double v) { return Oracle::from_bf16_bits(Oracle::to_bf16_bits(v)); }
  static bf16_t make(double q) { return bf16_t::from_bits(Oracle::to_bf16_bits(q)); }
  static double value(bf16_t s) { return Oracle::from_bf16_bits(s.bits); }
  static std::uint32_t raw(bf16_t s) { return s.bits; }
};

// ------------------------------------------------------------------------------------------------------------------
// Portable seeded RNG (SplitMix64; no std:: distributions, whose output is implementation-defined)
// ------------------------------------------------------------------------------------------------------------------
struct Rng {
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint64_t>(n)); }
  std::vector<int> permutation(int n) {
    std::vector<int> p(n);
    for (int i = 0; i < n; ++i) p[i] = i;
    for (int i = n - 1; i > 0; --i) std::swap(p[i], p[below(i + 1)]);
    return p;
  }
};
inline std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) { return Rng(a ^ (b * 0xD1B54A32D192ED03ull)).next(); }

// ------------------------------------------------------------------------------------------------------------------
// Config translation
// ------------------------------------------------------------------------------------------------------------------
inline KokkosMoE::RouterConfig to_config(const Oracle::Attr& a) {
  KokkosMoE::RouterConfig c;
  c.topk = a.topk;
  c.score_function = static_cast<KokkosMoE::ScoreFunction>(static_cast<int>(a.f));
  c.use_pre_softmax = a.pre;
  c.num_groups = a.G;
  c.group_topk = a.gk;
  c.scaling_factor = static_cast<float>(a.scale);
  return c;
}
inline Oracle::Attr make_attr(Oracle::Score f, bool pre, int k, int G = 0, int gk = 0, double scale = 1.0) {
  Oracle::Attr a;
  a.f = f;
  a.pre = pre;
  a.topk = k;
  a.G = G;
  a.gk = gk;
  a.scale = static_cast<double>(static_cast<float>(scale));  // the library sees the float
  return a;
}
inline const char* score_name(Oracle::Score f, bool pre) {
  switch (f) {
    case Oracle::Score::Sigmoid:
      return "sigmoid";
    case Oracle::Score::SqrtSoftplus:
      return "sqrtsoftplus";
    default:
      return pre ? "softmax-pre" : "softmax-post";
  }
}
inline std::string describe(const Oracle::Attr& a, int T, int E, bool bias, const char* dtype) {
  std::ostringstream os;
  os << score_name(a.f, a.pre) << " T=" << T << " E=" << E << " k=" << a.topk << " bias=" << bias;
  if (a.gk > 0) os << " G=" << a.G << " gk=" << a.gk;
  os << " scale=" << a.scale << " dtype=" << dtype;
  return os.str();
}
/// True when (E, k, grouping) satisfies docs/router.md §4 rule 6.
inline bool grouping_valid(int E, int k, int G, int gk) {
  if (gk <= 0) return true;
  return G > 0 && gk <= G && E % G == 0 && k % gk == 0 && k / gk <= E / G;
}

// ------------------------------------------------------------------------------------------------------------------
// Tolerances (docs/router.md §16.1) and comparisons
// ------------------------------------------------------------------------------------------------------------------
struct Tol {
  double atol, rtol;
};
/// Reference-style FP32 tolerance, scaled with the row length n (E, or C for the aux loss).
inline Tol fp32_tol(std::int64_t n) {
  return {std::max(1e-5, 4e-7 * static_cast<double>(n)), std::max(1.3e-6, 4e-7 * static_cast<double>(n))};
}
/// allclose-style; NaN matches NaN, infinities must be equal.
inline bool close(double got, double ref, Tol t) {
  if (std::isnan(ref) || std::isnan(got)) return std::isnan(ref) && std::isnan(got);
  if (std::isinf(ref) || std::isinf(got)) return got == ref;
  return std::fabs(got - ref) <= t.atol + t.rtol * std::fabs(ref);
}

/// A value of type S against a double reference. float: `tol`. fp16/bf16: at most 1 ulp from the reference rounded
/// to S; with `or_fp32_tol` also accepted when within `tol` (gradients, whose FP32 cancellation error can exceed a
/// 16-bit ulp near zero).
template <class S>
bool value_ok(S got, double ref, Tol tol, bool or_fp32_tol = false) {
  if constexpr (!Num<S>::is16) {
    return close(Num<S>::value(got), ref, tol);
  } else {
    const double g = Num<S>::value(got);
    if (std::isnan(ref) || std::isnan(g)) return std::isnan(ref) && std::isnan(g);
    const std::uint16_t rb = Num<S>::round_bits(ref);
    const auto d = std::abs(Oracle::ordinal16(static_cast<std::uint16_t>(Num<S>::raw(got))) - Oracle::ordinal16(rb));
    if (d <= 1) return true;
    return or_fp32_tol && close(g, ref, tol);
  }
}
template <class S>
bool is_plus_zero(S v) {
  return Num<S>::raw(v) == 0u;
}

/// Collects mismatches of one check and reports the count plus the first few, as one Boost.Test assertion.
class Mismatches {
 public:
  explicit Mismatches(std::string what) : m_what(std::move(what)) {}
  template <class F>
  void add(F&& describe_fn) {
    if (m_count++ < 6) {
      std::ostringstream os;
      describe_fn(os);
      m_first += "    " + os.str() + "\n";
    }
  }
  int count() const { return m_count; }
  bool report() const {
    BOOST_TEST(m_count == 0, m_what << ": " << m_count << " mismatch(es)\n" << m_first);
    return m_count == 0;
  }

 private:
  std::string m_what;
  std::string m_first;
  int m_count = 0;
};

// ------------------------------------------------------------------------------------------------------------------
// Device Views and transfers. Every operand lives in DeviceType's memory space; the host fills mirrors.
// ------------------------------------------------------------------------------------------------------------------
template <class D, class T>
using V2 = Kokkos::View<T**, Kokkos::LayoutRight, D>;
template <class D, class T>
using V1 = Kokkos::View<T*, Kokkos::LayoutRight, D>;
template <class D, class T>
using V0 = Kokkos::View<T, Kokkos::LayoutRight, D>;

/// A host View over v's data when the host can access it, else an uninitialized host mirror.
template <class View>
auto host_view(const View& v) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename View::memory_space>::accessible)
    return v;
  else
    return
        typename View::HostMirror(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("mirror")), v.layout());
}

template <class View>
void upload(const View& v, const std::vector<typename View::non_const_value_type>& h) {
  auto m = host_view(v);
  BOOST_TEST_REQUIRE(h.size() == static_cast<std::size_t>(v.span()));
  if (!h.empty()) std::memcpy(static_cast<void*>(m.data()), h.data(), h.size() * sizeof(h[0]));
  Kokkos::deep_copy(v, m);
}
template <class View>
std::vector<typename View::non_const_value_type> download(const View& v) {
  auto m = host_view(v);
  Kokkos::deep_copy(m, v);
  std::vector<typename View::non_const_value_type> h(v.span());
  if (!h.empty()) std::memcpy(static_cast<void*>(h.data()), m.data(), h.size() * sizeof(h[0]));
  return h;
}
/// A rank-2 device View filled with `fill` (a sentinel that detects elements the library failed to write). Views
/// are allocated without Kokkos' initialization kernel: the host fills every element.
template <class D, class T>
V2<D, T> make2(const char* label, std::int64_t rows, std::int64_t cols, T fill) {
  V2<D, T> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
  upload(v, std::vector<T>(static_cast<std::size_t>(rows * cols), fill));
  return v;
}
template <class D, class T>
V1<D, T> make1(const char* label, std::int64_t n, T fill) {
  V1<D, T> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), n);
  upload(v, std::vector<T>(static_cast<std::size_t>(n), fill));
  return v;
}
/// A device View holding the values q (already representable in S).
template <class D, class S>
V2<D, S> device_values(const char* label, std::int64_t rows, std::int64_t cols, const std::vector<double>& q) {
  std::vector<S> h(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) h[i] = Num<S>::make(q[i]);
  V2<D, S> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), rows, cols);
  upload(v, h);
  return v;
}
template <class D, class S>
V1<D, S> device_vector(const char* label, const std::vector<double>& q) {
  std::vector<S> h(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) h[i] = Num<S>::make(q[i]);
  V1<D, S> v(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string(label)), q.size());
  upload(v, h);
  return v;
}
template <class S>
std::vector<double> as_double(const std::vector<S>& v) {
  std::vector<double> d(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) d[i] = Num<S>::value(v[i]);
  return d;
}
template <class T>
bool bytes_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
/// Exact equality of two value arrays in which a NaN equals any NaN: IEEE 754 (§6.3) leaves the sign and payload of
/// an operation's NaN result unspecified, and compilers reorder commutative operands (x86 returns the first one's
/// NaN), so two compilations of the same expression may differ in a NaN's bits and nothing else (docs/router.md §16.1).
template <class S>
bool values_equal(const std::vector<S>& a, const std::vector<S>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (Num<S>::raw(a[i]) != Num<S>::raw(b[i]) && !(std::isnan(Num<S>::value(a[i])) && std::isnan(Num<S>::value(b[i]))))
      return false;
  return true;
}

/// The two implementations: Auto (the CUDA specialization on Kokkos::Cuda) and Portable (the generic kernels).
inline const KokkosMoE::Implementation kImpls[] = {KokkosMoE::Implementation::Auto,
                                                   KokkosMoE::Implementation::Portable};
inline const char* impl_name(KokkosMoE::Implementation i) {
  return i == KokkosMoE::Implementation::Portable ? "Portable" : "Auto";
}

// ------------------------------------------------------------------------------------------------------------------
// Conditioning of a row (docs/router.md §16.1 "ill-conditioned rows"): every decision the row's routing depends on
// (adjacent ranks among the first k+1 eligible experts; the boundary between the gk-th and (gk+1)-th group) must be
// separated by far more than the FP32 evaluation error, or be an exact tie of identical inputs (which FP32 and the
// oracle both resolve to the lower index).
// ------------------------------------------------------------------------------------------------------------------
inline bool well_conditioned(const Oracle::Attr& a, const double* x, const double* b, int E, double rel = 1e-5) {
  const Oracle::FwdRow r = Oracle::forward_row(a, x, E, b);
  const bool post = a.f == Oracle::Score::Softmax && !a.pre;
  double ymax = 0.0, bmax = 0.0, xmax = 0.0;
  for (int e = 0; e < E; ++e) {
    ymax = std::max(ymax, std::fabs(r.act[e]));
    xmax = std::max(xmax, std::fabs(x[e]));
    if (b) bmax = std::max(bmax, std::fabs(b[e]));
  }
  if (!std::isfinite(ymax) || !std::isfinite(xmax) || !std::isfinite(bmax)) return false;
  double abs_thr = 0.0;  // absolute FP32 error scale of one selection score
  if (a.f != Oracle::Score::Softmax) abs_thr = rel * (ymax + bmax);
  if (post) abs_thr = 0.0;  // raw logits: compared exactly in FP32 and in the oracle
  auto identical = [&](int i, int j) { return x[i] == x[j] && (!b || b[i] == b[j]); };
  std::vector<int> cand;
  for (int e = 0; e < E; ++e)
    if (r.eligible[e]) cand.push_back(e);
  const std::vector<int> ord = Oracle::selection_order(r.score, cand);
  const int last = std::min<int>(a.topk, static_cast<int>(ord.size()) - 1);
  for (int i = 0; i < last; ++i) {
    const int p = ord[i], q = ord[i + 1];
    const double sp = r.score[p], sq = r.score[q];
    if (identical(p, q)) continue;
    const double thr = a.f == Oracle::Score::Softmax && a.pre ? rel * std::max(std::fabs(sp), std::fabs(sq)) : abs_thr;
    if (!(std::fabs(sp - sq) > thr)) return false;
  }
  if (a.gk > 0 && a.gk < a.G) {
    const int kg = a.topk / a.gk;
    const double gp = r.gscore[r.group_order[a.gk - 1]], gq = r.gscore[r.group_order[a.gk]];
    double thr = rel * (std::fabs(gp) + std::fabs(gq)) + kg * abs_thr;
    if (post) thr = rel * kg * xmax;
    if (!(std::fabs(gp - gq) > thr)) return false;
  }
  return true;
}

// ------------------------------------------------------------------------------------------------------------------
// Generators (docs/router.md §16.2)
// ------------------------------------------------------------------------------------------------------------------
struct RouterInputs {
  int T = 0, E = 0;
  std::vector<double> x;  ///< [T*E] logits, representable in the logits type
  std::vector<double> b;  ///< [E] bias, representable in the bias type, or empty
  int redrawn_rows = 0;
};

/// Logit range of the primary generator per score function.
inline void logit_range(const Oracle::Attr& a, double& lo, double& hi) {
  lo = -4.0;
  hi = 4.0;
  if (a.f == Oracle::Score::SqrtSoftplus) {  // covers both branches of softplus (x > 20 is the identity)
    lo = -6.0;
    hi = 24.0;
  }
}

/// Runs fn(t) for every row t in [0, T): in order for the small cases of the CPU suites, spread over the host's
/// threads for the large ones of the full tier (rows are independent and seeded per row, so the results are the
/// same; fn must not call Boost.Test).
template <class F>
void for_rows(int T, int E, const F& fn) {
  const unsigned hw = std::thread::hardware_concurrency();
  if (static_cast<std::size_t>(T) * static_cast<std::size_t>(E) < (std::size_t{1} << 20) || hw < 2) {
    for (int t = 0; t < T; ++t) fn(t);
    return;
  }
  const int n = static_cast<int>(std::min(hw, 32u));
  std::vector<std::thread> pool;
  pool.reserve(n);
  for (int i = 0; i < n; ++i)
    pool.emplace_back([&fn, i, n, T] {
      for (int t = i; t < T; t += n) fn(t);
    });
  for (std::thread& th : pool) th.join();
}

/// Primary generator: each row a random permutation of E distinct, evenly spaced values spanning the range, plus
/// noise below a quarter of the spacing; rows are redrawn (deterministically) until well conditioned. The bias (if
/// any) is random per expert with a magnitude comparable to the spread of the activations.
template <class S, class B = S>
RouterInputs generate_router_inputs(const Oracle::Attr& a, int T, int E, bool with_bias, std::uint64_t seed,
                                    double rel_margin = 1e-5) {
  RouterInputs in;
  in.T = T;
  in.E = E;
  in.x.resize(static_cast<std::size_t>(T) * E);
  double lo, hi;
  logit_range(a, lo, hi);
  Rng brng(mix_seed(seed, 0xB1A5));
  if (with_bias) {
    const double ylo = a.f == Oracle::Score::Sigmoid ? Oracle::sigmoid(lo) : Oracle::sqrtsoftplus(lo);
    const double yhi = a.f == Oracle::Score::Sigmoid ? Oracle::sigmoid(hi) : Oracle::sqrtsoftplus(hi);
    const double w = yhi - ylo;
    in.b.resize(E);
    for (int e = 0; e < E; ++e) in.b[e] = Num<B>::quantize(brng.uniform(-0.5 * w, 0.5 * w));
  }
  const double delta = (hi - lo) / E;
  std::vector<int> redraws(T, 0);
  std::vector<char> ok(T, 0);
  for_rows(T, E, [&](int t) {
    double* row = in.x.data() + static_cast<std::size_t>(t) * E;
    for (int attempt = 0; attempt < 200 && !ok[t]; ++attempt) {
      Rng rng(mix_seed(seed, (static_cast<std::uint64_t>(t) << 16) + attempt));
      const std::vector<int> perm = rng.permutation(E);
      for (int e = 0; e < E; ++e) row[e] = Num<S>::quantize(lo + (perm[e] + 0.5 + rng.uniform(-0.25, 0.25)) * delta);
      ok[t] = well_conditioned(a, row, with_bias ? in.b.data() : nullptr, E, rel_margin) ? 1 : 0;
      if (!ok[t]) ++redraws[t];
    }
  });
  for (int t = 0; t < T; ++t) {
    in.redrawn_rows += redraws[t];
    if (!ok[t])
      BOOST_FAIL("generator: no well-conditioned row after 200 draws (row " << t << ", E=" << E << ", k=" << a.topk
                                                                            << ")");
  }
  return in;
}

/// The reference's own patterns (docs/router.md §16.2), a compatibility case only: every token selects the same
/// experts.
inline RouterInputs reference_pattern_inputs(const Oracle::Attr& a, int T, int E, bool with_bias) {
  RouterInputs in;
  in.T = T;
  in.E = E;
  in.x.resize(static_cast<std::size_t>(T) * E);
  for (int t = 0; t < T; ++t)
    for (int e = 0; e < E; ++e) {
      double v;
      if (a.f == Oracle::Score::Softmax)
        v = (-static_cast<double>(T) * E / 2 + static_cast<double>(t) * E + e) * 1e-4;
      else
        v = (e - E / 2) * 1e-2 + (t - T / 2) * 1e-4;
      in.x[static_cast<std::size_t>(t) * E + e] = Num<float>::quantize(v);
    }
  if (with_bias) {
    in.b.resize(E);
    for (int e = 0; e < E; ++e) in.b[e] = Num<float>::quantize((E - 1 - e) * 0.1);
  }
  return in;
}

/// Oracle forward of every row.
inline std::vector<Oracle::FwdRow> oracle_forward(const Oracle::Attr& a, const RouterInputs& in) {
  std::vector<Oracle::FwdRow> ref(in.T);
  for_rows(in.T, in.E, [&](int t) {
    ref[t] = Oracle::forward_row(a, in.x.data() + static_cast<std::size_t>(t) * in.E, in.E,
                                 in.b.empty() ? nullptr : in.b.data());
  });
  return ref;
}

/// Uniform values in [lo, hi) representable in S.
template <class S>
std::vector<double> random_values(std::size_t n, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Rng rng(seed);
  std::vector<double> v(n);
  for (auto& x : v) x = Num<S>::quantize(rng.uniform(lo, hi));
  return v;
}

/// Expects `f` to throw KokkosMoE::InvalidArgument with rule `rule` (and function `fn` / parameter `param` if given).
/// Not a template over the callable: the validation suites call it with a hundred distinct lambdas per backend, and
/// its assertions are compiled once (RouterTestUtils.cpp) instead of once per lambda.
void expect_rule(KokkosMoE::Rule rule, const std::string& what, const std::function<void()>& f,
                 const char* fn = nullptr, const char* param = nullptr);

// Explicit instantiation of the transfers for every element type the suites use on every enabled backend, and of
// the generator for the three logits types: each instantiates Kokkos' View allocation and deep_copy paths, which
// otherwise every test source compiles again. RouterTestUtils.cpp compiles them once. X-macros: PREFIX is `extern`
// (declaration) or empty (definition).
#define KOKKOSMOE_TEST_TRANSFER_ETI_DT(PREFIX, T, D)                                \
  PREFIX template void upload<V2<D, T>>(const V2<D, T>&, const std::vector<T>&);    \
  PREFIX template void upload<V1<D, T>>(const V1<D, T>&, const std::vector<T>&);    \
  PREFIX template std::vector<T> download<V2<D, T>>(const V2<D, T>&);               \
  PREFIX template std::vector<T> download<V1<D, T>>(const V1<D, T>&);               \
  PREFIX template V2<D, T> make2<D, T>(const char*, std::int64_t, std::int64_t, T); \
  PREFIX template V1<D, T> make1<D, T>(const char*, std::int64_t, T);
#define KOKKOSMOE_TEST_VALUES_ETI_DS(PREFIX, S, D)                                                                   \
  PREFIX template V2<D, S> device_values<D, S>(const char*, std::int64_t, std::int64_t, const std::vector<double>&); \
  PREFIX template V1<D, S> device_vector<D, S>(const char*, const std::vector<double>&);
#define KOKKOSMOE_TEST_UTILS_ETI_S(PREFIX, S)                               \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_TRANSFER_ETI_DT, PREFIX, S) \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_VALUES_ETI_DS, PREFIX, S)   \
  PREFIX template RouterInputs generate_router_inputs<S, S>(const Oracle::Attr&, int, int, bool, std::uint64_t, double);
#define KOKKOSMOE_TEST_UTILS_ETI(PREFIX)                                               \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_TRANSFER_ETI_DT, PREFIX, std::uint8_t) \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_TRANSFER_ETI_DT, PREFIX, std::int16_t) \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_TRANSFER_ETI_DT, PREFIX, std::int32_t) \
  KOKKOSMOE_FOR_EACH_DEVICE_TYPE(KOKKOSMOE_TEST_TRANSFER_ETI_DT, PREFIX, std::int64_t) \
  KOKKOSMOE_TEST_UTILS_ETI_S(PREFIX, float)                                            \
  KOKKOSMOE_TEST_UTILS_ETI_S(PREFIX, fp16_t)                                           \
  KOKKOSMOE_TEST_UTILS_ETI_S(PREFIX, bf16_t)

KOKKOSMOE_TEST_UTILS_ETI(extern)

}  // namespace KokkosMoETest

#endif
