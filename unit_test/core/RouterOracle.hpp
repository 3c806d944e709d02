/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_ROUTERORACLE_HPP
#define KOKKOSMOE_TEST_ROUTERORACLE_HPP

// Independent plain-loop oracle of docs/router.md in double precision. It includes no KokkosMoE header and
// calls no library code: its own enums, its own selection order (§6, §7), its own softmax (§5.1), grouping (§5.3),
// forward (§5.2), compact backward (§5.5), backward (§9), aux scores (§10), aux loss (§11), and its own
// round-to-nearest-even conversions to binary16 / bfloat16 (cross-checked against the library's storage types in
// tstOracle.cpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace KokkosMoETest {
namespace Oracle {

/// Score functions; the numeric values equal docs/router.md §2 (and therefore the library's enum).
enum class Score : int { Sigmoid = 0, Softmax = 1, SqrtSoftplus = 2 };

/// Attributes of one router call (docs/router.md §3). Grouping is on iff gk > 0.
struct Attr {
  int topk = 1;
  Score f = Score::Softmax;
  bool pre = false;
  int G = 0;
  int gk = 0;
  double scale = 1.0;
};

constexpr double kEps = 1e-20;  // docs/router.md §1
inline double inf() { return std::numeric_limits<double>::infinity(); }
inline double qnan() { return std::numeric_limits<double>::quiet_NaN(); }

// ------------------------------------------------------------------------------------------------------------------
// Total order of docs/router.md §6/§7: value descending; -0.0 == +0.0; +inf above finite; -inf below finite; NaN (any)
// below -inf; equal keys -> lower index first.
// ------------------------------------------------------------------------------------------------------------------
/// a ranks strictly above b.
inline bool ranks_above(double a, double b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a > b;  // -0.0 > +0.0 is false both ways: a tie
}
inline bool same_rank(double a, double b) { return !ranks_above(a, b) && !ranks_above(b, a); }
/// (a, ia) comes before (b, ib) in selection order.
inline bool precedes(double a, int ia, double b, int ib) {
  if (ranks_above(a, b)) return true;
  if (ranks_above(b, a)) return false;
  return ia < ib;
}
/// The candidates sorted in selection order.
inline std::vector<int> selection_order(const std::vector<double>& s, std::vector<int> candidates) {
  std::sort(candidates.begin(), candidates.end(), [&](int a, int b) { return precedes(s[a], a, s[b], b); });
  return candidates;
}

// ------------------------------------------------------------------------------------------------------------------
// Activations (§5.1)
// ------------------------------------------------------------------------------------------------------------------
inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double sqrtsoftplus(double x) { return std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x))); }

/// Softmax per §5.1 / §7.4: an element equal to -inf gets exactly 0; a row holding NaN or +inf, or only -inf, is NaN.
inline std::vector<double> softmax(const std::vector<double>& x) {
  std::vector<double> p(x.size(), qnan());
  double M = -inf();
  for (double v : x) {
    if (std::isnan(v) || v == inf()) return p;
    M = std::max(M, v);
  }
  if (M == -inf()) return p;
  double sum = 0.0;
  for (double v : x) sum += v == -inf() ? 0.0 : std::exp(v - M);
  for (std::size_t i = 0; i < x.size(); ++i) p[i] = x[i] == -inf() ? 0.0 : std::exp(x[i] - M) / sum;
  return p;
}

// ------------------------------------------------------------------------------------------------------------------
// topk_router forward, one token (§5.2, §5.3)
// ------------------------------------------------------------------------------------------------------------------
struct FwdRow {
  std::vector<int> idx;          ///< [k] selected experts in selection order
  std::vector<double> weight;    ///< [k] scaling_factor * v[i] (the compact weights)
  std::vector<double> probs;     ///< [E]
  std::vector<double> inter;     ///< [E] intermediate
  std::vector<double> score;     ///< [E] selection score s
  std::vector<double> act;       ///< [E] y (Softmax post: raw x)
  std::vector<char> routed;      ///< [E]
  std::vector<char> eligible;    ///< [E]
  std::vector<double> gscore;    ///< [G] group scores (grouping on)
  std::vector<int> group_order;  ///< [G] groups in selection order (grouping on)
};

