/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_KERNELS_HPP
#define KOKKOSMOE_EP_KERNELS_HPP

// The portable kernels of the EP layer (docs/ep.md §3): layout, pack, expand, reduce, as Kokkos parallel patterns
// that run on every backend. Slots are the (token, k) pairs with a valid expert id. A slot whose expert is on this
// rank is written by the pack kernel straight into the receive rows. Every other token travels once per destination
// rank ("token rows": the row with a trailer of its K slot floats) to its position in the peer's arrival space, from
// where the peer expands it into the expert-major receive rows; the way back reduces a token's slots on the expert's
// rank first and returns one row per (token, rank). Where a token row goes is a peer address table plus an index
// base per peer: the sender's own source stage for the message transports, the peer's window for direct writes. No
// atomics decide a position, so the layout is deterministic.

#include <KokkosMoE_Fp8Quantize.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_RowChunks.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Tokens per layout team: at most 32, and at most 2048 slots, so that a chunk's ids fit in team scratch.
KOKKOS_INLINE_FUNCTION constexpr int layout_chunk(int top_k) {
  return top_k >= 2048 ? 1 : (2048 / top_k < 32 ? 2048 / top_k : 32);
}

/// Every EP launch passes its functor as a kernel argument (Kokkos' light-weight launch): the functors are small,
/// and a launch through constant memory (a host staging buffer, an event wait) or global memory (a per-instance
/// buffer that may be reallocated) is not safe to capture into a CUDA graph and replay (docs/ep.md §6).
template <class Policy>
auto light(const Policy& p) {
  return Kokkos::Experimental::require(p, Kokkos::Experimental::WorkItemProperty::HintLightWeight);
}  ///< tokens per layout team: the in-chunk rank is a serial loop of chunk*K steps

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
  Kokkos::View<int*, Mem> status;                // [4] invalid ids, dropped slots, receive demand (rows), unused
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
  int chunk = 32;              // tokens per layout team (layout_chunk(K))
  bool capacity_mode = false;  // capacity or fixed: peer blocks of B token rows (index i * B + p)
  bool windows = false;        // direct writes into the peers' windows
  int max_teams = -1;          // > 0: the SM cap (EpGroupConfig::max_sms), teams per kernel at most; -1: none
  bool unique_ids = false;     // decode contract (docs/ep.md §15): an id repeated within a token counts as invalid
  KOKKOS_INLINE_FUNCTION bool eager() const { return !capacity_mode; }
};

KOKKOS_INLINE_FUNCTION int pad_to(int n, int a) { return a <= 1 ? n : (n + a - 1) / a * a; }

template <class Exec>
using TeamScratch = typename Exec::scratch_memory_space;

/// An EP kernel over n work items: one team per item, or under the SM cap (EpShape::max_teams) at most that many
/// teams, each taking the items league_rank, + max_teams, ... in turn (a barrier between two: they reuse the team's
/// scratch). A Cuda block runs on one SM, so a capped kernel occupies at most max_teams SMs (docs/ep.md §13).
/// f(m, item, scratch): \p scratch is the team's shmem bytes of scratch, afresh for every item (Kokkos's
/// team_scratch only ever advances, and a team of a capped kernel takes several items).
template <class Exec, class F>
void team_items(const Exec& exec, const EpShape& s, const char* label, std::int64_t n, std::size_t shmem, const F& f,
                int vector = 1) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = typename Exec::scratch_memory_space;
  if (n <= 0) return;
  if (s.max_teams <= 0 || n <= s.max_teams) {
    // One team per item: the kernel as written without a cap (a loop around the item costs the reduces registers).
    Kokkos::TeamPolicy<Exec> policy(exec, static_cast<int>(n), Kokkos::AUTO, vector);
    Kokkos::parallel_for(
        label, light(policy.set_scratch_size(0, Kokkos::PerTeam(shmem))),
        KOKKOS_LAMBDA(const Team& m) { f(m, m.league_rank(), m.team_scratch(0)); });
    return;
  }
  const std::int64_t league = s.max_teams;
  const auto body = KOKKOS_LAMBDA(const Team& m) {
    void* buf = shmem > 0 ? m.team_scratch(0).get_shmem(shmem) : nullptr;
    for (std::int64_t i = m.league_rank(); i < n; i += league) {
      if (i != m.league_rank()) m.team_barrier();
      f(m, i, Scratch(buf, shmem));
    }
  };
  Kokkos::TeamPolicy<Exec> policy(exec, static_cast<int>(league), Kokkos::AUTO, vector);
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

