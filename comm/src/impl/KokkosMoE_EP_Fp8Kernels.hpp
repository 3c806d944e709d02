/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_FP8KERNELS_HPP
#define KOKKOSMOE_EP_FP8KERNELS_HPP

// FP8 token rows (docs/ep.md §3.5): sources quantized in the pack or given, and their pack kernel.

#include <impl/KokkosMoE_EP_Native.hpp>
#include <impl/KokkosMoE_EP_PackKernels.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

// ----- FP8 rows (docs/ep.md §3.5) ----------------------------------------------------------------------------------
// On the wire an FP8 token row is its H bytes of E4M3 codes, then its H / 128 FP32 scales, then the trailer. Codes
// move in Chunk16 units of 16 channels; a block of 128 channels is 8 units.

constexpr int kFp8UnitsPerBlock = kFp8BlockChannels / 16;

/// FP8 rows quantized in the pack from float or bf16 rows x [T, H] (the rules of quantize_fp8_rows). Where x is
/// 16-byte aligned (\p vec; H is a multiple of 128, so every row is) 16 channels arrive in 16-byte loads, not one
/// element at a time: element loads kept the pack at the L1 pipe's limit, far from DRAM's.
template <class Scalar, class Mem>
struct QuantizingRows {
  static constexpr bool quantizes = true;
  static constexpr int kChunks = 16 * static_cast<int>(sizeof(Scalar)) / 16;  // 16-byte loads per 16 channels
  Unmanaged2<const Scalar, Mem> x;
  float min_amax = 0.0f;
  bool ue8m0 = false;
  bool vec = false;
  /// Channels [16 u, 16 u + 16) of row t as floats.
  KOKKOS_INLINE_FUNCTION void load16(int t, int u, float* f) const {
    if (vec) {
      const Chunk16* p = reinterpret_cast<const Chunk16*>(&x(t, 16 * u));
      Chunk16 raw[kChunks];
      for (int i = 0; i < kChunks; ++i) raw[i] = p[i];
      for (int i = 0; i < kChunks; ++i) UnitOps<Scalar, Chunk16>::load(raw[i], f + i * (16 / kChunks));
    } else {
      for (int c = 0; c < 16; ++c) f[c] = to_float(x(t, 16 * u + c));
    }
  }
  /// The largest finite |x| of channels [16 u, 16 u + 16) of row t.
  KOKKOS_INLINE_FUNCTION float amax16(int t, int u) const {
    float f[16];
    load16(t, u, f);
    float a = 0.0f;
    for (int c = 0; c < 16; ++c) {
      const float av = fp8_finite(f[c]) ? (f[c] < 0.0f ? -f[c] : f[c]) : 0.0f;
      a = av > a ? av : a;
    }
    return a;
  }
  KOKKOS_INLINE_FUNCTION float scale(int, int, float amax) const { return fp8_block_scale(amax, min_amax, ue8m0); }
  /// The codes of channels [16 u, 16 u + 16) of row t, little-endian in four words.
  KOKKOS_INLINE_FUNCTION Chunk16 unit(int t, int u, float scale) const {
    float f[16];
    load16(t, u, f);
    Chunk16 out;
    for (int i = 0; i < 4; ++i) {
      std::uint32_t word = 0;
      for (int j = 0; j < 4; ++j)
        word |= static_cast<std::uint32_t>(float_to_e4m3_bits(f[4 * i + j] / scale)) << (8 * j);
      out.v[i] = word;
    }
    return out;
  }
};

/// FP8 rows the caller quantized: codes [T, H / 16] in units, scales [T, H / 128].
template <class Mem>
struct QuantizedRows {
  static constexpr bool quantizes = false;
  Unmanaged2<const Chunk16, Mem> q;
  Unmanaged2<const float, Mem> scales;
  KOKKOS_INLINE_FUNCTION float amax16(int, int) const { return 0.0f; }
  KOKKOS_INLINE_FUNCTION float scale(int t, int b, float) const { return scales(t, b); }
  KOKKOS_INLINE_FUNCTION Chunk16 unit(int t, int u, float) const { return q(t, u); }
};

/// Forward direction, source side, FP8 rows: each token's codes and scales (quantized here from \p src when it
/// quantizes) go once to every remote rank its kept slots reach, at scales_off and the K weights at trailer_off of the
/// wire row, and to the receive rows of its local slots (local_q, local_s; local_f = the slot's weight or 1). A native
/// kernel of the space (EpNative) runs instead where it takes the arguments.
template <class Exec, class Src>
void pack_fp8_tokens(const Exec& exec, const EpShape s, const Src& src, int units,
                     const Unmanaged2<const float, typename Exec::memory_space>& w,
                     const EpLayoutViews<typename Exec::memory_space>& v,
                     const Unmanaged2<Chunk16, typename Exec::memory_space>& local_q,
                     const Unmanaged2<float, typename Exec::memory_space>& local_s,
                     const Unmanaged1<float, typename Exec::memory_space>& local_f,
                     const PeerRows<typename Exec::memory_space>& dst, std::size_t scales_off, std::size_t trailer_off,
                     const char* label) {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (s.T == 0) return;
  if (EpNative<Exec>::pack_fp8(exec, s, src, units, w, v, local_q, local_s, local_f, dst, scales_off, trailer_off,
                               label))
    return;
  const int blocks = units / kFp8UnitsPerBlock;
  // One vector of kFp8UnitsPerBlock lanes per 128-channel block: a lane's 16 channels, the block's maximum across the
  // lanes (a maximum: the same in any order), then the lane's codes from its channels again (the loads it just made).
  team_items(
      exec, s, label, s.T, PackScratch<Exec>::shmem(s),
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int t = static_cast<int>(item);
        const PackScratch<Exec> p(sp, s);
        p.template targets<Mem>(m, s, v, t, w, dst);
        const auto& ptr = p.ptr;
        const auto& lrow = p.lrow;
        const int nl = lrow(s.K), nr = lrow(s.K + 1);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, blocks), [&](int b) {
          float a = 0.0f;
          if (Src::quantizes)
            Kokkos::parallel_reduce(
                Kokkos::ThreadVectorRange(m, kFp8UnitsPerBlock),
                [&](int j, float& mx) {
                  const float aj = src.amax16(t, b * kFp8UnitsPerBlock + j);
                  mx = aj > mx ? aj : mx;
                },
                Kokkos::Max<float>(a));
          const float scale = src.scale(t, b, a);
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(m, kFp8UnitsPerBlock), [&](int j) {
            const int u = b * kFp8UnitsPerBlock + j;
            const Chunk16 val = src.unit(t, u, scale);
            for (int i = 0; i < nl; ++i) local_q(lrow(i), u) = val;
            for (int i = 0; i < nr; ++i) reinterpret_cast<Chunk16*>(ptr(i))[u] = val;
          });
          Kokkos::single(Kokkos::PerThread(m), [&]() {
            for (int i = 0; i < nl; ++i) local_s(lrow(i), b) = scale;
            for (int i = 0; i < nr; ++i) reinterpret_cast<float*>(ptr(i) + scales_off)[b] = scale;
          });
        });
        p.template weights<Mem>(m, s, t, w, trailer_off, local_f, nl, nr);
      },
      kFp8UnitsPerBlock);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
