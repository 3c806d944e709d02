/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_SIGNAL_HPP
#define KOKKOSMOE_EP_SIGNAL_HPP

// Signalling through peer windows (docs/ep.md §7.2): per region of the window and per peer, an "arrive" counter
// (the peer's rows for this rank are complete) and a "freed" counter (the peer consumed this rank's rows), both
// written by the peer into this rank's control block. Each operation that writes a region waits until every peer
// freed the previous epoch, writes, then posts: it raises its arrive counter in every peer and waits for every
// peer's; after consuming, it raises its freed counter in every peer. The epochs live in device memory and advance
// on the device, so a captured graph replays correctly. Every wait is bounded: a peer that never signals sets the
// group's error word (region, peer, epoch) and every later wait returns at once; the host turns it into CommError.

#include <Kokkos_Core.hpp>

#include <chrono>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

enum WindowRegion : int {
  kRegionMeta = 0,
  kRegionFwd = 1,
  kRegionFwdF = 2,
  kRegionRet = 3,
  kRegionRetF = 4,
  kRegionCounts = 5
};
constexpr int kWindowRegions = 6;
constexpr const char* kWindowRegionNames[kWindowRegions] = {"meta",        "forward rows",  "forward floats",
                                                            "return rows", "return floats", "counts"};

/// Nanoseconds of a monotonic clock, on the host and on the device.
KOKKOS_INLINE_FUNCTION std::uint64_t ep_now_ns() {
#if defined(__CUDA_ARCH__)
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
#endif
}

/// Orders this thread's earlier writes before its later ones for every observer: peers on other devices too.
KOKKOS_INLINE_FUNCTION void ep_fence_peers() {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
#else
  Kokkos::memory_fence();
#endif
}

constexpr int kErrWords = 6;

template <class Mem>
struct WindowSignals {
  Kokkos::View<const std::uintptr_t*, Mem> ctrl;  // [R] every rank's control block
  Kokkos::View<std::uint64_t*, Mem> epoch;        // [kWindowRegions] this rank's completed epochs
  Kokkos::View<std::int64_t*, Mem> err;           // [kErrWords] failed, region, peer, epoch, kind, value seen
  Kokkos::View<std::int64_t*, Mem> wait_ns;  // [R] nanoseconds spent waiting for each peer, since creation or reset
  Kokkos::View<int*, Mem> tickets;           // [3] teams of a one-kernel step past each of its meeting points
  int R = 0, me = 0;
  std::uint64_t timeout_ns = 0;

  /// Counter `kind` (0 arrive, 1 freed) that `peer` writes into `rank`'s control block for `region`.
  KOKKOS_INLINE_FUNCTION volatile std::uint64_t* flag(int rank, int region, int kind, int peer) const {
    return reinterpret_cast<volatile std::uint64_t*>(ctrl(rank)) + ((region * 2 + kind) * R + peer);
  }
  /// Spins until every peer's counter `kind` in this rank's block reaches n (this rank's own too with \p self: one
  /// kernel's teams tell each other through it); false (error word set) past the deadline. \p record: add the time to
  /// wait_ns (one waiter per rank, or the counts race).
  KOKKOS_INLINE_FUNCTION bool wait_all(int region, int kind, std::uint64_t n, bool self = false,
                                       bool record = true) const {
    const std::uint64_t start = ep_now_ns();
    for (int p = 0; p < R; ++p) {
      if (p == me && !self) continue;
      const std::uint64_t since = ep_now_ns();
      std::uint64_t seen = 0;
      while ((seen = *flag(me, region, kind, p)) < n) {
        if (err(0) != 0) return false;
        if (ep_now_ns() - start > timeout_ns) {
          err(1) = region;
          err(2) = p;
          err(3) = static_cast<std::int64_t>(n);
          err(4) = kind;
          err(5) = static_cast<std::int64_t>(seen);
          ep_fence_peers();
          err(0) = 1;
          return false;
        }
      }
      if (record && p != me) wait_ns(p) += static_cast<std::int64_t>(ep_now_ns() - since);
    }
    ep_fence_peers();
    return true;
  }
  KOKKOS_INLINE_FUNCTION void raise_all(int region, int kind, std::uint64_t n, bool self = false) const {
    ep_fence_peers();
    for (int p = 0; p < R; ++p)
      if (p != me || self) *flag(p, region, kind, me) = n;
    ep_fence_peers();
  }
};

/// A set of regions, one bit each (1u << region): the decode path signals its three regions in one kernel.
using RegionMask = unsigned;

/// f(region) for each region of \p mask in ascending order while f returns true; whether every call did.
template <class F>
KOKKOS_INLINE_FUNCTION bool each_region(RegionMask mask, const F& f) {
  for (int r = 0; r < kWindowRegions; ++r)
    if (((mask >> r) & 1u) && !f(r)) return false;
  return true;
}

