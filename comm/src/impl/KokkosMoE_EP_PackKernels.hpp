/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_PACKKERNELS_HPP
#define KOKKOSMOE_EP_PACKKERNELS_HPP

// Row movement of the EP layer (docs/ep.md §3.2-§3.4): the units rows move in, the per-token targets, and the pack
// kernels that write every token once per destination rank (and its local slots straight into the receive rows).

#include <impl/KokkosMoE_EP_KernelBase.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

// ----- row movement ------------------------------------------------------------------------------------------
// Rows move in units: Chunk16 when every row and buffer is 16-byte aligned (one vector load or store per unit),
// else the element type itself. UnitOps decodes a unit into FP32 lanes for the reductions (FP32 accumulation).

template <class Scalar, class Unit>
struct UnitOps {
  static constexpr int n = 1;
  KOKKOS_INLINE_FUNCTION static void load(const Unit& u, float* f) { f[0] = to_float(u); }
  KOKKOS_INLINE_FUNCTION static void store(const float* f, Unit& u) { u = from_float<Scalar>(f[0]); }
};
template <>
struct UnitOps<float, Chunk16> {
  static constexpr int n = 4;
  KOKKOS_INLINE_FUNCTION static void load(const Chunk16& u, float* f) {
    for (int i = 0; i < 4; ++i) f[i] = bits_float(u.v[i]);
  }
  KOKKOS_INLINE_FUNCTION static void store(const float* f, Chunk16& u) {
    for (int i = 0; i < 4; ++i) u.v[i] = float_bits(f[i]);
  }
};
template <>
struct UnitOps<bf16_t, Chunk16> {
  static constexpr int n = 8;
  KOKKOS_INLINE_FUNCTION static void load(const Chunk16& u, float* f) {
    for (int i = 0; i < 8; ++i)
      f[i] = bf16_bits_to_float(static_cast<std::uint16_t>((u.v[i / 2] >> (16 * (i % 2))) & 0xffffu));
  }
  KOKKOS_INLINE_FUNCTION static void store(const float* f, Chunk16& u) {
    for (int i = 0; i < 4; ++i)
      u.v[i] = static_cast<std::uint32_t>(float_to_bf16_bits(f[2 * i])) |
               (static_cast<std::uint32_t>(float_to_bf16_bits(f[2 * i + 1])) << 16);
  }
};

/// Units per thread in the copy loops of a row (pack, expand): that many independent loads in flight per thread
/// before its stores. One load per iteration (the stores may alias the source, so the compiler cannot hoist the next
/// one) leaves HBM under-subscribed. Thread b of the team takes units b, b + nb, ... (nb = units / batch rounded up),
/// so each batch step stays coalesced across the team. The reduces keep one unit per thread: their FP32 accumulators
/// (8 per 16-byte bf16 unit) times a batch cost occupancy. Chosen on the H200 at loopback R = 8
/// (perf_test/results/h200/README.md §6).
constexpr int kUnitBatch = 2;

/// Rows a reduce reads per step for one unit: that many independent 16-byte loads in flight per thread (raw, 4
/// registers each) before they are widened and accumulated; one row at a time left the reduces latency-bound (H200,
/// loopback R = 8: combine 0.80 of copy at 1, 0.845 at 4; perf_test/results/h200/README.md §6). The FP32 sum keeps
/// row order, so the bits do not depend on the gather width.
constexpr int kReduceGather = 4;

/// acc += coef(r) * row(r) over r in [0, n), in r order, reading up to kReduceGather rows at once.
template <class Ops, class Unit, class RowAt, class CoefAt>
KOKKOS_INLINE_FUNCTION void gather_sum(int n, const RowAt& row, const CoefAt& coef, float* acc) {
  for (int r0 = 0; r0 < n; r0 += kReduceGather) {
    Unit raw[kReduceGather];
    for (int j = 0; j < kReduceGather; ++j)
      if (r0 + j < n) raw[j] = row(r0 + j);
    for (int j = 0; j < kReduceGather; ++j) {
      if (r0 + j >= n) break;
      float f[Ops::n];
      Ops::load(raw[j], f);
      const float c = coef(r0 + j);
      for (int e = 0; e < Ops::n; ++e) acc[e] += c * f[e];
    }
  }
}

