/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_DECODE_HPP
#define KOKKOSMOE_EP_DECODE_HPP

// The decode path (docs/ep.md §15): layout and dispatch fused into one send and one receive kernel over the peer
// windows, for the fixed expert-major layout and small batches. No count exchange runs ahead of the rows: each token
// row goes to its arrival index me * B + t on every rank it reaches, with K codes per token saying which of the
// receiver's experts it feeds and its rank among this rank's slots for that expert, and a short counts vector per
// rank (L counts, T, invalid ids) travels in the same epoch. The receiver places a slot of source i for expert l at
// l * R * B + (slots of sources before i for l) + its rank: the fixed layout's order (source rank, token, k), from
// prefix sums only. Ids must be distinct within a token (a repeat counts as invalid), so no source sends one expert
// more than B slots and the slabs never overflow.

#include <KokkosMoE_EpConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_EP_Kernels.hpp>
#include <impl/KokkosMoE_EP_Signal.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// The window regions of one decode dispatch: rows, codes and counts, signalled together.
constexpr RegionMask kDecodeRegions = (1u << kRegionFwd) | (1u << kRegionMeta) | (1u << kRegionCounts);

/// Ints per source rank in a rank's counts area: its slots for each of the L local experts, its T, its invalid ids.
KOKKOS_INLINE_FUNCTION constexpr int decode_count_words(int L) { return L + 2; }

/// Slot k of a token whose ids id(0), id(1), ... reads: its expert id, or -1 when empty, out of range or a repeat of
/// an earlier slot of the token (the decode path's rule, for ids in global memory and staged ones alike).
template <class Id>
KOKKOS_INLINE_FUNCTION int decode_rule(const Id& id, int E, int k) {
  const long long e = id(k);
  if (e < 0 || e >= E) return -1;
  for (int k2 = 0; k2 < k; ++k2)
    if (id(k2) == e) return -1;
  return static_cast<int>(e);
}

/// Slot k of token t as the decode path reads it (decode_rule).
template <class IdxView>
KOKKOS_INLINE_FUNCTION int decode_id(const IdxView& idx, int E, int t, int k) {
  return decode_rule([&](int k2) { return static_cast<long long>(idx(t, k2)); }, E, k);
}

/// Ids a decode kernel's team stages in scratch at a time (decode_stage): whole tokens, about 8 KB.
constexpr int kDecodeStageIds = 2048;

/// Tokens per staged tile (at least one).
KOKKOS_INLINE_FUNCTION constexpr int decode_stage_tokens(int K) {
  return K >= kDecodeStageIds ? 1 : kDecodeStageIds / K;
}

/// Team scratch of one staged tile (ints) for a step of \p T tokens.
KOKKOS_INLINE_FUNCTION constexpr int decode_stage_ints(int T, int K) {
  const int tokens = T < decode_stage_tokens(K) ? T : decode_stage_tokens(K);
  return (tokens > 0 ? tokens : 1) * K;
}

/// Tokens [t0, t1)'s ids into team scratch, raw(j) for slot j = (t - t0) * K + k: the expert, -1 for an empty slot,
/// -2 for an id out of range. One pass of independent loads (the team's threads side by side), then a barrier: the
/// kernels' slot ranks and counts then read scratch, not a chain of global loads per id.
template <class Member, class IdxView, class Ints>
KOKKOS_INLINE_FUNCTION void decode_stage(const Member& m, const EpShape& s, const IdxView& idx, int t0, int t1,
                                         const Ints& raw) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, (t1 - t0) * s.K), [&](int j) {
    const long long e = static_cast<long long>(idx(t0 + j / s.K, j % s.K));
    raw(j) = e >= 0 && e < s.E ? static_cast<int>(e) : (e == -1 ? -1 : -2);
  });
  m.team_barrier();
}

/// decode_id of staged slot j (decode_rule over its token's staged ids).
template <class Ints>
KOKKOS_INLINE_FUNCTION int decode_staged_id(const Ints& raw, int j, const EpShape& s) {
  const int first = j - j % s.K;
  return decode_rule([&](int k2) { return static_cast<long long>(raw(first + k2)); }, s.E, j % s.K);
}

