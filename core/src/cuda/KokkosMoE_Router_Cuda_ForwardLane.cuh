/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARDLANE_CUH
#define KOKKOSMOE_ROUTER_CUDA_FORWARDLANE_CUH

// topk_fwd_lane<L, TPT, NC, W, K, QB>: the forward fast path of topk_router (every routing output kind, not
// aux_scores) for E <= TPT*NC*W (E % W == 0), k <= TPT, NC*W <= 32, groups only with NC == 1. It replaces the
// register kernels of KokkosMoE_Router_Cuda_Forward.cuh where it applies. Those are instruction-issue bound, not
// memory bound, mostly on integer selection work, so this kernel is built to issue fewer instructions per token:
// unique packed keys make one redux name a winner, and short lane lists avoid rescanning (docs/design.md).
//
// Mapping: TPT lanes own one token; lane `ls` owns NC chunks of W contiguous experts, chunk c covering experts
// (c*TPT + ls)*W .. +W-1 (16- or 32-byte loads). Per token:
//   1. activations, order-preserving keys (docs/router.md §5.1, §7) and early FP32 outputs, chunk by chunk; the
//      activation and key rows also go to a per-token shared row. Only the packed keys stay in registers: the
//      key's upper 32-IB bits over the inverted expert index (IB = index bits of the row), unique per token;
//   2. group-limited routing (§5.3, NC == 1, kg <= 2): lane top-2 keys merged over the lanes of a group; with
//      G <= 8 each group's rank comes from G independent shuffles, otherwise gk rounds of a segment max pick the
//      best groups (lowest group on equal scores either way);
//   3. per-lane lists of the best 3 packed keys (4 with 32 experts per lane: fewer refills), built by a merging
//      network; then k selections in pairs of rounds: a redux.sync max names the winner (no ballot, no index
//      shuffle), a second one over the heads with the winner's head replaced by its next key names slot r + 1,
//      and one vote per pair finds lists that ran dry (the pair is then redone as two single rounds, each lane
//      refilling from its keys below the round's maximum). Round r fixes slot r, so the slot order of §6 comes out
//      directly. Pairs of rounds halve the sequential cross-lane steps;
//   4. exactness check: packed order equals the selection order unless two of slots 0..k (slot k = best
//      unselected) share a coarse key with different full keys, or the boundary cuts a run of equal coarse keys
//      with different full keys; such tokens (a few % of random rows) redo the selection on full keys. Skipped
//      where the coarse key is the full key (Softmax post of 16-bit logits, below);
//   5. slot lane r computes the weight of slot r (sums in slot order via shuffles, one division per lane), writes
//      ids/weights/indices coalesced, and drops the weight into the shared row from which the owners build their
//      dense outputs (probs, map, Softmax-post intermediate) with vector stores.
// With QB (Quantile Balancing) it also writes order[k]'s score per token to FwdParams::cutoff (lane_order_k): a
// separate instantiation, so that the plain forward keeps its registers and occupancy.
// Bit-identical to the other CUDA forward kernels (same keys, slot order and FP32 expressions) except Softmax pre,
// whose row sum is associated per lane layout (last-bit differences, within docs/router.md §16.1).

#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

/// The D largest of v[0..W) among the values below `lim` (0 = none), in descending order; the values are distinct
/// or 0.
template <int W, int D>
__device__ __forceinline__ void top_below(const unsigned (&v)[W], unsigned lim, unsigned (&a)[D]) {
#pragma unroll
  for (int d = 0; d < D; ++d) a[d] = 0u;
#pragma unroll
  for (int p = 0; p < W; ++p) {
    unsigned x = v[p] < lim ? v[p] : 0u;
#pragma unroll
    for (int d = 0; d < D; ++d) {  // insertion: a[d] keeps the larger, the smaller moves down
      const unsigned lo = min(a[d], x);
      a[d] = max(a[d], x);
      x = lo;
    }
  }
}

