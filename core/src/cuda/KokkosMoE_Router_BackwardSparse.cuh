/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_BACKWARDSPARSE_CUH
#define KOKKOSMOE_ROUTER_BACKWARDSPARSE_CUH

// bwd_sparse<Params, TPT, VEC>: topk_backward's dense-indices path (IndicesBwdParams: gathers intermediate/grad at
// the k indices) and compact path (CompactBwdParams: gathers logits at the ids and recomputes the activations;
// Softmax pre reads the whole row). The k
// sums run in slot order (shuffles) when k <= TPT. The row is written as zeros (or -a*P for Softmax pre), then the k
// routed entries are overwritten after a warp barrier.

#include <cuda/KokkosMoE_Router_BackwardCommon.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

// ------------------------------------------------------------------------------------------------------------
// Sparse path: dense indices (gather intermediate/grad) or compact (gather logits, recompute activations).
/// The row fill of bwd_sparse before its routed entries are written: Softmax pre's non-routed gradient
/// softmax_grad(0, a, P) (docs/router.md §9), +0.0 for every other score function. The activations a come from the
/// forward's intermediate row, or, when lrow is set (compact form), from the logits row as exp(x - M) * inv.
template <class GO, class LD, int TPT, int VO, bool VEC>
__device__ __forceinline__ void fill_unrouted(typename Elem<GO>::S* orow, int E, int ls, bool pre, float Psum,
                                              const float* inter, const typename Elem<LD>::S* lrow, float M,
                                              float inv) {
  for (int e0 = ls * VO; e0 < E; e0 += TPT * VO) {
    float o[VO];
    if (pre) {
      if (lrow != nullptr) {
#pragma unroll
        for (int w = 0; w < VO; ++w) o[w] = softmax_exp(Elem<LD>::to_f(lrow[e0 + w]), M) * inv;
      } else if constexpr (VEC) {
        load_elems<float, VO>(inter + e0, o);
      } else {
        o[0] = inter[e0];
      }
#pragma unroll
      for (int w = 0; w < VO; ++w) o[w] = softmax_grad(0.0f, o[w], Psum);
    } else {
#pragma unroll
      for (int w = 0; w < VO; ++w) o[w] = 0.0f;
    }
    if constexpr (VEC)
      store_elems<GO, VO>(orow + e0, o);
    else
      orow[e0] = Elem<GO>::from_f(o[0]);
  }
}

/// A token's coefficients from its reduced sums (Ps for Softmax, S and Q otherwise), then, on a valid row, the fill
/// of its unrouted entries (fill_unrouted, from the intermediate row unless the form is compact).
template <class Params, int TPT, int VO, bool VEC>
__device__ __forceinline__ BwdCoef coef_and_fill(const Params& P, bool valid, long long rowE, bool pre, int ls,
                                                 float Ps, float S, float Q,
                                                 const typename Elem<typename Params::Logit>::S* lrow, float M,
                                                 float inv) {
  BwdCoef cf;
  cf.P = Ps;
  cf.norm = P.k > 1;
  cf.set_sums(S, Q);
  if (valid) {
    const float* inter_row = nullptr;
    if constexpr (!Params::compact) inter_row = P.inter + rowE;
    fill_unrouted<typename Params::Out, typename Params::Logit, TPT, VO, VEC>(P.gout + rowE, P.E, ls, pre, cf.P,
                                                                              inter_row, lrow, M, inv);
  }
  return cf;
}