/// K1 + K2 of the layout: per-chunk ranks and histograms, then the prefix over chunks (docs/ep.md §3.1).
template <class Exec, class IdxView>
void layout_count(const Exec& exec, const EpShape s, const IdxView& idx,
                  const EpLayoutViews<typename Exec::memory_space>& v) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int nch = (s.T + s.chunk - 1) / s.chunk;
  auto local_pos = v.local_pos;
  auto chunk_prefix = v.chunk_prefix;
  auto chunk_tokens = v.chunk_tokens;
  auto chunk_bad = v.chunk_bad;
  auto token_in_rank = v.token_in_rank;
  auto tok_local = v.tok_local;
  if (nch > 0) {
    // The chunk's ids are staged in scratch; each slot's rank among the chunk's slots of its expert is a count of
    // earlier equal ids there (no serial walk through global memory), and the histogram takes scratch atomics.
    const int n_max = s.chunk * s.K;
    const std::size_t shmem = Scratch::shmem_size(s.E) + Scratch::shmem_size(s.R) + Scratch::shmem_size(n_max);
    team_items(
        exec, s, "KokkosMoE::ep_layout::count", nch, shmem,
        KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
          const int c = static_cast<int>(item);
          Scratch cnt(sp, s.E);
          Scratch tok(sp, s.R);
          Scratch ids(sp, n_max);
          const int t0 = c * s.chunk;
          const int t1 = t0 + s.chunk < s.T ? t0 + s.chunk : s.T;
          const int n = (t1 - t0) * s.K;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E), [&](int e) { cnt(e) = 0; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R), [&](int r) { tok(r) = 0; });
          int bad = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, n),
              [&](int j, int& acc) {
                const long long e = static_cast<long long>(idx(t0 + j / s.K, j % s.K));
                bool ok = e >= 0 && e < s.E;
                if (ok && s.unique_ids)
                  for (int k2 = 0; k2 < j % s.K; ++k2) ok = ok && static_cast<long long>(idx(t0 + j / s.K, k2)) != e;
                if (!ok && e != -1) ++acc;
                ids(j) = ok ? static_cast<int>(e) : -1;
              },
              bad);
          m.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n), [&](int j) {
            const int e = ids(j);
            int pos = -1;
            if (e >= 0) {
              pos = 0;
              for (int i = 0; i < j; ++i) pos += ids(i) == e ? 1 : 0;
              Kokkos::atomic_add(&cnt(e), 1);
            }
            local_pos(static_cast<std::int64_t>(t0) * s.K + j) = pos;
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, t1 - t0), [&](int jt) {
            for (int r = 0; r < s.R; ++r) {
              bool any = false;
              for (int k = 0; k < s.K; ++k) {
                const int e = ids(jt * s.K + k);
                any = any || (e >= 0 && e / s.L == r);
              }
              token_in_rank(static_cast<std::int64_t>(t0 + jt) * s.R + r) = any ? 1 : 0;
              if (any) Kokkos::atomic_add(&tok(r), 1);
            }
          });
          m.team_barrier();
          // A token's rank among the chunk's tokens for rank r: a count of earlier tokens of the chunk (no atomics).
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, (t1 - t0) * s.R), [&](int j) {
            const int jt = j / s.R, r = j % s.R;
            const std::int64_t at = static_cast<std::int64_t>(t0 + jt) * s.R + r;
            int pos = -1;
            if (token_in_rank(at)) {
              pos = 0;
              for (int i = 0; i < jt; ++i) pos += token_in_rank(static_cast<std::int64_t>(t0 + i) * s.R + r);
            }
            tok_local(at) = pos;
          });
          Kokkos::single(Kokkos::PerTeam(m), [&]() { chunk_bad(c) = bad; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E),
                               [&](int e) { chunk_prefix(static_cast<std::int64_t>(c) * s.E + e) = cnt(e); });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R),
                               [&](int r) { chunk_tokens(static_cast<std::int64_t>(c) * s.R + r) = tok(r); });
        });
  }
  // K2: exclusive prefix over chunks per expert (teams e < E) and per destination rank (teams E..E+R), invalid ids
  // (the last team). A team scan, so that no thread walks the chunks serially through global memory. The totals form
  // the vector every rank all-gathers: slots per expert, invalid ids, tokens per rank.
  auto send = v.gather_send;
  auto status = v.status;
  team_items(
      exec, s, "KokkosMoE::ep_layout::prefix", s.E + s.R + 1, 0,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int i = static_cast<int>(item);
        if (i < s.E + s.R) {
          const bool expert = i < s.E;
          const int stride = expert ? s.E : s.R, col = expert ? i : i - s.E;
          auto& prefix = expert ? chunk_prefix : chunk_tokens;
          const int out = expert ? i : s.E + 1 + col;
          if (nch == 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() { send(out) = 0; });
            return;
          }
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, nch), [&](int c, int& part, bool final) {
            const std::int64_t at = static_cast<std::int64_t>(c) * stride + col;
            const int n = prefix(at);
            if (final) {
              prefix(at) = part;
              if (c == nch - 1) send(out) = part + n;
            }
            part += n;
          });
        } else {
          int bad = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, nch), [&](int c, int& acc) { acc += chunk_bad(c); }, bad);
          Kokkos::single(Kokkos::PerTeam(m), [&]() {
            status(0) = bad;
            status(1) = 0;
            status(3) = 0;
            send(s.E) = bad;  // travels with the counts: every rank learns of every rank's invalid ids
          });
        }
      });
}

/// Direct writes: this rank's gather vector into slot `me` of every rank's counts area (its own included).
template <class Exec>
void gather_pack(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v,
                 const Kokkos::View<std::uintptr_t*, typename Exec::memory_space>& peers) {
  const int W = s.E + 1 + s.R;
  auto send = v.gather_send;
  range_items(
      exec, s, "KokkosMoE::ep_layout::gather", static_cast<std::int64_t>(s.R) * W, KOKKOS_LAMBDA(std::int64_t i) {
        const int r = static_cast<int>(i / W), j = static_cast<int>(i % W);
        reinterpret_cast<int*>(peers(r))[static_cast<std::int64_t>(s.me) * W + j] = send(j);
      });
}

/// The layout's demand per local expert (recv_count, dropped slots included) joins the handle's cumulative load; on
/// the device only, so a captured layout keeps counting at every replay.
template <class Exec>
void accumulate_load(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v) {
  auto load = v.expert_load;
  auto recv_count = v.recv_count;
  range_items(
      exec, s, "KokkosMoE::ep_layout::load", s.L, KOKKOS_LAMBDA(std::int64_t l) { load(l) += recv_count(l); });
}

