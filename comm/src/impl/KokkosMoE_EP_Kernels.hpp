/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_KERNELS_HPP
#define KOKKOSMOE_EP_KERNELS_HPP

// The portable kernels of the EP layer (docs/ep.md §3): layout, pack, unpack, return pack and reduce, as Kokkos
// parallel patterns that run on every backend. Slots are the (token, k) pairs with a valid expert id. Every slot
// either stays on this rank ("local": the pack writes straight into the receive rows) or goes through the source
// stage (rows ordered by expert, then source token, then k) to the peer's destination stage, from where the unpack
// scatters it into the expert-major receive rows. No atomics decide a position, so the layout is deterministic.

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
/// The per-row floats of a stage: the trailer of each stage row (weights travel in the same transfer as their rows),
/// or a contiguous array (stride 1).
template <class T, class Mem>
using Strided1 = Kokkos::View<T*, Kokkos::LayoutStride, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

/// Device-side metadata of one layer (the EpHandle's memory). Extents are the group's maxima.
template <class Mem>
struct EpLayoutViews {
  Kokkos::View<int*, Mem> local_pos;               // [B*K] rank of the slot among this chunk's slots of its expert
  Kokkos::View<int*, Mem> chunk_prefix;            // [nchunks*E] exclusive prefix over chunks, per expert
  Kokkos::View<int*, Mem> chunk_tokens;            // [nchunks*R] tokens of the chunk sending to rank r
  Kokkos::View<int*, Mem> chunk_bad;               // [nchunks] invalid ids in the chunk
  Kokkos::View<int*, Mem> tokens_per_expert;       // [E+1] this rank's slots per expert, then its invalid ids (payload)
  Kokkos::View<int*, Mem> tokens_per_rank;         // [R]
  Kokkos::View<std::uint8_t*, Mem> token_in_rank;  // [B*R]
  Kokkos::View<int*, Mem> counts;                  // [R*(E+1)] all-gathered tokens_per_expert: counts(i*(E+1) + e)
  Kokkos::View<int*, Mem> dest_base;               // [E] receive row on rank e/L of this rank's first slot of expert e
  Kokkos::View<int*, Mem> dest_limit;              // [E] rows >= this are dropped (capacity)
  Kokkos::View<int*, Mem> send_base;               // [E] source-stage row of this rank's first slot of expert e
  Kokkos::View<int*, Mem> send_limit;              // [E] source-stage rows >= this are dropped (capacity: block end)
  Kokkos::View<int*, Mem> expert_offsets;          // [L+1] receive rows of local expert l: [off(l), off(l) + count(l))
  Kokkos::View<int*, Mem> recv_count;              // [L] slots received per local expert (demand, before any drop)
  Kokkos::View<int*, Mem> src_base;                // [R*L] destination-stage row of source i's first slot for expert l
  Kokkos::View<int*, Mem> src_limit;  // [R*L] end of that segment (clipped to the peer block in capacity mode)
  Kokkos::View<int*, Mem> recv_base;  // [R*L] receive row of that slot
  Kokkos::View<int*, Mem> slot_row;   // [B*K] receive row (local) or source-stage row (remote); -1: none
  Kokkos::View<std::uint8_t*, Mem> slot_local;  // [B*K]
  Kokkos::View<std::uint8_t*, Mem> slot_kept;   // [B*K] 1 iff the slot has an expert and was not dropped
  Kokkos::View<int*, Mem> recv_expert;          // [N] local expert of each receive row, -1 for padding and drops
  Kokkos::View<int*, Mem> stage_map;            // [S_dst] receive row of each destination-stage row, -1: none
  Kokkos::View<int*, Mem> status;               // [4] invalid ids, dropped slots, receive demand (rows), unused
  Kokkos::View<int*, Mem> rank_status;          // [2R] every rank's receive demand and receive-side drops: (2j, 2j + 1)
};

