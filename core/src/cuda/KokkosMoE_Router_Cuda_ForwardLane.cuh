/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARDLANE_CUH
#define KOKKOSMOE_ROUTER_CUDA_FORWARDLANE_CUH

// topk_fwd_lane<DT, TPT, W>: the forward fast path of topk_router for E <= TPT*W (E % W == 0) and k <= TPT, every
// routing output kind (not aux_scores). It was written to cut the instructions per token of the register kernels
// of KokkosMoE_Router_Cuda_Forward.cuh, which ncu showed issue-bound (DRAM 16 %, ~1290 warp instructions per token
// for DeepSeek-V3, mostly integer selection work).
//
// Mapping: TPT lanes own one token; lane `ls` owns the W contiguous experts ls*W .. ls*W+W-1 (one 16- or 32-byte
// load), so lane order is expert order. Per token:
//   1. activations and order-preserving keys in registers (router-spec §5.1, §7), early FP32 outputs;
//   2. per lane the two best keys with their positions (one pass, ties to the lower position);
//   3. group-limited routing (§5.3, kg <= 2): the lane top-2 lists merged over the lanes of a group, groups ranked
//      by shuffles; an ineligible lane simply offers nothing;
//   4. k rounds of a segment arg-max over the lane heads (one redux.sync for a whole warp): the lowest lane holding
//      the maximum wins (lower index on ties), pops its head, and refills its list from its unselected keys only
//      when both entries are gone. Round r fixes slot r, so the slot order of §6 comes out directly;
//   5. slot lane r computes the weight of slot r (sums in slot order via shuffles, one division per lane), writes
//      ids/weights/indices coalesced, and drops the weight into a per-token shared row from which the owners build
//      their dense outputs (probs, map, Softmax-post intermediate) with one vector store per lane and output.
// Bit-identical to the other CUDA forward kernels (same keys, same slot order, same FP32 expressions).

#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

/// okey() for scores that are never -0.0 (s = y + b with y >= +0 or NaN, or y + 0.0f), with NaN mapped to
/// kLaneNaNKey instead of 1: still below -inf (0x007fffff) and above "no candidate" (0), but with a nonzero coarse
/// part, so that a NaN score keeps a nonzero packed key (below).
constexpr unsigned kLaneNaNKey = 0x100u;
__device__ __forceinline__ unsigned okey_lane(float s) {
  const unsigned u = __float_as_uint(s);
  const unsigned k = u ^ (static_cast<unsigned>(static_cast<int>(u) >> 31) | 0x80000000u);
  return (s != s) ? kLaneNaNKey : k;
}

/// IEEE reciprocal of d in [1, 2^126): the fast path that nvcc emits for 1.0f / d in that range (approximate
/// reciprocal, one correction with a flush-to-zero negation), so the result is bit-identical to 1.0f / d.
__device__ __forceinline__ float rcp_rn_1_2p126(float d) {
  float r, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  e = fmaf(d, r, -1.0f);
  asm("neg.ftz.f32 %0, %0;" : "+f"(e));
  return fmaf(r, e, r);
}

/// y[w] = sigmoidf_(x[w]) for a lane's W values, bit-identical to the scalar version. 1 + expf(-x) is >= 1 (or
/// NaN); when every denominator of the lane is below 2^126 (logits above about -87.3) one range check covers all W
/// reciprocals instead of a check and branch each.
template <int W>
__device__ __forceinline__ void sigmoid_lane(const float (&x)[W], float (&y)[W]) {
  float d[W];
  float dmax = 1.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) {
    d[w] = 1.0f + expf(-x[w]);
    dmax = fmaxf(dmax, d[w]);  // (fmaxf skips NaN: a NaN denominator gives NaN on either path)
  }
  if (dmax < 0x1p126f) {
#pragma unroll
    for (int w = 0; w < W; ++w) y[w] = rcp_rn_1_2p126(d[w]);
  } else {
#pragma unroll
    for (int w = 0; w < W; ++w) y[w] = 1.0f / d[w];
  }
}

/// Three largest of v[0..W) among the values below `lim` (0 = none); the values are distinct or 0.
template <int W>
__device__ __forceinline__ void top3_below(const unsigned (&v)[W], unsigned lim, unsigned& a1, unsigned& a2,
                                           unsigned& a3) {
  a1 = 0u;
  a2 = 0u;
  a3 = 0u;
#pragma unroll
  for (int p = 0; p < W; ++p) {
    const unsigned x = v[p] < lim ? v[p] : 0u;
    const unsigned m1 = min(a1, x);
    a1 = max(a1, x);
    const unsigned m2 = min(a2, m1);
    a2 = max(a2, m1);
    a3 = max(a3, m2);
  }
}