/// K3: offsets from the all-gathered vectors (every rank derives every peer's offsets: no second count exchange).
/// One team per destination rank j; the prefixes over its local experts are team scans in scratch memory.
template <class Exec>
void layout_offsets(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  auto gathered = v.gathered;
  auto counts = v.counts;
  auto dest_base = v.dest_base;
  auto dest_limit = v.dest_limit;
  auto expert_offsets = v.expert_offsets;
  auto recv_count = v.recv_count;
  auto send_base = v.send_base;
  auto fwd_base = v.fwd_base;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto ret_base = v.ret_base;
  auto sent_rows = v.sent_rows;
  auto ret_rows = v.ret_rows;
  auto status = v.status;
  auto rank_status = v.rank_status;
  const std::size_t shmem = 4 * Scratch::shmem_size(s.L);
  team_items(
      exec, s, "KokkosMoE::ep_layout::offsets", s.R, shmem,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int j = static_cast<int>(item), L = s.L, E = s.E, W = s.E + 1 + s.R;
        constexpr int kNone = 2147483647;
        auto count = [&](int i, int ee) { return gathered(static_cast<std::int64_t>(i) * W + ee); };
        auto tok = [&](int i, int r) { return gathered(static_cast<std::int64_t>(i) * W + E + 1 + r); };
        // Index of source i's first token row for rank r in i's source stage (S) and in r's arrival space (A).
        auto S = [&](int i, int r) {
          if (!s.eager()) return r * s.B;
          int n = 0;
          for (int q = 0; q < r; ++q) n += q == i ? 0 : tok(i, q);
          return n;
        };
        auto A = [&](int r, int i) {
          if (!s.eager()) return i * s.B;
          int n = 0;
          for (int q = 0; q < i; ++q) n += q == r ? 0 : tok(q, r);
          return n;
        };
        Scratch tot(sp, L), off(sp, L), run(sp, L), unused(sp, L);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E + 1),
                             [&](int ee) { counts(static_cast<std::int64_t>(j) * (E + 1) + ee) = count(j, ee); });
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, L), [&](int l) {
          int n = 0;
          for (int i = 0; i < s.R; ++i) n += count(i, j * L + l);
          tot(l) = n;
          run(l) = 0;
          unused(l) = 0;
        });
        m.team_barrier();
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, L), [&](int l, int& part, bool final) {
          const int n = s.fixed ? s.slab : pad_to(tot(l), s.align);
          if (final) off(l) = part;
          part += n;
        });
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, L), [&](int l) {
          const int e = j * L + l;
          int before_me = 0;
          for (int i = 0; i < s.me; ++i) before_me += count(i, e);
          dest_base(e) = off(l) + before_me;
          dest_limit(e) = s.fixed ? off(l) + s.slab : (s.capacity > 0 ? s.capacity : kNone);
          if (j == s.me) {
            recv_count(l) = tot(l);
            // Capacity mode: offsets never point past the receive rows (docs/ep.md §4).
            expert_offsets(l) = s.capacity > 0 && off(l) > s.capacity ? s.capacity : off(l);
          }
        });
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          send_base(j) = S(s.me, j);
          fwd_base(j) = s.windows ? A(j, s.me) : S(s.me, j);
          arrive_base(j) = A(s.me, j);
          arrive_count(j) = j == s.me ? 0 : tok(j, s.me);
          ret_base(j) = s.windows ? S(j, s.me) : A(s.me, j);
          sent_rows(j) = 0;
          ret_rows(j) = 0;
        });
        // Every rank learns every rank's demand and receive-side drops from the same counts, so that an overflow is
        // reported on every rank of the group (docs/ep.md §5), not only where it happened.
        int largest = 0, dropped = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, L), [&](int l, int& acc) { acc = tot(l) > acc ? tot(l) : acc; },
            Kokkos::Max<int>(largest));
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, L),
            [&](int l, int& acc) {
              int kept = tot(l);
              if (s.fixed) {
                kept = kept < s.slab ? kept : s.slab;
              } else if (s.capacity > 0) {
                const int room = s.capacity - off(l);
                kept = room <= 0 ? 0 : (room < kept ? room : kept);
              }
              acc += tot(l) - kept;
            },
            dropped);
        const int end = s.fixed ? L * s.slab : off(L - 1) + pad_to(tot(L - 1), s.align);
        // Demand: rows the layout needs (padded) before any drop; for the fixed layout the largest expert.
        const int demand = s.fixed ? largest : end;
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          rank_status(2 * j) = demand;
          rank_status(2 * j + 1) = dropped;
          if (j == s.me) {
            expert_offsets(L) = s.capacity > 0 && end > s.capacity ? s.capacity : end;
            status(2) = demand;
          }
        });
      });
}