/// The shape facts every layout kernel needs, by value.
struct EpShape {
  int T = 0, K = 0, E = 0, L = 0, R = 0, me = 0;
  int align = 1;       // A
  bool fixed = false;  // ExpertMajorFixed: expert l owns rows [l*slab, (l+1)*slab)
  int slab = 0;        // fixed: R*B
  int capacity = 0;    // > 0: receive rows of the padded layout (capacity mode); 0: eager
  int block = 0;       // capacity mode: rows per peer block of the stages
  int chunk = 32;      // tokens per layout team (layout_chunk(K))
  KOKKOS_INLINE_FUNCTION bool eager() const { return capacity == 0 && !fixed; }
};

KOKKOS_INLINE_FUNCTION int pad_to(int n, int a) { return a <= 1 ? n : (n + a - 1) / a * a; }

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
  if (nch > 0) {
    // The chunk's ids are staged in scratch; each slot's rank among the chunk's slots of its expert is a count of
    // earlier equal ids there (no serial walk through global memory), and the histogram takes scratch atomics.
    const int n_max = s.chunk * s.K;
    const std::size_t shmem = Scratch::shmem_size(s.E) + Scratch::shmem_size(s.R) + Scratch::shmem_size(n_max);
    Kokkos::TeamPolicy<Exec> policy(exec, nch, Kokkos::AUTO);
    Kokkos::parallel_for(
        "KokkosMoE::ep_layout::count", light(policy.set_scratch_size(0, Kokkos::PerTeam(shmem))),
        KOKKOS_LAMBDA(const Team& m) {
          const int c = m.league_rank();
          Scratch cnt(m.team_scratch(0), s.E);
          Scratch tok(m.team_scratch(0), s.R);
          Scratch ids(m.team_scratch(0), n_max);
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
                const bool ok = e >= 0 && e < s.E;
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
          Kokkos::single(Kokkos::PerTeam(m), [&]() { chunk_bad(c) = bad; });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E),
                               [&](int e) { chunk_prefix(static_cast<std::int64_t>(c) * s.E + e) = cnt(e); });
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R),
                               [&](int r) { chunk_tokens(static_cast<std::int64_t>(c) * s.R + r) = tok(r); });
        });
  }
  // K2: exclusive prefix over chunks per expert (teams e < E), per-rank token totals (teams E..E+R), invalid ids
  // (the last team). A team scan, so that no thread walks the chunks serially through global memory.
  auto per_expert = v.tokens_per_expert;
  auto per_rank = v.tokens_per_rank;
  auto status = v.status;
  Kokkos::parallel_for(
      "KokkosMoE::ep_layout::prefix", light(Kokkos::TeamPolicy<Exec>(exec, s.E + s.R + 1, Kokkos::AUTO)),
      KOKKOS_LAMBDA(const Team& m) {
        const int i = m.league_rank();
        if (i < s.E) {
          if (nch == 0) {
            Kokkos::single(Kokkos::PerTeam(m), [&]() { per_expert(i) = 0; });
            return;
          }
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, nch), [&](int c, int& part, bool final) {
            const std::int64_t at = static_cast<std::int64_t>(c) * s.E + i;
            const int n = chunk_prefix(at);
            if (final) {
              chunk_prefix(at) = part;
              if (c == nch - 1) per_expert(i) = part + n;
            }
            part += n;
          });
        } else if (i < s.E + s.R) {
          const int r = i - s.E;
          int run = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, nch),
              [&](int c, int& acc) { acc += chunk_tokens(static_cast<std::int64_t>(c) * s.R + r); }, run);
          Kokkos::single(Kokkos::PerTeam(m), [&]() { per_rank(r) = run; });
        } else {
          int bad = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, nch), [&](int c, int& acc) { acc += chunk_bad(c); }, bad);
          Kokkos::single(Kokkos::PerTeam(m), [&]() {
            status(0) = bad;
            status(1) = 0;
            status(3) = 0;
            per_expert(s.E) = bad;  // travels with the counts: every rank learns of every rank's invalid ids
          });
        }
      });
}