/// The D (<= 4) largest of v[0..V) in descending order (V % 4 == 0; values distinct or 0), by a merging network:
/// runs of 4 sorted by 5 compare-exchanges, then pairwise merges that keep the best 4 (the elementwise maximum of
/// one run and the other reversed is a bitonic sequence holding the best 4, sorted by 4 compare-exchanges). For
/// V = 32 that is 164 min/max operations against 256 for insertion into a 4-deep list, with more independent work.
template <int V, int D>
__device__ __forceinline__ void top_first(const unsigned (&v)[V], unsigned (&a)[D]) {
  static_assert(V % 4 == 0 && D <= 4, "runs of 4, lists of at most 4");
  constexpr int NR = V / 4;
  unsigned r[NR][4];
  auto cx = [](unsigned& hi, unsigned& lo) {  // compare-exchange: hi keeps the larger
    const unsigned t = min(hi, lo);
    hi = max(hi, lo);
    lo = t;
  };
#pragma unroll
  for (int q = 0; q < NR; ++q) {
#pragma unroll
    for (int j = 0; j < 4; ++j) r[q][j] = v[4 * q + j];
    cx(r[q][0], r[q][1]);
    cx(r[q][2], r[q][3]);
    cx(r[q][0], r[q][2]);
    cx(r[q][1], r[q][3]);
    cx(r[q][1], r[q][2]);
  }
#pragma unroll
  for (int step = 1; step < NR; step <<= 1) {
#pragma unroll
    for (int q = 0; q + step < NR; q += 2 * step) {
#pragma unroll
      for (int j = 0; j < 4; ++j) r[q][j] = max(r[q][j], r[q + step][3 - j]);
      cx(r[q][0], r[q][2]);
      cx(r[q][1], r[q][3]);
      cx(r[q][0], r[q][1]);
      cx(r[q][2], r[q][3]);
    }
  }
#pragma unroll
  for (int d = 0; d < D; ++d) a[d] = r[0][d];
}

/// Exact selection on full keys (the slow path of topk_fwd_lane, taken when packed keys cannot decide): k rounds
/// of a segment arg-max over per-lane top-2 lists with positions; among lanes holding the maximum the lowest
/// expert index wins. Returns the selected positions of the lane and, on slot lanes, the expert index of slot ls.
template <int TPT, int NC, int W>
__device__ __forceinline__ void lane_select_exact(const unsigned* kbuf, const bool (&cvalid)[NC], bool elig, int k,
                                                  int ls, unsigned& selm, int& my_idx) {
  constexpr int V = NC * W;
  unsigned key[V];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int w = 0; w < W; ++w) key[c * W + w] = (elig && cvalid[c]) ? kbuf[(c * TPT + ls) * W + w] : 0u;
  auto top2 = [&](unsigned excl, unsigned& a1, int& p1, unsigned& a2, int& p2) {
    a1 = 0u;
    a2 = 0u;
    p1 = 0;
    p2 = 0;
#pragma unroll
    for (int p = 0; p < V; ++p) {
      const unsigned v = ((excl >> p) & 1u) ? 0u : key[p];
      const bool g1 = v > a1;
      const bool g2 = v > a2;
      a2 = g1 ? a1 : (g2 ? v : a2);
      p2 = g1 ? p1 : (g2 ? p : p2);
      a1 = g1 ? v : a1;
      p1 = g1 ? p : p1;
    }
  };
  auto index_of = [&](int p) { return ((p / W) * TPT + ls) * W + (p % W); };
  unsigned h, n;
  int hp, np;
  top2(0u, h, hp, n, np);
  selm = 0u;
  my_idx = 0;
  for (int r = 0; r < k; ++r) {
    const unsigned M = seg_max_u32<TPT>(h);
    const int hidx = index_of(hp);
    const unsigned cand = (h == M) ? static_cast<unsigned>(hidx) : 0xffffffffu;
    const int widx = static_cast<int>(seg_min_u32<TPT>(cand));
    if (ls == r) my_idx = widx;
    const bool win = h == M && hidx == widx;
    if (win) {
      selm |= 1u << hp;
      h = n;
      hp = np;
      n = 0u;
    }
    if (__any_sync(kFull, win && h == 0u && r + 1 < k)) {
      if (win && h == 0u) top2(selm, h, hp, n, np);
    }
  }
}