/// K4: each slot's receive row on its expert's rank, each token's position per destination rank, and this rank's
/// receive rows' expert ids (their arrival sources are cleared for meta_scatter).
template <class Exec, class IdxView>
void layout_slots(const Exec& exec, const EpShape s, const IdxView& idx,
                  const EpLayoutViews<typename Exec::memory_space>& v, int recv_rows) {
  auto local_pos = v.local_pos;
  auto chunk_prefix = v.chunk_prefix;
  auto chunk_tokens = v.chunk_tokens;
  auto tok_local = v.tok_local;
  auto tok_pos = v.tok_pos;
  auto dest_base = v.dest_base;
  auto dest_limit = v.dest_limit;
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  auto slot_kept = v.slot_kept;
  auto recv_expert = v.recv_expert;
  auto recv_src = v.recv_src;
  auto expert_offsets = v.expert_offsets;
  auto recv_count = v.recv_count;
  auto status = v.status;
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R;
  std::int64_t n = slots;
  n = recv_rows > n ? recv_rows : n;
  n = pairs > n ? pairs : n;
  range_items(
      exec, s, "KokkosMoE::ep_layout::slots", n, KOKKOS_LAMBDA(std::int64_t q) {
        const int L = s.L;
        if (q < slots) {
          const int pos = local_pos(q);
          int row = -1, rank = -1;
          if (pos >= 0) {
            const int e = static_cast<int>(idx(q / s.K, q % s.K));
            const int c = static_cast<int>(q / s.K) / s.chunk;
            const int dest = dest_base(e) + chunk_prefix(static_cast<std::int64_t>(c) * s.E + e) + pos;
            rank = e / L;
            row = dest >= dest_limit(e) ? -1 : dest;
            if (row < 0) Kokkos::atomic_add(&status(1), 1);
          }
          slot_row(q) = row;
          slot_rank(q) = rank;
          slot_kept(q) = row >= 0 ? 1 : 0;
        }
        if (q < pairs) {
          const int local = tok_local(q);
          const int t = static_cast<int>(q / s.R), r = static_cast<int>(q % s.R);
          tok_pos(q) = local < 0 ? -1 : chunk_tokens(static_cast<std::int64_t>(t / s.chunk) * s.R + r) + local;
        }
        if (q < recv_rows) {
          int owner = -1;
          if (q < expert_offsets(L)) {
            int lo = 0, hi = L;  // expert_offsets(lo) <= q < expert_offsets(hi)
            while (hi - lo > 1) {
              const int mid = (lo + hi) / 2;
              if (expert_offsets(mid) <= q) {
                lo = mid;
              } else {
                hi = mid;
              }
            }
            const int e = s.me * L + lo;
            const int row_end = expert_offsets(lo) + recv_count(lo);
            if (q < row_end && q < dest_limit(e)) owner = lo;
          }
          recv_expert(q) = owner;
          recv_src(q) = -1;
        }
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

/// K5 (sender): for every token and remote rank it reaches, the K receive rows of its slots there (-1 where the slot
/// is elsewhere, empty or dropped): what the peer needs to expand and reduce the token's row.
template <class Exec>
void meta_pack(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v,
               const PeerRows<typename Exec::memory_space>& dst) {
  const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R;
  if (pairs == 0 || s.R == 1) return;
  auto tok_pos = v.tok_pos;
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  auto sent_rows = v.sent_rows;
  range_items(
      exec, s, "KokkosMoE::ep_layout::meta", pairs, KOKKOS_LAMBDA(std::int64_t q) {
        const int t = static_cast<int>(q / s.R), r = static_cast<int>(q % s.R);
        const int p = tok_pos(q);
        if (r == s.me || p < 0) return;
        int* out = dst.template at<int>(r, p);
        bool kept = false;
        for (int k = 0; k < s.K; ++k) {
          const std::int64_t sq = static_cast<std::int64_t>(t) * s.K + k;
          const int row = slot_rank(sq) == r ? slot_row(sq) : -1;
          out[k] = row;
          kept = kept || row >= 0;
        }
        if (kept) Kokkos::atomic_add(&sent_rows(r), 1);  // a count, not a position
      });
}

/// K6 (receiver): the arrival index and slot of every remotely fed receive row, and the source of every arrival
/// index, from the arrived meta (fwd_rows). Each receive row has exactly one slot, so the scatter has no conflicts.
template <class Exec>
void meta_scatter(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v) {
  const std::int64_t n = static_cast<std::int64_t>(s.R) * s.B;
  if (s.R == 1) return;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto arrive_rank = v.arrive_rank;
  auto fwd_rows = v.fwd_rows;
  auto recv_src = v.recv_src;
  auto recv_k = v.recv_k;
  auto ret_rows = v.ret_rows;
  range_items(
      exec, s, "KokkosMoE::ep_layout::expand_map", n, KOKKOS_LAMBDA(std::int64_t a) {
        // The last source whose arrival block starts at or before a (bases ascend with the source rank).
        int lo = 0, hi = s.R;
        while (hi - lo > 1) {
          const int mid = (lo + hi) / 2;
          if (arrive_base(mid) <= a) {
            lo = mid;
          } else {
            hi = mid;
          }
        }
        const bool valid = a >= arrive_base(lo) && a < arrive_base(lo) + arrive_count(lo);
        arrive_rank(a) = valid ? lo : -1;
        if (!valid) return;
        bool kept = false;
        for (int k = 0; k < s.K; ++k) {
          const int row = fwd_rows(a * s.K + k);
          if (row < 0) continue;
          kept = true;
          recv_src(row) = static_cast<int>(a);
          recv_k(row) = k;
        }
        if (kept) Kokkos::atomic_add(&ret_rows(lo), 1);
      });
}

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

/// Combine's Weighted weights, source side: the K floats w(t,k) of each token, once per remote rank it reaches.
template <class Exec>
void pack_weights(const Exec& exec, const EpShape s, const Unmanaged2<const float, typename Exec::memory_space>& w,
                  const EpLayoutViews<typename Exec::memory_space>& v,
                  const PeerRows<typename Exec::memory_space>& dst) {
  const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R;
  if (pairs == 0 || s.R == 1) return;
  auto tok_pos = v.tok_pos;
  range_items(
      exec, s, "KokkosMoE::ep_combine::weights", pairs, KOKKOS_LAMBDA(std::int64_t q) {
        const int t = static_cast<int>(q / s.R), r = static_cast<int>(q % s.R);
        const int p = tok_pos(q);
        if (r == s.me || p < 0) return;
        float* out = dst.template at<float>(r, p);
        for (int k = 0; k < s.K; ++k) out[k] = w(t, k);
      });
}

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
/// wire row, and to the receive rows of its local slots (local_q, local_s; local_f = the slot's weight or 1).
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

/// Capacity mode's arrival kernels: the host knows only the bound R * B of the arrival indices, not the arrivals, and
/// one team per bound index launched mostly empty teams (over half at EP8), which cost the graph-safe mode about 8 %
/// of the combine. There a team walks kArrivalsPerTeam arrivals on average instead; eager mode keeps one team per
/// arrival.
constexpr int kArrivalsPerTeam = 4;

/// Teams of an arrival kernel over the arrival index space [0, arrivals) (eager: exact; capacity: the bound).
inline std::int64_t arrival_teams(const EpShape& s, std::int64_t arrivals) {
  return s.eager() ? arrivals : (arrivals + kArrivalsPerTeam - 1) / kArrivalsPerTeam;
}

/// The arrivals a walker walks: the c-th real arrival, c = the walker's index, + walkers, ... < the number of arrivals.
/// Eager mode's arrival indices are the arrivals themselves (source blocks back to back); in capacity mode source i's
/// arrivals are the first arrive_count(i) indices of its block [i * B, (i + 1) * B). \p pre (R + 1 ints of team
/// scratch) gets the prefix sums of arrive_count in capacity mode.
template <class Member, class Ints, class Counts>
KOKKOS_INLINE_FUNCTION std::int64_t arrivals_walked(const Member& m, const EpShape& s, std::int64_t arrivals,
                                                    const Counts& arrive_count, const Ints& pre) {
  if (s.eager()) return arrivals;
  team_prefetch(m, s.R, [&](int i) { pre(i + 1) = arrive_count(i); });
  Kokkos::single(Kokkos::PerTeam(m), [&]() {
    pre(0) = 0;
    for (int i = 0; i < s.R; ++i) pre(i + 1) += pre(i);
  });
  m.team_barrier();
  return pre(s.R);
}

/// The arrival index of the c-th real arrival (see arrivals_walked).
template <class Ints>
KOKKOS_INLINE_FUNCTION std::int64_t arrival_index(const EpShape& s, const Ints& pre, std::int64_t c) {
  if (s.eager()) return c;
  int i = 0;
  while (pre(i + 1) <= c) ++i;
  return static_cast<std::int64_t>(i) * s.B + (c - pre(i));
}

/// Receive rows per zeroing team of expand_arrivals: the team reads their owners in one round and zeroes the few
/// that no slot feeds (a team per row would spend a launch slot and a load latency on every fed row).
constexpr int kZeroRows = 64;

/// A zeroing team's rows: those of [q0, q0 + kZeroRows) that no slot feeds inside the experts' slabs, compacted into
/// rows (kZeroRows + 1 ints of scratch); returns their number.
template <class Member, class Ints, class Rows>
KOKKOS_INLINE_FUNCTION int unfed_rows(const Member& m, const EpShape& s, int q0, int recv_rows, const Ints& recv_src,
                                      const Ints& recv_expert, const Ints& offsets, const Rows& rows) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, kZeroRows), [&](int j) {
    const int q = q0 + j;
    rows(j) = q < recv_rows && recv_src(q) < 0 && recv_expert(q) < 0 && q < offsets(s.L) ? q : -1;
  });
  m.team_barrier();
  Kokkos::single(Kokkos::PerTeam(m), [&]() {
    int n = 0;
    for (int j = 0; j < kZeroRows; ++j)
      if (rows(j) >= 0) rows(n++) = rows(j);  // n <= j: compacts in place
    rows(kZeroRows) = n;
  });
  m.team_barrier();
  return rows(kZeroRows);
}

