/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERMATH_HPP
#define KOKKOSMOE_ROUTERMATH_HPP

// The router's math, once, for every implementation (docs/router.md §1, §5.1, §5.3, §6, §7, §9): the constants, the
// score-function codes, the score functions and their derivatives, the normalization, the softmax terms and the
// merge of softmax partials, the order-preserving selection key with its order for NaN, ±0 and ±inf, and the
// group-score rule. The portable Kokkos kernels, the per-token device functions of
// KokkosMoE_RouterToken.hpp and the native CUDA kernels all call these functions; none of them re-derives a formula
// or a constant. The header needs neither Kokkos nor CUDA (the native kernels include it without Kokkos), only a
// host/device decoration. Expression order is part of the contract: results are bit-identical wherever the same
// functions run on the same inputs.

#include <KokkosMoE_RouterConfig.hpp>  // ScoreFunction

#include <kokkos_ext/KokkosMoE_Float16.hpp>  // KOKKOSMOE_HD_INLINE, KOKKOSMOE_HD_FORCEINLINE, float_bits, bits_float

#include <cmath>
#include <cstdint>

/// Full unrolling of a loop with a compile-time trip count, for the device compilers.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define KOKKOSMOE_PRAGMA_UNROLL _Pragma("unroll")
#else
#define KOKKOSMOE_PRAGMA_UNROLL
#endif