/// Column blocks of a token row for the per-token kernels at decode sizes: with a team per token, 128 tokens leave
/// a device of 132 SMs one team each, too few loads in flight to reach the memory's rate. A row of more than
/// kSplitUnits units is split into blocks of at least that many, while the kernel has at most kSplitTeams teams; a team
/// then takes one block of its token (the same per-unit arithmetic: the bits do not change). Prefill sizes (T >=
/// kSplitTeams) keep one team per token; a kernel of a fixed league of teams asks for that many.
constexpr int kSplitTeams = 1024;
constexpr int kSplitUnits = 128;

struct RowSplit {
  int blocks = 1;  // column blocks per row
  int width = 0;   // units per block (the last may hold fewer)
  KOKKOS_INLINE_FUNCTION int begin(int c) const { return c * width; }
  KOKKOS_INLINE_FUNCTION int end(int c, int units) const { return (c + 1) * width < units ? (c + 1) * width : units; }
};

inline RowSplit row_split(int T, int units, int teams = kSplitTeams) {
  const int most = units / kSplitUnits;                     // blocks of at least kSplitUnits units
  const int wanted = T >= teams || T <= 0 ? 1 : teams / T;  // at most \p teams teams
  RowSplit r;
  r.blocks = wanted < most ? wanted : (most > 1 ? most : 1);
  r.width = (units + r.blocks - 1) / r.blocks;
  return r;
}

/// team_unit_batches over the units [u0, u1) of a row, Batch units per item.
template <int Batch = kUnitBatch, class Member, class F>
KOKKOS_INLINE_FUNCTION void team_unit_block(const Member& m, int u0, int u1, const F& f) {
  const int n = u1 - u0, nb = (n + Batch - 1) / Batch;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nb), [&](int b) { f(u0 + b, nb, u1); });
}

/// Copies the units [u0, u1) of one row to n destinations: src(u) reads unit u, dst(i, u) is destination i's unit u.
/// Batch loads in flight per thread before the stores, in team_unit_block's order.
template <class Unit, int Batch = kUnitBatch, class Member, class Src, class Dst>
KOKKOS_INLINE_FUNCTION void team_fan_out(const Member& m, int u0, int u1, int n, const Src& src, const Dst& dst) {
  team_unit_block<Batch>(m, u0, u1, [&](int b, int nb, int end) {
    Unit val[Batch];
    for (int j = 0; j < Batch; ++j)
      if (b + j * nb < end) val[j] = src(b + j * nb);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < Batch; ++j)
        if (b + j * nb < end) dst(i, b + j * nb) = val[j];
  });
}

template <class Member, class F>
KOKKOS_INLINE_FUNCTION void team_unit_batches(const Member& m, int units, const F& f) {
  const int nb = (units + kUnitBatch - 1) / kUnitBatch;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nb), [&](int b) { f(b, nb); });
}

/// Loads a token's K per-slot entries into team scratch with K threads at once, then a barrier: the one thread
/// that builds the token's tables next reads shared memory instead of issuing K dependent global loads in turn.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void team_prefetch(const Member& m, int K, const F& f) {
  // One lane per thread writes (the FP8 pack runs vectors of lanes).
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, K),
                       [&](int j) { Kokkos::single(Kokkos::PerThread(m), [&]() { f(j); }); });
  m.team_barrier();
}

/// Slots whose dot products one team reduction forms in the Weighted combine backward: a token's kept slots on one
/// rank beyond it take another pass over its row. Four keep the reduction's value and the slots' loads in registers
/// (eight cost the expert side occupancy: 96 registers a thread), and a token rarely has more on one rank
/// (DeepSeek-V3 at EP8: about 1.8 on average).
constexpr int kDotSlots = 4;

