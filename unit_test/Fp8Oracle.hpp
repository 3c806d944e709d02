/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_FP8ORACLE_HPP
#define KOKKOSMOE_TEST_FP8ORACLE_HPP

// The FP8 E4M3 rows of docs/ep.md §3.5 as plain loops that share no code with the library: E4M3 values from the
// format's definition (powers of two), float -> E4M3 as a search for the nearest of the 254 finite values with ties
// to the even code, the block scales from their formula. Used by the quantizer's tests and the EP layer's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace KokkosMoE::Test {

/// The value of E4M3 code b from the format's definition; NaN for S.1111.111.
inline double fp8_oracle_value(int b) {
  const int s = (b >> 7) & 1, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

/// float -> E4M3 by search: the nearest finite value, ties to the even code; beyond 448 (infinities too) +-448;
/// NaN -> S.1111.111 with the sign of the input.
inline std::uint8_t fp8_oracle_code(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const int sign = (u >> 31) ? 0x80 : 0;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7e);
  int best = 0;
  double dbest = a;  // code 0 is 0
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(fp8_oracle_value(c) - a);
    if (d < dbest || (d == dbest && (c & 1) == 0)) {
      best = c;
      dbest = d;
    }
  }
  return static_cast<std::uint8_t>(sign | best);
}

/// One row of H values (already in the row type's precision) to H codes and H / 128 scales.
inline void fp8_oracle_quantize_row(const float* x, int H, bool ue8m0, float min_amax, std::uint8_t* q, float* s) {
  for (int b = 0; b < H / 128; ++b) {
    float amax = 0.0f;
    for (int c = b * 128; c < b * 128 + 128; ++c)
      if (std::isfinite(x[c])) amax = std::max(amax, std::fabs(x[c]));
    float sc = std::max(amax, min_amax) / 448.0f;
    if (ue8m0) {
      int e = 0;
      const float f = std::frexp(sc, &e);  // sc = f * 2^e, f in [0.5, 1)
      sc = f == 0.5f ? sc : std::ldexp(1.0f, e);
    }
    s[b] = sc;
    for (int c = b * 128; c < b * 128 + 128; ++c) q[c] = fp8_oracle_code(x[c] / sc);
  }
}

}  // namespace KokkosMoE::Test

#endif
