/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_FLOAT16_HPP
#define KOKKOSMOE_FLOAT16_HPP

/// \file KokkosMoE_Float16.hpp
/// \brief `fp16_t` (IEEE binary16) and `bf16_t` (bfloat16): 16-bit storage types with round-to-nearest-even
/// conversions from float, identical on host and device (docs/router.md §2).
///
/// Kokkos' `half_t` is plain `float` in host-only builds and Kokkos 3.4 has no `bhalf_t`, so they would make
/// 16-bit behaviour untestable on CPU. These types are bit-exact everywhere and layout-compatible with CUDA's
/// `__half` / `__nv_bfloat16`. Plain C++ with no Kokkos dependency, so native CUDA kernels use them too.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define KOKKOSMOE_HOST_DEVICE __host__ __device__
#define KOKKOSMOE_HD_FORCEINLINE __host__ __device__ __forceinline__
#else
#define KOKKOSMOE_HOST_DEVICE
#define KOKKOSMOE_HD_FORCEINLINE inline
#endif
#define KOKKOSMOE_HD_INLINE KOKKOSMOE_HOST_DEVICE inline

namespace KokkosMoE {
namespace Impl {

KOKKOSMOE_HD_INLINE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

KOKKOSMOE_HD_INLINE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

/// float -> binary16, round to nearest even; NaN stays NaN (quiet), overflow goes to inf, subnormals exact.
KOKKOSMOE_HD_INLINE std::uint16_t float_to_half_bits(float f) {
  const std::uint32_t x = float_bits(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<std::uint16_t>(sign | (absx > 0x7f800000u ? 0x7e00u | ((absx >> 13) & 0x3ffu) : 0x7c00u));
  }
  if (absx >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                                                    // below 2^-14: subnormal or 0
    if (absx < 0x33000000u) return static_cast<std::uint16_t>(sign);           // below 2^-25: rounds to 0
    const std::uint32_t e = absx >> 23;                                        // 102..112
    const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24
    std::uint32_t r = m >> shift;
    const std::uint32_t rem = m & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = absx - 0x38000000u;  // rebias exponent 127 -> 15 (in place)
  const std::uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;  // carry may roll into the exponent: correct
  return static_cast<std::uint16_t>(sign | r);
}

KOKKOSMOE_HD_INLINE float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  if (e == 0x1fu) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // subnormal: value = m * 2^-24, exactly representable in float
    int exp = -1;
    do {
      m <<= 1;
      ++exp;
    } while ((m & 0x400u) == 0);
    return bits_float(sign | (static_cast<std::uint32_t>(127 - 15 - exp) << 23) | ((m & 0x3ffu) << 13));
  }
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

/// float -> bfloat16, round to nearest even; NaN stays a quiet NaN.
KOKKOSMOE_HD_INLINE std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t lsb = (x >> 16) & 1u;
  return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
}

KOKKOSMOE_HD_INLINE float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

#if defined(__CUDACC__)
// The conversion instructions of the GPU, for the native CUDA kernels: one instruction each where the functions
// above take a dozen. For every input but a NaN they give the same bits as those (widening is exact; narrowing rounds
// to nearest even); a NaN becomes the hardware's NaN pattern, not the one of the functions above. bfloat16 widening is
// a shift, so bf16_bits_to_float serves both.
__device__ __forceinline__ float half_bits_to_float_hw(std::uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ std::uint16_t float_to_half_bits_hw(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ std::uint16_t float_to_bf16_bits_hw(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
#endif

}  // namespace Impl

/// \brief IEEE 754 binary16 storage type. Arithmetic happens in float.
struct alignas(2) fp16_t {
  std::uint16_t bits;
  KOKKOSMOE_HD_INLINE fp16_t() : bits(0) {}
  KOKKOSMOE_HD_INLINE fp16_t(float f) : bits(Impl::float_to_half_bits(f)) {}  // NOLINT: implicit by design
  KOKKOSMOE_HD_INLINE operator float() const { return Impl::half_bits_to_float(bits); }
  KOKKOSMOE_HD_INLINE static fp16_t from_bits(std::uint16_t b) {
    fp16_t h;
    h.bits = b;
    return h;
  }
};

/// \brief bfloat16 storage type. Arithmetic happens in float.
struct alignas(2) bf16_t {
  std::uint16_t bits;
  KOKKOSMOE_HD_INLINE bf16_t() : bits(0) {}
  KOKKOSMOE_HD_INLINE bf16_t(float f) : bits(Impl::float_to_bf16_bits(f)) {}  // NOLINT: implicit by design
  KOKKOSMOE_HD_INLINE operator float() const { return Impl::bf16_bits_to_float(bits); }
  KOKKOSMOE_HD_INLINE static bf16_t from_bits(std::uint16_t b) {
    bf16_t h;
    h.bits = b;
    return h;
  }
};

static_assert(sizeof(fp16_t) == 2 && sizeof(bf16_t) == 2, "16-bit storage types must be 2 bytes");

namespace Impl {
/// Widening load / narrowing store used by every kernel: one rounding, on store.
KOKKOSMOE_HD_INLINE float to_float(float x) { return x; }
KOKKOSMOE_HD_INLINE float to_float(fp16_t x) { return static_cast<float>(x); }
KOKKOSMOE_HD_INLINE float to_float(bf16_t x) { return static_cast<float>(x); }
template <class T>
KOKKOSMOE_HD_INLINE T from_float(float x) {
  return T(x);
}
}  // namespace Impl

}  // namespace KokkosMoE

#endif