/// K3: offsets from the all-gathered counts (every rank derives every peer's offsets: no second exchange). One team
/// per destination rank j; the prefixes over its local experts are team scans in scratch memory.
template <class Exec>
void layout_offsets(const Exec& exec, const EpShape s, const EpLayoutViews<typename Exec::memory_space>& v) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Scratch = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  auto counts = v.counts;
  auto dest_base = v.dest_base;
  auto dest_limit = v.dest_limit;
  auto send_base = v.send_base;
  auto send_limit = v.send_limit;
  auto expert_offsets = v.expert_offsets;
  auto recv_count = v.recv_count;
  auto src_base = v.src_base;
  auto src_limit = v.src_limit;
  auto recv_base = v.recv_base;
  auto status = v.status;
  auto rank_status = v.rank_status;
  const std::size_t shmem = 6 * Scratch::shmem_size(s.L);
  Kokkos::TeamPolicy<Exec> policy(exec, s.R, Kokkos::AUTO);
  Kokkos::parallel_for(
      "KokkosMoE::ep_layout::offsets", light(policy.set_scratch_size(0, Kokkos::PerTeam(shmem))),
      KOKKOS_LAMBDA(const Team& m) {
        const int j = m.league_rank(), L = s.L, E = s.E;
        constexpr int kNone = 2147483647;
        auto count = [&](int i, int ee) { return counts(static_cast<std::int64_t>(i) * (E + 1) + ee); };
        Scratch tot(m.team_scratch(0), L), mine(m.team_scratch(0), L), off(m.team_scratch(0), L),
            blk(m.team_scratch(0), L), run(m.team_scratch(0), L), pre(m.team_scratch(0), L);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, L), [&](int l) {
          int n = 0;
          for (int i = 0; i < s.R; ++i) n += count(i, j * L + l);
          tot(l) = n;
          mine(l) = count(s.me, j * L + l);
          run(l) = 0;
        });
        m.team_barrier();
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, L), [&](int l, int& part, bool final) {
          const int n = s.fixed ? s.slab : pad_to(tot(l), s.align);
          if (final) off(l) = part;
          part += n;
        });
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, L), [&](int l, int& part, bool final) {
          if (final) blk(l) = part;
          part += mine(l);
        });
        m.team_barrier();
        // Eager: this rank's remote slots for ranks before j come first in its source stage.
        int remote_before = 0;
        if (s.eager() && j != s.me) {
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, j * L),
              [&](int ee, int& acc) {
                if (ee / L != s.me) acc += count(s.me, ee);
              },
              remote_before);
        }
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, L), [&](int l) {
          const int e = j * L + l;
          int before_me = 0;
          for (int i = 0; i < s.me; ++i) before_me += count(i, e);
          dest_base(e) = off(l) + before_me;
          dest_limit(e) = s.fixed ? off(l) + s.slab : (s.capacity > 0 ? s.capacity : kNone);
          if (j != s.me) {
            send_base(e) = s.eager() ? remote_before + blk(l) : j * s.block + blk(l);
            send_limit(e) = s.eager() ? kNone : (j + 1) * s.block;
          } else {
            send_base(e) = 0;
            send_limit(e) = 0;
            recv_count(l) = tot(l);
            // Capacity mode: offsets never point past the receive rows (docs/ep.md §4).
            expert_offsets(l) = s.capacity > 0 && off(l) > s.capacity ? s.capacity : off(l);
          }
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
        });
        if (j != s.me) return;
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          expert_offsets(L) = s.capacity > 0 && end > s.capacity ? s.capacity : end;
          status(2) = demand;
        });
        // Where each source's slots for each local expert sit in the destination stage and in the receive rows.
        int dst_off = 0;
        for (int i = 0; i < s.R; ++i) {
          m.team_barrier();
          int row_sum = 0;
          Kokkos::parallel_scan(Kokkos::TeamThreadRange(m, L), [&](int l, int& part, bool final) {
            if (final) pre(l) = part;
            part += count(i, s.me * L + l);
          });
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(m, L), [&](int l, int& acc) { acc += count(i, s.me * L + l); }, row_sum);
          m.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, L), [&](int l) {
            const int e = s.me * L + l;
            const std::int64_t at = static_cast<std::int64_t>(i) * L + l;
            recv_base(at) = off(l) + run(l);
            run(l) += count(i, e);
            const int start = s.eager() ? dst_off : i * s.block;
            if (i == s.me) {
              // Local slots never pass through the stages: an empty segment keeps the bases ordered.
              src_base(at) = start;
              src_limit(at) = start;
            } else {
              // Capacity mode: a segment is clipped to its source's block, its start too, so that the bases stay
              // ordered by (source, expert) for the search in layout_slots even where a source's slots for this
              // rank overflow its block (those past the block are dropped on the sender).
              const int base = start + pre(l);
              const int end = base + count(i, e);
              const int block_end = s.eager() ? end : (i + 1) * s.block;
              src_base(at) = base < block_end ? base : block_end;
              src_limit(at) = end < block_end ? end : block_end;
            }
          });
          if (i != s.me) dst_off += row_sum;
        }
      });
}

