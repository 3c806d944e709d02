/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_BACKWARDDENSE_CUH
#define KOKKOSMOE_ROUTER_BACKWARDDENSE_CUH

// The map backward's kernels (docs/router.md §9, §10): bwd_dense<GI, GO, TPT, NC, W> streams the rows (map path and
// aux-score path): TPT lanes per token, NC chunks of W experts per lane (16/32-byte vector accesses); rows longer than
// one register tile are processed in tiles with a second (cache-resident) read. Intermediate/gradient chunks are
// loaded only where the map has a routed expert (or everywhere for Softmax pre / aux scores), so a k-sparse map moves
// about map + k sectors + the output. Sums (S, Q, P) run per lane in index order, then a fixed butterfly:
// deterministic; Bytemap and BitmapU8 decode to the same flags and run the same code, so their gradients are
// bit-identical. bwd_map_sparse: the same lane layout, gathering only the routed entries.

#include <cuda/KokkosMoE_Router_BackwardCommon.cuh>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

/// The per-lane sums of a token's routed experts over V register slots, in slot (= index) order: P (Softmax), S and
/// Q (Sigmoid, SqrtSoftplus).
template <int V>
__device__ __forceinline__ void add_routed_sums(int fn, unsigned rm, const float* a, const float* g, const float* v,
                                                float& S, float& Q, float& Ps) {
#pragma unroll
  for (int p = 0; p < V; ++p) {
    if (rm & (1u << p)) {
      if (fn == kFnSoftmax) {
        Ps += g[p] * a[p];
      } else {
        S += v[p];
        Q += g[p] * v[p];
      }
    }
  }
}

/// The gradients of V register slots from the reduced coefficients (every slot for Softmax pre / aux scores).
template <int V>
__device__ __forceinline__ void row_gradients(int fn, bool all_a, unsigned rm, const BwdCoef& cf, const float* a,
                                              const float* v, const float* g, float* dx) {
#pragma unroll
  for (int p = 0; p < V; ++p) {
    const bool r = (rm & (1u << p)) != 0;
    if (fn == kFnSoftmax)
      dx[p] = all_a ? softmax_grad(r ? g[p] : 0.0f, a[p], cf.P) : (r ? softmax_grad(g[p], a[p], cf.P) : 0.0f);
    else
      dx[p] = dx_sig_ssp(fn, cf, r, a[p], v[p], g[p]);
  }
}

// ------------------------------------------------------------------------------------------------------------
// Launch bounds: one chunk per lane asks for at least 6 blocks per SM, which allows 80 registers, enough for ptxas
// to keep the kernel's rows without spilling (without the bound it allocates fewer and spills); several chunks per
// lane need more registers than a multi-block bound leaves.
template <class GI, class GO, int TPT, int NC, int W>
__global__ void __launch_bounds__(128, NC == 1 ? 6 : 1) bwd_dense(const DenseBwdParams<GI, GO> P) {
  using TI = Elem<GI>;
  constexpr int V = NC * W;
  constexpr int TPW = 32 / TPT;
  constexpr int ECAP = TPT * V;
  static_assert(V <= 32, "flag masks are 32-bit");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = lane / TPT, ls = lane % TPT;
  const int E = P.E, fn = P.fn;
  const bool aux = P.aux != 0;
  const bool all_a = fn == kFnSoftmax && (P.pre || aux);  // every expert's a is needed
  const bool single = E <= ECAP;
  const int nb = (E + 7) >> 3;
  const long long nwarps = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
  const long long gwarp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;

  // The pipelined single-tile path needs two tokens of chunks in registers: with FP32 gradients and <= 16
  // experts per lane ptxas caps it at 72 registers and spills, which costs more than the pipeline hides, so
  // those instantiations keep the plain loop below.
  constexpr bool kPipe = !std::is_same_v<GI, float> || (V >= 32);
  if constexpr (kPipe)
    if (single) {
      // Software pipeline over this warp's tokens: the map is loaded two tokens ahead, the routed intermediate /
      // gradient chunks one token ahead, so a token costs one memory latency overlapped with the previous ones.
      using MC = MapChunk<W>;
      using AR = typename Vec<float, W>::R;
      using GR = typename Vec<typename TI::S, W>::R;
      const long long stride = nwarps * TPW;
      auto map_load = [&](long long tb, MC(&mc)[NC]) {
        const long long t = tb + seg;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e0 = (c * TPT + ls) * W;
          mc[c].load(P, t, e0, nb, t < P.T && e0 < E && !aux);
        }
      };
      auto flags = [&](long long tb, const MC(&mc)[NC], int c) -> unsigned {
        const long long t = tb + seg;
        const int e0 = (c * TPT + ls) * W;
        if (!(t < P.T && e0 < E)) return 0u;
        if (aux) return (W == 32) ? 0xffffffffu : ((1u << W) - 1u);
        return mc[c].flags(P, e0);
      };
      auto ag_load = [&](long long tb, const MC(&mc)[NC], AR(&ar)[NC], GR(&gr)[NC]) {
        const long long t = tb + seg;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e0 = (c * TPT + ls) * W;
          const unsigned f = flags(tb, mc, c);
          memset(&ar[c], 0, sizeof(AR));
          memset(&gr[c], 0, sizeof(GR));
          if (f != 0 || (all_a && t < P.T && e0 < E))
            ar[c] = Vec<float, W>::ldg(P.inter + t * static_cast<long long>(E) + e0);
          if (f != 0) gr[c] = Vec<typename TI::S, W>::ldg(P.gin + t * static_cast<long long>(E) + e0);
        }
      };
      MC m0[NC], m1[NC], m2[NC];
      AR a0[NC], a1[NC];
      GR g0[NC], g1[NC];
      long long tb = gwarp * TPW;
      map_load(tb, m0);
      map_load(tb + stride, m1);
      ag_load(tb, m0, a0, g0);
      for (; tb < P.T; tb += stride) {
        map_load(tb + 2 * stride, m2);
        ag_load(tb + stride, m1, a1, g1);
        // ---- token tb: widen, sums, gradients
        const long long t = tb + seg;
        const bool valid = t < P.T;
        const long long rowE = t * static_cast<long long>(E);
        float a[V], g[V], v[V];
        unsigned rm = 0;
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          rm |= flags(tb, m0, c) << (c * W);
          float av[W];
          typename TI::S gs[W];
          memcpy(av, &a0[c], sizeof(av));
          memcpy(gs, &g0[c], sizeof(gs));
#pragma unroll
          for (int w = 0; w < W; ++w) {
            a[c * W + w] = av[w];
            g[c * W + w] = TI::to_f(gs[w]) * P.scale;
          }
        }
        float S = 0.0f, Q = 0.0f, Ps = 0.0f;