/// The expert of order[k] (docs/router.md §19.4, the QB cutoff): the best unselected eligible expert by full key,
/// the lower index first on equal keys. Mk, the best unselected packed key, names it unless the selection was redone
/// on full keys (redo) or another unselected key shares Mk's coarse part (packed keys order equal coarse parts by
/// index alone, whatever their full keys); tokens of such a warp scan the full keys instead. Returns the same expert
/// on every lane of the token.
template <int TPT, int NC, int W, unsigned IMASK>
__device__ __forceinline__ int lane_order_k(const unsigned* kbuf, const unsigned (&pk)[NC * W],
                                            const bool (&cvalid)[NC], bool elig, unsigned selm, unsigned Mk, bool redo,
                                            int ls) {
  int ek = static_cast<int>(IMASK - (Mk & IMASK));
  bool scan = redo || Mk == 0u;
  if (!scan) {
    // Without a redo the selected keys are those >= the last slot's, all above Mk, so the other unselected keys of
    // Mk's coarse part are exactly the packed keys in [coarse(Mk), Mk): two compares per key, no shared memory.
    const unsigned cMk = Mk & ~IMASK;
    const unsigned span = Mk - cMk;
    bool hit = false;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int w = 0; w < W; ++w) hit |= cvalid[c] && pk[c * W + w] - cMk < span;
    scan = __any_sync(kFull, elig && hit);
  }
  if (scan) {
    unsigned bk = 0u;
    int be = 0x7fffffff;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const int p = c * W + w;
        const int e = (c * TPT + ls) * W + w;
        if (elig && cvalid[c] && ((selm >> p) & 1u) == 0u) {
          const unsigned kk = kbuf[e];
          if (kk > bk || (kk == bk && e < be)) {
            bk = kk;
            be = e;
          }
        }
      }
#pragma unroll
    for (int o = TPT / 2; o > 0; o >>= 1) {
      const unsigned ok = __shfl_xor_sync(kFull, bk, o);
      const int oe = __shfl_xor_sync(kFull, be, o);
      if (ok > bk || (ok == bk && oe < be)) {
        bk = ok;
        be = oe;
      }
    }
    ek = be;
  }
  return ek;
}