/// K4: each slot's row, the receive rows' expert ids and the destination-stage map.
template <class Exec, class IdxView>
void layout_slots(const Exec& exec, const EpShape s, const IdxView& idx,
                  const EpLayoutViews<typename Exec::memory_space>& v, int recv_rows, int stage_rows) {
  auto local_pos = v.local_pos;
  auto chunk_prefix = v.chunk_prefix;
  auto dest_base = v.dest_base;
  auto dest_limit = v.dest_limit;
  auto send_base = v.send_base;
  auto send_limit = v.send_limit;
  auto slot_row = v.slot_row;
  auto slot_local = v.slot_local;
  auto slot_kept = v.slot_kept;
  auto recv_expert = v.recv_expert;
  auto expert_offsets = v.expert_offsets;
  auto recv_count = v.recv_count;
  auto stage_map = v.stage_map;
  auto src_base = v.src_base;
  auto src_end = v.src_limit;
  auto recv_base = v.recv_base;
  auto status = v.status;
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  std::int64_t n = slots;
  n = recv_rows > n ? recv_rows : n;
  n = stage_rows > n ? stage_rows : n;
  Kokkos::parallel_for(
      "KokkosMoE::ep_layout::slots", light(Kokkos::RangePolicy<Exec>(exec, 0, n)), KOKKOS_LAMBDA(std::int64_t q) {
        const int L = s.L;
        if (q < slots) {
          const int pos = local_pos(q);
          int row = -1;
          std::uint8_t local = 0;
          if (pos >= 0) {
            const int e = static_cast<int>(idx(q / s.K, q % s.K));
            const int c = static_cast<int>(q / s.K) / s.chunk;
            const int within = chunk_prefix(static_cast<std::int64_t>(c) * s.E + e) + pos;
            const int dest = dest_base(e) + within;
            const bool dropped = dest >= dest_limit(e);
            if (e / L == s.me) {
              local = 1;
              row = dropped ? -1 : dest;
            } else {
              const int srow = send_base(e) + within;
              row = (dropped || srow >= send_limit(e)) ? -1 : srow;
            }
            if (row < 0) Kokkos::atomic_add(&status(1), 1);
          }
          slot_row(q) = row;
          slot_local(q) = local;
          slot_kept(q) = row >= 0 ? 1 : 0;
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
        }
        if (q < stage_rows) {
          // The last (source, expert) segment starting at or before q; segments are ordered by source then expert.
          const int nseg = s.R * L;
          int lo = 0, hi = nseg;
          while (hi - lo > 1) {
            const int mid = (lo + hi) / 2;
            if (src_base(mid) <= q) {
              lo = mid;
            } else {
              hi = mid;
            }
          }
          int target = -1;
          if (src_base(lo) <= q && q < src_end(lo)) {
            const int l = lo % L;
            const int row = recv_base(lo) + static_cast<int>(q - src_base(lo));
            target = row < dest_limit(s.me * L + l) ? row : -1;
          }
          stage_map(q) = target;
        }
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

/// Dispatch direction, source side: token t's row is read once and written to the receive row (local slots) or
/// the source-stage row (remote slots) of each of its slots; the slot's float (the top-k weight) travels alongside
/// when \p src_f is non-empty. Team q also zeroes receive row q when it holds no slot (padding, drops) and
/// \p zero_rows > q, so that one launch covers both.
template <class Exec, class Unit>
void pack_forward(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& src,
                  const Unmanaged2<const float, typename Exec::memory_space>& src_f,
                  const EpLayoutViews<typename Exec::memory_space>& v,
                  const Unmanaged2<Unit, typename Exec::memory_space>& local,
                  const Unmanaged1<float, typename Exec::memory_space>& local_f,
                  const Unmanaged2<Unit, typename Exec::memory_space>& stage,
                  const Strided1<float, typename Exec::memory_space>& stage_f, int zero_rows, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  const int league = s.T > zero_rows ? s.T : zero_rows;
  if (league == 0) return;
  // Either View may be empty (no tokens; nothing received): the row width comes from the other one.
  const int units = static_cast<int>(src.extent(1) > 0 ? src.extent(1) : local.extent(1));
  const bool with_f = src_f.extent(0) > 0;
  const bool zero_f = local_f.extent(0) > 0;
  auto slot_row = v.slot_row;
  auto slot_local = v.slot_local;
  auto recv_expert = v.recv_expert;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<Exec>(exec, league, Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const int t = m.league_rank();
        if (t < s.T) {
          const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) {
            const Unit val = src(t, u);
            for (int k = 0; k < s.K; ++k) {
              const int row = slot_row(q0 + k);
              if (row < 0) continue;
              if (slot_local(q0 + k)) {
                local(row, u) = val;
              } else {
                stage(row, u) = val;
              }
            }
          });
          if (with_f) {
            Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
              const int row = slot_row(q0 + k);
              if (row < 0) return;
              if (slot_local(q0 + k)) {
                local_f(row) = src_f(t, k);
              } else {
                stage_f(row) = src_f(t, k);
              }
            });
          }
        }
        if (t < zero_rows && recv_expert(t) < 0) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { local(t, u) = Unit{}; });
          if (zero_f) Kokkos::single(Kokkos::PerTeam(m), [&]() { local_f(t) = 0.0f; });
        }
      });
}