#pragma unroll
        for (int p = 0; p < V; ++p) {
          v[p] = a[p];
          if (fn == kFnSqrtSoftplus && (rm & (1u << p))) v[p] = sqrt_softplus(a[p]);
        }
        add_routed_sums<V>(fn, rm, a, g, v, S, Q, Ps);
        const BwdCoef cf = reduce_coef<TPT>(fn, aux || P.k > 1, S, Q, Ps);
        float dx[V];
        row_gradients<V>(fn, all_a, rm, cf, a, v, g, dx);
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e0 = (c * TPT + ls) * W;
          if (valid && e0 < E) store_elems<GO, W>(P.gout + rowE + e0, dx + c * W);
        }
        // rotate the pipeline
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          m0[c] = m1[c];
          m1[c] = m2[c];
          a0[c] = a1[c];
          g0[c] = g1[c];
        }
      }
      return;
    }

  for (long long tb = gwarp * TPW; tb < P.T; tb += nwarps * TPW) {
    const long long t = tb + seg;
    const bool valid = t < P.T;
    const long long rowE = t * static_cast<long long>(E);
    float a[V], g[V], v[V];
    unsigned rm = 0;
    float S = 0.0f, Q = 0.0f, Ps = 0.0f;
    BwdCoef cf{0.0f, 0.0f, 0.0f, 0.0f, false};
    for (int pass = 0; pass < 2; ++pass) {
      for (int base = 0; base < E; base += ECAP) {
        if (!(single && pass == 1)) {
          rm = 0;
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int e0 = base + (c * TPT + ls) * W;
            unsigned f = 0;  // W flag bits
            if (valid && e0 < E)
              f = aux ? ((W == 32) ? 0xffffffffu : ((1u << W) - 1u)) : map_chunk_flags<W>(P, t, e0, nb);
            rm |= f << (c * W);
            if (valid && e0 < E && (f != 0 || all_a)) {
              load_elems<float, W>(P.inter + rowE + e0, a + c * W);
            } else {
#pragma unroll
              for (int w = 0; w < W; ++w) a[c * W + w] = 0.0f;
            }
            if (f != 0) {
              load_elems<GI, W>(P.gin + rowE + e0, g + c * W);
#pragma unroll
              for (int w = 0; w < W; ++w) g[c * W + w] *= P.scale;
            } else {
#pragma unroll
              for (int w = 0; w < W; ++w) g[c * W + w] = 0.0f;
            }
          }
#pragma unroll
          for (int p = 0; p < V; ++p) {
            v[p] = a[p];
            if (fn == kFnSqrtSoftplus && (rm & (1u << p))) v[p] = sqrt_softplus(a[p]);
          }
        }
        if (pass == 0) {
          add_routed_sums<V>(fn, rm, a, g, v, S, Q, Ps);
        } else {
          float dx[V];
          row_gradients<V>(fn, all_a, rm, cf, a, v, g, dx);
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int e0 = base + (c * TPT + ls) * W;
            if (valid && e0 < E) store_elems<GO, W>(P.gout + rowE + e0, dx + c * W);
          }
        }
      }
      if (pass == 0) cf = reduce_coef<TPT>(fn, aux || P.k > 1, S, Q, Ps);
    }
  }
}

