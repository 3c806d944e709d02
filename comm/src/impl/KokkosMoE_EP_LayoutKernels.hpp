/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_LAYOUTKERNELS_HPP
#define KOKKOSMOE_EP_LAYOUTKERNELS_HPP

// The layout kernels of the EP layer (docs/ep.md §3.1): counts, offsets, slots and the meta every receiver needs,
// and the traffic counters of §9. No atomics decide a position, so the layout is deterministic.

#include <impl/KokkosMoE_EP_KernelBase.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Chunks of the layout at most whose prefix the count kernel's last team scans itself (one kernel); more chunks
/// take a prefix kernel of a team per column, since one thread per column then walks too long a chain.
constexpr int kLayoutScanChunks = 32;

/// The exclusive prefix over the \p nch chunks of one column of counts (p[c * stride] for chunk c), in place, by one
/// thread; returns the column's total. The counts are read kBatch chunks at a time, as volatile loads: another team
/// of the kernel wrote them, and no earlier read may answer from a cache.
KOKKOS_INLINE_FUNCTION int scan_column(int* p, std::int64_t stride, int nch) {
  constexpr int kBatch = 8;
  const volatile int* in = p;
  int part = 0;
  for (int c0 = 0; c0 < nch; c0 += kBatch) {
    int n[kBatch];
    for (int j = 0; j < kBatch; ++j) n[j] = c0 + j < nch ? in[(c0 + j) * stride] : 0;
    for (int j = 0; j < kBatch && c0 + j < nch; ++j) {
      p[(c0 + j) * stride] = part;
      part += n[j];
    }
  }
  return part;
}

/// The layout's column totals: the vector every rank all-gathers (slots per expert, invalid ids, tokens per rank),
/// into the gathered vectors too at one rank (no exchange follows), and the invalid ids into the status.
template <class Mem>
struct LayoutTotals {
  Kokkos::View<int*, Mem> send, own, status;
  int E = 0;
  bool alone = false;
  KOKKOS_INLINE_FUNCTION void column(int out, int n) const {
    send(out) = n;
    if (alone) own(out) = n;
  }
  KOKKOS_INLINE_FUNCTION void invalid(int bad) const {
    status(0) = bad;
    status(1) = 0;
    column(E, bad);  // travels with the counts: every rank learns of every rank's invalid ids
  }
};