/// Dispatch direction, destination side: destination-stage row q goes to receive row stage_map(q).
template <class Exec, class Unit>
void unpack_forward(const Exec& exec, int stage_rows, const Unmanaged2<const Unit, typename Exec::memory_space>& stage,
                    const Strided1<const float, typename Exec::memory_space>& stage_f,
                    const EpLayoutViews<typename Exec::memory_space>& v,
                    const Unmanaged2<Unit, typename Exec::memory_space>& dst,
                    const Unmanaged1<float, typename Exec::memory_space>& dst_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (stage_rows == 0) return;
  const int units = static_cast<int>(dst.extent(1));
  const bool with_f = dst_f.extent(0) > 0;
  auto stage_map = v.stage_map;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<Exec>(exec, stage_rows, Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const int q = m.league_rank();
        const int row = stage_map(q);
        if (row < 0) return;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { dst(row, u) = stage(q, u); });
        if (with_f) Kokkos::single(Kokkos::PerTeam(m), [&]() { dst_f(row) = stage_f(q); });
      });
}

/// Receive rows that hold no slot (alignment padding, dropped slots) are zeroed, rows and floats.
template <class Exec, class Unit>
void zero_invalid_rows(const Exec& exec, int recv_rows, const EpLayoutViews<typename Exec::memory_space>& v,
                       const Unmanaged2<Unit, typename Exec::memory_space>& dst,
                       const Unmanaged1<float, typename Exec::memory_space>& dst_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (recv_rows == 0) return;
  const int units = static_cast<int>(dst.extent(1));
  const bool with_f = dst_f.extent(0) > 0;
  auto recv_expert = v.recv_expert;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<Exec>(exec, recv_rows, Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const int row = m.league_rank();
        if (recv_expert(row) >= 0) return;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { dst(row, u) = Unit{}; });
        if (with_f) Kokkos::single(Kokkos::PerTeam(m), [&]() { dst_f(row) = 0.0f; });
      });
}