template <class L, int TPT, int NC, int W, int K, bool QB>
// Blocks per SM, the fastest count per shape on the H200: 8 blocks of 128 threads for one chunk per lane (its rows
// fit in 64 registers); 4 with several chunks, so that every chunk's row stays in registers (up to 128); 5 for 4
// chunks of 16-bit logits, where the fifth resident block is worth the few bytes its 96-register cap spills. With
// f32 logits, or at 6 blocks, the spills cost more than the extra block gains. The QB variant: with 2 chunks 5 blocks
// (f32: the plain kernel gets 5 from its 93 registers, the cutoff's few more would cost the fifth block; it fits 90
// without spills), 7 for bf16 logits, as many as the plain kernel (71 registers, no spills; capped at 5 it took 84
// registers and was 2% slower on an H100, E = 384); 4 with 4 chunks (at 5, bf16 logits spilled 134 MB per call at
// E = 896 and were 4% slower).
__global__ void __launch_bounds__(128, NC == 1 ? 8
                                               : (QB ? (NC == 2 ? (std::is_same_v<L, bf16_t> ? 7 : 5) : 4)
                                                     : (NC == 4 && !std::is_same_v<L, float> ? 5 : 4)))
    topk_fwd_lane(const FwdParams<L> P) {
  using TT = Elem<L>;
  using S = typename TT::S;
  constexpr int V = NC * W;                                       // experts per lane
  constexpr int LD = V >= 32 ? 4 : 3;                             // depth of the lane lists of step 3
  constexpr int TPW = 32 / TPT;                                   // tokens per warp
  constexpr int ROW = TPT * V;                                    // experts covered by one token's lanes
  constexpr int IB = ROW <= 2 ? 1 : 32 - __builtin_clz(ROW - 1);  // index bits of a packed key
  constexpr unsigned IMASK = (1u << IB) - 1u;
  static_assert(V <= 32 && IB <= 10, "selection masks are 32-bit; packed keys keep at least 22 key bits");
  static_assert((kNaNKey & ~IMASK) != 0u, "a NaN score keeps a nonzero packed key (its coarse part is kNaNKey's)");
  extern __shared__ __align__(16) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int seg = lane / TPT;
  const int ls = lane % TPT;
  const int sbase = seg * TPT;
  const unsigned segmask = (TPT == 32) ? kFull : (((1u << TPT) - 1u) << sbase);
  const int E = P.E;
  const int k = K > 0 ? K : P.k;  // K > 0: k known at compile time (fully unrolled rounds and sums)
  const int fn = P.fn;
  const bool compact = P.out == kOutCompact;
  const bool softmax_pre = fn == kFnSoftmax && P.pre;
  const bool softmax_post = fn == kFnSoftmax && !P.pre;
  bool cvalid[NC];  // E % W == 0: a chunk is wholly inside the row or wholly outside
#pragma unroll
  for (int c = 0; c < NC; ++c) cvalid[c] = (c * TPT + ls) * W < E;
  const bool lvalid = cvalid[0];
  const int sg = P.gk > 0 ? P.gs / W : 1;  // lanes per group (a power of two; NC == 1)
  const int sgs = __ffs(sg) - 1;
  const int gid = ls >> sgs;

  float* ybuf = reinterpret_cast<float*>(smem) + static_cast<size_t>(warp * TPW + seg) * (2 * ROW);
  unsigned* kbuf = reinterpret_cast<unsigned*>(ybuf + ROW);

  // bias (Sigmoid/SqrtSoftplus only, §4); +0.0f otherwise, so that s = y + b also turns -0.0 into +0.0. One chunk
  // per lane: kept in registers. Several: the block's widened row after the token rows (stage_bias).
  const bool has_bias = P.bias.present();
  float bias1[W];
#pragma unroll
  for (int w = 0; w < W; ++w) bias1[w] = (NC == 1 && has_bias && lvalid) ? bias_value(P.bias, ls * W + w) : 0.0f;
  float* sbias = reinterpret_cast<float*>(
      smem + bias_row_offset(static_cast<size_t>(blockDim.x >> 5) * TPW * 2 * ROW * sizeof(float)));
  if constexpr (NC > 1) stage_bias(P, sbias, ROW);

  using VV = Vec<S, W>;
  using Raw = typename VV::R;
  const long long nwarps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const long long gwarp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;
  const long long stride = nwarps * TPW;

  // t, its row offset t*E and the logits pointer advance incrementally (no 64-bit multiply per token)
  const long long strideE = stride * static_cast<long long>(E);
  long long t = gwarp * TPW + seg;
  long long rowE = t * static_cast<long long>(E);
  const S* lp = storage(P.logits) + rowE + ls * W;
  Raw raw[NC];
#pragma unroll
  for (int c = 0; c < NC; ++c) {
    memset(&raw[c], 0, sizeof(Raw));
    if (t < P.T && cvalid[c]) raw[c] = VV::ldg(lp + c * TPT * W);
  }

  for (long long tb = gwarp * TPW; tb < P.T; tb += stride, t += stride, rowE += strideE) {
    const bool valid = t < P.T;
    Raw cur[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) cur[c] = raw[c];
    lp += strideE;
#pragma unroll
    for (int c = 0; c < NC; ++c)  // prefetch of the next token's row
      if (t + stride < P.T && cvalid[c]) raw[c] = VV::ldg(lp + c * TPT * W);
    auto widen = [&](int c, float(&x)[W]) {
      S s[W];
      VV::to_array(cur[c], s);
#pragma unroll
      for (int w = 0; w < W; ++w) x[w] = TT::to_f(s[w]);
    };

    // ---- 1. activations, keys, early outputs, chunk by chunk ----------------------------------------------
    float m = -INFINITY, inv = 0.0f;  // Softmax pre row statistics
    if (softmax_pre) {
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float x[W];
        widen(c, x);
#pragma unroll
        for (int w = 0; w < W; ++w) m = cvalid[c] ? math_fmax(m, x[w]) : m;
      }
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        float x[W];
        widen(c, x);
#pragma unroll
        for (int w = 0; w < W; ++w) s += (cvalid[c] && x[w] != -INFINITY) ? softmax_exp(x[w], m) : 0.0f;
      }
#pragma unroll
      for (int o = TPT / 2; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(kFull, m, o);
        const float so = __shfl_xor_sync(kFull, s, o);
        softmax_merge(m, s, mo, so);
      }
      inv = 1.0f / s;
    }
    unsigned pk[V];
    unsigned g1 = 0u, g2 = 0u;  // lane top-2 full keys (group scores, NC == 1)
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * TPT + ls) * W;
      float x[W], y[W];
      widen(c, x);
      if (fn == kFnSigmoid) {
        sigmoid_n<W>(x, y);
      } else if (fn == kFnSqrtSoftplus) {
#pragma unroll
        for (int w = 0; w < W; ++w) y[w] = sqrt_softplus(x[w]);
      } else if (softmax_pre) {
#pragma unroll
        for (int w = 0; w < W; ++w) y[w] = softmax_exp(x[w], m) * inv;
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) y[w] = x[w];
      }
      // the chunk's bias: from registers with one chunk per lane, from the block's row with several; a chunk
      // outside the row reads none (it is never eligible, so its keys need no masking)
      float b[W];