inline FwdRow forward_row(const Attr& a, const double* x, int E, const double* bias) {
  FwdRow r;
  const int k = a.topk;
  r.probs.assign(E, 0.0);
  r.inter.assign(E, 0.0);
  r.score.assign(E, 0.0);
  r.act.assign(E, 0.0);
  r.routed.assign(E, 0);
  r.eligible.assign(E, 1);
  const bool post = a.f == Score::Softmax && !a.pre;
  if (a.f == Score::Softmax) {
    if (a.pre) {
      r.act = softmax(std::vector<double>(x, x + E));
      r.inter = r.act;
      r.score = r.act;
    } else {
      for (int e = 0; e < E; ++e) {
        r.act[e] = x[e];
        r.score[e] = x[e];
        r.inter[e] = -inf();
      }
    }
  } else {
    for (int e = 0; e < E; ++e) {
      const double y = a.f == Score::Sigmoid ? sigmoid(x[e]) : sqrtsoftplus(x[e]);
      r.act[e] = y;
      r.inter[e] = a.f == Score::Sigmoid ? y : x[e];
      r.score[e] = y + (bias ? bias[e] : 0.0);
    }
  }
  if (a.gk > 0) {
    const int G = a.G, gs = E / G, kg = k / a.gk;
    r.gscore.assign(G, 0.0);
    for (int g = 0; g < G; ++g) {
      std::vector<int> members(gs);
      std::iota(members.begin(), members.end(), g * gs);
      const std::vector<int> ord = selection_order(r.score, members);
      double sum = 0.0;
      for (int j = 0; j < kg; ++j) sum += r.score[ord[j]];
      r.gscore[g] = sum;
    }
    std::vector<int> groups(G);
    std::iota(groups.begin(), groups.end(), 0);
    r.group_order = selection_order(r.gscore, groups);
    std::fill(r.eligible.begin(), r.eligible.end(), 0);
    for (int j = 0; j < a.gk; ++j)
      for (int e = r.group_order[j] * gs; e < (r.group_order[j] + 1) * gs; ++e) r.eligible[e] = 1;
  }
  std::vector<int> cand;
  for (int e = 0; e < E; ++e)
    if (r.eligible[e]) cand.push_back(e);
  const std::vector<int> ord = selection_order(r.score, cand);
  r.idx.assign(ord.begin(), ord.begin() + k);
  std::vector<double> v(k);
  for (int i = 0; i < k; ++i) v[i] = r.act[r.idx[i]];
  if (post) {
    v = softmax(v);
    for (int i = 0; i < k; ++i) r.inter[r.idx[i]] = v[i];
  } else if (a.f != Score::Softmax && k > 1) {
    double sum = 0.0;
    for (int i = 0; i < k; ++i) sum += v[i];
    for (int i = 0; i < k; ++i) v[i] = v[i] / (sum + kEps);
  }
  r.weight.resize(k);
  for (int i = 0; i < k; ++i) {
    r.weight[i] = a.scale * v[i];
    r.probs[r.idx[i]] = r.weight[i];
    r.routed[r.idx[i]] = 1;
  }
  return r;
}

// ------------------------------------------------------------------------------------------------------------------
// topk_router backward, one token (§9); `routed` is the decoded routing output, `inter` the saved intermediate.
// ------------------------------------------------------------------------------------------------------------------
inline std::vector<double> backward_row(const Attr& a, const std::vector<char>& routed,
                                        const std::vector<double>& inter, const double* grad_probs) {
  const int E = static_cast<int>(inter.size());
  std::vector<double> dx(E, 0.0);
  if (a.f == Score::Softmax) {
    double P = 0.0;
    for (int e = 0; e < E; ++e)
      if (routed[e]) P += grad_probs[e] * a.scale * inter[e];
    for (int e = 0; e < E; ++e) {
      const double g = grad_probs[e] * a.scale;
      if (routed[e])
        dx[e] = inter[e] * (g - P);
      else
        dx[e] = a.pre ? inter[e] * (0.0 - P) : 0.0;
    }
    return dx;
  }
  auto v_of = [&](int e) { return a.f == Score::Sigmoid ? inter[e] : sqrtsoftplus(inter[e]); };
  double S = 0.0, Q = 0.0;
  for (int e = 0; e < E; ++e)
    if (routed[e]) {
      S += v_of(e);
      Q += grad_probs[e] * a.scale * v_of(e);
    }
  const double D = S + kEps;
  for (int e = 0; e < E; ++e) {
    if (!routed[e]) continue;  // assigned +0.0
    const double g = grad_probs[e] * a.scale;
    const double h = a.topk > 1 ? g / D - Q / (D * D) : g;
    const double ae = inter[e];
    if (a.f == Score::Sigmoid) {
      dx[e] = h * ae * (1.0 - ae);
    } else {
      const double v = sqrtsoftplus(ae);
      dx[e] = ae > 20.0 ? h / (2.0 * v + kEps) : h * sigmoid(ae) / (2.0 * v + kEps);
    }
  }
  return dx;
}

