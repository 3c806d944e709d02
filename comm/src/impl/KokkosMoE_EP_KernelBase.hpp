/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_KERNELBASE_HPP
#define KOKKOSMOE_EP_KERNELBASE_HPP

// What every EP kernel shares (docs/ep.md §3): the step's shape, the layer's device metadata, the launch helpers
// under the SM cap (§13) and the address tables of token rows.

#include <KokkosMoE_Fp8Quantize.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_RowChunks.hpp>

#include <cstddef>
#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Tokens per layout team: 32 (one 32-bit word per expert and rank in the team's masks), fewer where a chunk's
/// topk slots would pass 2048 (a chunk's ids sit in team scratch). Chunks of 64-128 tokens left too few teams: on an
/// H100 the count kernel took 19.6 us over 4096 x 8 ids in 32 teams of 128-token chunks, and the capacity layout
/// 27 us against 20-22 us with 32-token chunks (docs/ep.md §3.1).
KOKKOS_INLINE_FUNCTION constexpr int layout_chunk(int topk) {
  return topk >= 2048 ? 1 : (2048 / topk < 32 ? 2048 / topk : 32);
}

/// Every EP launch passes its functor as a kernel argument (Kokkos' light-weight launch): the functors are small,
/// and a launch through constant memory (a host staging buffer, an event wait) or global memory (a per-instance
/// buffer that may be reallocated) is not safe to capture into a CUDA graph and replay (docs/ep.md §6). Host spaces
/// launch by calling, so they take the policy as it is: their team policies lose the execution space instance when a
/// property is added (the converting TeamPolicyInternal constructors of Serial, OpenMP and Threads do not copy it,
/// Kokkos 4.6), and the kernel would run on the default instance, behind every other rank's kernel there.
template <class Policy>
auto light(const Policy& p) {
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                                           typename Policy::execution_space::memory_space>::accessible) {
    return p;
  } else {
    return Kokkos::Experimental::require(p, Kokkos::Experimental::WorkItemProperty::HintLightWeight);
  }
}