/// Exact selection on full keys (the slow path of topk_fwd_lane, taken when packed keys cannot decide): k rounds
/// of a segment arg-max over per-lane top-2 lists with positions; the lowest lane with the maximum wins. Returns the
/// selected positions of the lane and, on slot lanes, the expert index of slot ls.
template <int TPT, int W>
__device__ __forceinline__ void lane_select_exact(const unsigned (&key)[W], bool elig, int k, int lane, int ls, int e0,
                                                  unsigned segmask, unsigned& selm, int& my_idx) {
  auto top2 = [&](unsigned excl, unsigned& a1, int& p1, unsigned& a2, int& p2) {
    a1 = 0u;
    a2 = 0u;
    p1 = 0;
    p2 = 0;
#pragma unroll
    for (int p = 0; p < W; ++p) {
      const unsigned v = ((excl >> p) & 1u) ? 0u : key[p];
      const bool g1 = v > a1;
      const bool g2 = v > a2;
      a2 = g1 ? a1 : (g2 ? v : a2);
      p2 = g1 ? p1 : (g2 ? p : p2);
      a1 = g1 ? v : a1;
      p1 = g1 ? p : p1;
    }
  };
  unsigned h, n;
  int hp, np;
  top2(0u, h, hp, n, np);
  if (!elig) {
    h = 0u;
    n = 0u;
  }
  selm = 0u;
  my_idx = 0;
  for (int r = 0; r < k; ++r) {
    const unsigned M = seg_max_u32<TPT>(h);
    const unsigned b = __ballot_sync(kFull, h == M) & segmask;
    const int wl = __ffs(b) - 1;
    const int widx = __shfl_sync(kFull, e0 + hp, wl);
    if (ls == r) my_idx = widx;
    const bool win = lane == wl;
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

template <int DT, int TPT, int W, int K>
__global__ void __launch_bounds__(128, 6) topk_fwd_lane(const FwdParams P) {
  using TT = Ty<DT>;
  using S = typename TT::S;
  constexpr int TPW = 32 / TPT;                                   // tokens per warp
  constexpr int ROW = TPT * W;                                    // experts covered by one token's lanes
  constexpr int IB = ROW <= 2 ? 1 : 32 - __builtin_clz(ROW - 1);  // index bits of a packed key
  constexpr unsigned IMASK = (1u << IB) - 1u;
  static_assert(W <= 32 && IB <= 8, "packed keys keep at least 24 key bits");
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
  const int e0 = ls * W;
  const bool lvalid = e0 < E;              // E % W == 0: a lane is wholly inside the row or wholly outside
  const int sg = P.gk > 0 ? P.gs / W : 1;  // lanes per group (a power of two)
  const int sgs = __ffs(sg) - 1;
  const int gid = ls >> sgs;

  float* ybuf = reinterpret_cast<float*>(smem) + static_cast<size_t>(warp * TPW + seg) * (2 * ROW);
  unsigned* kbuf = reinterpret_cast<unsigned*>(ybuf + ROW);

  // bias (Sigmoid/SqrtSoftplus only, §4); +0.0f otherwise, so that s = y + b also turns -0.0 into +0.0
  float bias[W];
#pragma unroll
  for (int w = 0; w < W; ++w) bias[w] = (P.bias != nullptr && lvalid) ? load_any(P.bias, P.bias_type, e0 + w) : 0.0f;

  using VV = Vec<S, W>;
  using Raw = typename VV::R;
  const long long nwarps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const long long gwarp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;
  const long long stride = nwarps * TPW;

  // t, its row offset t*E + e0 and the logits pointer advance incrementally (no 64-bit multiply per token)
  const long long strideE = stride * static_cast<long long>(E);
  long long t = gwarp * TPW + seg;
  long long rowE = t * static_cast<long long>(E);
  const S* lp = static_cast<const S*>(P.logits) + rowE + e0;
  Raw raw;
  memset(&raw, 0, sizeof(Raw));
  if (t < P.T && lvalid) raw = VV::ldg(lp);

  for (long long tb = gwarp * TPW; tb < P.T; tb += stride, t += stride, rowE += strideE) {
    const bool valid = t < P.T;
    float x[W];
    {
      S s[W];
      VV::to_array(raw, s);
#pragma unroll
      for (int w = 0; w < W; ++w) x[w] = TT::to_f(s[w]);
    }
    lp += strideE;
    if (t + stride < P.T && lvalid) raw = VV::ldg(lp);  // prefetch of the next token's row

    // ---- 1. activations, keys, early outputs ----------------------------------------------------------------
    float y[W];
    if (fn == kFnSigmoid) {
      sigmoid_lane<W>(x, y);
    } else if (fn == kFnSqrtSoftplus) {
#pragma unroll
      for (int w = 0; w < W; ++w) y[w] = sqrtsoftplusf_(x[w]);
    } else if (softmax_pre) {
      float m = -INFINITY;
#pragma unroll
      for (int w = 0; w < W; ++w) m = lvalid ? fmaxf(m, x[w]) : m;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) s += (lvalid && x[w] != -INFINITY) ? expf(x[w] - m) : 0.0f;
#pragma unroll
      for (int o = TPT / 2; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(kFull, m, o);
        const float so = __shfl_xor_sync(kFull, s, o);
        softmax_merge(m, s, mo, so);
      }
      const float inv = 1.0f / s;
#pragma unroll
      for (int w = 0; w < W; ++w) y[w] = expf(x[w] - m) * inv;
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) y[w] = x[w];
    }
    // full keys (§7) and packed keys: the key's upper 32-IB bits over the inverted expert index. Packed keys are
    // unique per token, so one max reduction names the winner; their order is the selection order wherever the
    // coarse parts differ (checked below).
    unsigned key[W], pk[W];
#pragma unroll
    for (int w = 0; w < W; ++w) {
      // (a lane outside the row is never eligible, so its keys need no masking)
      key[w] = okey_lane(y[w] + bias[w]);
      pk[w] = (key[w] & ~IMASK) | (IMASK - static_cast<unsigned>(e0 + w));
    }
    if (!compact && !softmax_post && valid && lvalid) {
      if (fn == kFnSqrtSoftplus)
        store_chunk<kDtF32, W>(P.inter + rowE + e0, x);
      else
        store_chunk<kDtF32, W>(P.inter + rowE + e0, y);
    }
    // activation and key rows for the slot lanes
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

    // ---- 2. group-limited routing (§5.3): kg <= 2, a group spans sg lanes -------------------------------------
    bool elig = lvalid;
    if (P.gk > 0) {
      unsigned g1 = 0u, g2 = 0u;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        g2 = max(g2, min(g1, key[w]));
        g1 = max(g1, key[w]);
      }
      for (int o = 1; o < sg; o <<= 1) {
        const unsigned b1 = __shfl_xor_sync(kFull, g1, o);
        const unsigned b2 = __shfl_xor_sync(kFull, g2, o);
        const unsigned n2 = max(min(g1, b1), max(g2, b2));
        g1 = max(g1, b1);
        g2 = n2;
      }
      float gsum = okey_decode(g1);
      if (P.kg == 2) gsum += okey_decode(g2);
      unsigned gkey = lvalid ? okey(gsum) : 0u;
      // gk rounds: the best remaining group (lowest group on equal scores) becomes eligible
      elig = false;
      for (int r = 0; r < P.gk; ++r) {
        const unsigned M = seg_max_u32<TPT>(gkey);
        const int wl = __ffs(__ballot_sync(kFull, gkey == M) & segmask) - 1;
        const bool mine = ((wl - sbase) >> sgs) == gid;
        elig = elig || mine;
        gkey = mine ? 0u : gkey;
      }
      elig = elig && lvalid;
    }

    // ---- 3. k rounds of a segment max over packed keys ---------------------------------------------------------
    unsigned h, n, n3;
    top3_below<W>(pk, 0xffffffffu, h, n, n3);
    if (!elig) {
      h = 0u;
      n = 0u;
      n3 = 0u;
    }
    unsigned myP = 0u, Mlast = 0u;
#pragma unroll
    for (int r = 0; r < k; ++r) {
      const unsigned M = seg_max_u32<TPT>(h);
      myP = (ls == r) ? M : myP;
      const bool win = h == M;
      h = win ? n : h;
      n = win ? n3 : n;
      n3 = win ? 0u : n3;
      // a lane whose list ran dry refills from its keys below M (it pops in descending order); also after the
      // last round, so that Mk below is exact
      if (__any_sync(kFull, win && h == 0u)) {
        if (win && h == 0u) top3_below<W>(pk, M, h, n, n3);
      }
      Mlast = M;
    }
    const unsigned Mk = seg_max_u32<TPT>(h);  // the best unselected packed key (0: none)

    // ---- 4. exactness check: packed order == selection order over slots 0..k and at the boundary --------------
    const bool has = ls < k;
    int my_idx = static_cast<int>(IMASK - (myP & IMASK));
    unsigned fk = has ? kbuf[my_idx] : 0u;
    unsigned nP = __shfl_down_sync(kFull, myP, 1, TPT);
    unsigned nK = __shfl_down_sync(kFull, fk, 1, TPT);
    const bool last = ls == k - 1;
    if (last) {
      nP = Mk;
      nK = Mk ? kbuf[IMASK - (Mk & IMASK)] : 0u;
    }
    const bool same_coarse = ((myP ^ nP) & ~IMASK) == 0u && nP != 0u;
    bool bad = has && same_coarse && fk != nK;
    if (__any_sync(kFull, last && same_coarse)) {
      // the boundary falls inside a run of equal coarse keys: exact only if the whole run has one full key
      const int src = sbase + k - 1;
      const bool bnd = __shfl_sync(kFull, same_coarse, src);
      const unsigned cb = __shfl_sync(kFull, myP, src) & ~IMASK;
      const unsigned fb = __shfl_sync(kFull, fk, src);
#pragma unroll
      for (int w = 0; w < W; ++w) bad = bad || (bnd && elig && (key[w] & ~IMASK) == cb && key[w] != fb);
    }
    unsigned selm = 0u;
    if (__any_sync(kFull, bad)) {
      lane_select_exact<TPT, W>(key, elig, k, lane, ls, e0, segmask, selm, my_idx);
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) selm |= (elig && pk[w] >= Mlast) ? (1u << w) : 0u;
    }
    __syncwarp();

    // ---- 5. slot weights (§5.2), sums in slot order ------------------------------------------------------------
    const float yr = has ? ybuf[my_idx] : 1.0f;  // (1, not 0: an idle lane must not take the division's slow path)
    float vr;
    if (softmax_post) {
      const float x0 = __shfl_sync(kFull, yr, sbase);
      const float er = expf(yr - x0);
      const float ez = (yr == -INFINITY) ? 0.0f : er;
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < k; ++r) sum += __shfl_sync(kFull, ez, sbase + r);
      vr = er * (1.0f / sum);
    } else if (fn == kFnSoftmax || k == 1) {
      vr = yr;
    } else {
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < k; ++r) sum += __shfl_sync(kFull, yr, sbase + r);
      vr = yr / (sum + kEps);
    }
    if (valid && has) {
      const long long o = t * static_cast<long long>(k) + ls;
      if (compact) {
        P.ids[o] = my_idx;
        P.weights[o] = P.scale * vr;
      } else if (P.out == kOutIndices) {
        store_index(P.indices, P.idx_type, o, my_idx);
      }
    }

    // ---- dense outputs: one vector store per lane and output --------------------------------------------------
    if (!compact) {
      if (has) ybuf[my_idx] = vr;  // every read of ybuf above is by the lane that now writes the entry
      __syncwarp();
      const bool st = valid && lvalid;
      float wv[W], pv[W];
      if constexpr (W % 4 == 0) {
#pragma unroll
        for (int w = 0; w < W; w += 4) {
          const float4 q = *reinterpret_cast<const float4*>(ybuf + e0 + w);
          wv[w] = q.x;
          wv[w + 1] = q.y;
          wv[w + 2] = q.z;
          wv[w + 3] = q.w;
        }
      } else {
#pragma unroll
        for (int w = 0; w < W; ++w) wv[w] = ybuf[e0 + w];
      }
#pragma unroll
      for (int w = 0; w < W; ++w) pv[w] = ((selm >> w) & 1u) ? P.scale * wv[w] : 0.0f;
      if (st) store_chunk<DT, W>(static_cast<S*>(P.probs) + rowE + e0, pv);
      if (softmax_post) {
#pragma unroll
        for (int w = 0; w < W; ++w) wv[w] = ((selm >> w) & 1u) ? wv[w] : -INFINITY;
        if (st) store_chunk<kDtF32, W>(P.inter + rowE + e0, wv);
      }
      if (P.out == kOutBytemap && st) {
        // bit j of a nibble to byte j: the multiplier's four shifts (0, 7, 14, 21) never collide
        const unsigned lo = ((selm & 0xfu) * 0x00204081u) & 0x01010101u;
        if constexpr (W == 8) {
          const unsigned hi = (((selm >> 4) & 0xfu) * 0x00204081u) & 0x01010101u;
          __stcs(reinterpret_cast<uint2*>(P.map + rowE + e0), make_uint2(lo, hi));
        } else {
          static_assert(W == 4, "bytemap rows are built from 8- or 4-expert lanes");
          __stcs(reinterpret_cast<unsigned*>(P.map + rowE + e0), lo);
        }
      } else if (P.out == kOutBitmap) {
        unsigned char* mrow = P.map + t * static_cast<long long>((E + 7) >> 3);
        if constexpr (W == 8) {
          if (st) mrow[ls] = static_cast<unsigned char>(selm);
        } else {
          const unsigned o = __shfl_xor_sync(kFull, selm, 1);
          if ((ls & 1) == 0 && st) mrow[ls >> 1] = static_cast<unsigned char>(selm | (o << 4));
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