/// Calls f(t0, t1) for the tiles of tokens [0, t) staged in turn into raw (a barrier between two: they share raw).
template <class Member, class IdxView, class Ints, class F>
KOKKOS_INLINE_FUNCTION void decode_tiles(const Member& m, const EpShape& s, const IdxView& idx, int t, const Ints& raw,
                                         const F& f) {
  const int tile = decode_stage_tokens(s.K);
  for (int t0 = 0; t0 < t; t0 += tile) {
    const int t1 = t0 + tile < t ? t0 + tile : t;
    if (t0 > 0) m.team_barrier();
    decode_stage(m, s, idx, t0, t1, raw);
    f(t0, t1);
  }
}

/// Token t's slots as the decode path numbers them, into team scratch: slots(k) the slot's expert (-1 none), slots(K +
/// k) its rank among this rank's slots of that expert, the tokens before t that chose it (-1 for an empty slot). One
/// pass over the earlier tokens' slots, staged in \p raw (decode_stage_ints ints): a valid id equal to one of t's
/// experts adds one to that slot's count (a count in scratch, the same in any order; a repeat is dropped, so a token
/// counts once per expert). Ends with a barrier.
template <class Member, class IdxView, class Ints>
KOKKOS_INLINE_FUNCTION void decode_slots(const Member& m, const EpShape& s, const IdxView& idx, int t,
                                         const Ints& slots, const Ints& raw) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
    slots(k) = decode_id(idx, s.E, t, k);
    slots(s.K + k) = 0;
  });
  decode_tiles(m, s, idx, t, raw, [&](int t0, int t1) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, (t1 - t0) * s.K), [&](int j) {
      const int e = decode_staged_id(raw, j, s);
      if (e < 0) return;
      for (int k = 0; k < s.K; ++k)
        if (slots(k) == e) {
          Kokkos::atomic_add(&slots(s.K + k), 1);
          break;  // t's experts are distinct
        }
    });
  });
  m.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
    if (slots(k) < 0) slots(s.K + k) = -1;
  });
  m.team_barrier();
}

/// The decode path's histogram of this rank's slots, into team scratch: cnt(e) slots per expert (E), then cnt(E + r)
/// tokens that reach rank r (R); the ids staged in \p raw (decode_stage_ints ints). Returns the invalid ids (out of
/// range or repeated, not -1). Ends with a barrier.
template <class Member, class IdxView, class Ints>
KOKKOS_INLINE_FUNCTION int decode_histogram(const Member& m, const EpShape& s, const IdxView& idx, const Ints& cnt,
                                            const Ints& raw) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E + s.R), [&](int e) { cnt(e) = 0; });
  int bad = 0;
  decode_tiles(m, s, idx, s.T, raw, [&](int t0, int t1) {
    int part = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, t1 - t0),
        [&](int jt, int& acc) {
          std::uint64_t reached = 0;  // R <= EpDecodeLimits::max_ep_size
          for (int k = 0; k < s.K; ++k) {
            const int j = jt * s.K + k;
            const int e = decode_staged_id(raw, j, s);
            if (e >= 0) {
              Kokkos::atomic_add(&cnt(e), 1);  // a histogram: the same counts in any order
              reached |= std::uint64_t(1) << (e / s.L);
            } else if (raw(j) != -1) {
              ++acc;
            }
          }
          for (int r = 0; r < s.R; ++r)
            if ((reached >> r) & 1u) Kokkos::atomic_add(&cnt(s.E + r), 1);
        },
        part);
    bad += part;
  });
  m.team_barrier();
  return bad;
}

/// This rank's vector as the layout would gather it (slots per expert, invalid ids, tokens per rank), from the
/// histogram.
template <class Member, class Mem, class Ints>
KOKKOS_INLINE_FUNCTION void decode_gather_send(const Member& m, const EpShape& s, const EpLayoutViews<Mem>& v,
                                               const Ints& cnt, int bad) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.E + 1 + s.R),
                       [&](int j) { v.gather_send(j) = j < s.E ? cnt(j) : (j == s.E ? bad : cnt(j - 1)); });
}