#pragma unroll
      for (int w = 0; w < W; ++w) b[w] = bias1[w];
      if (NC > 1 && has_bias && cvalid[c]) {
        load_shared4<W>(sbias + e0, b);
      }
      unsigned key[W];
#pragma unroll
      for (int w = 0; w < W; ++w) {
        key[w] = order_key_no_negative_zero(y[w] + b[w]);
        pk[c * W + w] = (key[w] & ~IMASK) | (IMASK - static_cast<unsigned>(e0 + w));
      }
      if (NC == 1 && P.gk > 0) {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          g2 = max(g2, min(g1, key[w]));
          g1 = max(g1, key[w]);
        }
      }
      if (!compact && !softmax_post && valid && cvalid[c]) {
        if (fn == kFnSqrtSoftplus)
          store_elems<float, W>(P.inter + rowE + e0, x);
        else
          store_elems<float, W>(P.inter + rowE + e0, y);
      }
      if constexpr (W % 4 == 0) {
#pragma unroll
        for (int w = 0; w < W; w += 4) {
          *reinterpret_cast<float4*>(ybuf + e0 + w) = make_float4(y[w], y[w + 1], y[w + 2], y[w + 3]);
          *reinterpret_cast<uint4*>(kbuf + e0 + w) = make_uint4(key[w], key[w + 1], key[w + 2], key[w + 3]);
        }
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) {
          ybuf[e0 + w] = y[w];
          kbuf[e0 + w] = key[w];
        }
      }
    }

    // ---- 2. group-limited routing (§5.3): NC == 1, kg <= 2, a group spans sg lanes ----------------------------
    bool elig = lvalid;
    if (NC == 1 && P.gk > 0) {
      const float gsum = group_top2_score(g1, g2, sg, P.kg);
      unsigned gkey = lvalid ? order_key(gsum) : 0u;
      elig = false;
      if (P.G <= 8) {
        // few groups: the rank of the lane's group among all G (score descending, lower group first), from G
        // independent shuffles instead of gk dependent rounds
        int rank = 0;
#pragma unroll 8
        for (int j = 0; j < P.G; ++j) {
          const unsigned o = __shfl_sync(kFull, gkey, sbase + (j << sgs));
          rank += (o > gkey || (o == gkey && j < gid)) ? 1 : 0;
        }
        elig = rank < P.gk;
      } else {
        // gk rounds: the best remaining group (lowest group on equal scores) becomes eligible
        for (int r = 0; r < P.gk; ++r) {
          const unsigned M = seg_max_u32<TPT>(gkey);
          const int wl = __ffs(__ballot_sync(kFull, gkey == M) & segmask) - 1;
          const bool mine = ((wl - sbase) >> sgs) == gid;
          elig = elig || mine;
          gkey = mine ? 0u : gkey;
        }
      }
      elig = elig && lvalid;
    }
    if constexpr (NC > 1) {
#pragma unroll
      for (int c = 1; c < NC; ++c)
#pragma unroll
        for (int w = 0; w < W; ++w) pk[c * W + w] = cvalid[c] ? pk[c * W + w] : 0u;
    }

    // ---- 3. k rounds of a segment max over packed keys ---------------------------------------------------------
    unsigned lst[LD];  // the lane's best remaining packed keys, descending (lst[0]: its head)
    top_first<V, LD>(pk, lst);
    if (!elig) {
#pragma unroll
      for (int d = 0; d < LD; ++d) lst[d] = 0u;
    }
    unsigned myP = 0u, Mlast = 0u;
    // one exact round: the segment maximum of the heads is slot r; a lane whose list ran dry refills from its keys
    // below M (it pops in descending order), also after the last round, so that Mk below is exact
    auto single_round = [&](int r) {
      const unsigned M = seg_max_u32<TPT>(lst[0]);
      myP = (ls == r) ? M : myP;
      const bool win = lst[0] == M;
#pragma unroll
      for (int d = 0; d + 1 < LD; ++d) lst[d] = win ? lst[d + 1] : lst[d];
      lst[LD - 1] = win ? 0u : lst[LD - 1];
      if (__any_sync(kFull, win && lst[0] == 0u)) {
        if (win && lst[0] == 0u) top_below<V, LD>(pk, M, lst);
      }
      Mlast = M;
    };
    // rounds in pairs: the second maximum is taken over the heads with the first winner's head replaced by its
    // next key, so one vote per two slots. That is exact unless the first winner's list held a single key (its
    // next key is unknown) or a list ran dry in the pair; both leave a winner with an empty list, and then the
    // pops are undone and the pair is redone as two single rounds with refills.
    // (unrolled for k = 8; not for 32 experts per lane, whose redo path holds two list refills)