// ------------------------------------------------------------------------------------------------------------
// bwd_map_sparse<GI, GO, TPT, NC, W>: the map path where only routed entries are needed (Sigmoid, SqrtSoftplus,
// Softmax post; one register tile: E <= TPT * NC * W). The same lane layout and per-lane index order as bwd_dense,
// so the sums and gradients are bit-identical to it; but a lane keeps only its flag mask and the values of its
// first kHeld routed experts in registers: the map is loaded one token ahead, the routed intermediate / gradient
// elements are gathered (their loads overlap), the output chunks are written as zeros and the routed gradients
// stored over them. A lane with more routed experts gathers the rest one by one, twice. Few registers, so many
// tokens are in flight per SM.
template <class GI, class GO, int TPT, int NC, int W>
__global__ void __launch_bounds__(128) bwd_map_sparse(const DenseBwdParams<GI, GO> P) {
  using TI = Elem<GI>;
  using TO = Elem<GO>;
  using GS = typename TI::S;
  using OS = typename TO::S;
  constexpr int TPW = 32 / TPT;
  constexpr int kHeld = 4;
  static_assert(NC * W <= 32, "flag masks are 32-bit");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = lane / TPT, ls = lane % TPT;
  const int E = P.E, fn = P.fn;
  const int nb = (E + 7) >> 3;
  const GS* gin = P.gin;
  const long long stride = static_cast<long long>(gridDim.x) * (blockDim.x >> 5) * TPW;
  const long long gwarp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + warp;
  // expert of flag bit p of this lane
  auto expert = [&](int p) { return ((p / W) * TPT + ls) * W + p % W; };
  auto map_load = [&](long long t, MapChunk<W>(&mc)[NC]) {
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * TPT + ls) * W;
      mc[c].load(P, t, e0, nb, t < P.T && e0 < E);
    }
  };
  // the terms of one routed expert: a (intermediate), g (scaled gradient)
  auto gather = [&](long long rowE, int p, float& a, float& g) {
    a = __ldg(P.inter + rowE + expert(p));
    g = TI::to_f(__ldg(gin + rowE + expert(p))) * P.scale;
  };
  float S = 0.0f, Q = 0.0f, Ps = 0.0f;
  auto accumulate = [&](float a, float g) {
    if (fn == kFnSoftmax) {
      Ps += g * a;
    } else {
      const float v = (fn == kFnSqrtSoftplus) ? sqrt_softplus(a) : a;
      S += v;
      Q += g * v;
    }
  };

  MapChunk<W> mc[NC];
  long long t = gwarp * TPW + seg;
  map_load(t, mc);
  for (; t - seg < P.T; t += stride) {
    const bool valid = t < P.T;
    const long long rowE = t * static_cast<long long>(E);
    unsigned rm = 0;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if ((c * TPT + ls) * W < E) rm |= mc[c].flags(P, (c * TPT + ls) * W) << (c * W);
    map_load(t + stride, mc);
    // the first kHeld routed experts, in bit (= index) order, kept; the rest after them
    int p[kHeld];
    bool h[kHeld];
    float a[kHeld], g[kHeld];
    unsigned rest = rm;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      h[j] = rest != 0;
      p[j] = h[j] ? __ffs(rest) - 1 : 0;
      rest &= rest - 1;
    }
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      a[j] = 0.0f;
      g[j] = 0.0f;
      if (h[j]) gather(rowE, p[j], a[j], g[j]);
    }
    S = Q = Ps = 0.0f;
#pragma unroll
    for (int j = 0; j < kHeld; ++j)
      if (h[j]) accumulate(a[j], g[j]);
    for (unsigned m = rest; m != 0; m &= m - 1) {
      float ar, gr;
      gather(rowE, __ffs(m) - 1, ar, gr);
      accumulate(ar, gr);
    }
    const BwdCoef cf = reduce_coef<TPT>(fn, P.k > 1, S, Q, Ps);
    if (!valid) continue;
    auto dx = [&](float av, float gv) {
      if (fn == kFnSoftmax) return softmax_grad(gv, av, cf.P);
      return dx_sig_ssp(fn, cf, true, av, (fn == kFnSqrtSoftplus) ? sqrt_softplus(av) : av, gv);
    };
    OS* orow = P.gout + rowE;
    const float zero[W] = {};
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * TPT + ls) * W;
      if (e0 < E) store_elems<GO, W, false>(orow + e0, zero);  // write-back: the routed stores follow
    }
    // the same thread stores the routed gradients over its zeros (program order on the same address)
#pragma unroll
    for (int j = 0; j < kHeld; ++j)
      if (h[j]) orow[expert(p[j])] = TO::from_f(dx(a[j], g[j]));
    for (unsigned m = rest; m != 0; m &= m - 1) {
      float ar, gr;
      gather(rowE, __ffs(m) - 1, ar, gr);
      orow[expert(__ffs(m) - 1)] = TO::from_f(dx(ar, gr));
    }
  }
}

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