/// The maps every later operation reads that follow from the sources' counts alone: count(i, c) is source i's slots
/// for this rank's local expert c < L, its T at c = L, its invalid ids at c = L + 1. Counts, offsets (slabs of R * B
/// rows), the load, the arrival bases and the demand.
template <class Member, class Mem, class Count>
KOKKOS_INLINE_FUNCTION void decode_maps(const Member& m, const EpShape& s, const EpLayoutViews<Mem>& v,
                                        const Count& count) {
  const std::int64_t RB = static_cast<std::int64_t>(s.R) * s.B;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R * (s.E + 1)), [&](int j) {
    const int i = j / (s.E + 1), e = j % (s.E + 1);
    v.counts(j) = e == s.E ? count(i, s.L + 1) : (e / s.L == s.me ? count(i, e % s.L) : 0);
  });
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.L + 1),
                       [&](int l) { v.expert_offsets(l) = static_cast<int>(l * RB); });
  int demand = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, s.L),
      [&](int l, int& mx) {
        int n = 0;
        for (int i = 0; i < s.R; ++i) n += count(i, l);
        v.recv_count(l) = n;
        v.expert_load(l) += n;
        mx = n > mx ? n : mx;
      },
      Kokkos::Max<int>(demand));
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R), [&](int j) {
    v.arrive_base(j) = j * s.B;
    v.arrive_count(j) = j == s.me ? 0 : count(j, s.L);
    v.send_base(j) = j * s.B;
    v.fwd_base(j) = s.me * s.B;
    v.ret_base(j) = s.me * s.B;
    v.rank_status(2 * j) = j == s.me ? demand : 0;
    v.rank_status(2 * j + 1) = 0;  // the slabs hold every slot: nothing drops
  });
  Kokkos::single(Kokkos::PerTeam(m), [&]() { v.status(2) = demand; });
}

/// Slab l's rows past its n slots are owned by nobody (the masked slab: they are not written).
template <class Member, class Mem>
KOKKOS_INLINE_FUNCTION void decode_mask_slab(const Member& m, const EpShape& s, const EpLayoutViews<Mem>& v, int l,
                                             int n) {
  const std::int64_t RB = static_cast<std::int64_t>(s.R) * s.B;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, static_cast<int>(RB) - n), [&](int j) {
    const std::int64_t q = l * RB + n + j;
    v.recv_expert(q) = -1;
    v.recv_src(q) = -1;
  });
}

/// The rows a decode dispatch moves, as its kernels see them: token t's columns [u0, u1) go to n destination rows
/// (put), an arrived wire row goes to n receive rows (get). A destination row is the base of its units, codes(i), and
/// of its scales, scales(i) (FP8 rows only).
///
/// Rows of x's element type: units move unchanged.
template <class Exec, class Unit>
struct DecodeRows {
  using Mem = typename Exec::memory_space;
  Unmanaged2<const Unit, Mem> x;
  Unmanaged2<Unit, Mem> recv;
  KOKKOS_INLINE_FUNCTION int units() const { return static_cast<int>(x.extent(1)); }
  RowSplit split(int T, int teams) const { return row_split(T, units(), teams); }
  static std::size_t shmem(const RowSplit&) { return 0; }
  KOKKOS_INLINE_FUNCTION char* local_codes(int q) const { return reinterpret_cast<char*>(&recv(q, 0)); }
  KOKKOS_INLINE_FUNCTION float* local_scales(int) const { return nullptr; }
  template <int Batch, class Member, class Space, class Codes, class Scales>
  KOKKOS_INLINE_FUNCTION void put(const Member& m, const Space&, int t, int u0, int u1, int n, const Codes& codes,
                                  const Scales&) const {
    team_fan_out<Unit, Batch>(
        m, u0, u1, n, [&](int u) { return x(t, u); },
        [&](int i, int u) -> Unit& { return reinterpret_cast<Unit*>(codes(i))[u]; });
  }
  template <int Batch, class Member, class Rows>
  KOKKOS_INLINE_FUNCTION void get(const Member& m, const char* row, int n, const Rows& rows) const {
    const Unit* src = reinterpret_cast<const Unit*>(row);
    team_fan_out<Unit, Batch>(
        m, 0, static_cast<int>(recv.extent(1)), n, [&](int u) { return src[u]; },
        [&](int d, int u) -> Unit& { return recv(rows(d), u); });
  }
};