/// Compact backward (§5.5): the dense backward of §9 fed with the dense grad_probs that scatters grad_weights to ids,
/// with the activations recomputed from the logits.
inline std::vector<double> compact_backward_row(const Attr& a, const double* x, int E, const int* ids,
                                                const double* grad_weights) {
  const int k = a.topk;
  std::vector<char> routed(E, 0);
  std::vector<double> gp(E, 0.0), inter(E, 0.0);
  for (int i = 0; i < k; ++i) {
    routed[ids[i]] = 1;
    gp[ids[i]] = grad_weights[i];
  }
  if (a.f == Score::Sigmoid) {
    for (int e = 0; e < E; ++e) inter[e] = sigmoid(x[e]);
  } else if (a.f == Score::SqrtSoftplus) {
    for (int e = 0; e < E; ++e) inter[e] = x[e];
  } else if (a.pre) {
    inter = softmax(std::vector<double>(x, x + E));
  } else {
    std::vector<double> v(k);
    for (int i = 0; i < k; ++i) v[i] = x[ids[i]];
    v = softmax(v);
    for (int e = 0; e < E; ++e) inter[e] = -inf();
    for (int i = 0; i < k; ++i) inter[ids[i]] = v[i];
  }
  return backward_row(a, routed, inter, gp.data());
}

// ------------------------------------------------------------------------------------------------------------------
// aux_scores (§10)
// ------------------------------------------------------------------------------------------------------------------
struct AuxRow {
  std::vector<double> scores, inter;
  std::vector<int> idx;
  std::vector<char> routed;
};

inline AuxRow aux_scores_row(Score f, int k, const double* x, int E) {
  AuxRow r;
  r.scores.assign(E, 0.0);
  r.inter.assign(E, 0.0);
  r.routed.assign(E, 0);
  if (f == Score::Softmax) {
    r.scores = softmax(std::vector<double>(x, x + E));
    r.inter = r.scores;
  } else {
    std::vector<double> y(E);
    double sum = 0.0;
    for (int e = 0; e < E; ++e) {
      y[e] = f == Score::Sigmoid ? sigmoid(x[e]) : sqrtsoftplus(x[e]);
      r.inter[e] = f == Score::Sigmoid ? y[e] : x[e];
      sum += y[e];
    }
    for (int e = 0; e < E; ++e) r.scores[e] = y[e] / (sum + kEps);
  }
  std::vector<int> all(E);
  std::iota(all.begin(), all.end(), 0);
  const std::vector<int> ord = selection_order(r.scores, all);
  r.idx.assign(ord.begin(), ord.begin() + k);
  for (int e : r.idx) r.routed[e] = 1;
  return r;
}

inline std::vector<double> aux_scores_backward_row(Score f, const std::vector<double>& inter, const double* g) {
  const int E = static_cast<int>(inter.size());
  std::vector<double> dx(E);
  if (f == Score::Softmax) {
    double P = 0.0;
    for (int e = 0; e < E; ++e) P += g[e] * inter[e];
    for (int e = 0; e < E; ++e) dx[e] = inter[e] * (g[e] - P);
    return dx;
  }
  auto v_of = [&](int e) { return f == Score::Sigmoid ? inter[e] : sqrtsoftplus(inter[e]); };
  double S = 0.0, Q = 0.0;
  for (int e = 0; e < E; ++e) {
    S += v_of(e);
    Q += g[e] * v_of(e);
  }
  const double D = S + kEps;
  for (int e = 0; e < E; ++e) {
    const double h = g[e] / D - Q / (D * D);
    const double ae = inter[e];
    if (f == Score::Sigmoid) {
      dx[e] = h * ae * (1.0 - ae);
    } else {
      const double v = sqrtsoftplus(ae);
      dx[e] = ae > 20.0 ? h / (2.0 * v + kEps) : h * sigmoid(ae) / (2.0 * v + kEps);
    }
  }
  return dx;
}

// ------------------------------------------------------------------------------------------------------------------
// aux_loss (§11)
// ------------------------------------------------------------------------------------------------------------------
inline double aux_loss_const(int E, int topk, double coeff, double total) {
  return ((E * coeff) / topk) / total / total;
}
/// probs [R, C] row-major, tpe [C].
inline double aux_loss(const std::vector<double>& probs, std::int64_t R, std::int64_t C, const std::vector<double>& tpe,
                       double cst) {
  double acc = 0.0;
  for (std::int64_t c = 0; c < C; ++c) {
    double col = 0.0;
    for (std::int64_t r = 0; r < R; ++r) col += probs[r * C + c];
    acc += col * tpe[c];
  }
  return cst * acc;
}