/// Forward direction, destination side: every arrived token row is read once and written to the receive rows of its
/// kept slots here (fwd_rows), and dst_f of each such row gets the slot's trailer float (1 without a trailer); the
/// receive rows no slot feeds inside the experts' slabs (alignment padding, drops) are zeroed, rows and dst_f alike.
/// Rows past off(L) (capacity mode's unused tail, owned by no expert) are not written. Local rows were written by the
/// pack. One launch: the arrival_teams walk the arrivals, the kZeroRows-row groups of the receive rows follow.
/// \p side (FP8 rows: the scales) gets side.extent(1) floats from side_off of the arrived row, per row as dst.
template <class Exec, class Scalar, class Unit>
void expand_arrivals(const Exec& exec, const EpShape s, std::int64_t arrivals, int recv_rows, const LocalRows in,
                     std::size_t trailer_off, const EpLayoutViews<typename Exec::memory_space>& v,
                     const Unmanaged2<Unit, typename Exec::memory_space>& dst,
                     const Unmanaged1<float, typename Exec::memory_space>& dst_f, const char* label,
                     std::size_t side_off = 0, const Unmanaged2<float, typename Exec::memory_space>& side = {}) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  if (recv_rows == 0) return;
  const int units = static_cast<int>(dst.extent(1)), sides = static_cast<int>(side.extent(1));
  const bool with_f = dst_f.extent(0) > 0;
  auto recv_src = v.recv_src;
  auto recv_expert = v.recv_expert;
  auto arrive_rank = v.arrive_rank;
  auto arrive_count = v.arrive_count;
  auto fwd_rows = v.fwd_rows;
  auto offsets = v.expert_offsets;
  const int groups = (recv_rows + kZeroRows - 1) / kZeroRows;
  const std::int64_t walkers = arrival_teams(s, arrivals);
  const int teams = static_cast<int>(walkers) + groups;
  const int rows_len = s.K + 2 > kZeroRows + 1 ? s.K + 2 : kZeroRows + 1;
  const std::size_t shmem = SInt::shmem_size(rows_len) + SInt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  team_items(
      exec, s, label, teams, shmem, KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        SInt rows(sp, rows_len);
        SInt fwd(sp, s.K);
        SInt pre(sp, s.R + 1);
        if (item >= walkers) {
          const int n = unfed_rows(m, s, static_cast<int>(item - walkers) * kZeroRows, recv_rows, recv_src, recv_expert,
                                   offsets, rows);
          for (int d = 0; d < n; ++d)
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { dst(rows(d), u) = Unit{}; });
          if (with_f) Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n), [&](int d) { dst_f(rows(d)) = 0.0f; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n * sides),
                               [&](int j) { side(rows(j / sides), j % sides) = 0.0f; });
          return;
        }
        const std::int64_t walked = arrivals_walked(m, s, arrivals, arrive_count, pre);
        for (std::int64_t c = item; c < walked; c += walkers) {
          const std::int64_t i = arrival_index(s, pre, c);
          // The token's kept rows here, compacted in k order (a slot is fed by exactly one arrival: no conflicts);
          // the arrival's source rank is read in the same round (an unused index has rank -1).
          team_prefetch(m, s.K, [&](int k) {
            fwd(k) = fwd_rows(i * s.K + k);
            if (k == 0) rows(s.K + 1) = arrive_rank(i);
          });
          if (rows(s.K + 1) >= 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() {
              int n = 0;
              for (int k = 0; k < s.K; ++k)
                if (fwd(k) >= 0) rows(n++) = fwd(k);
              rows(s.K) = n;
            });
            m.team_barrier();
            const int n = rows(s.K);
            const char* row = in.at<char>(i);
            const Unit* r = reinterpret_cast<const Unit*>(row);
            team_unit_batches(m, units, [&](int b, int nb) {
              Unit val[kUnitBatch];
              for (int j = 0; j < kUnitBatch; ++j)
                if (b + j * nb < units) val[j] = r[b + j * nb];
              for (int d = 0; d < n; ++d)
                for (int j = 0; j < kUnitBatch; ++j)
                  if (b + j * nb < units) dst(rows(d), b + j * nb) = val[j];
            });
            if (with_f) {
              const float* f = trailer_off > 0 ? reinterpret_cast<const float*>(row + trailer_off) : nullptr;
              Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
                const int q = fwd(k);
                if (q >= 0) dst_f(q) = f != nullptr ? f[k] : 1.0f;
              });
            }
            const float* sv = reinterpret_cast<const float*>(row + side_off);
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n * sides),
                                 [&](int j) { side(rows(j / sides), j % sides) = sv[j % sides]; });
          }
          if (c + walkers < walked) m.team_barrier();  // the next arrival's tables overwrite these
        }
      });
}