/// FP8 rows (docs/ep.md §3.5): quantized in the send from float or bf16 rows (QuantizingRows) or given
/// (QuantizedRows); on the wire H bytes of codes, then H / 128 FP32 scales. A column block covers whole 128-channel
/// blocks. The send takes each unit's largest |x| into scratch, each block's scale from its units' (a maximum: the same
/// in any order, so the scales and codes of pack_fp8_tokens), then the codes.
template <class Exec, class Src>
struct DecodeFp8Rows {
  using Mem = typename Exec::memory_space;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  Src src;
  Unmanaged2<Chunk16, Mem> recv_q;  // [N, H / 16]
  Unmanaged2<float, Mem> recv_s;    // [N, H / 128]
  int hidden = 0;
  KOKKOS_INLINE_FUNCTION int units() const { return hidden / 16; }
  RowSplit split(int T, int teams) const {
    RowSplit r = row_split(T, units(), teams);
    r.width = (r.width + kFp8UnitsPerBlock - 1) / kFp8UnitsPerBlock * kFp8UnitsPerBlock;
    r.blocks = (units() + r.width - 1) / r.width;
    return r;
  }
  static std::size_t shmem(const RowSplit& r) {
    return SFlt::shmem_size(r.width) + SFlt::shmem_size(r.width / kFp8UnitsPerBlock);
  }
  KOKKOS_INLINE_FUNCTION char* local_codes(int q) const { return reinterpret_cast<char*>(&recv_q(q, 0)); }
  KOKKOS_INLINE_FUNCTION float* local_scales(int q) const { return &recv_s(q, 0); }
  template <int Batch, class Member, class Space, class Codes, class Scales>
  KOKKOS_INLINE_FUNCTION void put(const Member& m, const Space& sp, int t, int u0, int u1, int n, const Codes& codes,
                                  const Scales& scales) const {
    const int b0 = u0 / kFp8UnitsPerBlock, b1 = u1 / kFp8UnitsPerBlock;
    const SFlt amax(sp, u1 - u0), scale(sp, b1 - b0);
    if (Src::quantizes) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, u0, u1), [&](int u) { amax(u - u0) = src.amax16(t, u); });
      m.team_barrier();
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, b0, b1), [&](int b) {
      float a = 0.0f;
      if (Src::quantizes)
        for (int j = 0; j < kFp8UnitsPerBlock; ++j) {
          const float aj = amax((b - b0) * kFp8UnitsPerBlock + j);
          a = aj > a ? aj : a;
        }
      const float sc = src.scale(t, b, a);
      scale(b - b0) = sc;
      for (int i = 0; i < n; ++i) scales(i)[b] = sc;
    });
    m.team_barrier();
    team_unit_block<Batch>(m, u0, u1, [&](int b, int nb, int end) {
      Chunk16 val[Batch];
      for (int j = 0; j < Batch; ++j) {
        const int u = b + j * nb;
        if (u < end) val[j] = src.unit(t, u, scale(u / kFp8UnitsPerBlock - b0));
      }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < Batch; ++j)
          if (b + j * nb < end) reinterpret_cast<Chunk16*>(codes(i))[b + j * nb] = val[j];
    });
  }
  template <int Batch, class Member, class Rows>
  KOKKOS_INLINE_FUNCTION void get(const Member& m, const char* row, int n, const Rows& rows) const {
    const Chunk16* q = reinterpret_cast<const Chunk16*>(row);
    const float* sc = reinterpret_cast<const float*>(row + hidden);
    team_fan_out<Chunk16, Batch>(
        m, 0, hidden / 16, n, [&](int u) { return q[u]; },
        [&](int d, int u) -> Chunk16& { return recv_q(rows(d), u); });
    team_fan_out<float, 1>(
        m, 0, hidden / kFp8BlockChannels, n, [&](int b) { return sc[b]; },
        [&](int d, int b) -> float& { return recv_s(rows(d), b); });
  }
};

