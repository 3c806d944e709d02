/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_EP_ARRIVALKERNELS_HPP
#define KOKKOSMOE_EP_ARRIVALKERNELS_HPP

// The receive side of the EP layer (docs/ep.md §3.2-§3.4): expanding arrived token rows into the expert-major
// receive rows, reducing slots on the expert's rank and then over ranks, and the combine backward's dots.

#include <impl/KokkosMoE_EP_Native.hpp>
#include <impl/KokkosMoE_EP_PackKernels.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

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

/// The teams of a launch that walks the arrivals and zeroes the receive rows no slot feeds: `walkers` teams
/// (arrival_teams) walk, then one team per kZeroRows receive rows; a team's receive-row table holds `rows_len` ints
/// (K slots and two more for a walker, kZeroRows + 1 for a zeroing team).
struct WalkAndZeroTeams {
  std::int64_t walkers;
  int teams;
  int rows_len;
  WalkAndZeroTeams(const EpShape& s, std::int64_t arrivals, int recv_rows)
      : walkers(arrival_teams(s, arrivals)),
        teams(static_cast<int>(walkers) + (recv_rows + kZeroRows - 1) / kZeroRows),
        rows_len(s.K + 2 > kZeroRows + 1 ? s.K + 2 : kZeroRows + 1) {}
};

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