/// One team's meeting points in a one-kernel step (docs/ep.md §15): waits on the window's counters (its first team
/// records the wait times) and tickets (every team passes ticket j once per step, its items done, and the last one
/// runs the step's signals).
template <class Member, class Mem>
struct TeamMeet {
  const Member& m;
  const WindowSignals<Mem>& sig;
  /// Whether every peer's counter `kind` of every region of \p mask reached its epoch + \p ahead (this rank's own too
  /// with \p self); false at once after a failure, or past the deadline (the error word set).
  KOKKOS_INLINE_FUNCTION bool wait(RegionMask mask, int kind, int ahead, bool self = false) const {
    bool ok = false;
    Kokkos::single(
        Kokkos::PerTeam(m),
        [&](bool& r) {
          r = sig.err(0) == 0 && each_region(mask, [&](int g) {
                return sig.wait_all(g, kind, sig.epoch(g) + ahead, self, m.league_rank() == 0);
              });
        },
        ok);
    return ok;
  }
  /// After the team's items: the last team past ticket j runs last() (unless a wait failed).
  template <class F>
  KOKKOS_INLINE_FUNCTION void ticket(int j, const F& last) const {
    m.team_barrier();
    Kokkos::single(Kokkos::PerTeam(m), [&]() {
      ep_fence_peers();
      if (Kokkos::atomic_fetch_add(&sig.tickets(j), 1) != m.league_size() - 1) return;
      sig.tickets(j) = 0;
      if (sig.err(0) == 0) last();
    });
  }
  /// Raises this rank's counter `kind` of every region of \p mask to its epoch + 1 in every peer (and its own).
  KOKKOS_INLINE_FUNCTION void raise(RegionMask mask, int kind, bool self = false) const {
    each_region(mask, [&](int g) {
      sig.raise_all(g, kind, sig.epoch(g) + 1, self);
      return true;
    });
  }
  /// Advances the epochs of every region of \p mask (the last ticket of a step: no team reads them any more).
  KOKKOS_INLINE_FUNCTION void advance(RegionMask mask) const {
    each_region(mask, [&](int g) {
      sig.epoch(g) += 1;
      return true;
    });
  }
};

/// Before writing regions: every peer freed the previous epoch's rows of each.
template <class Exec>
void window_acquire_regions(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, RegionMask mask) {
  if (w.R <= 1) return;  // no peer to wait for or to signal: stream order suffices
  Kokkos::parallel_for(
      "KokkosMoE::ep::window_acquire", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        if (w.err(0) != 0) return;
        each_region(mask, [&](int r) { return w.wait_all(r, 1, w.epoch(r)); });
      });
}

/// After writing regions: raise this rank's arrive counters in every peer, then wait for every peer's.
template <class Exec>
void window_post_regions(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, RegionMask mask) {
  if (w.R <= 1) return;  // no peer to wait for or to signal: stream order suffices
  Kokkos::parallel_for(
      "KokkosMoE::ep::window_post", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        if (w.err(0) != 0) return;
        each_region(mask, [&](int r) {
          w.raise_all(r, 0, w.epoch(r) + 1);
          return true;
        });
        if (!each_region(mask, [&](int r) { return w.wait_all(r, 0, w.epoch(r) + 1); })) return;
        each_region(mask, [&](int r) {
          w.epoch(r) += 1;
          return true;
        });
      });
}

/// After consuming regions: tell every peer its rows there may be overwritten.
template <class Exec>
void window_release_regions(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, RegionMask mask) {
  if (w.R <= 1) return;  // no peer to wait for or to signal: stream order suffices
  Kokkos::parallel_for(
      "KokkosMoE::ep::window_release", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        if (w.err(0) != 0) return;
        each_region(mask, [&](int r) {
          w.raise_all(r, 1, w.epoch(r));
          return true;
        });
      });
}

template <class Exec>
void window_acquire(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, int region) {
  window_acquire_regions(exec, w, 1u << region);
}

template <class Exec>
void window_post(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, int region) {
  window_post_regions(exec, w, 1u << region);
}

/// The send half of window_post (split operations, docs/ep.md §14): raise this rank's arrive counter in every peer.
template <class Exec>
void window_raise(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, int region) {
  if (w.R <= 1) return;
  Kokkos::parallel_for(
      "KokkosMoE::ep::window_raise", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        if (w.err(0) != 0) return;
        w.raise_all(region, 0, w.epoch(region) + 1);
      });
}

/// The receive half of window_post: wait for every peer's arrive counter of the next epoch.
template <class Exec>
void window_wait(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, int region) {
  if (w.R <= 1) return;
  Kokkos::parallel_for(
      "KokkosMoE::ep::window_wait", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        if (w.err(0) != 0) return;
        const std::uint64_t n = w.epoch(region) + 1;
        if (w.wait_all(region, 0, n)) w.epoch(region) = n;
      });
}

template <class Exec>
void window_release(const Exec& exec, const WindowSignals<typename Exec::memory_space>& w, int region) {
  window_release_regions(exec, w, 1u << region);
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
