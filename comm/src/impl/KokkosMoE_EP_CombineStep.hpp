/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_COMBINESTEP_HPP
#define KOKKOSMOE_EP_COMBINESTEP_HPP

// The combine over the peer windows in one kernel (docs/ep.md §15): the Weighted weights to the experts' ranks, the
// expert side's reduction of every arrival back to its source, and the source side's sum over the ranks, with the
// window signals between them raised and awaited by the kernel's own teams. The same team functions as the
// combine's separate kernels (pack_weight_pair, ReduceArrivals, ReduceRanks), so the same bits.

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_EP_ArrivalKernels.hpp>
#include <impl/KokkosMoE_EP_KernelBase.hpp>
#include <impl/KokkosMoE_EP_LayoutKernels.hpp>
#include <impl/KokkosMoE_EP_PackKernels.hpp>
#include <impl/KokkosMoE_EP_Signal.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// What one combine over the windows reads and writes, its three phases as team functions over work items.
template <class Exec, class Scalar, class Unit>
struct CombineStep {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  EpShape s;
  bool weighted = false;
  Unmanaged2<const float, Mem> w;  // Weighted: the weights each expert's rank applies
  Kokkos::View<int*, Mem> tok_pos;
  PeerRows<Mem> wdst;  // the peers' forward float rows
  ReduceArrivals<Exec, Scalar, Unit> arrivals;
  ReduceRanks<Exec, Scalar, Unit> ranks;
  // The traffic counters' view of the step: the weights' and the returned rows' bytes.
  Kokkos::View<int*, Mem> sent_rows, ret_rows;
  Kokkos::View<std::int64_t*, Mem> traffic;
  std::int64_t fpitch = 0, pitch = 0, row_bytes = 0;

  std::int64_t weight_items() const {
    return weighted ? (static_cast<std::int64_t>(s.T) * s.R + kRangeItemsPerTeam - 1) / kRangeItemsPerTeam : 0;
  }
  std::size_t shmem() const { return arrivals.shmem() > ranks.shmem() ? arrivals.shmem() : ranks.shmem(); }

  /// kRangeItemsPerTeam (token, rank) pairs of the weights.
  KOKKOS_INLINE_FUNCTION void weights(const Team& m, std::int64_t item) const {
    const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R, q0 = item * kRangeItemsPerTeam;
    const int len = static_cast<int>(pairs - q0 < kRangeItemsPerTeam ? pairs - q0 : kRangeItemsPerTeam);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, len),
                         [&](int j) { pack_weight_pair(s, w, tok_pos, wdst, q0 + j); });
  }
  /// The bytes of the step, as the separate kernels count them (the last team, once).
  KOKKOS_INLINE_FUNCTION void account() const {
    const std::int64_t signals = 16 * static_cast<std::int64_t>(s.R - 1);
    if (weighted) add_traffic(s, sent_rows, traffic, kOpCombine, fpitch, 0, 0, signals);
    add_traffic(s, ret_rows, traffic, kOpCombine, pitch, row_bytes, 0, signals);
  }
};

/// The combine over the windows in one kernel of \p league resident teams (EpGroupState::resident_league). Weighted:
/// every team waits until every peer freed the previous epoch's weights, sends its pairs' weights, and the last team
/// past the first ticket raises the weights' arrive counters. Every team waits for every peer's weights (Weighted)
/// and for every peer to have freed the previous epoch's returns, reduces its arrivals into the sources' return
/// rows; the last team past the second ticket raises the returns' arrive counters and frees the weights. Every team
/// waits for every peer's returns and sums its tokens; the last team past the third ticket frees the returns,
/// advances the epochs and counts the bytes. A wait past the deadline sets the group's error word: every later wait
/// returns at once, the teams skip their items and still pass every ticket, so the kernel ends.
template <class Exec, class Scalar, class Unit>
void combine_step(const Exec& exec, const CombineStep<Exec, Scalar, Unit>& f,
                  const WindowSignals<typename Exec::memory_space>& sig, int league, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  constexpr RegionMask kWeights = 1u << kRegionFwdF, kReturns = 1u << kRegionRet;
  const std::size_t shmem = f.shmem();
  const std::int64_t nw = f.weight_items(), na = f.arrivals.items(), nr = f.ranks.items();
  resident_teams(
      exec, league, shmem, label, KOKKOS_LAMBDA(const Team& m, void* buf) {
        const TeamMeet<Team, typename Exec::memory_space> meet{m, sig};
        if (f.weighted) {
          if (meet.wait(kWeights, 1, 0)) team_stride(m, nw, [&](std::int64_t i) { f.weights(m, i); });
          meet.ticket(0, [&]() { meet.raise(kWeights, 0); });
        }
        if ((!f.weighted || meet.wait(kWeights, 0, 1)) && meet.wait(kReturns, 1, 0))
          team_stride(m, na, [&](std::int64_t i) { f.arrivals(m, i, na, TeamScratch<Exec>(buf, shmem)); });
        meet.ticket(1, [&]() {
          meet.raise(kReturns, 0);
          if (f.weighted) meet.raise(kWeights, 1);
        });
        if (meet.wait(kReturns, 0, 1))
          team_stride(m, nr, [&](std::int64_t i) { f.ranks(m, i, TeamScratch<Exec>(buf, shmem)); });
        meet.ticket(2, [&]() {
          meet.raise(kReturns, 1);
          meet.advance(f.weighted ? kReturns | kWeights : kReturns);
          f.account();
        });
      });
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
