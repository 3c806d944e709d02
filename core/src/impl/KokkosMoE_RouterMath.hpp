/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERMATH_HPP
#define KOKKOSMOE_ROUTERMATH_HPP

// The router's math, once, for every implementation (docs/router.md §1, §5.1, §5.3, §6, §7, §9): the constants, the
// score functions and their derivatives, the softmax term, the order-preserving selection key with its order for
// NaN, ±0 and ±inf, and the group-score rule. The portable Kokkos kernels, the per-token device functions of
// KokkosMoE_RouterToken.hpp and the native CUDA kernels all call these functions; none of them re-derives a formula
// or a constant. The header needs neither Kokkos nor CUDA (the native kernels include it without Kokkos), only a
// host/device decoration. Expression order is part of the contract: results are bit-identical wherever the same
// functions run on the same inputs.

#include <kokkos_ext/KokkosMoE_Float16.hpp>  // KOKKOSMOE_HD_INLINE, float_bits, bits_float

#include <cmath>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

// ---------------------------------------------------------------------------------------------------------------
// Constants (docs/router.md §1, §5.1)
// ---------------------------------------------------------------------------------------------------------------
constexpr float kEps = 1e-20f;                ///< added to the Sigmoid/SqrtSoftplus normalization denominator
constexpr float kSqrtSoftplusCutoff = 20.0f;  ///< softplus(x) is taken as x above this (log1p(exp(x)) == x in FP32)

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

KOKKOSMOE_HD_INLINE float neg_inf() { return bits_float(0xff800000u); }

// ---------------------------------------------------------------------------------------------------------------
// Score functions (docs/router.md §5.1) and their derivatives (§9)
// ---------------------------------------------------------------------------------------------------------------
KOKKOSMOE_HD_INLINE float sigmoid(float x) { return 1.0f / (1.0f + math_exp(-x)); }
KOKKOSMOE_HD_INLINE float sqrt_softplus(float x) {
  return math_sqrt(x > kSqrtSoftplusCutoff ? x : math_log1p(math_exp(x)));
}
/// One softmax numerator: exp(x - M), where an element equal to -inf contributes exactly 0.
KOKKOSMOE_HD_INLINE float softmax_term(float x, float M) { return x == neg_inf() ? 0.0f : math_exp(x - M); }

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