/// Return direction, expert side (combine, dispatch backward): for every arrival a, the FP32 sum in k order of
/// c_k * src(row_k) over the rows it fed (c_k = the arrived weight when \p coef is given, else 1), rounded to the row
/// type, goes back once to its source rank, with a trailer of extra_f(row_k) per slot when \p trailer_off > 0.
template <class Exec, class Scalar, class Unit>
void reduce_arrivals(const Exec& exec, const EpShape s, std::int64_t arrivals,
                     const Unmanaged2<const Unit, typename Exec::memory_space>& src, const LocalRows coef,
                     const Unmanaged1<const float, typename Exec::memory_space>& extra_f,
                     const EpLayoutViews<typename Exec::memory_space>& v,
                     const PeerRows<typename Exec::memory_space>& ret, std::size_t trailer_off, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  if (arrivals == 0) return;
  const int units = static_cast<int>(src.extent(1));
  const bool with_coef = coef.base != nullptr, with_f = extra_f.extent(0) > 0;
  auto arrive_rank = v.arrive_rank;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto fwd_rows = v.fwd_rows;
  const std::int64_t walkers = arrival_teams(s, arrivals);
  const std::size_t shmem =
      SInt::shmem_size(s.K + 2) + SInt::shmem_size(s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  team_items(
      exec, s, label, static_cast<int>(walkers), shmem,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        // The kept rows of the token here and their coefficients, in k order (the order of the sum); the arrival's
        // source rank in the same round of loads (-1: an unused index).
        SInt rows(sp, s.K + 2);
        SInt fwd(sp, s.K);
        SFlt cs(sp, s.K);
        SInt pre(sp, s.R + 1);
        const std::int64_t walked = arrivals_walked(m, s, arrivals, arrive_count, pre);
        for (std::int64_t c = item; c < walked; c += walkers) {
          const std::int64_t a = arrival_index(s, pre, c);
          team_prefetch(m, s.K, [&](int k) {
            fwd(k) = fwd_rows(a * s.K + k);
            cs(k) = with_coef ? coef.at<float>(a)[k] : 1.0f;
            if (k == 0) rows(s.K + 1) = arrive_rank(a);
          });
          const int i = rows(s.K + 1);
          if (i >= 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() {
              int n = 0;
              for (int k = 0; k < s.K; ++k) {
                if (fwd(k) < 0) continue;
                rows(n) = fwd(k);
                cs(n) = cs(k);  // n <= k: compacts in place
                ++n;
              }
              rows(s.K) = n;
            });
            m.team_barrier();
          }
          // n == 0: every slot of the token here was dropped, and its rank reads no return row.
          const int n = i >= 0 ? rows(s.K) : 0;
          if (n > 0) {
            char* out = ret.template at<char>(i, static_cast<int>(a - arrive_base(i)));
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) {
              float acc[Ops::n];
              for (int e = 0; e < Ops::n; ++e) acc[e] = 0.0f;
              gather_sum<Ops, Unit>(
                  n, [&](int r) { return src(rows(r), u); }, [&](int r) { return cs(r); }, acc);
              Ops::store(acc, reinterpret_cast<Unit*>(out)[u]);
            });
            if (trailer_off > 0) {
              Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
                const int row = fwd(k);
                reinterpret_cast<float*>(out + trailer_off)[k] = (row >= 0 && with_f) ? extra_f(row) : 0.0f;
              });
            }
          }
          if (c + walkers < walked) m.team_barrier();  // the next arrival's tables overwrite these
        }
      });
}