/// Where the decode kernels write in the peers' windows and read in this rank's.
template <class Mem>
struct DecodeWire {
  Kokkos::View<const std::uintptr_t*, Mem> fwd, meta, counts;  // every rank's regions
  const char* in_fwd = nullptr;                                // this rank's
  const int* in_meta = nullptr;
  const int* in_counts = nullptr;
  std::size_t pitch = 0;        // bytes per token row
  std::size_t trailer_off = 0;  // where its K weights start
  std::size_t scales_off = 0;   // where an FP8 row's scales start
  std::size_t row_bytes = 0;    // the row's own bytes (the traffic counters' logical bytes)
};

/// One decode dispatch over the windows: what its send and receive phases read and write, and the phases as team
/// functions over work items.
///
/// Send (a team per token block, and one for the counts). Token t's K codes go to every rank (l * B + rank of the slot
/// among this rank's slots of expert l, -1 where the slot is not that rank's), its row and weights to every rank it
/// reaches, this rank's own included (its arrival space is where the receive phase finds it). The sender's maps get
/// the slots' ranks and codes (a remote slot's code stands for its row: it is kept, and only the expert's rank needs
/// its row). The counts item counts the slots per expert, the invalid ids and the tokens per rank, writes them where
/// the layout would (gather_send, status, the traffic counters) and sends each rank its counts vector.
///
/// Receive, after the window's epoch arrived (a team per arrival index a = i * B + t, source i, token t < T_i, then one
/// per local expert, then one for the maps). An arrival's codes give its receive rows; its row and weights go there,
/// and the maps the later operations read (fwd_rows, arrive_rank, recv_src, recv_expert, recv_k) get it as the layout
/// would have written them. This rank's own tokens are local slots: their rows are written here and their slot_row
/// becomes the receive row. An expert's item marks the rows past its count unowned (they are not written: the masked
/// slab). The last item derives counts, offsets and bases from the counts vectors.
template <class Exec, class Rows, class IdxView>
struct DecodeDispatch {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  EpShape s;
  IdxView idx;
  Rows rows;
  Unmanaged2<const float, Mem> w;
  EpLayoutViews<Mem> v;
  DecodeWire<Mem> d;
  Unmanaged1<float, Mem> recv_w;
  RowSplit split;