/// An arrival's kept slots in k order: rows(0), ... their receive rows (fwd(k) >= 0), their coefficients compacted in
/// cs in place, rows(K) their number, kept(n, k) for each (the slot's k where the caller needs it). One thread, then a
/// barrier.
template <class Member, class Ints, class Flts, class Kept>
KOKKOS_INLINE_FUNCTION void compact_kept(const Member& m, int K, const Ints& fwd, const Ints& rows, const Flts& cs,
                                         const Kept& kept) {
  Kokkos::single(Kokkos::PerTeam(m), [&]() {
    int n = 0;
    for (int k = 0; k < K; ++k) {
      if (fwd(k) < 0) continue;
      rows(n) = fwd(k);
      cs(n) = cs(k);  // n <= k: compacts in place
      kept(n, k);
      ++n;
    }
    rows(K) = n;
  });
  m.team_barrier();
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
  const WalkAndZeroTeams wz(s, arrivals, recv_rows);
  const std::int64_t walkers = wz.walkers;
  const int rows_len = wz.rows_len;
  const std::size_t shmem = SInt::shmem_size(rows_len) + SInt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  team_items(
      exec, s, label, wz.teams, shmem, KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) {
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
            team_fan_out<Unit>(
                m, 0, units, n, [&](int u) { return r[u]; }, [&](int d, int u) -> Unit& { return dst(rows(d), u); });
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
/// type, goes back once to its source rank, with a trailer of extra_f(row_k) per slot when \p trailer_off > 0. A team
/// function over walkers (arrival_teams) for one-kernel steps; reduce_arrivals launches it.
template <class Exec, class Scalar, class Unit>
struct ReduceArrivals {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  EpShape s;
  std::int64_t arrivals = 0;
  Unmanaged2<const Unit, Mem> src;
  LocalRows coef;
  Unmanaged1<const float, Mem> extra_f;
  Kokkos::View<int*, Mem> arrive_rank, arrive_base, arrive_count, fwd_rows;
  PeerRows<Mem> ret;
  std::size_t trailer_off = 0;

  ReduceArrivals(const EpShape& s_, std::int64_t arrivals_, const Unmanaged2<const Unit, Mem>& src_,
                 const LocalRows& coef_, const Unmanaged1<const float, Mem>& extra_f_, const EpLayoutViews<Mem>& v,
                 const PeerRows<Mem>& ret_, std::size_t trailer_off_)
      : s(s_),
        arrivals(arrivals_),
        src(src_),
        coef(coef_),
        extra_f(extra_f_),
        arrive_rank(v.arrive_rank),
        arrive_base(v.arrive_base),
        arrive_count(v.arrive_count),
        fwd_rows(v.fwd_rows),
        ret(ret_),
        trailer_off(trailer_off_) {}

  std::int64_t items() const { return arrivals == 0 ? 0 : arrival_teams(s, arrivals); }
  std::size_t shmem() const {
    return SInt::shmem_size(s.K + 2) + SInt::shmem_size(s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  }

  /// Walker \p item of \p walkers.
  KOKKOS_INLINE_FUNCTION void operator()(const Team& m, std::int64_t item, std::int64_t walkers,
                                         const TeamScratch<Exec>& sp) const {
    const int units = static_cast<int>(src.extent(1));
    const bool with_coef = coef.base != nullptr, with_f = extra_f.extent(0) > 0;
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
      if (i >= 0) compact_kept(m, s.K, fwd, rows, cs, [](int, int) {});
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
  }
};

template <class Exec, class Scalar, class Unit>
void reduce_arrivals(const Exec& exec, const EpShape s, std::int64_t arrivals,
                     const Unmanaged2<const Unit, typename Exec::memory_space>& src, const LocalRows coef,
                     const Unmanaged1<const float, typename Exec::memory_space>& extra_f,
                     const EpLayoutViews<typename Exec::memory_space>& v,
                     const PeerRows<typename Exec::memory_space>& ret, std::size_t trailer_off, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  const ReduceArrivals<Exec, Scalar, Unit> f(s, arrivals, src, coef, extra_f, v, ret, trailer_off);
  const std::int64_t walkers = f.items();
  team_items(
      exec, s, label, walkers, f.shmem(),
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) { f(m, item, walkers, sp); });
}

/// Return direction, source side: y[t] = the FP32 sum, over the ranks its kept slots reach in ascending order, of
/// each rank's partial rounded to the row type: this rank's own from the local rows (FP32 in k order, times w(t,k)
/// when \p coef is given), the others' as returned. out_f(t,k) gets the slot's float (local_f of its row here, the
/// returned trailer otherwise; 0 for empty and dropped slots). A team function over (token, column block) items for
/// one-kernel steps; reduce_ranks launches it.
template <class Exec, class Scalar, class Unit>
struct ReduceRanks {
  using Mem = typename Exec::memory_space;
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Ops = UnitOps<Scalar, Unit>;
  using SInt = Kokkos::View<int*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  using SFlt = Kokkos::View<float*, typename Exec::scratch_memory_space, Kokkos::MemoryUnmanaged>;
  EpShape s;
  Unmanaged2<const Unit, Mem> local;
  Unmanaged2<const float, Mem> coef;
  Unmanaged1<const float, Mem> local_f;
  LocalRows ret;
  std::size_t trailer_off = 0;
  Kokkos::View<int*, Mem> slot_row, slot_rank, tok_pos, send_base;
  Unmanaged2<Unit, Mem> y;
  Unmanaged2<float, Mem> out_f;
  RowSplit split;

  ReduceRanks(const EpShape& s_, const Unmanaged2<const Unit, Mem>& local_, const Unmanaged2<const float, Mem>& coef_,
              const Unmanaged1<const float, Mem>& local_f_, const LocalRows& ret_, std::size_t trailer_off_,
              const EpLayoutViews<Mem>& v, const Unmanaged2<Unit, Mem>& y_, const Unmanaged2<float, Mem>& out_f_,
              int teams = kSplitTeams)
      : s(s_),
        local(local_),
        coef(coef_),
        local_f(local_f_),
        ret(ret_),
        trailer_off(trailer_off_),
        slot_row(v.slot_row),
        slot_rank(v.slot_rank),
        tok_pos(v.tok_pos),
        send_base(v.send_base),
        y(y_),
        out_f(out_f_),
        split(row_split(s_.T, static_cast<int>(y_.extent(1)), teams)) {}  // decode sizes: a team per column block

  std::int64_t items() const { return static_cast<std::int64_t>(s.T) * split.blocks; }
  std::size_t shmem() const {
    return 3 * SInt::shmem_size(s.K + 1) + SInt::shmem_size(2 * s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) const {
    const int units = static_cast<int>(y.extent(1));
    const bool with_coef = coef.extent(0) > 0, with_f = out_f.extent(0) > 0;
    const int t = static_cast<int>(item / split.blocks), c = static_cast<int>(item % split.blocks);
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
    const int u0 = split.begin(c);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, split.end(c, units) - u0), [&](int ju) {
      const int u = u0 + ju;
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
    if (with_f && c == 0) {
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
  }
};

template <class Exec, class Scalar, class Unit>
void reduce_ranks(const Exec& exec, const EpShape s, const Unmanaged2<const Unit, typename Exec::memory_space>& local,
                  const Unmanaged2<const float, typename Exec::memory_space>& coef,
                  const Unmanaged1<const float, typename Exec::memory_space>& local_f, const LocalRows ret,
                  std::size_t trailer_off, const EpLayoutViews<typename Exec::memory_space>& v,
                  const Unmanaged2<Unit, typename Exec::memory_space>& y,
                  const Unmanaged2<float, typename Exec::memory_space>& out_f, const char* label) {
  using Team = typename Kokkos::TeamPolicy<Exec>::member_type;
  if (s.T == 0) return;
  // At decode sizes one wave: a second wave of a few teams costs a whole team's time (docs/ep.md §3.3).
  const ReduceRanks<Exec, Scalar, Unit> f(s, local, coef, local_f, ret, trailer_off, v, y, out_f,
                                          s.wave_teams > 0 ? s.wave_teams : kSplitTeams);
  team_items(
      exec, s, label, f.items(), f.shmem(),
      KOKKOS_LAMBDA(const Team& m, std::int64_t item, const TeamScratch<Exec>& sp) { f(m, item, sp); });
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
/// feeds are zeroed up to off(L), as in expand_arrivals; local rows were written by local_dots. A native kernel of the
/// space (EpNative) runs instead where it takes the arguments.
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
  if (EpNative<Exec>::template expand_with_dots<Scalar, Unit>(exec, s, arrivals, recv_rows, in, trailer_off, out, v,
                                                              dots, grad_out))
    return;
  const int units = static_cast<int>(grad_out.extent(1));
  auto recv_src = v.recv_src;
  auto recv_expert = v.recv_expert;
  auto arrive_rank = v.arrive_rank;
  auto arrive_base = v.arrive_base;
  auto arrive_count = v.arrive_count;
  auto fwd_rows = v.fwd_rows;
  auto offsets = v.expert_offsets;
  const WalkAndZeroTeams wz(s, arrivals, recv_rows);
  const std::int64_t walkers = wz.walkers;
  const int rows_len = wz.rows_len;
  const std::size_t shmem =
      SInt::shmem_size(rows_len) + 2 * SInt::shmem_size(s.K) + SFlt::shmem_size(s.K) + SInt::shmem_size(s.R + 1);
  team_items(
      exec, s, "KokkosMoE::ep_combine_backward::expert", wz.teams, shmem,
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
            compact_kept(m, s.K, fwd, rows, cs, [&](int n, int k) { ks(n) = k; });
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

}  // namespace Impl
}  // namespace KokkosMoE

#endif