namespace KokkosMoE {
namespace Impl {

// ---------------------------------------------------------------------------------------------------------------
// Constants (docs/router.md §1, §5.1)
// ---------------------------------------------------------------------------------------------------------------
constexpr float kEps = 1e-20f;                ///< added to the Sigmoid/SqrtSoftplus normalization denominator
constexpr float kSqrtSoftplusCutoff = 20.0f;  ///< softplus(x) is taken as x above this (log1p(exp(x)) == x in FP32)

/// The score function as the integer code that the native kernels' parameter blocks carry.
constexpr int kFnSigmoid = static_cast<int>(ScoreFunction::Sigmoid);
constexpr int kFnSoftmax = static_cast<int>(ScoreFunction::Softmax);
constexpr int kFnSqrtSoftplus = static_cast<int>(ScoreFunction::SqrtSoftplus);

// ---------------------------------------------------------------------------------------------------------------
// Elementary functions: the accurate single-precision library functions on every backend (no fast-math), so that a
// device and the host agree to the last bit where their libraries do.
// ---------------------------------------------------------------------------------------------------------------
KOKKOSMOE_HD_INLINE float math_exp(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
KOKKOSMOE_HD_INLINE float math_log1p(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::log1pf(x);
#else
  return std::log1p(x);
#endif
}
KOKKOSMOE_HD_INLINE float math_sqrt(float x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

/// fmaxf: the larger of a and b; a NaN argument is skipped (the other one is returned).
KOKKOSMOE_HD_INLINE float math_fmax(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return ::fmaxf(a, b);
#else
  return std::fmax(a, b);
#endif
}

KOKKOSMOE_HD_INLINE float neg_inf() { return bits_float(0xff800000u); }

// ---------------------------------------------------------------------------------------------------------------
// Score functions (docs/router.md §5.1) and their derivatives (§9)
// ---------------------------------------------------------------------------------------------------------------
/// The denominator of the sigmoid, 1 + exp(-x): >= 1, or NaN.
KOKKOSMOE_HD_INLINE float sigmoid_denominator(float x) { return 1.0f + math_exp(-x); }
KOKKOSMOE_HD_INLINE float sigmoid(float x) { return 1.0f / sigmoid_denominator(x); }

/// 1.0f / d for d in [1, 2^126), bit-identical to that division. On a CUDA device it is the fast path that nvcc
/// emits for 1.0f / d in that range (approximate reciprocal, one correction with a flush-to-zero negation), without
/// the range check and branch of the full division.
KOKKOSMOE_HD_FORCEINLINE float reciprocal_1_2p126(float d) {
#if defined(__CUDA_ARCH__)
  float r, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  e = fmaf(d, r, -1.0f);
  asm("neg.ftz.f32 %0, %0;" : "+f"(e));
  return fmaf(r, e, r);
#else
  return 1.0f / d;
#endif
}

/// y[w] = sigmoid(x[w]) for W values, bit-identical to it. Every denominator is >= 1 (or NaN); when all W are below
/// 2^126 (logits above about -87.3) one range check covers the W reciprocals instead of a check and branch each.
template <int W>
KOKKOSMOE_HD_FORCEINLINE void sigmoid_n(const float (&x)[W], float (&y)[W]) {
  float d[W];
  float dmax = 1.0f;
  KOKKOSMOE_PRAGMA_UNROLL
  for (int w = 0; w < W; ++w) {
    d[w] = sigmoid_denominator(x[w]);
    dmax = math_fmax(dmax, d[w]);  // (fmax skips NaN: a NaN denominator gives NaN on either path)
  }
  if (dmax < 0x1p126f) {
    KOKKOSMOE_PRAGMA_UNROLL
    for (int w = 0; w < W; ++w) y[w] = reciprocal_1_2p126(d[w]);
  } else {
    KOKKOSMOE_PRAGMA_UNROLL
    for (int w = 0; w < W; ++w) y[w] = 1.0f / d[w];
  }
}

KOKKOSMOE_HD_INLINE float sqrt_softplus(float x) {
  return math_sqrt(x > kSqrtSoftplusCutoff ? x : math_log1p(math_exp(x)));
}

/// The Sigmoid/SqrtSoftplus normalization (docs/router.md §5.2): its denominator from the sum of the activations,
/// and one activation y divided by it.
KOKKOSMOE_HD_INLINE float normalization_denominator(float sum) { return sum + kEps; }
KOKKOSMOE_HD_INLINE float normalize(float y, float sum) { return y / normalization_denominator(sum); }

// ---------------------------------------------------------------------------------------------------------------
// Softmax (docs/router.md §5.1, §7.4)
// ---------------------------------------------------------------------------------------------------------------
/// exp(x - M) with no test of x: the numerator where x is known not to be -inf, or where the caller tests it.
KOKKOSMOE_HD_INLINE float softmax_exp(float x, float M) { return math_exp(x - M); }
/// One softmax numerator: exp(x - M), where an element equal to -inf contributes exactly 0.
KOKKOSMOE_HD_INLINE float softmax_term(float x, float M) { return x == neg_inf() ? 0.0f : softmax_exp(x, M); }

/// Merge of two softmax partials (max, sum). A partial whose max is -inf contributes its sum unscaled: 0 when it
/// holds no data or only -inf, NaN when it holds a NaN (fmax skips NaN, so the max of such a partial stays -inf
/// while its sum is NaN, and the NaN must reach the row, §7.4). Symmetric in its arguments, so butterfly reductions
/// give every lane the same bits.
KOKKOSMOE_HD_FORCEINLINE void softmax_merge(float& m, float& s, float mo, float so) {
  const float M = math_fmax(m, mo);
  const float a = (m == neg_inf()) ? s : s * softmax_exp(m, M);
  const float b = (mo == neg_inf()) ? so : so * softmax_exp(mo, M);
  m = M;
  s = a + b;
}

/// d sigmoid / dx times h, from the saved activation a = sigmoid(x).
KOKKOSMOE_HD_INLINE float sigmoid_grad(float h, float a) { return h * a * (1.0f - a); }
/// d sqrt_softplus / dx times h, from the saved logit x and v = sqrt_softplus(x).
KOKKOSMOE_HD_INLINE float sqrt_softplus_grad(float h, float x, float v) {
  const float den = 2.0f * v + kEps;
  return x > kSqrtSoftplusCutoff ? h / den : h * sigmoid(x) / den;
}
/// d softmax / dx_e times the incoming gradient g_e, with P = sum over the softmax's support of g * a.
KOKKOSMOE_HD_INLINE float softmax_grad(float g, float a, float P) { return a * (g - P); }

// ---------------------------------------------------------------------------------------------------------------
// Selection keys (docs/router.md §6, §7)
//
// A score becomes an order-preserving unsigned 32-bit key: -inf < finite < +inf, -0.0 ties with +0.0, and NaN (any
// sign or payload) gets kNaNKey, below -inf (whose key is 0x007fffff). Key 0 is "no candidate" (padding, an
// ineligible expert, a removed entry): every real score outranks it. kNaNKey has bits above the low 12 so that a
// key whose low bits are replaced by an expert index (the packed keys of the CUDA lane kernel) stays non-zero.
// The 64-bit packed key puts the 32-bit key over the inverted expert index: larger is better, equal keys resolve
// to the lower index, every (key, index) pair is unique, and a plain max reduction selects deterministically.
// ---------------------------------------------------------------------------------------------------------------
constexpr std::uint32_t kNaNKey = 0x1000u;

/// order_key for a score known not to be -0.0 (for example y + b with y >= +0 or NaN): one instruction less.
KOKKOSMOE_HD_INLINE std::uint32_t order_key_no_negative_zero(float s) {
  const std::uint32_t u = float_bits(s);
  const std::uint32_t k = u ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(u) >> 31) | 0x80000000u);
  return (s != s) ? kNaNKey : k;
}
KOKKOSMOE_HD_INLINE std::uint32_t order_key(float s) { return order_key_no_negative_zero(s == 0.0f ? 0.0f : s); }
/// Inverse of order_key for keys of real scores (keys 0 and kNaNKey decode to a NaN).
KOKKOSMOE_HD_INLINE float order_key_decode(std::uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

KOKKOSMOE_HD_INLINE std::uint64_t pack_key(std::uint32_t key, int index) {
  return (static_cast<std::uint64_t>(key) << 32) |
         static_cast<std::uint32_t>(0xffffffffu - static_cast<std::uint32_t>(index));
}
KOKKOSMOE_HD_INLINE std::uint64_t pack_key(float score, int index) { return pack_key(order_key(score), index); }
KOKKOSMOE_HD_INLINE int key_index(std::uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<std::uint32_t>(key & 0xffffffffu));
}

// ---------------------------------------------------------------------------------------------------------------
// Quantile Balancing histogram (docs/router.md §19.5): the bin of a required bias r = cutoff - y. The scale is
// num_bins / (upper - lower) in FP32, once per call; z = (r - lower) * scale, subtract first; floor(z) clamped into
// [0, num_bins - 1], NaN and everything below 0 into bin 0, +inf and everything from num_bins up into the last bin
// (tested in float before converting, so no conversion is out of range).
// ---------------------------------------------------------------------------------------------------------------
KOKKOSMOE_HD_INLINE float qb_bin_scale(float lower, float upper, int num_bins) {
  return static_cast<float>(num_bins) / (upper - lower);
}
KOKKOSMOE_HD_INLINE int qb_bin(float r, float lower, float scale, int num_bins) {
  const float z = (r - lower) * scale;
  if (!(z >= 0.0f)) return 0;
  if (z >= static_cast<float>(num_bins)) return num_bins - 1;
  return static_cast<int>(z);  // truncation is floor for 0 <= z < num_bins
}

// ---------------------------------------------------------------------------------------------------------------
// Group-limited routing (docs/router.md §5.3): a group's score is the sum of its kg = topk / group_topk best
// selection scores, added best first starting from the best one.
// ---------------------------------------------------------------------------------------------------------------
/// Adds the next-best score of a group to its running score (j = 0 starts it).
KOKKOSMOE_HD_INLINE float group_score_add(float running, int j, float score) {
  return j == 0 ? score : running + score;
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