/// Return direction, destination side: receive row stage_map(q) goes to destination-stage row q.
template <class Exec, class Unit>
void pack_return(const Exec& exec, int stage_rows, const Unmanaged2<const Unit, typename Exec::memory_space>& src,
                 const Unmanaged1<const float, typename Exec::memory_space>& src_f,
                 const EpLayoutViews<typename Exec::memory_space>& v,
                 const Unmanaged2<Unit, typename Exec::memory_space>& stage,
                 const Strided1<float, typename Exec::memory_space>& stage_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (stage_rows == 0) return;
  const int units = static_cast<int>(src.extent(1));
  const bool with_f = src_f.extent(0) > 0;
  auto stage_map = v.stage_map;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<Exec>(exec, stage_rows, Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const int q = m.league_rank();
        const int row = stage_map(q);
        if (row < 0) return;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { stage(q, u) = src(row, u); });
        if (with_f) Kokkos::single(Kokkos::PerTeam(m), [&]() { stage_f(q) = src_f(row); });
      });
}

/// Return direction, source side: y[t] = sum over valid k, in k order, of c(t,k) * row(slot(t,k)) in FP32, with
/// c = coef(t,k) when \p coef is non-empty, else 1; the slot's float lands in out_f(t,k) (0 for invalid slots).
template <class Exec, class Scalar, class Unit>
void reduce_return(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& local,
                   const Unmanaged1<const float, typename Exec::memory_space>& local_f,
                   const Unmanaged2<const Unit, typename Exec::memory_space>& stage,
                   const Strided1<const float, typename Exec::memory_space>& stage_f,
                   const Unmanaged2<const float, typename Exec::memory_space>& coef,
                   const EpLayoutViews<typename Exec::memory_space>& v,
                   const Unmanaged2<Unit, typename Exec::memory_space>& y,
                   const Unmanaged2<float, typename Exec::memory_space>& out_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  if (s.T == 0) return;
  const int units = static_cast<int>(y.extent(1));
  const bool with_coef = coef.extent(0) > 0;
  const bool with_rows = units > 0;
  const bool with_f = out_f.extent(0) > 0;
  auto slot_row = v.slot_row;
  auto slot_local = v.slot_local;
  Kokkos::parallel_for(
      label, light(Kokkos::TeamPolicy<Exec>(exec, s.T, Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const int t = m.league_rank();
        const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K;
        if (with_rows) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) {
            float acc[Ops::n];
            for (int i = 0; i < Ops::n; ++i) acc[i] = 0.0f;
            for (int k = 0; k < s.K; ++k) {
              const int row = slot_row(q0 + k);
              if (row < 0) continue;
              const float c = with_coef ? coef(t, k) : 1.0f;
              float val[Ops::n];
              Ops::load(slot_local(q0 + k) ? local(row, u) : stage(row, u), val);
              for (int i = 0; i < Ops::n; ++i) acc[i] += c * val[i];
            }
            Ops::store(acc, y(t, u));
          });
        }
        if (with_f) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
            const int row = slot_row(q0 + k);
            out_f(t, k) = row < 0 ? 0.0f : (slot_local(q0 + k) ? local_f(row) : stage_f(row));
          });
        }
      });
}

/// Combine backward, Weighted, one slot: dst(rd, :) = c * g(rg, :) and the FP32 dot(g(rg, :), out(ro, :)), in one
/// pass over the units (a team reduction in a fixed order). Both the source and the expert side use it.
template <class Scalar, class Unit, class Member, class G, class O, class D>
KOKKOS_INLINE_FUNCTION float scale_and_dot(const Member& m, int units, float c, const G& g, int rg, const O& out,
                                           int ro, const D& dst, int rd) {
  using Ops = UnitOps<Scalar, Unit>;
  float sum = 0.0f;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, units),
      [&](int u, float& part) {
        float x[Ops::n], z[Ops::n], y[Ops::n];
        Ops::load(g(rg, u), x);
        Ops::load(out(ro, u), z);
        for (int i = 0; i < Ops::n; ++i) {
          part += x[i] * z[i];
          y[i] = c * x[i];
        }
        Ops::store(y, dst(rd, u));
      },
      sum);
  return sum;
}

