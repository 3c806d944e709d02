/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_SELECT_HPP
#define KOKKOSMOE_ROUTER_SELECT_HPP

// Selection keys and scalar helpers shared by every implementation (docs/router.md §6, §7).
//
// A score becomes an order-preserving unsigned 32-bit key: NaN (any sign or payload) maps to 0, below -inf;
// -0.0 maps to +0.0. Paired with the inverted expert index in the low 32 bits, the 64-bit key orders by value
// descending and then by lower index, so a plain max reduction selects deterministically and ties resolve to the
// lowest index on every backend. Key 0 is never a real key (the inverted index of any e < 2^31 is non-zero): it
// marks excluded experts.

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#include <cmath>
#endif

namespace KokkosMoE {
namespace Impl {

KOKKOSMOE_HD_INLINE std::uint32_t order_key(float v) {
  std::uint32_t b = float_bits(v);
  if ((b & 0x7fffffffu) > 0x7f800000u) return 0u;  // NaN ranks below -inf
  if (b == 0x80000000u) b = 0u;                    // -0.0 ties with +0.0
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

KOKKOSMOE_HD_INLINE std::uint64_t pack_key(float v, int index) {
  return (static_cast<std::uint64_t>(order_key(v)) << 32) | static_cast<std::uint32_t>(0xffffffffu - index);
}

KOKKOSMOE_HD_INLINE int key_index(std::uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<std::uint32_t>(key & 0xffffffffu));
}

KOKKOSMOE_HD_INLINE float neg_inf() { return bits_float(0xff800000u); }

}  // namespace Impl
}  // namespace KokkosMoE

#endif
