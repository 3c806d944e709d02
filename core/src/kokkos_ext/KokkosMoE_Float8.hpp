/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_FLOAT8_HPP
#define KOKKOSMOE_FLOAT8_HPP

/// \file KokkosMoE_Float8.hpp
/// \brief `fp8_e4m3_t`: the OCP FP8 E4M3 ("fn") storage type, 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no
/// infinities, one NaN pattern per sign (S.1111.111), largest finite magnitude 448, subnormals down to 2^-9.
///
/// The conversion from float rounds to nearest even and saturates: magnitudes above 448 (infinities included) become
/// +-448, NaN stays NaN (docs/ep.md §3.5). Identical on host and device, layout-compatible with CUDA's
/// `__nv_fp8_e4m3`; plain C++ with no Kokkos dependency, like KokkosMoE_Float16.hpp.

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cstdint>
#if defined(__CUDACC__)
#include <cuda_fp8.h>
#endif

namespace KokkosMoE {
namespace Impl {

constexpr float kE4m3Max = 448.0f;

/// float -> E4M3 bits in integer arithmetic: round to nearest even, saturating at +-448, NaN -> S.1111.111.
KOKKOSMOE_HD_INLINE std::uint8_t float_to_e4m3_bits_integer(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 24) & 0x80u;
  const std::uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);   // NaN
  if (a >= 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // >= 448 (and inf): saturate
  if (a < 0x3c800000u) {
    // Below 2^-6: the subnormal codes m * 2^-9, m = 0..7 (m = 8 is the smallest normal, code 0x08). The float's
    // significand, shifted to units of 2^-9, rounds to nearest even in integer arithmetic.
    if (a < 0x3a000000u) return static_cast<std::uint8_t>(sign);  // below 2^-11 (a quarter unit): rounds to 0
    const std::uint32_t e = a >> 23;                              // 116..120
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;          // value = m * 2^(e - 150)
    const std::uint32_t shift = 150u - 9u - e;                    // 21..25: units of 2^-9
    const std::uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    const std::uint32_t r = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
    return static_cast<std::uint8_t>(sign | r);
  }
  // Normal: biased exponent 1..15, three mantissa bits rounded from 23 to nearest even.
  std::uint32_t exp = (a >> 23) - 127u + 7u;
  std::uint32_t keep = (a >> 20) & 7u;
  const std::uint32_t rest = a & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u))) ++keep;
  if (keep == 8u) {
    keep = 0;
    ++exp;
  }
  std::uint32_t code = (exp << 3) | keep;
  if (code > 0x7eu) code = 0x7eu;  // rounded up past 448 (the NaN pattern): saturate
  return static_cast<std::uint8_t>(sign | code);
}

/// float -> E4M3 bits: round to nearest even, saturating at +-448, NaN -> S.1111.111.
KOKKOSMOE_HD_INLINE std::uint8_t float_to_e4m3_bits(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // Ada and Hopper convert in one instruction (cvt.rn.satfinite.e4m3x2.f32) with the same rounding and saturation of
  // finite and infinite magnitudes; only NaN's sign is set here, the instruction's NaN has none.
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint8_t>(((x >> 24) & 0x80u) | 0x7fu);
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_e4m3_bits_integer(f);
#endif
}

/// The FP32 scale of one block of FP8 rows from its amax (docs/ep.md §3.5): max(amax, min_amax) / 448, with
/// \p ue8m0 the next power of two at or above it.
KOKKOSMOE_HD_INLINE float fp8_block_scale(float amax, float min_amax, bool ue8m0) {
  const float a = amax > min_amax ? amax : min_amax;
  float s = a / kE4m3Max;
  if (ue8m0) {
    const std::uint32_t u = float_bits(s);
    if ((u & 0x7fffffu) != 0u) s = bits_float((u & 0x7f800000u) + 0x800000u);  // next power of two
  }
  return s;
}

/// Whether v is finite (the values a block's amax takes).
KOKKOSMOE_HD_INLINE bool fp8_finite(float v) { return (float_bits(v) & 0x7f800000u) != 0x7f800000u; }

/// E4M3 bits -> float (exact).
KOKKOSMOE_HD_INLINE float e4m3_bits_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exp = (b >> 3) & 0xfu, man = b & 7u;
  if (exp == 15u && man == 7u) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0u) {
    if (man == 0u) return bits_float(sign);
    // man * 2^-9: normalize the 3-bit significand into a float.
    std::uint32_t m = man, e = 0;
    while ((m & 4u) == 0u) {
      m <<= 1;
      ++e;
    }
    // leading bit at position 2: value = (m / 4) * 2^(-7 - e) with m in [4, 8)
    return bits_float(sign | ((127u - 7u - e) << 23) | ((m & 3u) << 21));
  }
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

}  // namespace Impl

/// \brief FP8 E4M3 storage type. Arithmetic happens in float.
struct alignas(1) fp8_e4m3_t {
  std::uint8_t bits;
  KOKKOSMOE_HD_INLINE fp8_e4m3_t() : bits(0) {}
  KOKKOSMOE_HD_INLINE explicit fp8_e4m3_t(float f) : bits(Impl::float_to_e4m3_bits(f)) {}
  KOKKOSMOE_HD_INLINE explicit operator float() const { return Impl::e4m3_bits_to_float(bits); }
  KOKKOSMOE_HD_INLINE static fp8_e4m3_t from_bits(std::uint8_t b) {
    fp8_e4m3_t h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(fp8_e4m3_t) == 1, "FP8 storage type must be 1 byte");

}  // namespace KokkosMoE

#endif