template <class T, class Mem>
using Unmanaged1 = Kokkos::View<T*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
template <class T, class Mem>
using Unmanaged2 = Kokkos::View<T**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Device-side metadata of one layer (the EpHandle's memory). Extents are the group's maxima; "arrival index" a is
/// the position of a token row from a peer in this rank's arrival space ([0, R * B)).
template <class Mem>
struct EpLayoutViews {
  Kokkos::View<int*, Mem> local_pos;               // [B*K] rank of the slot among this chunk's slots of its expert
  Kokkos::View<int*, Mem> chunk_prefix;            // [nchunks*E] exclusive prefix over chunks, per expert
  Kokkos::View<int*, Mem> chunk_tokens;            // [nchunks*R] tokens of the chunk sending to rank r, then prefix
  Kokkos::View<int*, Mem> chunk_bad;               // [nchunks] invalid ids in the chunk
  Kokkos::View<int*, Mem> tok_local;               // [B*R] rank of token t among its chunk's tokens for rank r
  Kokkos::View<int*, Mem> gather_send;             // [E+1+R] slots per expert, invalid ids, tokens per rank
  Kokkos::View<int*, Mem> gathered;                // [R*(E+1+R)] every rank's gather_send
  Kokkos::View<std::uint8_t*, Mem> token_in_rank;  // [B*R]
  Kokkos::View<int*, Mem> tok_pos;                 // [B*R] position of token t among this rank's tokens for r, -1
  Kokkos::View<int*, Mem> counts;                  // [R*(E+1)] slots from rank i to expert e: counts(i*(E+1) + e)
  Kokkos::View<int*, Mem> dest_base;               // [E] receive row on rank e/L of this rank's first slot of expert e
  Kokkos::View<int*, Mem> dest_limit;              // [E] rows >= this are dropped (capacity)
  Kokkos::View<int*, Mem> expert_offsets;          // [L+1] receive rows of local expert l: [off(l), off(l) + count(l))
  Kokkos::View<int*, Mem> recv_count;              // [L] slots received per local expert (demand, before any drop)
  Kokkos::View<int*, Mem> send_base;               // [R] this rank's source-stage index of its first token for r
  Kokkos::View<int*, Mem> fwd_base;                // [R] index of its first token row for r at r's end of the wire
  Kokkos::View<int*, Mem> arrive_base;             // [R] arrival index of the first token row from rank i
  Kokkos::View<int*, Mem> arrive_count;            // [R] token rows from rank i (0 for this rank)
  Kokkos::View<int*, Mem> ret_base;                // [R] index of the first return row for rank i at i's end
  Kokkos::View<int*, Mem> slot_row;   // [B*K] receive row of the slot on its expert's rank; -1: none or dropped
  Kokkos::View<int*, Mem> slot_rank;  // [B*K] rank of the slot's expert, -1 for an empty or invalid slot
  Kokkos::View<std::uint8_t*, Mem> slot_kept;    // [B*K] 1 iff the slot has an expert and was not dropped
  Kokkos::View<int*, Mem> fwd_rows;              // [R*B*K] per arrival index, the K receive rows it feeds (-1 none)
  Kokkos::View<int*, Mem> arrive_rank;           // [R*B] source rank of each arrival index, -1 unused
  Kokkos::View<int*, Mem> recv_expert;           // [N] local expert of each receive row, -1 for padding and drops
  Kokkos::View<int*, Mem> recv_src;              // [N] arrival index feeding receive row q, -1: local or none
  Kokkos::View<int*, Mem> recv_k;                // [N] the slot k of that arrival
  Kokkos::View<int*, Mem> sent_rows;             // [R] token rows this rank writes for rank r (a kept slot there)
  Kokkos::View<int*, Mem> ret_rows;              // [R] return rows this rank writes for rank i
  Kokkos::View<std::int64_t*, Mem> traffic;      // [2 * kEpOps] logical and wire bytes per operation since the sync
  Kokkos::View<std::int64_t*, Mem> expert_load;  // [L] slots addressed to each local expert since creation or reset
  Kokkos::View<int*, Mem> status;                // [4] invalid ids, dropped slots, receive demand, count ticket
  Kokkos::View<int*, Mem> rank_status;  // [2R] every rank's receive demand and receive-side drops: (2j, 2j + 1)
};

/// The operations whose bytes are counted (CommStats::bytes), in the order of EpLayoutViews::traffic.
enum EpOp : int { kOpLayout = 0, kOpDispatch, kOpCombine, kOpCombineBackward, kOpDispatchBackward, kEpOps };
constexpr const char* kEpOpNames[kEpOps] = {"ep_layout", "ep_dispatch", "ep_combine", "ep_combine_backward",
                                            "ep_dispatch_backward"};

/// The shape facts every layout kernel needs, by value.
struct EpShape {
  int T = 0, K = 0, E = 0, L = 0, R = 0, me = 0;
  int B = 0;                   // max_tokens_per_rank: token rows per peer at most
  int align = 1;               // A
  bool fixed = false;          // ExpertMajorFixed: expert l owns rows [l*slab, (l+1)*slab)
  int slab = 0;                // fixed: R*B
  int capacity = 0;            // > 0: receive rows of the padded layout (capacity mode); 0: eager
  int chunk = 32;              // tokens per layout team (layout_chunk)
  bool capacity_mode = false;  // capacity or fixed: peer blocks of B token rows (index i * B + p)
  bool windows = false;        // direct writes into the peers' windows
  int max_teams = -1;          // > 0: the SM cap (EpGroupConfig::max_sms), teams per kernel at most; -1: none
  bool unique_ids = false;     // decode contract (docs/ep.md §15): an id repeated within a token counts as invalid
  int wave_teams = 0;          // > 0 (devices): teams one wave of a per-token kernel holds (kResidentTeamsPerSm / SM)
  KOKKOS_INLINE_FUNCTION bool eager() const { return !capacity_mode; }
};

/// Set bits of a 32-bit word.
KOKKOS_INLINE_FUNCTION int popcount32(std::uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

KOKKOS_INLINE_FUNCTION int pad_to(int n, int a) { return a <= 1 ? n : (n + a - 1) / a * a; }

/// The last i in [0, n) with start(i) <= q, for starts that ascend with i and start(0) <= q (a binary search).
template <class Start>
KOKKOS_INLINE_FUNCTION int last_start_at_or_below(int n, std::int64_t q, const Start& start) {
  int lo = 0, hi = n;  // start(lo) <= q < start(hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (start(mid) <= q) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class Exec>
using TeamScratch = typename Exec::scratch_memory_space;

/// The items league_rank, + league_size, ... of [0, n) in turn, one call f(i) each, a barrier between two (they
/// reuse the team's scratch).
template <class Member, class F>
KOKKOS_INLINE_FUNCTION void team_stride(const Member& m, std::int64_t n, const F& f) {
  for (std::int64_t i = m.league_rank(); i < n; i += m.league_size()) {
    if (i != m.league_rank()) m.team_barrier();
    f(i);
  }
}

/// The policy of team_items: \p team threads a team on a device where the kernel fits them (the most it fits
/// otherwise), Kokkos' choice (AUTO) for team = 0 and on host spaces.
template <class Exec, class Body>
Kokkos::TeamPolicy<Exec> items_policy(const Exec& exec, std::int64_t league, std::size_t shmem, int team, int vector,
                                      const Body& body) {
  Kokkos::TeamPolicy<Exec> auto_policy(exec, static_cast<int>(league), Kokkos::AUTO, vector);
  auto_policy.set_scratch_size(0, Kokkos::PerTeam(shmem));
  if constexpr (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
    return auto_policy;
  } else {
    if (team <= 0) return auto_policy;
    const int most = auto_policy.team_size_max(body, Kokkos::ParallelForTag());
    Kokkos::TeamPolicy<Exec> policy(exec, static_cast<int>(league), team < most ? team : most, vector);
    policy.set_scratch_size(0, Kokkos::PerTeam(shmem));
    return policy;
  }
}

/// An EP kernel over n work items: one team per item, or under the SM cap (EpShape::max_teams) at most that many
/// teams, each taking the items league_rank, + max_teams, ... in turn (a barrier between two: they reuse the team's
/// scratch). A Cuda block runs on one SM, so a capped kernel occupies at most max_teams SMs (docs/ep.md §13).
/// f(m, item, scratch): \p scratch is the team's shmem bytes of scratch, afresh for every item (Kokkos's
/// team_scratch only ever advances, and a team of a capped kernel takes several items). \p team: threads a team
/// on a device (items_policy).
template <class Exec, class F>
void team_items(const Exec& exec, const EpShape& s, const char* label, std::int64_t n, std::size_t shmem, const F& f,
                int vector = 1, int team = 0) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = typename Exec::scratch_memory_space;
  if (n <= 0) return;
  if (s.max_teams <= 0 || n <= s.max_teams) {
    // One team per item: the kernel as written without a cap (a loop around the item costs the reduces registers).
    const auto body = KOKKOS_LAMBDA(const Team& m) { f(m, m.league_rank(), m.team_scratch(0)); };
    Kokkos::parallel_for(label, light(items_policy(exec, n, shmem, team, vector, body)), body);
    return;
  }
  const std::int64_t league = s.max_teams;
  const auto body = KOKKOS_LAMBDA(const Team& m) {
    void* buf = shmem > 0 ? m.team_scratch(0).get_shmem(shmem) : nullptr;
    team_stride(m, n, [&](std::int64_t i) { f(m, i, Scratch(buf, shmem)); });
  };
  Kokkos::parallel_for(label, light(items_policy(exec, league, shmem, team, vector, body)), body);
}

/// A kernel whose teams wait for each other on a device runs teams of kResidentTeamSize threads compiled for
/// kResidentTeamsPerSm of them on one SM (at most 128 registers a thread), so that many teams of it fit every SM.
constexpr int kResidentTeamSize = 128;
constexpr int kResidentTeamsPerSm = 4;
/// Units a thread of such a kernel loads before it stores them: its few teams take whole rows in turn, and a
/// 7168-wide bf16 row is then one round of loads (team_fan_out).
constexpr int kResidentBatch = 8;

/// A kernel whose teams wait for each other and for the peers' kernels (docs/ep.md §15): f(member, buf) on \p league
/// teams that are all resident at once, buf the team's \p shmem bytes of scratch. A device keeps kResidentTeamsPerSm
/// teams on each SM, so a league of at most that many per SM (shared among the ranks on the device) is resident; a
/// host space runs teams in turn, so there the league is one team of the instance's threads.
template <class Exec, class F>
void resident_teams(const Exec& exec, int league, std::size_t shmem, const char* label, const F& f) {
  using Policy = Kokkos::TeamPolicy<Exec, Kokkos::LaunchBounds<kResidentTeamSize, kResidentTeamsPerSm>>;
  using Team = typename Policy::member_type;
  const auto body = KOKKOS_LAMBDA(const Team& m) { f(m, shmem > 0 ? m.team_scratch(0).get_shmem(shmem) : nullptr); };
  // A device kernel is compiled for kResidentTeamSize threads (the launch bounds); a host team is the instance's
  // threads, at most that many.
  int size = kResidentTeamSize;
  if (Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible) {
    league = 1;
    const int most = Policy(exec, 1, 1).team_size_max(body, Kokkos::ParallelForTag());
    size = most < size ? (most > 0 ? most : 1) : size;
  }
  Policy policy(exec, league, size);
  Kokkos::parallel_for(label, light(policy.set_scratch_size(0, Kokkos::PerTeam(shmem))), body);
}

/// Flat work items per team of a capped flat kernel.
constexpr int kRangeItemsPerTeam = 256;

/// A flat EP kernel over [0, n): a RangePolicy, or under the SM cap at most max_teams teams over chunks of
/// kRangeItemsPerTeam items.
template <class Exec, class F>
void range_items(const Exec& exec, const EpShape& s, const char* label, std::int64_t n, const F& f) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (n <= 0) return;
  if (s.max_teams <= 0) {
    Kokkos::parallel_for(label, light(Kokkos::RangePolicy<Exec>(exec, 0, n)), f);
    return;
  }
  team_items(
      exec, s, label, (n + kRangeItemsPerTeam - 1) / kRangeItemsPerTeam, 0,
      KOKKOS_LAMBDA(const Team& m, std::int64_t c, const TeamScratch<Exec>&) {
        const std::int64_t i0 = c * kRangeItemsPerTeam;
        const int len = static_cast<int>(n - i0 < kRangeItemsPerTeam ? n - i0 : kRangeItemsPerTeam);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, len), [&](int j) { f(i0 + j); });
      });
}

/// A peer address table: rows for rank r go to peer(r) + (base(r) + p) * pitch bytes (the sender's source stage for
/// the message transports, the peer's window for direct writes).
template <class Mem>
struct PeerRows {
  Kokkos::View<const std::uintptr_t*, Mem> peer;
  Kokkos::View<const int*, Mem> base;
  std::size_t pitch = 0;
  template <class T>
  KOKKOS_INLINE_FUNCTION T* at(int r, int p) const {
    return reinterpret_cast<T*>(peer(r) + (static_cast<std::size_t>(base(r)) + static_cast<std::size_t>(p)) * pitch);
  }
};

/// Rows in this rank's memory, `pitch` bytes apart (arrivals, returned rows).
struct LocalRows {
  const char* base = nullptr;
  std::size_t pitch = 0;
  template <class T>
  KOKKOS_INLINE_FUNCTION const T* at(std::int64_t i) const {
    return reinterpret_cast<const T*>(base + static_cast<std::size_t>(i) * pitch);
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