/// Return direction, source side: y[t] = the FP32 sum, over the ranks its kept slots reach in ascending order, of
/// each rank's partial rounded to the row type: this rank's own from the local rows (FP32 in k order, times w(t,k)
/// when \p coef is given), the others' as returned. out_f(t,k) gets the slot's float (local_f of its row here, the
/// returned trailer otherwise; 0 for empty and dropped slots).
template <class Exec, class Scalar, class Unit>
void reduce_ranks(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& local,
                  const Unmanaged2<const float, typename Exec::memory_space>& coef,
                  const Unmanaged1<const float, typename Exec::memory_space>& local_f, const LocalRows ret,
                  std::size_t trailer_off, const EpLayoutViews<typename Exec::memory_space>& v,
                  const Unmanaged2<Unit, typename Exec::memory_space>& y,
                  const Unmanaged2<float, typename Exec::memory_space>& out_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  if (s.T == 0) return;
  const int units = static_cast<int>(y.extent(1));
  const bool with_coef = coef.extent(0) > 0, with_f = out_f.extent(0) > 0;
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  auto tok_pos = v.tok_pos;
  auto send_base = v.send_base;
  const std::size_t shmem =
      3 * SInt::shmem_size(s.K + 1) + SInt::shmem_size(2 * s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R);
  team_items(
      exec, s, label, s.T, shmem, KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int t = static_cast<int>(item);
        const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K;
        // The distinct ranks of the kept slots, ascending (count last); per rank the returned row's index, -1 for
        // this rank, whose kept rows and coefficients follow in k order (count last).
        SInt order(sp, s.K + 1);
        SInt from(sp, s.K + 1);
        SInt lrow(sp, s.K + 1);
        SFlt lcoef(sp, s.K);
        SInt slots(sp, 2 * s.K);  // slot_row, then slot_rank
        SInt rret(sp, s.R);       // per rank the returned row's index (-1: none, or this rank)
        team_prefetch(m, s.K > s.R ? s.K : s.R, [&](int j) {
          if (j < s.K) {
            slots(j) = slot_row(q0 + j);
            slots(s.K + j) = slot_rank(q0 + j);
            lcoef(j) = with_coef ? coef(t, j) : 1.0f;
          }
          if (j < s.R) {
            const int p = tok_pos(static_cast<std::int64_t>(t) * s.R + j);
            rret(j) = p < 0 || j == s.me ? -1 : send_base(j) + p;
          }
        });
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          int n = 0, prev = -1;
          for (;;) {
            int next = -1;
            for (int k = 0; k < s.K; ++k) {
              const int r = slots(s.K + k);
              if (slots(k) >= 0 && r > prev && (next < 0 || r < next)) next = r;
            }
            if (next < 0) break;
            from(n) = rret(next);
            order(n++) = next;
            prev = next;
          }
          order(s.K) = n;
          int nl = 0;
          for (int k = 0; k < s.K; ++k) {
            if (slots(k) < 0 || slots(s.K + k) != s.me) continue;
            lrow(nl) = slots(k);
            lcoef(nl) = lcoef(k);  // nl <= k: compacts in place
            ++nl;
          }
          lrow(s.K) = nl;
        });
        m.team_barrier();
        const int nd = order(s.K), nl = lrow(s.K);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) {
          // This rank's partial (FP32 in k order, rounded to the row type), then the ranks' partials in ascending
          // rank order, the returned ones read kReduceGather at a time.
          float mine[Ops::n];
          for (int e = 0; e < Ops::n; ++e) mine[e] = 0.0f;
          if (nl > 0) {
            gather_sum<Ops, Unit>(
                nl, [&](int l) { return local(lrow(l), u); }, [&](int l) { return lcoef(l); }, mine);
            Unit rounded;
            Ops::store(mine, rounded);
            Ops::load(rounded, mine);
          }
          float acc[Ops::n];
          for (int e = 0; e < Ops::n; ++e) acc[e] = 0.0f;
          for (int d0 = 0; d0 < nd; d0 += kReduceGather) {
            Unit raw[kReduceGather];
            for (int j = 0; j < kReduceGather; ++j)
              if (d0 + j < nd && from(d0 + j) >= 0) raw[j] = ret.at<Unit>(from(d0 + j))[u];
            for (int j = 0; j < kReduceGather; ++j) {
              if (d0 + j >= nd) break;
              float part[Ops::n];
              if (from(d0 + j) < 0) {
                for (int e = 0; e < Ops::n; ++e) part[e] = mine[e];
              } else {
                Ops::load(raw[j], part);
              }
              for (int e = 0; e < Ops::n; ++e) acc[e] += part[e];
            }
          }
          Ops::store(acc, y(t, u));
        });
        if (with_f) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
            const int row = slots(k), r = slots(s.K + k);
            float f = 0.0f;
            if (row >= 0 && r == s.me) {
              f = local_f.extent(0) > 0 ? local_f(row) : 0.0f;
            } else if (row >= 0) {
              f = reinterpret_cast<const float*>(ret.at<char>(rret(r)) + trailer_off)[k];
            }
            out_f(t, k) = f;
          });
        }
      });
}

/// Combine backward, Weighted, source side: token t's kept local slots get grad_out = w * grad_y[t] and
/// grad_w = dot(grad_y[t], out[row]) here, its row read once (remote slots are finished on the expert's rank).
template <class Exec, class Scalar, class Unit>
void local_dots(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& grad_y,
                const Unmanaged2<const float, typename Exec::memory_space>& w,
                const Unmanaged2<const Unit, typename Exec::memory_space>& out,
                const EpLayoutViews<typename Exec::memory_space>& v,
                const Unmanaged2<Unit, typename Exec::memory_space>& grad_out,
                const Unmanaged2<float, typename Exec::memory_space>& grad_w) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  if (s.T == 0) return;
  const int units = static_cast<int>(grad_y.extent(1));
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  const std::size_t shmem = 2 * SInt::shmem_size(s.K + 1) + SInt::shmem_size(s.K) + SFlt::shmem_size(s.K);
  team_items(
      exec, s, "KokkosMoE::ep_combine_backward::local", s.T, shmem,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        const int t = static_cast<int>(item);
        SInt rows(sp, s.K + 1);
        SInt ks(sp, s.K + 1);
        SInt ranks(sp, s.K);
        SFlt cs(sp, s.K);
        const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K;
        team_prefetch(m, s.K, [&](int k) {
          rows(k) = slot_row(q0 + k);
          ranks(k) = slot_rank(q0 + k);
          cs(k) = w(t, k);
        });
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          int n = 0;
          for (int k = 0; k < s.K; ++k) {
            if (rows(k) < 0 || ranks(k) != s.me) continue;
            rows(n) = rows(k);  // n <= k: compacts in place
            cs(n) = cs(k);
            ks(n) = k;
            ++n;
          }
          rows(s.K) = n;
        });
        m.team_barrier();
        scale_and_dots<Scalar, Unit>(m, units, &grad_y(t, 0), rows(s.K), rows, cs, out, grad_out,
                                     [&](int d, float dot) { grad_w(t, ks(d)) = dot; });
      });
}