/// The FP32 dot products of up to kDotSlots slots: the value of one team reduction.
struct SlotDots {
  float v[kDotSlots];
  KOKKOS_INLINE_FUNCTION SlotDots() {
    for (int i = 0; i < kDotSlots; ++i) v[i] = 0.0f;
  }
  KOKKOS_INLINE_FUNCTION SlotDots& operator+=(const SlotDots& o) {
    for (int i = 0; i < kDotSlots; ++i) v[i] += o.v[i];
    return *this;
  }
  // Kokkos 3's reducers join through volatile references.
  KOKKOS_INLINE_FUNCTION void operator+=(const volatile SlotDots& o) volatile {
    for (int i = 0; i < kDotSlots; ++i) v[i] += o.v[i];
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

namespace Kokkos {
template <>
struct reduction_identity<KokkosMoE::Impl::SlotDots> {
  KOKKOS_FORCEINLINE_FUNCTION static KokkosMoE::Impl::SlotDots sum() { return KokkosMoE::Impl::SlotDots(); }
};
}  // namespace Kokkos

namespace KokkosMoE {
namespace Impl {

/// Combine backward, Weighted, one token row g and its n kept slots on this rank (receive rows rows(d), coefficients
/// cs(d)): grad_out(rows(d), :) = cs(d) * g and put(d, FP32 dot(g, out(rows(d), :))). The row is read once per
/// kDotSlots slots, their expert outputs in one round of loads per unit (the stores may alias them, so the compiler
/// would not hoist the loads); the dots of a pass are one team reduction (a fixed tree of the team). Both the source
/// and the expert side use it.
template <class Scalar, class Unit, class Member, class Rows, class Coefs, class O, class D, class Put>
KOKKOS_INLINE_FUNCTION void scale_and_dots(const Member& m, int units, const Unit* g, int n, const Rows& rows,
                                           const Coefs& cs, const O& out, const D& grad_out, const Put& put) {
  using Ops = UnitOps<Scalar, Unit>;
  for (int d0 = 0; d0 < n; d0 += kDotSlots) {
    const int nd = n - d0 < kDotSlots ? n - d0 : kDotSlots;
    SlotDots dots;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, units),
        [&](int u, SlotDots& part) {
          Unit raw[kDotSlots];
          const Unit gu = g[u];
          for (int d = 0; d < kDotSlots; ++d)
            if (d < nd) raw[d] = out(rows(d0 + d), u);
          float x[Ops::n];
          Ops::load(gu, x);
          for (int d = 0; d < kDotSlots; ++d) {
            if (d >= nd) break;
            float z[Ops::n], y[Ops::n];
            Ops::load(raw[d], z);
            const float c = cs(d0 + d);
            for (int i = 0; i < Ops::n; ++i) {
              part.v[d] += x[i] * z[i];
              y[i] = c * x[i];
            }
            Ops::store(y, grad_out(rows(d0 + d), u));
          }
        },
        dots);
    Kokkos::single(Kokkos::PerTeam(m), [&]() {
      for (int d = 0; d < nd; ++d) put(d0 + d, dots.v[d]);
    });
  }
}

/// The targets of token t's row, built in scratch: its kept local slots (receive row, coefficient) and one address
/// per remote rank it reaches. One parallel round of global loads (the K slots, the R rank positions of the token)
/// fills the scratch tables; the one thread that then compacts them reads shared memory only.
template <class Mem, class Member, class Ptrs, class Ints, class Floats>
KOKKOS_INLINE_FUNCTION void token_targets(const Member& m, const EpShape& s, const EpLayoutViews<Mem>& v, int t,
                                          const Unmanaged2<const float, Mem>& w, const PeerRows<Mem>& dst,
                                          const Ptrs& ptr, const Ptrs& raddr, const Ints& lrow, const Floats& lcoef,
                                          const Ints& slots, int* counts) {
  const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K, p0 = static_cast<std::int64_t>(t) * s.R;
  team_prefetch(m, s.K > s.R ? s.K : s.R, [&](int j) {
    if (j < s.K) {
      slots(j) = v.slot_row(q0 + j);
      slots(s.K + j) = v.slot_rank(q0 + j);
      lcoef(j) = w.extent(0) > 0 ? w(t, j) : 1.0f;
    }
    if (j < s.R) {
      const int p = v.tok_pos(p0 + j);
      raddr(j) = p < 0 || j == s.me ? 0 : reinterpret_cast<std::uintptr_t>(dst.template at<char>(j, p));
    }
  });
  Kokkos::single(Kokkos::PerTeam(m), [&]() {
    int nl = 0, nr = 0;
    for (int k = 0; k < s.K; ++k) {
      const int row = slots(k), r = slots(s.K + k);
      if (row < 0) continue;
      if (r == s.me) {
        lrow(nl) = row;
        lcoef(nl) = lcoef(k);  // nl <= k: compacts in place
        ++nl;
        continue;
      }
      bool first = true;  // the rank's first kept slot adds it: the row goes once
      for (int k2 = 0; k2 < k; ++k2) first = first && !(slots(s.K + k2) == r && slots(k2) >= 0);
      if (first) ptr(nr++) = raddr(r);
    }
    counts[0] = nl;
    counts[1] = nr;
  });
}

/// A pack kernel's team scratch for its token: the targets token_targets builds and the tables behind them.
template <class Exec>
struct PackScratch {
  using SPtr = Kokkos::View<std::uintptr_t*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  SPtr ptr, raddr;
  SInt lrow;
  SFlt lcoef;
  SInt slots;
  static std::size_t shmem(const EpShape& s) {
    return SPtr::shmem_size(s.K) + SPtr::shmem_size(s.R) + SInt::shmem_size(s.K + 2) + SFlt::shmem_size(s.K) +
           SInt::shmem_size(2 * s.K);
  }
  template <class Space>
  KOKKOS_INLINE_FUNCTION PackScratch(const Space& sp, const EpShape& s)
      : ptr(sp, s.K), raddr(sp, s.R), lrow(sp, s.K + 2), lcoef(sp, s.K), slots(sp, 2 * s.K) {}
  /// Token t's targets (token_targets), then a barrier: lrow(K) local rows, lrow(K + 1) remote ranks.
  template <class Mem, class Member>
  KOKKOS_INLINE_FUNCTION void targets(const Member& m, const EpShape& s, const EpLayoutViews<Mem>& v, int t,
                                      const Unmanaged2<const float, Mem>& w, const PeerRows<Mem>& dst) const {
    token_targets<Mem>(m, s, v, t, w, dst, ptr, raddr, lrow, lcoef, slots, &lrow(s.K));
    m.team_barrier();
  }
  /// The weights' side of the pack: the K floats w(t, k) (0 without weights) into the trailer of every remote row
  /// when trailer_off > 0, and each local slot's coefficient into local_f when it is given.
  template <class Mem, class Member>
  KOKKOS_INLINE_FUNCTION void weights(const Member& m, const EpShape& s, int t, const Unmanaged2<const float, Mem>& w,
                                      std::size_t trailer_off, const Unmanaged1<float, Mem>& local_f, int nl,
                                      int nr) const {
    if (trailer_off > 0) {
      const bool with_w = w.extent(0) > 0;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nr * s.K), [&](int j) {
        const int k = j % s.K;
        Kokkos::single(Kokkos::PerThread(m),
                       [&]() { reinterpret_cast<float*>(ptr(j / s.K) + trailer_off)[k] = with_w ? w(t, k) : 0.0f; });
      });
    }
    if (local_f.extent(0) > 0)
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nl), [&](int i) {
        Kokkos::single(Kokkos::PerThread(m), [&]() { local_f(lrow(i)) = lcoef(i); });
      });
  }
};