  KOKKOS_INLINE_FUNCTION std::int64_t send_items() const { return static_cast<std::int64_t>(s.T) * split.blocks + 1; }
  std::size_t send_shmem() const {
    const std::size_t stage = SInt::shmem_size(decode_stage_ints(s.T, s.K));
    const std::size_t a = PackScratch<Exec>::shmem(s) + stage + Rows::shmem(split),
                      b = SInt::shmem_size(s.E + s.R) + stage;
    return a > b ? a : b;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t receive_items() const { return static_cast<std::int64_t>(s.R) * s.B + s.L + 1; }
  std::size_t receive_shmem() const { return SInt::shmem_size(2 * s.K + 1); }

  KOKKOS_INLINE_FUNCTION void send(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) const {
    const int units = rows.units();
    const int CW = decode_count_words(s.L);
    if (item == send_items() - 1) {
      SInt cnt(sp, s.E + s.R);  // slots per expert, then tokens per rank
      SInt raw(sp, decode_stage_ints(s.T, s.K));
      const int bad = decode_histogram(m, s, idx, cnt, raw);
      decode_gather_send(m, s, v, cnt, bad);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R), [&](int r) {
        v.sent_rows(r) = r == s.me ? 0 : cnt(s.E + r);
        v.ret_rows(r) = 0;  // the receive phase counts the returns
      });
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R * CW), [&](int j) {
        const int r = j / CW, c = j % CW;
        reinterpret_cast<int*>(d.counts(r))[s.me * CW + c] = c < s.L ? cnt(r * s.L + c) : (c == s.L ? s.T : bad);
      });
      Kokkos::single(Kokkos::PerTeam(m), [&]() {
        v.status(0) = bad;
        v.status(1) = 0;
        v.status(3) = 0;
        // The layout's part of the wire: the codes of every token, the counts vector and their two 16-byte
        // signals, to each peer.
        v.traffic(2 * kOpLayout + 1) += static_cast<std::int64_t>(s.R - 1) * ((CW + s.T * s.K) * 4 + 32);
        // The rows: one per (token, remote rank reached), and this rank's arrive signal to each peer.
        std::int64_t rows = 0;
        for (int r = 0; r < s.R; ++r) rows += r == s.me ? 0 : cnt(s.E + r);
        v.traffic(2 * kOpDispatch) += rows * static_cast<std::int64_t>(d.row_bytes);
        v.traffic(2 * kOpDispatch + 1) +=
            rows * static_cast<std::int64_t>(d.pitch) + 16 * static_cast<std::int64_t>(s.R - 1);
      });
      return;
    }
    const int t = static_cast<int>(item / split.blocks), c = static_cast<int>(item % split.blocks);
    const PackScratch<Exec> p(sp, s);
    SInt raw(sp, decode_stage_ints(s.T, s.K));
    decode_slots(m, s, idx, t, p.slots, raw);
    const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K, a = static_cast<std::int64_t>(s.me) * s.B + t;
    // The token's first block sends its codes and weights and writes its maps; every block its columns of the row.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, c == 0 ? s.R * s.K : 0), [&](int j) {
      const int r = j / s.K, k = j % s.K, e = p.slots(k);
      const int code = e >= 0 && e / s.L == r ? (e % s.L) * s.B + p.slots(s.K + k) : -1;
      reinterpret_cast<int*>(d.meta(r))[a * s.K + k] = code;
      if (e >= 0 && e / s.L == r) v.slot_row(q0 + k) = code;
      if (r == 0) {
        v.slot_rank(q0 + k) = e >= 0 ? e / s.L : -1;
        v.slot_kept(q0 + k) = e >= 0 ? 1 : 0;
        if (e < 0) v.slot_row(q0 + k) = -1;
      }
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.R), [&](int r) {
      bool reach = false;
      for (int k = 0; k < s.K; ++k) reach = reach || (p.slots(k) >= 0 && p.slots(k) / s.L == r);
      const std::int64_t tr = static_cast<std::int64_t>(t) * s.R + r;
      if (c == 0) {
        v.token_in_rank(tr) = reach ? 1 : 0;
        v.tok_pos(tr) = reach ? t : -1;
      }
      p.raddr(r) = reach ? d.fwd(r) + static_cast<std::size_t>(a) * d.pitch : 0;
    });
    m.team_barrier();
    Kokkos::single(Kokkos::PerTeam(m), [&]() {
      int nr = 0;
      for (int r = 0; r < s.R; ++r)
        if (p.raddr(r) != 0) p.ptr(nr++) = p.raddr(r);  // nr <= min(R, K): a rank is reached by a slot
      p.lrow(s.K + 1) = nr;
    });
    m.team_barrier();
    const int nr = p.lrow(s.K + 1);
    rows.template put<kResidentBatch>(
        m, sp, t, split.begin(c), split.end(c, units), nr, [&](int i) { return reinterpret_cast<char*>(p.ptr(i)); },
        [&](int i) { return reinterpret_cast<float*>(p.ptr(i) + d.scales_off); });
    if (c == 0) p.template weights<Mem>(m, s, t, w, d.trailer_off, Unmanaged1<float, Mem>(), 0, nr);
  }

  KOKKOS_INLINE_FUNCTION void receive(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) const {
    const bool with_w = recv_w.extent(0) > 0;
    const int CW = decode_count_words(s.L);
    const std::int64_t RB = static_cast<std::int64_t>(s.R) * s.B;
    const int* cnt = d.in_counts;  // [R][CW]
    if (item >= RB + s.L) {
      decode_maps(m, s, v, [&](int i, int c) { return cnt[i * CW + c]; });
      return;
    }
    if (item >= RB) {
      const int l = static_cast<int>(item - RB);
      int n = 0;
      for (int i = 0; i < s.R; ++i) n += cnt[i * CW + l];
      decode_mask_slab(m, s, v, l, n);
      return;
    }
    const std::int64_t a = item;
    const int i = static_cast<int>(a / s.B), t = static_cast<int>(a % s.B);
    const bool mine = i == s.me;
    if (t >= cnt[i * CW + s.L]) {
      // No token of source i here this step: the index feeds nothing.
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) { v.fwd_rows(a * s.K + k) = -1; });
      Kokkos::single(Kokkos::PerTeam(m), [&]() { v.arrive_rank(a) = -1; });
      return;
    }
    SInt to(sp, 2 * s.K + 1);  // per k the receive row (-1 none), then the compacted rows, their count last
    const char* row = d.in_fwd + static_cast<std::size_t>(a) * d.pitch;
    const float* trailer = reinterpret_cast<const float*>(row + d.trailer_off);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
      const int code = d.in_meta[a * s.K + k];
      int q = -1;
      if (code >= 0) {
        const int l = code / s.B;
        int base = 0;
        for (int i2 = 0; i2 < i; ++i2) base += cnt[i2 * CW + l];
        q = static_cast<int>(l * RB) + base + code % s.B;
        v.recv_expert(q) = l;
        v.recv_src(q) = mine ? -1 : static_cast<int>(a);
        v.recv_k(q) = k;
        if (with_w) recv_w(q) = trailer[k];
        if (mine) v.slot_row(static_cast<std::int64_t>(t) * s.K + k) = q;
      }
      to(k) = q;
      v.fwd_rows(a * s.K + k) = mine ? -1 : q;
    });
    m.team_barrier();
    Kokkos::single(Kokkos::PerTeam(m), [&]() {
      int n = 0;
      for (int k = 0; k < s.K; ++k)
        if (to(k) >= 0) to(s.K + n++) = to(k);
      to(2 * s.K) = n;
      v.arrive_rank(a) = !mine && n > 0 ? i : -1;
      if (!mine && n > 0) Kokkos::atomic_add(&v.ret_rows(i), 1);  // a count, not a position
    });
    m.team_barrier();
    rows.template get<kResidentBatch>(m, row, to(2 * s.K), [&](int dd) { return to(s.K + dd); });
  }
};

