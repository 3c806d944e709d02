/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_FP8QUANTIZE_HPP
#define KOKKOSMOE_FP8QUANTIZE_HPP

/// \file KokkosMoE_Fp8Quantize.hpp
/// \brief Rows to FP8 E4M3 with one FP32 scale per 128 channels, and back (docs/ep.md §3.5): the format of FP8
/// token rows (the layout DeepEP's FP8 dispatch uses, which grouped FP8 GEMMs consume).
///
/// For row r and block b (channels [128 b, 128 b + 128)): amax = the largest |x| over the block's finite values,
/// at least `min_amax`; scale(r, b) = amax / 448, or with `Fp8ScaleFormat::Ue8m0` the next power of two at or above
/// it; q(r, c) = E4M3(x(r, c) / scale(r, b)), rounded to nearest even and saturated (fp8_e4m3_t). Dequantized:
/// float(q) * scale. Every value is defined for every input, NaN and infinities included, and the bits are the same
/// on every backend: amax is a maximum (order-free) and each element is one IEEE division and one rounding.

#include <KokkosMoE_Error.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_Float8.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

namespace KokkosMoE {

/// Channels per FP32 scale.
constexpr int kFp8BlockChannels = 128;

/// \brief How the per-block scales are stored.
enum class Fp8ScaleFormat : int {
  Fp32 = 0,   ///< amax / 448 as computed
  Ue8m0 = 1,  ///< rounded up to a power of two (an 8-bit exponent would hold it exactly)
};

/// \brief Settings of quantize_fp8_rows.
struct Fp8QuantizeConfig {
  Fp8ScaleFormat scale_format = Fp8ScaleFormat::Fp32;
  /// Floor of a block's amax: an all-zero (or all non-finite) block gets scale min_amax / 448 and zeros.
  float min_amax = 1e-4f;
};

/// \brief FP8 rows and their scales as one argument (ep_dispatch's FP8 forms): q [N, H] fp8_e4m3_t, scales
/// [N, H / 128] float, both LayoutRight (the layout quantize_fp8_rows writes).
template <class QView, class SView>
struct Fp8Rows {
  QView q;
  SView scales;
};
template <class QView, class SView>
Fp8Rows<QView, SView> fp8_rows(const QView& q, const SView& scales) {
  return {q, scales};
}

namespace Impl {

/// The rules of Fp8QuantizeConfig, checked at each boundary that takes one.
inline void fp8_check_config(const char* fn, const Fp8QuantizeConfig& config) {
  const int format = static_cast<int>(config.scale_format);
  if (format != 0 && format != 1)
    throw InvalidArgument(fn, "config.scale_format", Rule::ConfigValue,
                          "scale_format (" + std::to_string(format) + ") is not an Fp8ScaleFormat enumerator");
  if (!(std::isfinite(config.min_amax) && config.min_amax >= 1e-30f))
    throw InvalidArgument(fn, "config.min_amax", Rule::ConfigValue,
                          "min_amax (" + std::to_string(config.min_amax) + ") must be finite and at least 1e-30");
}

template <class V>
void fp8_check_rows(const char* fn, const char* name, const V& v, std::size_t rows, std::size_t cols) {
  if (v.extent(0) != rows || v.extent(1) != cols)
    throw InvalidArgument(fn, name, Rule::ShapeMismatch,
                          std::string(name) + " has extents [" + std::to_string(v.extent(0)) + ", " +
                              std::to_string(v.extent(1)) + "], expected [" + std::to_string(rows) + ", " +
                              std::to_string(cols) + "]");
  if (v.size() > 0 && !v.span_is_contiguous())
    throw InvalidArgument(fn, name, Rule::NotContiguous, std::string(name) + " must be contiguous and row-major");
}

template <class Exec, class V, int Rank>
constexpr void fp8_static_view() {
  static_assert(Kokkos::is_view<V>::value, "KokkosMoE FP8 rows: arguments must be Kokkos Views");
  static_assert(static_cast<int>(V::rank) == Rank, "KokkosMoE FP8 rows: wrong View rank");
  static_assert(std::is_same<typename V::array_layout, Kokkos::LayoutRight>::value,
                "KokkosMoE FP8 rows: Views must be LayoutRight");
  static_assert(Kokkos::SpaceAccessibility<Exec, typename V::memory_space>::accessible,
                "KokkosMoE FP8 rows: the execution space cannot access a View's memory");
}

// fp8_block_scale and fp8_finite are in kokkos_ext/KokkosMoE_Float8.hpp (Kokkos-free: native kernels use them too).

}  // namespace Impl

/// \brief q(r, :) and scales(r, :) from the rows x(r, :) (docs/ep.md §3.5). x: [N, H] float or bf16_t with H a
/// multiple of 128; q: [N, H] fp8_e4m3_t; scales: [N, H / 128] float; all LayoutRight, contiguous, on \p exec.
/// \throws InvalidArgument naming the argument: ShapeMismatch (H not a multiple of 128, extents), NotContiguous,
/// ConfigValue (a scale format that is no enumerator, min_amax not finite and positive)
template <class Exec, class XView, class QView, class SView>
void quantize_fp8_rows(const Exec& exec, const XView& x, const QView& q, const SView& scales,
                       const Fp8QuantizeConfig& config = {}) {
  constexpr const char* fn = "quantize_fp8_rows";
  using Scalar = typename XView::non_const_value_type;
  Impl::fp8_static_view<Exec, XView, 2>();
  Impl::fp8_static_view<Exec, QView, 2>();
  Impl::fp8_static_view<Exec, SView, 2>();
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, bf16_t>::value,
                "KokkosMoE::quantize_fp8_rows: x must hold float or KokkosMoE::bf16_t");
  static_assert(std::is_same<typename QView::value_type, fp8_e4m3_t>::value,
                "KokkosMoE::quantize_fp8_rows: q must be non-const fp8_e4m3_t");
  static_assert(std::is_same<typename SView::value_type, float>::value,
                "KokkosMoE::quantize_fp8_rows: scales must be non-const float");
  const std::size_t N = x.extent(0), H = x.extent(1);
  if (H % kFp8BlockChannels != 0)
    throw InvalidArgument(fn, "x", Rule::ShapeMismatch,
                          "x has " + std::to_string(H) + " channels per row; FP8 rows need a multiple of " +
                              std::to_string(kFp8BlockChannels) + " (one scale per block)");
  if (x.size() > 0 && !x.span_is_contiguous())
    throw InvalidArgument(fn, "x", Rule::NotContiguous, "x must be contiguous and row-major");
  Impl::fp8_check_rows(fn, "q", q, N, H);
  Impl::fp8_check_rows(fn, "scales", scales, N, H / kFp8BlockChannels);
  Impl::fp8_check_config(fn, config);
  const std::int64_t blocks = static_cast<std::int64_t>(N) * static_cast<std::int64_t>(H / kFp8BlockChannels);
  if (blocks > static_cast<std::int64_t>(std::numeric_limits<int>::max()))
    throw InvalidArgument(fn, "x", Rule::ShapeMismatch,
                          "x has " + std::to_string(blocks) + " blocks of 128 channels, more than 2^31 - 1");
  if (blocks == 0) return;
  const int nb = static_cast<int>(H / kFp8BlockChannels);
  const bool ue8m0 = config.scale_format == Fp8ScaleFormat::Ue8m0;
  const float min_amax = config.min_amax;
  // One team per block: the amax is a vector max (exact in any order), then each lane converts its channels.
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  Kokkos::parallel_for(
      "KokkosMoE::quantize_fp8_rows", Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(blocks), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& m) {
        const std::int64_t blk = m.league_rank();
        const std::size_t r = static_cast<std::size_t>(blk / nb);
        const int c0 = static_cast<int>(blk % nb) * kFp8BlockChannels;
        float amax = 0.0f;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, kFp8BlockChannels),
            [&](int i, float& a) {
              const float v = Impl::to_float(x(r, c0 + i));
              const float av = Impl::fp8_finite(v) ? (v < 0.0f ? -v : v) : 0.0f;
              if (av > a) a = av;
            },
            Kokkos::Max<float>(amax));
        const float s = Impl::fp8_block_scale(amax, min_amax, ue8m0);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, kFp8BlockChannels),
                             [&](int i) { q(r, c0 + i) = fp8_e4m3_t(Impl::to_float(x(r, c0 + i)) / s); });
        Kokkos::single(Kokkos::PerTeam(m), [&] { scales(r, blk % nb) = s; });
      });
}