#pragma unroll(V >= 32 ? 1 : 8)
    for (int r = 0; r < k; r += 2) {
      const bool two = r + 1 < k;
      const unsigned M1 = seg_max_u32<TPT>(lst[0]);
      const bool w1 = lst[0] == M1;
      const unsigned c = w1 ? lst[1] : lst[0];
      const unsigned M2 = two ? seg_max_u32<TPT>(c) : 0u;
      const bool w2 = two && c == M2;
      const bool p2 = w1 && w2;
      const bool p1 = w1 != w2;
#pragma unroll
      for (int d = 0; d < LD; ++d) {
        const unsigned n1 = d + 1 < LD ? lst[d + 1] : 0u;
        const unsigned n2 = d + 2 < LD ? lst[d + 2] : 0u;
        lst[d] = p2 ? n2 : (p1 ? n1 : lst[d]);
      }
      myP = (ls == r) ? M1 : ((two && ls == r + 1) ? M2 : myP);
      Mlast = two ? M2 : M1;
      if (__any_sync(kFull, (w1 || w2) && lst[0] == 0u)) {
        // undo the pops (the popped keys are M1 and/or M2; nothing fell off the end), then two exact rounds (they
        // set myP of slots r and r + 1 again)
#pragma unroll
        for (int d = LD - 1; d >= 0; --d) {
          const unsigned b1 = d >= 1 ? lst[d - 1] : (w1 ? M1 : M2);
          const unsigned b2 = d >= 2 ? lst[d - 2] : (d == 1 ? M2 : M1);
          lst[d] = p2 ? b2 : (p1 ? b1 : lst[d]);
        }
        single_round(r);
        if (two) single_round(r + 1);
      }
    }
    __syncwarp();

    // ---- 4. exactness check: packed order == selection order over slots 0..k and at the boundary --------------
    // Skipped where packed keys are exact: Softmax post keys 16-bit logits, whose FP32 widening leaves the low 16
    // (bf16) or 13 (fp16) bits of the order-preserving key all equal to the sign bit's pattern, so two keys with
    // the same upper 32-IB bits are equal when IB does not exceed that.
    constexpr int kExactBits = std::is_same_v<L, bf16_t> ? 16 : (std::is_same_v<L, fp16_t> ? 13 : 0);
    const bool exact_keys = softmax_post && IB <= kExactBits;
    const unsigned Mk = exact_keys ? 0u : seg_max_u32<TPT>(lst[0]);  // the best unselected packed key (0: none)
    const bool has = ls < k;
    int my_idx = static_cast<int>(IMASK - (myP & IMASK));
    bool bad = false;
    if (!exact_keys) {
      const unsigned fk = has ? kbuf[my_idx] : 0u;
      unsigned nP = __shfl_down_sync(kFull, myP, 1, TPT);
      unsigned nK = __shfl_down_sync(kFull, fk, 1, TPT);
      const bool last = ls == k - 1;
      if (last) {
        nP = Mk;
        nK = Mk ? kbuf[IMASK - (Mk & IMASK)] : 0u;
      }
      const bool same_coarse = ((myP ^ nP) & ~IMASK) == 0u && nP != 0u;
      bad = has && same_coarse && fk != nK;
      if (__any_sync(kFull, last && same_coarse)) {
        // the boundary falls inside a run of equal coarse keys: exact only if the whole run has one full key
        const int src = sbase + k - 1;
        const bool bnd = __shfl_sync(kFull, same_coarse, src);
        const unsigned cb = __shfl_sync(kFull, myP, src) & ~IMASK;
        const unsigned fb = __shfl_sync(kFull, fk, src);
        if (bnd && elig) {
          bool hit = false;  // (non-short-circuit: no branch per key)
#pragma unroll
          for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int w = 0; w < W; ++w) {
              const unsigned kw = kbuf[(c * TPT + ls) * W + w];
              hit |= cvalid[c] & ((kw & ~IMASK) == cb) & (kw != fb);
            }
          bad = bad || hit;
        }
      }
    }
    unsigned selm = 0u;
    const bool redo = __any_sync(kFull, bad);
    if (redo) {
      lane_select_exact<TPT, NC, W>(kbuf, cvalid, elig, k, ls, selm, my_idx);
    } else {
#pragma unroll
      for (int p = 0; p < V; ++p) selm |= (elig && pk[p] >= Mlast) ? (1u << p) : 0u;
    }
    __syncwarp();

    // ---- QB cutoff (docs/router.md §19.4): the score of order[k], y + b with the selection's own FP32 add --------
    if constexpr (QB) {
      const int ek = lane_order_k<TPT, NC, W, IMASK>(kbuf, pk, cvalid, elig, selm, Mk, redo, ls);
      if (valid && ls == 0) P.cutoff[t] = ybuf[ek] + (has_bias ? (NC > 1 ? sbias[ek] : bias_value(P.bias, ek)) : 0.0f);
    }

    // ---- 5. slot weights (§5.2), sums in slot order ------------------------------------------------------------
    const float vr = slot_weight(P, k, softmax_post, has ? ybuf[my_idx] : 1.0f, sbase);
    if (valid && has) store_slot(P, k, t, ls, my_idx, vr);

    // ---- dense outputs: vector stores per chunk and output ----------------------------------------------------
    if (!compact) {
      if (has) ybuf[my_idx] = vr;  // every read of ybuf above is by the lane that now writes the entry
      __syncwarp();
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int e0 = (c * TPT + ls) * W;
        const bool st = valid && cvalid[c];
        const unsigned cm = (selm >> (c * W)) & ((W == 32) ? 0xffffffffu : ((1u << W) - 1u));
        float wv[W], pv[W];
        if constexpr (W % 4 == 0) {
          load_shared4<W>(ybuf + e0, wv);
        } else {
#pragma unroll
          for (int w = 0; w < W; ++w) wv[w] = ybuf[e0 + w];
        }
#pragma unroll
        for (int w = 0; w < W; ++w) pv[w] = ((cm >> w) & 1u) ? P.scale * wv[w] : 0.0f;
        if (st) store_elems<L, W>(storage(P.probs) + rowE + e0, pv);
        if (softmax_post) {
#pragma unroll
          for (int w = 0; w < W; ++w) wv[w] = ((cm >> w) & 1u) ? wv[w] : -INFINITY;
          if (st) store_elems<float, W>(P.inter + rowE + e0, wv);
        }
        if (P.out == kOutBytemap && st) {
          // bit j of a nibble to byte j: the multiplier's four shifts (0, 7, 14, 21) never collide
          const unsigned lo = ((cm & 0xfu) * 0x00204081u) & 0x01010101u;
          if constexpr (W == 8) {
            const unsigned hi = (((cm >> 4) & 0xfu) * 0x00204081u) & 0x01010101u;
            __stcs(reinterpret_cast<uint2*>(P.map + rowE + e0), make_uint2(lo, hi));
          } else {
            static_assert(W == 4, "bytemap rows are built from 8- or 4-expert chunks");
            __stcs(reinterpret_cast<unsigned*>(P.map + rowE + e0), lo);
          }
        } else if (P.out == kOutBitmap) {
          unsigned char* mrow = P.map + t * static_cast<long long>((E + 7) >> 3);
          if constexpr (W == 8) {
            if (st) mrow[e0 >> 3] = static_cast<unsigned char>(cm);
          } else {
            const unsigned o = __shfl_xor_sync(kFull, cm, 1);
            if ((ls & 1) == 0 && st) mrow[e0 >> 3] = static_cast<unsigned char>(cm | (o << 4));
          }
        }
      }
    }
    __syncwarp();
  }
}

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