/// Forward direction, source side (dispatch, combine backward): token t's row is read once and written to the
/// receive row of each kept local slot (times its coefficient w(t,k) when \p scale_local) and once to every remote
/// rank it reaches, with a trailer of its K floats w(t,k) when \p trailer_off > 0. The local slots' floats go to
/// \p local_f when it is non-empty.
template <class Exec, class Scalar, class Unit>
void pack_tokens(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& src,
                 const Unmanaged2<const float, typename Exec::memory_space>& w, bool write_local, bool scale_local,
                 const EpLayoutViews<typename Exec::memory_space>& v,
                 const Unmanaged2<Unit, typename Exec::memory_space>& local,
                 const Unmanaged1<float, typename Exec::memory_space>& local_f,
                 const PeerRows<typename Exec::memory_space>& dst, std::size_t trailer_off, const char* label) {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  if (s.T == 0) return;
  const int units = static_cast<int>(src.extent(1));
  team_items(
      exec, s, label, s.T, PackScratch<Exec>::shmem(s),
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int t = static_cast<int>(item);
        const PackScratch<Exec> p(sp, s);
        p.template targets<Mem>(m, s, v, t, w, dst);
        const auto& ptr = p.ptr;
        const auto& lrow = p.lrow;
        const auto& lcoef = p.lcoef;
        const int nl = write_local ? lrow(s.K) : 0, nr = lrow(s.K + 1);
        team_unit_batches(m, units, [&](int b, int nb) {
          Unit val[kUnitBatch];
          for (int j = 0; j < kUnitBatch; ++j)
            if (b + j * nb < units) val[j] = src(t, b + j * nb);
          for (int i = 0; i < nl; ++i)
            for (int j = 0; j < kUnitBatch; ++j) {
              const int u = b + j * nb;
              if (u >= units) break;
              if (scale_local) {
                float f[Ops::n];
                Ops::load(val[j], f);
                for (int e = 0; e < Ops::n; ++e) f[e] *= lcoef(i);
                Ops::store(f, local(lrow(i), u));
              } else {
                local(lrow(i), u) = val[j];
              }
            }
          for (int i = 0; i < nr; ++i) {
            Unit* out = reinterpret_cast<Unit*>(ptr(i));
            for (int j = 0; j < kUnitBatch; ++j)
              if (b + j * nb < units) out[b + j * nb] = val[j];
          }
        });
        p.template weights<Mem>(m, s, t, w, trailer_off, local_f, nl, nr);
      });
}