/// The whole decode dispatch over the windows in one kernel of \p league resident teams (EpGroupState::
/// resident_league): every team waits until every peer freed the previous epoch's rows, codes and counts, takes its
/// send items, and meets the others at a ticket: the last team to arrive raises this rank's arrive counters of the
/// three regions in every rank, this one included. Every team waits for every rank's, takes its receive items and
/// meets the others again: the last one tells every peer the epoch's regions are free and advances the epochs. A wait
/// past the deadline sets the group's error word and every later wait returns at once: the teams skip their items and
/// still pass both tickets, so the kernel ends.
template <class Exec, class Rows, class IdxView>
void decode_step(const Exec& exec, const DecodeDispatch<Exec, Rows, IdxView>& f,
                 const WindowSignals<typename Exec::memory_space>& sig, int league, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  const std::size_t shmem = f.send_shmem() > f.receive_shmem() ? f.send_shmem() : f.receive_shmem();
  const std::int64_t ns = f.send_items(), nr = f.receive_items();
  resident_teams(
      exec, league, shmem, label, KOKKOS_LAMBDA(const Team& m, void* buf) {
        const TeamMeet<Team, typename Exec::memory_space> meet{m, sig};
        if (meet.wait(kDecodeRegions, 1, 0))
          team_stride(m, ns, [&](std::int64_t i) { f.send(m, i, TeamScratch<Exec>(buf, shmem)); });
        meet.ticket(0, [&]() { meet.raise(kDecodeRegions, 0, true); });
        if (meet.wait(kDecodeRegions, 0, 1, true))
          team_stride(m, nr, [&](std::int64_t i) { f.receive(m, i, TeamScratch<Exec>(buf, shmem)); });
        meet.ticket(1, [&]() {
          meet.raise(kDecodeRegions, 1);
          meet.advance(kDecodeRegions);
        });
      });
}

