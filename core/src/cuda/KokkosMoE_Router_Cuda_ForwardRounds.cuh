/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_CUDA_FORWARDROUNDS_CUH
#define KOKKOSMOE_ROUTER_CUDA_FORWARDROUNDS_CUH

// The rounds kernel of topk_router's forward (KokkosMoE_Router_Cuda_Forward.cuh describes the family): k <= TPT,
// selection by k rounds of a segment arg-max, on the lane mapping and the helpers of the register kernel.

#include <cuda/KokkosMoE_Router_Cuda_Forward.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

// =============================================================================================================
// Fast path for k <= TPT: k rounds of a segment arg-max over per-lane sorted top-3 lists (registers only).
//   round r: M = max of the lane heads (one redux.sync for TPT == 32); the winner is the lowest lane whose head
//   equals M (lowest index: lane order is index order inside a chunk row; across chunks a min-index reduction
//   breaks the tie); the winner pops its head, recomputing its list only when it runs dry. Slot r's index goes
//   to lane r; weights are computed by the slot lanes (sums in slot order via shuffles) and fetched by the
//   owner lanes with one shuffle per expert. Shared memory holds only the activation row and a slot byte per
//   selected expert.
// =============================================================================================================
template <class L, int TPT, int NC, int W>
__global__ void __launch_bounds__(128) topk_fwd_rounds(const FwdParams<L> P) {
  using TT = Elem<L>;
  using S = typename TT::S;
  constexpr int V = NC * W;
  constexpr int TPW = 32 / TPT;
  constexpr int Q = 3;
  static_assert(V <= 32, "selection masks are 32-bit");
  extern __shared__ __align__(16) unsigned char smem[];

  LaneTokens<L, TPT, NC, W> it;
  const int lane = it.lane;
  const int seg = it.seg;
  const int ls = it.ls;
  const bool(&cvalid)[NC] = it.cvalid;
  const int sbase = seg * TPT;
  const unsigned segmask = (TPT == 32) ? kFull : (((1u << TPT) - 1u) << sbase);
  const int E = P.E;
  const int k = P.k;
  const int fn = P.fn;
  const bool aux = P.aux != 0;
  const bool compact = P.out == kOutCompact;
  const bool softmax_post = fn == kFnSoftmax && !P.pre && !aux;

  unsigned char* tok = smem + static_cast<size_t>(it.warp * TPW + seg) * P.tok_smem;
  float* ybuf = reinterpret_cast<float*>(tok);  // activations
  unsigned char* sl = tok + P.off_fbuf;         // slot of each selected expert
  const float* sbias = it.start(P, smem, TPT * V);

  for (; it.more(P); it.next()) {
    float y[V];
    unsigned key[V];
    const bool valid = it.front(P, sbias, ybuf, y, key);
    const long long t = it.token();
    const long long rowE = t * static_cast<long long>(E);

    // ---- per-lane sorted top-Q (key desc, position asc) -------------------------------------------------
    unsigned Lk[Q];
    int Lp[Q];
#pragma unroll
    for (int j = 0; j < Q; ++j) {
      Lk[j] = 0u;
      Lp[j] = 0;
    }
#pragma unroll
    for (int p = 0; p < V; ++p) topq_insert<Q>(Lk, Lp, key[p], p);

    // ---- k rounds ---------------------------------------------------------------------------------------
    unsigned selmask = 0;
    int my_idx = 0;  // slot ls (ls < k): expert index
    for (int r = 0; r < k; ++r) {
      const unsigned head = Lk[0];
      const int hp = Lp[0];
      const int hidx = ((hp / W) * TPT + ls) * W + (hp % W);
      const unsigned M = seg_max_u32<TPT>(head);
      const unsigned b = __ballot_sync(kFull, head == M) & segmask;
      int wl = __ffs(b) - 1;  // lowest lane with the maximum
      if constexpr (NC > 1) {
        // equal heads in different chunk rows: the lowest expert index wins
        if (__any_sync(kFull, __popc(b) > 1)) {
          const unsigned cand = (head == M) ? static_cast<unsigned>(hidx) : 0xffffffffu;
          const unsigned mn = seg_min_u32<TPT>(cand);
          wl = __ffs(__ballot_sync(kFull, cand == mn) & segmask) - 1;
        }
      }
      const int widx = __shfl_sync(kFull, hidx, wl);
      if (ls == r) my_idx = widx;
      const bool win = lane == wl;
      if (win) {
        selmask |= 1u << hp;
        if (!aux) sl[hidx] = static_cast<unsigned char>(r);
#pragma unroll
        for (int j = 0; j + 1 < Q; ++j) {
          Lk[j] = Lk[j + 1];
          Lp[j] = Lp[j + 1];
        }
        Lk[Q - 1] = 0u;
        Lp[Q - 1] = 0;
      }
      const bool dry = win && Lk[0] == 0u && r + 1 < k;
      if (__any_sync(kFull, dry)) {
        if (dry) {
#pragma unroll
          for (int p = 0; p < V; ++p) topq_insert<Q>(Lk, Lp, (selmask & (1u << p)) ? 0u : key[p], p);
        }
      }
    }
    __syncwarp();

    // ---- slot weights (§5.2): slot lanes, sums in slot order ---------------------------------------------
    float vr = 0.0f;
    if (!aux) {
      const bool has = ls < k;
      vr = slot_weight(P, k, softmax_post, has ? ybuf[my_idx] : 1.0f, sbase);
      if (valid && has) store_slot(P, k, t, ls, my_idx, vr);
    }

    // ---- dense outputs: one pass over the row ----------------------------------------------------------
    if (!compact) {
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        const int e0 = (c * TPT + ls) * W;
        const bool st = valid && cvalid[c];
        unsigned char f[W];
#pragma unroll
        for (int w = 0; w < W; ++w) f[w] = (selmask >> (c * W + w)) & 1u;
        if (!aux) {
          unsigned char sv[W];
          {
            using VB = Vec<unsigned char, W>;
            const typename VB::R rb = *reinterpret_cast<const typename VB::R*>(sl + e0);
            VB::to_array(rb, sv);
          }
          float wv[W], pv[W];
#pragma unroll
          for (int w = 0; w < W; ++w) {
            const int src = f[w] ? (sv[w] & (TPT - 1)) : 0;
            wv[w] = __shfl_sync(kFull, vr, sbase + src);
            pv[w] = f[w] ? P.scale * wv[w] : 0.0f;
          }
          if (st) store_elems<L, W>(storage(P.probs) + rowE + e0, pv);
          if (softmax_post) {
#pragma unroll
            for (int w = 0; w < W; ++w) wv[w] = f[w] ? wv[w] : -INFINITY;
            if (st) store_elems<float, W>(P.inter + rowE + e0, wv);
          }
        }
        if (P.out == kOutBytemap && st) store_bytes<W>(P.map + rowE + e0, f);
      }
      if (P.out == kOutBitmap) {
        const long long nb = (E + 7) >> 3;
        unsigned char* mrow = P.map + t * nb;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const unsigned bits = (selmask >> (c * W)) & ((W == 32) ? 0xffffffffu : ((1u << W) - 1u));
          if constexpr (W == 8) {
            if (valid && cvalid[c]) mrow[((c * TPT + ls) * W) >> 3] = static_cast<unsigned char>(bits);
          } else if constexpr (W == 4) {
            if constexpr (TPT == 1) {
              if ((c & 1) == 0) {
                const unsigned hi = (c + 1 < NC) ? ((selmask >> ((c + 1) * W)) & 0xfu) : 0u;
                if (valid && cvalid[c]) mrow[c >> 1] = static_cast<unsigned char>(bits | (hi << 4));
              }
            } else {
              const unsigned o = __shfl_xor_sync(kFull, bits, 1);
              if ((ls & 1) == 0 && valid && cvalid[c])
                mrow[((c * TPT + ls) * W) >> 3] = static_cast<unsigned char>(bits | (o << 4));
            }
          } else {
            static_assert(W == 1 && TPT == 32, "scalar rounds kernel uses whole warps");
            const unsigned bb = __ballot_sync(kFull, bits != 0u);
            if ((ls & 7) == 0 && valid && cvalid[c])
              mrow[(c * TPT + ls) >> 3] = static_cast<unsigned char>((bb >> ls) & 0xffu);
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