template <class Params, int TPT, bool VEC>
__global__ void __launch_bounds__(128) bwd_sparse(const Params P) {
  using GO = typename Params::Out;
  using LD = typename Params::Logit;
  using TO = Elem<GO>;
  using OS = typename TO::S;
  using TL = Elem<LD>;
  using LS = typename TL::S;
  constexpr int TPW = 32 / TPT;
  constexpr int VO = VEC ? 16 / static_cast<int>(sizeof(OS)) : 1;  // output elements per store
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = lane / TPT, ls = lane % TPT;
  const int E = P.E, k = P.k, fn = P.fn;
  constexpr bool compact = Params::compact;
  const bool pre = fn == kFnSoftmax && P.pre;
  const bool post = fn == kFnSoftmax && !P.pre;
  const bool small = k <= TPT;
  const long long nwarps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const long long gwarp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;

  if (small && !(compact && pre)) {
    // Software pipeline: slot indices (and compact gradient weights) two tokens ahead, the gathers one token
    // ahead. Lane ls < k owns slot ls.
    const long long stride = nwarps * TPW;
    auto idx_load = [&](long long tb, int& idx, float& gw) {
      const long long t = tb + seg;
      idx = 0;
      gw = 0.0f;
      if (t < P.T && ls < k) {
        const long long o = t * static_cast<long long>(k) + ls;
        if constexpr (compact) {
          idx = __ldg(P.ids + o);
          gw = P.weight(o);
        } else {
          idx = static_cast<int>(__ldg(P.indices + o));
        }
      }
    };
    auto gather = [&](long long tb, int idx, float& u, float& g) {  // compact: u = logit; indices: u = a, g = grad
      const long long t = tb + seg;
      u = 0.0f;
      g = 0.0f;
      if (t < P.T && ls < k) {
        const long long rowE = t * static_cast<long long>(E);
        if constexpr (compact) {
          u = TL::to_f(__ldg(P.logits + rowE + idx));
        } else {
          u = __ldg(P.inter + rowE + idx);
          g = TO::to_f(__ldg(P.gin + rowE + idx));
        }
      }
    };
    int i0, i1, i2;
    float w0, w1, w2, u0, u1, h0, h1;
    long long tb = gwarp * TPW;
    idx_load(tb, i0, w0);
    idx_load(tb + stride, i1, w1);
    gather(tb, i0, u0, h0);
    for (; tb < P.T; tb += stride) {
      idx_load(tb + 2 * stride, i2, w2);
      gather(tb + stride, i1, u1, h1);
      const long long t = tb + seg;
      const bool valid = t < P.T;
      const long long rowE = t * static_cast<long long>(E);
      const bool has = valid && ls < k;
      // activations of the k slots
      float a, v, g;
      if constexpr (compact) {
        g = w0 * P.scale;
        if (fn == kFnSigmoid) {
          a = sigmoid(u0);
        } else if (fn == kFnSqrtSoftplus) {
          a = u0;
        } else {  // Softmax post: softmax over the slots, slot order (the forward's bits)
          const float x0 = __shfl_sync(kFull, u0, seg * TPT);
          const float e = softmax_exp(u0, x0);
          const float ez = softmax_term(u0, x0);
          float sum = 0.0f;
          for (int r = 0; r < k; ++r) sum += __shfl_sync(kFull, ez, seg * TPT + r);
          a = e * (1.0f / sum);
        }
      } else {
        a = u0;
        g = h0 * P.scale;
      }
      v = (fn == kFnSqrtSoftplus && has) ? sqrt_softplus(a) : a;
      float S = 0.0f, Q = 0.0f, Ps = 0.0f;
      const float gv = g * v, ga = g * a;
      for (int r = 0; r < k; ++r) {
        const int src = seg * TPT + r;
        if (fn == kFnSoftmax) {
          Ps += __shfl_sync(kFull, ga, src);
        } else {
          S += __shfl_sync(kFull, v, src);
          Q += __shfl_sync(kFull, gv, src);
        }
      }
      const BwdCoef cf = coef_and_fill<Params, TPT, VO, VEC>(P, valid, rowE, pre, ls, Ps, S, Q, nullptr, 0.0f, 0.0f);
      __syncwarp();
      if (has) {
        const float dx = (fn == kFnSoftmax) ? softmax_grad(g, a, cf.P) : dx_sig_ssp(fn, cf, true, a, v, g);
        P.gout[rowE + i0] = TO::from_f(dx);
      }
      __syncwarp();
      i0 = i1;
      i1 = i2;
      w0 = w1;
      w1 = w2;
      u0 = u1;
      h0 = h1;
    }
    return;
  }

  for (long long tb = gwarp * TPW; tb < P.T; tb += nwarps * TPW) {
    const long long t = tb + seg;
    const bool valid = t < P.T;
    const long long rowE = t * static_cast<long long>(E);
    const long long rowK = t * static_cast<long long>(k);
    const LS* lrow = nullptr;
    if constexpr (compact) lrow = P.logits + rowE;

    // Softmax pre in compact form: full-row statistics from the logits
    float M = 0.0f, inv = 0.0f;
    if (compact && pre) {
      float m = -INFINITY, s = 0.0f;
      if (valid) {
        for (int e = ls; e < E; e += TPT) m = math_fmax(m, TL::to_f(lrow[e]));
        for (int e = ls; e < E; e += TPT) {
          const float xe = TL::to_f(lrow[e]);
          if (xe != -INFINITY) s += softmax_exp(xe, m);
        }
      }
#pragma unroll
      for (int o = TPT / 2; o > 0; o >>= 1) {
        const float mo = __shfl_xor_sync(kFull, m, o);
        const float so = __shfl_xor_sync(kFull, s, o);
        softmax_merge(m, s, mo, so);
      }
      M = m;
      inv = 1.0f / s;
    }
    // Softmax post in compact form: logit of slot 0 and the softmax sum over the slots
    float x0 = 0.0f, sinv = 0.0f;
    if constexpr (compact)
      if (post && valid) x0 = TL::to_f(lrow[P.ids[rowK]]);

    // per-slot values: idx, a (intermediate-equivalent), v (normalization value), g (scaled gradient)
    auto slot = [&](int r, int& idx, float& a, float& v, float& g, float& e) {
      if constexpr (compact) {
        idx = P.ids[rowK + r];
        const float x = TL::to_f(lrow[idx]);
        g = P.weight(rowK + r) * P.scale;
        e = 0.0f;
        if (fn == kFnSigmoid) {
          a = sigmoid(x);
        } else if (fn == kFnSqrtSoftplus) {
          a = x;
        } else if (pre) {
          a = softmax_exp(x, M) * inv;
        } else {
          e = softmax_exp(x, x0);
          a = (x == -INFINITY) ? -INFINITY : e;  // marker for the sum; fixed below
        }
      } else {
        idx = static_cast<int>(P.indices[rowK + r]);
        a = P.inter[rowE + idx];
        g = TO::to_f(P.gin[rowE + idx]) * P.scale;
        e = 0.0f;
      }
      v = (fn == kFnSqrtSoftplus) ? sqrt_softplus(a) : a;
    };
    // slot r with the compact Softmax post activation normalized by sinv (set below, before the first call)
    auto weighted_slot = [&](int r, int& idx, float& a, float& v, float& g) {
      float e;
      slot(r, idx, a, v, g, e);
      if (compact && post) {
        a = e * sinv;
        v = a;
      }
    };

    float S = 0.0f, Q = 0.0f, Ps = 0.0f;
    int my_idx = 0;
    float my_a = 0.0f, my_v = 0.0f, my_g = 0.0f;
    if (small) {
      const bool has = valid && ls < k;
      float e = 0.0f;
      if (has) slot(ls, my_idx, my_a, my_v, my_g, e);
      if (compact && post) {
        // softmax over the k slots, slot order (matches the forward's bits)
        float sum = 0.0f;
        for (int r = 0; r < k; ++r) {
          const float er = __shfl_sync(kFull, my_a, seg * TPT + r);
          sum += (er == -INFINITY) ? 0.0f : er;
        }
        sinv = 1.0f / sum;
        my_a = e * sinv;
        my_v = my_a;
      }
      for (int r = 0; r < k; ++r) {
        const int src = seg * TPT + r;
        const float va = __shfl_sync(kFull, my_a, src);
        const float vv = __shfl_sync(kFull, my_v, src);
        const float vg = __shfl_sync(kFull, my_g, src);
        if (fn == kFnSoftmax) {
          Ps += vg * va;
        } else {
          S += vv;
          Q += vg * vv;
        }
      }
    } else {
      if (compact && post) {
        float sum = 0.0f;
        if (valid)
          for (int r = ls; r < k; r += TPT) {
            int idx;
            float a, v, g, e;
            slot(r, idx, a, v, g, e);
            sum += (a == -INFINITY) ? 0.0f : e;
          }
        sinv = 1.0f / seg_add_f32<TPT>(sum);
      }
      if (valid)
        for (int r = ls; r < k; r += TPT) {
          int idx;
          float a, v, g;
          weighted_slot(r, idx, a, v, g);
          if (fn == kFnSoftmax) {
            Ps += g * a;
          } else {
            S += v;
            Q += g * v;
          }
        }
      Ps = seg_add_f32<TPT>(Ps);
      S = seg_add_f32<TPT>(S);
      Q = seg_add_f32<TPT>(Q);
    }
    // row fill: +0.0, or the non-routed Softmax pre gradient
    const BwdCoef cf = coef_and_fill<Params, TPT, VO, VEC>(P, valid, rowE, pre, ls, Ps, S, Q, lrow, M, inv);
    __syncwarp();
    // routed entries
    if (valid) {
      OS* orow = P.gout + rowE;
      auto put = [&](int idx, float a, float v, float g) {
        float dx;
        if (fn == kFnSoftmax)
          dx = softmax_grad(g, a, cf.P);
        else
          dx = dx_sig_ssp(fn, cf, true, a, v, g);
        orow[idx] = TO::from_f(dx);
      };
      if (small) {
        if (ls < k) put(my_idx, my_a, my_v, my_g);
      } else {
        for (int r = ls; r < k; r += TPT) {
          int idx;
          float a, v, g;
          weighted_slot(r, idx, a, v, g);
          put(idx, a, v, g);
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