/// K1 + K2 of the layout: per-chunk ranks and histograms, then the prefix over chunks (docs/ep.md §3.1). With at
/// most kLayoutScanChunks chunks one kernel: the team that finishes the last chunk (a ticket in status(3): it decides
/// who scans, not what is written) scans every column.
template <class Exec, class IdxView>
void layout_count(const Exec& exec, const EpShape s, const IdxView& idx,
                  const EpLayoutViews<typename Exec::memory_space>& v) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const int nch = (s.T + s.chunk - 1) / s.chunk;
  const bool fused = nch <= kLayoutScanChunks;
  auto local_pos = v.local_pos;
  auto chunk_prefix = v.chunk_prefix;
  auto chunk_tokens = v.chunk_tokens;
  auto chunk_bad = v.chunk_bad;
  auto token_in_rank = v.token_in_rank;
  auto tok_local = v.tok_local;
  auto status = v.status;
  const LayoutTotals<typename Exec::memory_space> totals{v.gather_send, v.gathered, status, s.E, s.R == 1};
  if (nch > 0) {
    // The chunk's ids are staged in scratch, with a bit mask of the chunk's tokens (chunk <= 32: one word) per
    // expert and per rank. A slot's rank among the chunk's slots of its expert is then the number of
    // earlier tokens in its expert's mask (population counts), and so is a token's rank among the chunk's tokens for
    // a rank; no serial walk. Where a token holds one expert twice (allowed outside the decode contract) a token may
    // stand for two slots: such a chunk counts the equal ids of the tokens its masks name instead.
    using Masks =
        Kokkos::View<std::uint32_t*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    const int n_max = s.chunk * s.K, C = s.E + s.R;
    const std::size_t shmem =
        Scratch::shmem_size(s.E) + Scratch::shmem_size(n_max) + Masks::shmem_size(static_cast<std::size_t>(C) + 1);
    team_items(
        exec, s, "KokkosMoE::ep_layout::count", nch, shmem,
        KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
          const int c = static_cast<int>(item);
          Scratch cnt(sp, s.E);
          Scratch ids(sp, n_max);
          Masks mask(sp, C + 1);  // tokens per expert and per rank; last: a repeated id
          const int t0 = c * s.chunk;
          const int t1 = t0 + s.chunk < s.T ? t0 + s.chunk : s.T;
          const int n = (t1 - t0) * s.K;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C + 1), [&](int e) {
            mask(e) = 0;
            if (e < s.E) cnt(e) = 0;
          });
          m.team_barrier();
          int bad = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, n),
              [&](int j, int& acc) {
                const int jt = j / s.K, k = j % s.K;
                const long long e = static_cast<long long>(idx(t0 + jt, k));
                bool ok = e >= 0 && e < s.E;
                bool repeat = false;
                if (ok)
                  for (int k2 = 0; k2 < k; ++k2) repeat = repeat || static_cast<long long>(idx(t0 + jt, k2)) == e;
                if (repeat && s.unique_ids) ok = false;
                if (!ok && e != -1) ++acc;
                ids(j) = ok ? static_cast<int>(e) : -1;
                if (!ok) return;
                const std::uint32_t bit = std::uint32_t(1) << jt;
                Kokkos::atomic_fetch_or(&mask(static_cast<int>(e)), bit);
                Kokkos::atomic_fetch_or(&mask(s.E + static_cast<int>(e) / s.L), bit);
                if (repeat) Kokkos::atomic_fetch_or(&mask(C), std::uint32_t(1));
              },
              bad);
          m.team_barrier();
          // The chunk's tokens before token jt in column col's mask.
          auto before = [&](int col, int jt) { return popcount32(mask(col) & ((std::uint32_t(1) << jt) - 1)); };
          auto all = [&](int col) { return popcount32(mask(col)); };
          const bool repeats = mask(C) != 0;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n), [&](int j) {
            const int e = ids(j), jt = j / s.K;
            int pos = -1;
            if (e >= 0 && !repeats) {
              pos = before(e, jt);
            } else if (e >= 0) {
              // The earlier tokens that hold e (its mask's bits below jt), each with its repeats, then this
              // token's earlier slots of e: the chunk's earlier slots of e, without a walk over all of them.
              pos = 0;
              for (std::uint32_t bits = mask(e) & ((std::uint32_t(1) << jt) - 1); bits != 0; bits &= bits - 1) {
                const int t2 = popcount32((bits & (~bits + 1)) - 1);  // the lowest set bit's token
                for (int k2 = 0; k2 < s.K; ++k2) pos += ids(t2 * s.K + k2) == e ? 1 : 0;
              }
              for (int i = jt * s.K; i < j; ++i) pos += ids(i) == e ? 1 : 0;
              Kokkos::atomic_add(&cnt(e), 1);
            }
            local_pos(static_cast<std::int64_t>(t0) * s.K + j) = pos;
          });
          // A token's rank among the chunk's tokens for rank r: the earlier tokens in r's mask.
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, (t1 - t0) * s.R), [&](int j) {
            const int jt = j / s.R, r = j % s.R;
            const bool in = (mask(s.E + r) >> jt) & 1u;
            token_in_rank(static_cast<std::int64_t>(t0 + jt) * s.R + r) = in ? 1 : 0;
            tok_local(static_cast<std::int64_t>(t0 + jt) * s.R + r) = in ? before(s.E + r, jt) : -1;
          });
          m.team_barrier();
          Kokkos::single(Kokkos::PerTeam(m), [&]() { chunk_bad(c) = bad; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E), [&](int e) {
            chunk_prefix(static_cast<std::int64_t>(c) * s.E + e) = repeats ? cnt(e) : all(e);
          });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R),
                               [&](int r) { chunk_tokens(static_cast<std::int64_t>(c) * s.R + r) = all(s.E + r); });
          if (!fused) return;
          // Every thread's counts are out before the team takes its ticket; the last one scans every column.
          Kokkos::memory_fence();
          m.team_barrier();
          int last = 0;
          Kokkos::single(
              Kokkos::PerTeam(m),
              [&](int& l) {
                l = Kokkos::atomic_fetch_add(&status(3), 1) == nch - 1 ? 1 : 0;
                if (l) status(3) = 0;  // for the next layout (a captured one replays)
              },
              last);
          if (!last) return;
          Kokkos::memory_fence();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int i) {
            const bool expert = i < s.E;
            const int col = expert ? i : i - s.E;
            const int n_col = scan_column(expert ? &chunk_prefix(col) : &chunk_tokens(col), expert ? s.E : s.R, nch);
            totals.column(expert ? i : s.E + 1 + col, n_col);
          });
          int sum = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, nch),
              [&](int c2, int& acc) { acc += static_cast<const volatile int*>(chunk_bad.data())[c2]; }, sum);
          Kokkos::single(Kokkos::PerTeam(m), [&]() { totals.invalid(sum); });
        },
        1, n_max);
  }
  if (nch > 0 && fused) return;
  // K2: exclusive prefix over chunks per expert (teams e < E) and per destination rank (teams E..E+R), invalid ids
  // (the last team). A team scan, so that no thread walks the chunks serially through global memory.
  team_items(
      exec, s, "KokkosMoE::ep_layout::prefix", s.E + s.R + 1, 0,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>&) {
        const int i = static_cast<int>(item);
        if (i < s.E + s.R) {
          const bool expert = i < s.E;
          const int stride = expert ? s.E : s.R, col = expert ? i : i - s.E;
          auto& prefix = expert ? chunk_prefix : chunk_tokens;
          const int out = expert ? i : s.E + 1 + col;
          if (nch == 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() { totals.column(out, 0); });
            return;
          }
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, nch), [&](int c, int& part, bool final) {
            const std::int64_t at = static_cast<std::int64_t>(c) * stride + col;
            const int n = prefix(at);
            if (final) {
              prefix(at) = part;
              if (c == nch - 1) totals.column(out, part + n);
            }
            part += n;
          });
        } else {
          int bad = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, nch), [&](int c, int& acc) { acc += chunk_bad(c); }, bad);
          Kokkos::single(Kokkos::PerTeam(m), [&]() {
            totals.invalid(bad);
            status(3) = 0;
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

/// Slots, token pairs and receive rows per team of layout_place: about one per thread of a Cuda team, since each
/// item's loads depend on each other (at 512 per team Nsight Compute timed the kernel at 18.7 us on an H100, 4096
/// tokens, capacity mode).
constexpr int kPlaceItemsPerTeam = 128;

/// The receive rows layout_place fills. Known: capacity mode's, or eager mode's once the host has read the counts.
/// Derived: eager mode's launch queued before that host read (docs/ep.md §3.1), where the kernel takes the padded
/// total of this rank's experts from the gathered counts, within the \p rows its receive maps hold.
struct PlaceRows {
  std::int64_t rows = 0;
  bool derive = false;
  /// Whether the layout's demand is added to the expert load: not on a launch that repeats one (the maps grew), and
  /// the kernel skips it where an eager layout will throw (an invalid id on some rank).
  bool add_load = true;
};

/// K3 + K4 in one kernel (docs/ep.md §3.1). Every team derives every expert's offsets from the all-gathered vectors
/// into scratch (E + R columns of R counts: little against its share of the slots); team 0 writes them out with the
/// per-rank bases, demands and drops and adds the demand to the load; then every team places its share of the slots
/// (receive row on the expert's rank), of the (token, rank) pairs (position among the tokens for that rank) and of
/// this rank's receive rows (their expert, their arrival sources cleared for meta_scatter).
template <class Exec, class IdxView>
void layout_place(const Exec& exec, const EpShape s, const IdxView& idx,
                  const EpLayoutViews<typename Exec::memory_space>& v, const PlaceRows pr) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  auto gathered = v.gathered;
  auto counts = v.counts;
  auto dest_base = v.dest_base;
  auto dest_limit = v.dest_limit;
  auto expert_offsets = v.expert_offsets;
  auto recv_count = v.recv_count;
  auto load = v.expert_load;
  auto send_base = v.send_base;
  auto fwd_base = v.fwd_base;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto ret_base = v.ret_base;
  auto sent_rows = v.sent_rows;
  auto ret_rows = v.ret_rows;
  auto rank_status = v.rank_status;
  auto status = v.status;
  auto local_pos = v.local_pos;
  auto chunk_prefix = v.chunk_prefix;
  auto chunk_tokens = v.chunk_tokens;
  auto tok_local = v.tok_local;
  auto tok_pos = v.tok_pos;
  auto slot_row = v.slot_row;
  auto slot_rank = v.slot_rank;
  auto slot_kept = v.slot_kept;
  auto recv_expert = v.recv_expert;
  auto recv_src = v.recv_src;
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  const std::int64_t pairs = static_cast<std::int64_t>(s.T) * s.R;
  // Derived rows are at most every rank's slots to this rank's experts, each expert padded.
  const std::int64_t most = static_cast<std::int64_t>(s.R) * s.B * s.K + static_cast<std::int64_t>(s.L) * (s.align - 1);
  const std::int64_t bound = pr.derive && most < pr.rows ? most : pr.rows;
  std::int64_t n = slots;
  n = bound > n ? bound : n;
  n = pairs > n ? pairs : n;
  const std::int64_t items = (n + kPlaceItemsPerTeam - 1) / kPlaceItemsPerTeam;
  std::int64_t league = s.max_teams > 0 && items > s.max_teams ? s.max_teams : items;
  league = league < 1 ? 1 : league;  // team 0 writes the offsets even where nothing is placed
  const std::size_t shmem = 3 * Scratch::shmem_size(s.E) + Scratch::shmem_size(s.E + 1) + 2 * Scratch::shmem_size(s.R);
  Kokkos::TeamPolicy<Exec> policy(exec, static_cast<int>(league), Kokkos::AUTO);
  Kokkos::parallel_for(
      "KokkosMoE::ep_layout::place", light(policy.set_scratch_size(0, Kokkos::PerTeam(shmem))),
      KOKKOS_LAMBDA(const Team& m) {
        const int E = s.E, L = s.L, R = s.R, me = s.me, W = s.E + 1 + s.R;
        constexpr int kNone = 2147483647;
        const bool lead = m.league_rank() == 0;
        Scratch tot(m.team_scratch(0), E), base(m.team_scratch(0), E), limit(m.team_scratch(0), E);
        Scratch ex(m.team_scratch(0), E + 1), drops(m.team_scratch(0), R), big(m.team_scratch(0), R);
        auto count = [&](int i, int e) { return gathered(static_cast<std::int64_t>(i) * W + e); };
        auto tok = [&](int i, int r) { return gathered(static_cast<std::int64_t>(i) * W + E + 1 + r); };
        // Capacity mode: offsets never point past the receive rows (docs/ep.md §4).
        auto clamp = [&](int o) { return s.capacity > 0 && o > s.capacity ? s.capacity : o; };
        // Index of source i's first token row for rank r in i's source stage (S) and in r's arrival space (A).
        auto S = [&](int i, int r) {
          if (!s.eager()) return r * s.B;
          int k = 0;
          for (int q = 0; q < r; ++q) k += q == i ? 0 : tok(i, q);
          return k;
        };
        auto A = [&](int r, int i) {
          if (!s.eager()) return i * s.B;
          int k = 0;
          for (int q = 0; q < i; ++q) k += q == r ? 0 : tok(q, r);
          return k;
        };
        // The lead adds the load, except where an eager layout throws once the host has read the counts (an invalid
        // id on some rank).
        bool add_load = lead && pr.add_load;
        for (int i = 0; i < R && add_load && s.eager(); ++i) add_load = count(i, E) == 0;
        // Slots per expert from every rank, and this rank's slots of it before its own (ranks below it come first).
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](int e) {
          int all = 0, before = 0;
          for (int i = 0; i < R; ++i) {
            const int c = count(i, e);
            all += c;
            before += i < me ? c : 0;
          }
          tot(e) = all;
          base(e) = before;
        });
        if (lead)
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, R), [&](int j) {
            drops(j) = 0;
            big(j) = 0;
          });
        m.team_barrier();
        // Padded rows per expert, scanned over all experts: expert e's rows on its rank start at ex(e) - ex(e/L*L).
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, E), [&](int e, int& part, bool final) {
          const int rows = s.fixed ? s.slab : pad_to(tot(e), s.align);
          if (final) {
            ex(e) = part;
            if (e == E - 1) ex(E) = part + rows;
          }
          part += rows;
        });
        m.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](int e) {
          const int j = e / L, off = ex(e) - ex(j * L);
          base(e) += off;
          limit(e) = s.fixed ? off + s.slab : (s.capacity > 0 ? s.capacity : kNone);
          if (!lead) return;
          dest_base(e) = base(e);
          dest_limit(e) = limit(e);
          // Every rank learns every rank's demand and receive-side drops from the same counts, so that an overflow is
          // reported on every rank of the group (docs/ep.md §5), not only where it happened.
          int kept = tot(e);
          if (s.fixed) {
            kept = kept < s.slab ? kept : s.slab;
          } else if (s.capacity > 0) {
            const int room = s.capacity - off;
            kept = room <= 0 ? 0 : (room < kept ? room : kept);
          }
          Kokkos::atomic_add(&drops(j), tot(e) - kept);
          Kokkos::atomic_fetch_max(&big(j), tot(e));
          if (j == me) {
            const int l = e - me * L;
            recv_count(l) = tot(e);
            expert_offsets(l) = clamp(off);
            if (add_load) load(l) += tot(e);  // on the device only: a captured layout keeps counting at every replay
          }
        });
        m.team_barrier();
        if (lead) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, R * (E + 1)),
                               [&](int i) { counts(i) = count(i / (E + 1), i % (E + 1)); });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, R), [&](int j) {
            // Demand: rows the layout needs (padded) before any drop; for the fixed layout the largest expert.
            const int end = ex((j + 1) * L) - ex(j * L);
            const int demand = s.fixed ? big(j) : end;
            rank_status(2 * j) = demand;
            rank_status(2 * j + 1) = drops(j);
            if (j == me) {
              expert_offsets(L) = clamp(end);
              status(2) = demand;
            }
            send_base(j) = S(me, j);
            fwd_base(j) = s.windows ? A(j, me) : S(me, j);
            arrive_base(j) = A(me, j);
            arrive_count(j) = j == me ? 0 : tok(j, me);
            ret_base(j) = s.windows ? S(j, me) : A(me, j);
            sent_rows(j) = 0;
            ret_rows(j) = 0;
          });
        }
        const int first = ex(me * L);
        auto own_offset = [&](int l) { return clamp(l == L ? ex((me + 1) * L) - first : ex(me * L + l) - first); };
        const std::int64_t recv_rows = pr.derive && own_offset(L) < pr.rows ? own_offset(L) : pr.rows;
        for (std::int64_t item = m.league_rank(); item < items; item += league) {
          const std::int64_t q0 = item * kPlaceItemsPerTeam;
          const int len = static_cast<int>(n - q0 < kPlaceItemsPerTeam ? n - q0 : kPlaceItemsPerTeam);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, len), [&](int jq) {
            const std::int64_t q = q0 + jq;
            if (q < slots) {
              const int pos = local_pos(q);
              const int e = static_cast<int>(idx(q / s.K, q % s.K));  // loaded beside pos: one chain, not two
              int row = -1, rank = -1;
              if (pos >= 0) {
                const int c = static_cast<int>(q / s.K) / s.chunk;
                const int dest = base(e) + chunk_prefix(static_cast<std::int64_t>(c) * E + e) + pos;
                rank = e / L;
                row = dest >= limit(e) ? -1 : dest;
                if (row < 0) Kokkos::atomic_add(&status(1), 1);
              }
              slot_row(q) = row;
              slot_rank(q) = rank;
              slot_kept(q) = row >= 0 ? 1 : 0;
            }
            if (q < pairs) {
              const int local = tok_local(q);
              const int t = static_cast<int>(q / R), r = static_cast<int>(q % R);
              tok_pos(q) = local < 0 ? -1 : chunk_tokens(static_cast<std::int64_t>(t / s.chunk) * R + r) + local;
            }
            if (q < recv_rows) {
              int owner = -1;
              if (q < own_offset(L)) {
                const int lo = last_start_at_or_below(L, q, own_offset);
                const int e = me * L + lo;
                const int row_end = own_offset(lo) + tot(e);
                if (q < row_end && q < limit(e)) owner = lo;
              }
              recv_expert(q) = owner;
              recv_src(q) = -1;
            }
          });
        }
      });
}

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
        const int lo = last_start_at_or_below(s.R, a, [&](int r) { return arrive_base(r); });
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