/// Combine backward, Weighted, expert side: every arrived row g is read once for the kept slots it feeds here
/// (fwd_rows); each such receive row q gets grad_out = w * g (w from the arrived trailer), and the slot's
/// dot(g, out[q]) goes back to the source in the float row of the return (K floats per token). Receive rows no slot
/// feeds are zeroed up to off(L), as in expand_arrivals; local rows were written by local_dots.
template <class Exec, class Scalar, class Unit>
void expand_with_dots(const Exec& exec, const EpShape s, std::int64_t arrivals, int recv_rows, const LocalRows in,
                      std::size_t trailer_off, const Unmanaged2<const Unit, typename Exec::memory_space>& out,
                      const EpLayoutViews<typename Exec::memory_space>& v,
                      const PeerRows<typename Exec::memory_space>& dots,
                      const Unmanaged2<Unit, typename Exec::memory_space>& grad_out) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  if (recv_rows == 0) return;
  const int units = static_cast<int>(grad_out.extent(1));
  auto recv_src = v.recv_src;
  auto recv_expert = v.recv_expert;
  auto arrive_rank = v.arrive_rank;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto fwd_rows = v.fwd_rows;
  auto offsets = v.expert_offsets;
  const int groups = (recv_rows + kZeroRows - 1) / kZeroRows;
  const std::int64_t walkers = arrival_teams(s, arrivals);
  const int teams = static_cast<int>(walkers) + groups;
  const int rows_len = s.K + 2 > kZeroRows + 1 ? s.K + 2 : kZeroRows + 1;
  const std::size_t shmem =
      SInt::shmem_size(rows_len) + 2 * SInt::shmem_size(s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  team_items(
      exec, s, "KokkosMoE::ep_combine_backward::expert", teams, shmem,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        SInt rows(sp, rows_len);
        SInt fwd(sp, s.K);
        SInt ks(sp, s.K);
        SFlt cs(sp, s.K);
        SInt pre(sp, s.R + 1);
        if (item >= walkers) {
          const int n = unfed_rows(m, s, static_cast<int>(item - walkers) * kZeroRows, recv_rows, recv_src, recv_expert,
                                   offsets, rows);
          for (int d = 0; d < n; ++d)
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { grad_out(rows(d), u) = Unit{}; });
          return;
        }
        const std::int64_t walked = arrivals_walked(m, s, arrivals, arrive_count, pre);
        for (std::int64_t c = item; c < walked; c += walkers) {
          const std::int64_t a = arrival_index(s, pre, c);
          const char* row = in.at<char>(a);
          team_prefetch(m, s.K, [&](int k) {
            fwd(k) = fwd_rows(a * s.K + k);
            cs(k) = reinterpret_cast<const float*>(row + trailer_off)[k];
            if (k == 0) rows(s.K + 1) = arrive_rank(a);
          });
          const int i = rows(s.K + 1);
          if (i >= 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() {
              int n = 0;
              for (int k = 0; k < s.K; ++k) {
                if (fwd(k) < 0) continue;
                rows(n) = fwd(k);
                cs(n) = cs(k);  // n <= k: compacts in place
                ks(n) = k;
                ++n;
              }
              rows(s.K) = n;
            });
            m.team_barrier();
            float* back = dots.template at<float>(i, static_cast<int>(a - arrive_base(i)));
            scale_and_dots<Scalar, Unit>(m, units, reinterpret_cast<const Unit*>(row), rows(s.K), rows, cs, out,
                                         grad_out, [&](int d, float dot) { back[ks(d)] = dot; });
          }
          if (c + walkers < walked) m.team_barrier();  // the next arrival's tables overwrite these
        }
      });
}

/// Combine backward, Weighted, source side after the dots came back: the remote slots' weight gradients, 0 for empty
/// and dropped slots (local ones were written by local_dots).
template <class Exec>
void scatter_dots(const Exec& exec, const EpShape s, const LocalRows ret,
                  const EpLayoutViews<typename Exec::memory_space>& v,
                  const Unmanaged2<float, typename Exec::memory_space>& grad_w) {
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  if (slots == 0) return;
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  auto tok_pos = v.tok_pos;
  auto send_base = v.send_base;
  range_items(
      exec, s, "KokkosMoE::ep_combine_backward::scatter", slots, KOKKOS_LAMBDA(std::int64_t q) {
        const int t = static_cast<int>(q / s.K), k = static_cast<int>(q % s.K);
        const int row = slot_row(q), r = slot_rank(q);
        if (row < 0) {
          grad_w(t, k) = 0.0f;
        } else if (r != s.me) {
          const std::int64_t i = send_base(r) + tok_pos(static_cast<std::int64_t>(t) * s.R + r);
          grad_w(t, k) = ret.at<float>(i)[k];
        }
      });
}

/// Adds one transfer of an operation to the traffic counters: forward (token rows this rank sent) or return (rows
/// it sent back); \p block_rows > 0 where the transport moves whole blocks of that many rows per peer, \p signals
/// the bytes of the window counters it raised.
template <class Exec>
void account_transfer(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v, int op,
                      bool forward, std::int64_t pitch, std::int64_t row_bytes, std::int64_t block_rows,
                      std::int64_t signals) {
  if (s.R == 1) return;
  auto rows = forward ? v.sent_rows : v.ret_rows;
  auto traffic = v.traffic;
  Kokkos::parallel_for(
      "KokkosMoE::ep::account", light(Kokkos::RangePolicy<Exec>(exec, 0, 1)), KOKKOS_LAMBDA(int) {
        std::int64_t n = 0;
        for (int r = 0; r < s.R; ++r) n += r == s.me ? 0 : rows(r);
        traffic(2 * op) += n * row_bytes;
        traffic(2 * op + 1) += (block_rows > 0 ? static_cast<std::int64_t>(s.R - 1) * block_rows : n) * pitch + signals;
      });
}

/// The layout's bytes: the count all-gather and the meta (K ints per token row, every token a peer receives).
template <class Exec>
void account_layout(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v,
                    std::int64_t block_rows, std::int64_t signals) {
  if (s.R == 1) return;
  auto send = v.gather_send;
  auto traffic = v.traffic;
  Kokkos::parallel_for(
      "KokkosMoE::ep::account_layout", light(Kokkos::RangePolicy<Exec>(exec, 0, 1)), KOKKOS_LAMBDA(int) {
        std::int64_t n = 0;
        for (int r = 0; r < s.R; ++r) n += r == s.me ? 0 : send(s.E + 1 + r);
        const std::int64_t meta = (block_rows > 0 ? static_cast<std::int64_t>(s.R - 1) * block_rows : n) * s.K * 4;
        traffic(2 * kOpLayout + 1) += static_cast<std::int64_t>(s.R - 1) * (s.E + 1 + s.R) * 4 + meta + signals;
      });
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