/// \brief y(r, c) = float(q(r, c)) * scales(r, c / 128), rounded to y's type (float or bf16_t).
/// \throws InvalidArgument naming the argument: ShapeMismatch, NotContiguous
template <class Exec, class QView, class SView, class YView>
void dequantize_fp8_rows(const Exec& exec, const QView& q, const SView& scales, const YView& y) {
  constexpr const char* fn = "dequantize_fp8_rows";
  using Scalar = typename YView::value_type;
  Impl::fp8_static_view<Exec, QView, 2>();
  Impl::fp8_static_view<Exec, SView, 2>();
  Impl::fp8_static_view<Exec, YView, 2>();
  static_assert(std::is_same<typename QView::non_const_value_type, fp8_e4m3_t>::value,
                "KokkosMoE::dequantize_fp8_rows: q must hold fp8_e4m3_t");
  static_assert(std::is_same<Scalar, float>::value || std::is_same<Scalar, bf16_t>::value,
                "KokkosMoE::dequantize_fp8_rows: y must be non-const float or KokkosMoE::bf16_t");
  const std::size_t N = q.extent(0), H = q.extent(1);
  if (H % kFp8BlockChannels != 0)
    throw InvalidArgument(
        fn, "q", Rule::ShapeMismatch,
        "q has " + std::to_string(H) + " channels per row, not a multiple of " + std::to_string(kFp8BlockChannels));
  if (q.size() > 0 && !q.span_is_contiguous())
    throw InvalidArgument(fn, "q", Rule::NotContiguous, "q must be contiguous and row-major");
  Impl::fp8_check_rows(fn, "scales", scales, N, H / kFp8BlockChannels);
  Impl::fp8_check_rows(fn, "y", y, N, H);
  const std::int64_t n = static_cast<std::int64_t>(N) * static_cast<std::int64_t>(H);
  if (n == 0) return;
  const std::int64_t cols = static_cast<std::int64_t>(H);
  Kokkos::parallel_for(
      "KokkosMoE::dequantize_fp8_rows", Kokkos::RangePolicy<Exec>(exec, 0, n), KOKKOS_LAMBDA(std::int64_t i) {
        const std::size_t r = static_cast<std::size_t>(i / cols), c = static_cast<std::size_t>(i % cols);
        y(r, c) = Scalar(static_cast<float>(q(r, c)) * scales(r, c / kFp8BlockChannels));
      });
}

}  // namespace KokkosMoE

#endif