// ------------------------------------------------------------------------------------------------------------------
// Routing-output encodings (§5.4)
// ------------------------------------------------------------------------------------------------------------------
/// NumPy packbits(bitorder="little") of one routed row.
inline std::vector<std::uint8_t> pack_bits(const std::vector<char>& routed) {
  const int E = static_cast<int>(routed.size());
  std::vector<std::uint8_t> bytes((E + 7) / 8, 0);
  for (int e = 0; e < E; ++e)
    if (routed[e]) bytes[e / 8] = static_cast<std::uint8_t>(bytes[e / 8] | (1u << (e % 8)));
  return bytes;
}

// ------------------------------------------------------------------------------------------------------------------
// Own round-to-nearest-even conversions (independent of the library's fp16_t / bf16_t)
// ------------------------------------------------------------------------------------------------------------------
/// double -> IEEE binary16 bits, RNE; NaN -> quiet NaN (sign kept), overflow -> inf.
inline std::uint16_t to_half_bits(double v) {
  const std::uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
  if (std::isnan(v)) return static_cast<std::uint16_t>(sign | 0x7e00u);
  const double a = std::fabs(v);
  if (a >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7c00u);        // max 65504; halfway to 65536 rounds up
  if (a < std::ldexp(1.0, -14)) {                                             // subnormal range: units of 2^-24
    const double q = std::nearbyint(std::ldexp(a, 24));                       // exact scaling; RNE (default mode)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));  // q == 1024 is the smallest normal
  }
  int ex = 0;
  const double m = std::frexp(a, &ex);  // a = m * 2^ex, m in [0.5, 1)
  int exp = ex - 1;                     // a = (2m) * 2^exp, 2m in [1, 2)
  double q = std::nearbyint((2.0 * m - 1.0) * 1024.0);
  if (q == 1024.0) {
    q = 0.0;
    ++exp;
  }
  if (exp + 15 >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  return static_cast<std::uint16_t>(sign | ((exp + 15) << 10) | static_cast<int>(q));
}
inline double from_half_bits(std::uint16_t h) {
  const double s = (h & 0x8000u) ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  if (e == 31) return m ? std::copysign(qnan(), s) : s * inf();
  if (e == 0) return s * std::ldexp(static_cast<double>(m), -24);
  return s * std::ldexp(1.0 + m / 1024.0, e - 15);
}
/// double -> bfloat16 bits, RNE; NaN -> quiet NaN, overflow -> inf.
inline std::uint16_t to_bf16_bits(double v) {
  const std::uint16_t sign = std::signbit(v) ? 0x8000u : 0u;
  if (std::isnan(v)) return static_cast<std::uint16_t>(sign | 0x7fc0u);
  const double a = std::fabs(v);
  if (a >= std::ldexp(2.0 - std::ldexp(1.0, -8), 127)) return static_cast<std::uint16_t>(sign | 0x7f80u);
  if (a < std::ldexp(1.0, -126)) {  // subnormal: units of 2^-133
    const double q = std::nearbyint(std::ldexp(a, 133));
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(q));
  }
  int ex = 0;
  const double m = std::frexp(a, &ex);
  int exp = ex - 1;
  double q = std::nearbyint((2.0 * m - 1.0) * 128.0);
  if (q == 128.0) {
    q = 0.0;
    ++exp;
  }
  if (exp + 127 >= 255) return static_cast<std::uint16_t>(sign | 0x7f80u);
  return static_cast<std::uint16_t>(sign | ((exp + 127) << 7) | static_cast<int>(q));
}
inline double from_bf16_bits(std::uint16_t b) {
  const double s = (b & 0x8000u) ? -1.0 : 1.0;
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  if (e == 255) return m ? std::copysign(qnan(), s) : s * inf();
  if (e == 0) return s * std::ldexp(static_cast<double>(m), -133);
  return s * std::ldexp(1.0 + m / 128.0, e - 127);
}

/// Ordinal of a 16-bit float pattern on a line where adjacent representable values differ by 1 and -0 == +0.
inline std::int32_t ordinal16(std::uint16_t bits) {
  const std::int32_t mag = bits & 0x7fff;
  return (bits & 0x8000u) ? -mag : mag;
}

}  // namespace Oracle
}  // namespace KokkosMoETest

#endif