/// Combine backward, Weighted, source side: local slots get grad_out = w * grad_y[t] and
/// grad_w = dot(grad_y[t], out[row]) here; remote slots send grad_y[t] with w (the expert side finishes them).
template <class Exec, class Scalar, class Unit>
void combine_backward_source(const Exec& exec, const EpShape s,
                             const Unmanaged2<const Unit, typename Exec::memory_space>& grad_y,
                             const Unmanaged2<const float, typename Exec::memory_space>& w,
                             const Unmanaged2<const Unit, typename Exec::memory_space>& out,
                             const EpLayoutViews<typename Exec::memory_space>& v,
                             const Unmanaged2<Unit, typename Exec::memory_space>& grad_out,
                             const Unmanaged2<float, typename Exec::memory_space>& grad_w,
                             const Unmanaged2<Unit, typename Exec::memory_space>& stage,
                             const Strided1<float, typename Exec::memory_space>& stage_f) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  if (slots == 0) return;
  const int units = static_cast<int>(grad_y.extent(1));
  auto slot_row = v.slot_row;
  auto slot_local = v.slot_local;
  Kokkos::parallel_for(
      "KokkosMoE::ep_combine_backward::source",
      light(Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(slots), Kokkos::AUTO)), KOKKOS_LAMBDA(const Team& m) {
        const std::int64_t q = m.league_rank();
        const int t = static_cast<int>(q / s.K), k = static_cast<int>(q % s.K);
        const int row = slot_row(q);
        if (row < 0) {
          Kokkos::single(Kokkos::PerTeam(m), [&]() { grad_w(t, k) = 0.0f; });
          return;
        }
        const float c = w(t, k);
        if (slot_local(q)) {
          const float d = scale_and_dot<Scalar, Unit>(m, units, c, grad_y, t, out, row, grad_out, row);
          Kokkos::single(Kokkos::PerTeam(m), [&]() { grad_w(t, k) = d; });
        } else {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, units), [&](int u) { stage(row, u) = grad_y(t, u); });
          Kokkos::single(Kokkos::PerTeam(m), [&]() { stage_f(row) = c; });
        }
      });
}

/// Combine backward, Weighted, expert side: destination-stage row q holds grad_y of a remote slot and its weight
/// (the row's trailer): grad_out = w * g, and the slot's dot(g, out) goes to dots(q) for the way back.
template <class Exec, class Scalar, class Unit>
void combine_backward_expert(const Exec& exec, int stage_rows,
                             const Unmanaged2<const Unit, typename Exec::memory_space>& stage,
                             const Strided1<const float, typename Exec::memory_space>& stage_w,
                             const Unmanaged1<float, typename Exec::memory_space>& dots,
                             const Unmanaged2<const Unit, typename Exec::memory_space>& out,
                             const EpLayoutViews<typename Exec::memory_space>& v,
                             const Unmanaged2<Unit, typename Exec::memory_space>& grad_out) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (stage_rows == 0) return;
  const int units = static_cast<int>(out.extent(1));
  auto stage_map = v.stage_map;
  Kokkos::parallel_for(
      "KokkosMoE::ep_combine_backward::expert", light(Kokkos::TeamPolicy<Exec>(exec, stage_rows, Kokkos::AUTO)),
      KOKKOS_LAMBDA(const Team& m) {
        const int q = m.league_rank();
        const int row = stage_map(q);
        if (row < 0) return;
        const float c = stage_w(q);
        const float d = scale_and_dot<Scalar, Unit>(m, units, c, stage, q, out, row, grad_out, row);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { dots(q) = d; });
      });
}

/// Combine backward, Weighted, source side after the floats came back: remote slots' weight gradients.
template <class Exec>
void combine_backward_scatter(const Exec& exec, const EpShape s,
                              const Unmanaged1<const float, typename Exec::memory_space>& stage_f,
                              const EpLayoutViews<typename Exec::memory_space>& v,
                              const Unmanaged2<float, typename Exec::memory_space>& grad_w) {
  const std::int64_t slots = static_cast<std::int64_t>(s.T) * s.K;
  if (slots == 0) return;
  auto slot_row = v.slot_row;
  auto slot_local = v.slot_local;
  Kokkos::parallel_for(
      "KokkosMoE::ep_combine_backward::scatter", light(Kokkos::RangePolicy<Exec>(exec, 0, slots)),
      KOKKOS_LAMBDA(std::int64_t q) {
        const int row = slot_row(q);
        if (row >= 0 && !slot_local(q)) grad_w(q / s.K, q % s.K) = stage_f(row);
      });
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