/// Combine's Weighted weights of pair q = t * R + r: the K floats w(t, k) to rank r when token t reaches it (not
/// this rank).
template <class Mem>
KOKKOS_INLINE_FUNCTION void pack_weight_pair(const EpShape& s, const Unmanaged2<const float, Mem>& w,
                                             const Kokkos::View<int*, Mem>& tok_pos, const PeerRows<Mem>& dst,
                                             std::int64_t q) {
  const int t = static_cast<int>(q / s.R), r = static_cast<int>(q % s.R);
  const int p = tok_pos(q);
  if (r == s.me || p < 0) return;
  float* out = dst.template at<float>(r, p);
  for (int k = 0; k < s.K; ++k) out[k] = w(t, k);
}

/// Combine's Weighted weights, source side: the K floats w(t,k) of each token, once per remote rank it reaches.
template <class Exec>
void pack_weights(const Exec& exec, const EpShape s, const Unmanaged2<const float, typename Exec::memory_space>& w,
                  const EpLayoutViews<typename Exec::memory_space>& v,
                  const PeerRows<typename Exec::memory_space>& dst) {
  const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R;
  if (pairs == 0 || s.R == 1) return;
  auto tok_pos = v.tok_pos;
  range_items(
      exec, s, "KokkosMoE::ep_combine::weights", pairs,
      KOKKOS_LAMBDA(std::int64_t q) { pack_weight_pair(s, w, tok_pos, dst, q); });
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