/// One rank (no peer, no window): the whole decode dispatch in one kernel. A team per token places its slots where
/// the receive kernel would (expert l's slot of rank p at row l * B + p) and writes its row, weights and maps there;
/// a team per expert counts its slots and masks the slab past them; the last team writes the counts, offsets and
/// status from the histogram. No team waits for another.
template <class Exec, class Rows, class IdxView>
void decode_local(const Exec& exec, const EpShape s, const IdxView& idx, const Rows& rows,
                  const Unmanaged2<const float, typename Exec::memory_space>& w,
                  const EpLayoutViews<typename Exec::memory_space>& v,
                  const Unmanaged1<float, typename Exec::memory_space>& recv_w, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  const int units = rows.units();
  const bool with_w = recv_w.extent(0) > 0;
  const RowSplit split = rows.split(s.T, kSplitTeams);
  const int stage = decode_stage_ints(s.T, s.K);
  const std::size_t a = SInt::shmem_size(s.E + s.R) + SInt::shmem_size(stage),
                    b = SInt::shmem_size(3 * s.K + 1) + SInt::shmem_size(stage) + Rows::shmem(split);
  const std::size_t shmem = a > b ? a : b;
  const std::int64_t blocks = static_cast<std::int64_t>(s.T) * split.blocks;
  team_items(
      exec, s, label, blocks + s.L + 1, shmem,
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
        if (item == blocks + s.L) {
          SInt cnt(sp, s.E + s.R);
          SInt raw(sp, stage);
          const int bad = decode_histogram(m, s, idx, cnt, raw);
          decode_gather_send(m, s, v, cnt, bad);
          decode_maps(m, s, v, [&](int, int c) { return c < s.L ? cnt(c) : (c == s.L ? s.T : bad); });
          Kokkos::single(Kokkos::PerTeam(m), [&]() {
            v.status(0) = bad;
            v.status(1) = 0;
            v.status(3) = 0;
            v.sent_rows(0) = 0;
            v.ret_rows(0) = 0;
          });
          return;
        }
        if (item >= blocks) {
          const int l = static_cast<int>(item - blocks);
          SInt raw(sp, stage);
          int n = 0;
          decode_tiles(m, s, idx, s.T, raw, [&](int t0, int t1) {
            int part = 0;
            Kokkos::parallel_reduce(
                Kokkos::TeamThreadRange(m, (t1 - t0) * s.K),
                [&](int j, int& acc) { acc += decode_staged_id(raw, j, s) == l ? 1 : 0; }, part);
            n += part;
          });
          decode_mask_slab(m, s, v, l, n);
          return;
        }
        const int t = static_cast<int>(item / split.blocks), c = static_cast<int>(item % split.blocks);
        SInt slots(sp, 3 * s.K + 1);  // decode_slots' 2K, then the compacted receive rows, their count last
        SInt raw(sp, stage);
        decode_slots(m, s, idx, t, slots, raw);
        const std::int64_t q0 = static_cast<std::int64_t>(t) * s.K;
        // The token's first block writes its maps; every block its columns of the rows.
        if (c == 0)
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, s.K), [&](int k) {
            const int e = slots(k);
            const int q = e >= 0 ? e * s.B + slots(s.K + k) : -1;
            v.slot_row(q0 + k) = q;
            v.slot_rank(q0 + k) = e >= 0 ? 0 : -1;
            v.slot_kept(q0 + k) = e >= 0 ? 1 : 0;
            if (e < 0) return;
            v.recv_expert(q) = e;
            v.recv_src(q) = -1;
            v.recv_k(q) = k;
            if (with_w) recv_w(q) = w(t, k);
          });
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          int n = 0;
          for (int k = 0; k < s.K; ++k)
            if (slots(k) >= 0) slots(2 * s.K + n++) = slots(k) * s.B + slots(s.K + k);
          slots(3 * s.K) = n;
          if (c > 0) return;
          v.token_in_rank(t) = n > 0 ? 1 : 0;
          v.tok_pos(t) = n > 0 ? t : -1;
        });
        m.team_barrier();
        rows.template put<kUnitBatch>(
            m, sp, t, split.begin(c), split.end(c, units), slots(3 * s.K),
            [&](int i) { return rows.local_codes(slots(2 * s.K + i)); },
            [&](int i) { return rows.local_scales(slots(2 * s.K + i)); });
      });
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