/// Adds one transfer of an operation to the traffic counters: forward (token rows this rank sent) or return (rows
/// it sent back); \p block_rows > 0 where the transport moves whole blocks of that many rows per peer, \p signals
/// the bytes of the window counters it raised.
template <class Mem>
KOKKOS_INLINE_FUNCTION void add_traffic(const EpShape& s, const Kokkos::View<int*, Mem>& rows,
                                        const Kokkos::View<std::int64_t*, Mem>& traffic, int op, std::int64_t pitch,
                                        std::int64_t row_bytes, std::int64_t block_rows, std::int64_t signals) {
  std::int64_t n = 0;
  for (int r = 0; r < s.R; ++r) n += r == s.me ? 0 : rows(r);
  traffic(2 * op) += n * row_bytes;
  traffic(2 * op + 1) += (block_rows > 0 ? static_cast<std::int64_t>(s.R - 1) * block_rows : n) * pitch + signals;
}

/// add_traffic in a kernel of one thread, behind the transfer's kernels.
template <class Exec>
void account_transfer(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v, int op,
                      bool forward, std::int64_t pitch, std::int64_t row_bytes, std::int64_t block_rows,
                      std::int64_t signals) {
  if (s.R == 1) return;
  auto rows = forward ? v.sent_rows : v.ret_rows;
  auto traffic = v.traffic;
  Kokkos::parallel_for(
      "KokkosMoE::ep::account", light(Kokkos::RangePolicy<Exec>(exec, 0, 1)),
      KOKKOS_LAMBDA(int) { add_traffic(s, rows, traffic, op, pitch, row_bytes, block_rows, signals); });
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
