/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Backward kernels: topk_backward (Bytemap, BitmapU8, dense indices, compact) and aux_scores_backward
// (docs/router.md §5.5, §9, §10).
//
// bwd_dense<GI, GO, TPT, NC, W>: map path and aux-score path. TPT lanes per token, NC chunks of W experts per lane
//   (16/32-byte vector accesses), rows longer than one register tile are processed in tiles with a second
//   (cache-resident) read. Intermediate/gradient chunks are loaded only where the map has a routed expert (or
//   everywhere for Softmax pre / aux scores), so a k-sparse map moves about map + k sectors + the output.
//   Sums (S, Q, P) run per lane in index order, then a fixed butterfly: deterministic; Bytemap and BitmapU8
//   decode to the same flags and run the same code, so their gradients are bit-identical.
// bwd_sparse<GO, LD, TPT, VEC> (KokkosMoE_Router_BackwardSparse.cuh): dense-indices and compact paths.

#include <cuda/KokkosMoE_Router_Kernels.hpp>
#include <impl/KokkosMoE_TestSeam.hpp>

#include <algorithm>
#include <cuda/KokkosMoE_Router_BackwardCommon.cuh>
#include <cuda/KokkosMoE_Router_BackwardSparse.cuh>
#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

namespace {

// ------------------------------------------------------------------------------------------------------------
// Launch bounds: one chunk per lane asks for at least 6 blocks per SM, which allows 80 registers, enough for ptxas
// to keep the kernel's rows without spilling (without the bound it allocates fewer and spills); several chunks per
// lane need more registers than a multi-block bound leaves.
template <int GI, int GO, int TPT, int NC, int W>
__global__ void __launch_bounds__(128, NC == 1 ? 6 : 1) bwd_dense(const BwdParams P) {
  using TI = Ty<GI>;
  using TO = Ty<GO>;
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
  constexpr bool kPipe = (GI != kDtF32) || (V >= 32);
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
          if (f != 0)
            gr[c] = Vec<typename TI::S, W>::ldg(static_cast<const typename TI::S*>(P.gin) +
                                                t * static_cast<long long>(E) + e0);
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
          if (rm & (1u << p)) {
            if (fn == kFnSoftmax) {
              Ps += g[p] * a[p];
            } else {
              S += v[p];
              Q += g[p] * v[p];
            }
          }
        }
        const BwdCoef cf = reduce_coef<TPT>(fn, aux || P.k > 1, S, Q, Ps);
        float dx[V];
#pragma unroll
        for (int p = 0; p < V; ++p) {
          const bool r = (rm & (1u << p)) != 0;
          if (fn == kFnSoftmax)
            dx[p] = all_a ? softmax_grad(r ? g[p] : 0.0f, a[p], cf.P) : (r ? softmax_grad(g[p], a[p], cf.P) : 0.0f);
          else
            dx[p] = dx_sig_ssp(fn, cf, r, a[p], v[p], g[p]);
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          const int e0 = (c * TPT + ls) * W;
          if (valid && e0 < E) store_chunk<GO, W>(static_cast<typename TO::S*>(P.gout) + rowE + e0, dx + c * W);
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
              load_chunk<kDtF32, W>(P.inter + rowE + e0, a + c * W);
            } else {
#pragma unroll
              for (int w = 0; w < W; ++w) a[c * W + w] = 0.0f;
            }
            if (f != 0) {
              load_chunk<GI, W>(static_cast<const typename TI::S*>(P.gin) + rowE + e0, g + c * W);
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
        } else {
          float dx[V];
#pragma unroll
          for (int p = 0; p < V; ++p) {
            const bool r = (rm & (1u << p)) != 0;
            if (fn == kFnSoftmax)
              dx[p] = all_a ? softmax_grad(r ? g[p] : 0.0f, a[p], cf.P) : (r ? softmax_grad(g[p], a[p], cf.P) : 0.0f);
            else
              dx[p] = dx_sig_ssp(fn, cf, r, a[p], v[p], g[p]);
          }
#pragma unroll
          for (int c = 0; c < NC; ++c) {
            const int e0 = base + (c * TPT + ls) * W;
            if (valid && e0 < E) store_chunk<GO, W>(static_cast<typename TO::S*>(P.gout) + rowE + e0, dx + c * W);
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
template <int GI, int GO, int TPT, int NC, int W>
__global__ void __launch_bounds__(128) bwd_map_sparse(const BwdParams P) {
  using TI = Ty<GI>;
  using TO = Ty<GO>;
  using GS = typename TI::S;
  using OS = typename TO::S;
  constexpr int TPW = 32 / TPT;
  constexpr int kHeld = 4;
  static_assert(NC * W <= 32, "flag masks are 32-bit");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int seg = lane / TPT, ls = lane % TPT;
  const int E = P.E, fn = P.fn;
  const int nb = (E + 7) >> 3;
  const GS* gin = static_cast<const GS*>(P.gin);
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
    OS* orow = static_cast<OS*>(P.gout) + rowE;
    const float zero[W] = {};
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int e0 = (c * TPT + ls) * W;
      if (e0 < E) store_chunk<GO, W, false>(orow + e0, zero);  // write-back: the routed stores follow
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

// ------------------------------------------------------------------------------------------------------------
template <class K>
cudaError_t launch_warps(K kern, const BwdParams& P, int tpt, const Queue& q) {
  const int block = 128;
  const long long tok_per_block = 4LL * (32 / tpt);
  const long long work = (P.T + tok_per_block - 1) / tok_per_block;
  const int grid = persistent_grid(q.device, reinterpret_cast<const void*>(kern), block, 0, work);
  kern<<<grid, block, 0, q.stream>>>(P);
  return cudaGetLastError();
}

/// Lane layout of a row in vector chunks of 8 experts: TPT lanes per token, NC chunks per lane.
template <int TPT_, int NC_>
struct RowLayout {
  static constexpr int TPT = TPT_, NC = NC_;
};
/// Calls launch(RowLayout) with the smallest layout that holds E experts in one register tile (E <= 1024).
template <class Launch>
cudaError_t by_row_layout(int E, const Launch& launch) {
  if (E <= 8) return launch(RowLayout<1, 1>{});
  if (E <= 16) return launch(RowLayout<2, 1>{});
  if (E <= 32) return launch(RowLayout<4, 1>{});
  if (E <= 64) return launch(RowLayout<8, 1>{});
  if (E <= 128) return launch(RowLayout<16, 1>{});
  if (E <= 256) return launch(RowLayout<32, 1>{});
  if (E <= 512) return launch(RowLayout<32, 2>{});
  return launch(RowLayout<32, 4>{});
}

/// The map path. Sigmoid, SqrtSoftplus and Softmax post with vector accesses and E <= 1024 run the sparse kernel,
/// unless the test seam asks for the streaming one (both give the same bits); the rest streams the rows.
template <int GI, int GO>
cudaError_t dense_dispatch(const BwdParams& P, bool vec, const Queue& q) {
  const bool sparse = !P.aux && !(P.fn == kFnSoftmax && P.pre) && P.E <= 1024;
  if (vec && sparse && !TestSeam::cuda_backward_kernel.streaming_only)
    return by_row_layout(P.E, [&](auto L) {
      using Lay = decltype(L);
      return launch_warps(bwd_map_sparse<GI, GO, Lay::TPT, Lay::NC, 8>, P, Lay::TPT, q);
    });
  if (vec)
    return by_row_layout(P.E, [&](auto L) {
      using Lay = decltype(L);
      return launch_warps(bwd_dense<GI, GO, Lay::TPT, Lay::NC, 8>, P, Lay::TPT, q);
    });
  return launch_warps(bwd_dense<GI, GO, 32, 8, 1>, P, 32, q);
}

template <int GO, int LD>
cudaError_t sparse_dispatch(const BwdParams& P, const Queue& q) {
  constexpr int VO = 16 / static_cast<int>(sizeof(typename Ty<GO>::S));
  const bool vec = (P.E % VO == 0) && aligned16(P.gout) && aligned16(P.inter);
  const int k = P.k;
  if (vec) {
    if (k <= 2) return launch_warps(bwd_sparse<GO, LD, 2, true>, P, 2, q);
    if (k <= 8) return launch_warps(bwd_sparse<GO, LD, 8, true>, P, 8, q);
    return launch_warps(bwd_sparse<GO, LD, 32, true>, P, 32, q);
  }
  if (k <= 2) return launch_warps(bwd_sparse<GO, LD, 2, false>, P, 2, q);
  if (k <= 8) return launch_warps(bwd_sparse<GO, LD, 8, false>, P, 8, q);
  return launch_warps(bwd_sparse<GO, LD, 32, false>, P, 32, q);
}

template <int GO>
cudaError_t aux_dispatch(const BwdParams& P, bool vec, const Queue& q) {
  if (vec) return launch_warps(bwd_dense<kDtF32, GO, 32, 1, 8>, P, 32, q);
  return launch_warps(bwd_dense<kDtF32, GO, 32, 8, 1>, P, 32, q);
}

}  // namespace
}  // namespace detail

using namespace detail;

cudaError_t topk_backward(const TopkBackwardArgs& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  BwdParams P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = a.config.topk;
  P.fn = static_cast<int>(a.config.score_function);
  P.pre = (a.config.score_function == ScoreFunction::Softmax && a.config.use_pre_softmax) ? 1 : 0;
  P.scale = a.config.scaling_factor;
  if (a.output == RoutingOutput::Compact) {
    P.compact = 1;
    P.logits = a.logits;
    P.ids = a.ids;
    P.gw_type = static_cast<int>(a.grad_weights_type);
    P.gw = a.grad_weights;
    P.gout = a.grad_logits;
    switch (a.logits_type) {
      case DType::F32:
        return sparse_dispatch<kDtF32, kDtF32>(P, q);
      case DType::F16:
        return sparse_dispatch<kDtF16, kDtF16>(P, q);
      case DType::BF16:
        return sparse_dispatch<kDtBF16, kDtBF16>(P, q);
      default:
        return cudaErrorInvalidValue;
    }
  }
  P.inter = a.intermediate;
  P.gin = a.grad_probs;
  P.gout = a.grad_logits;
  if (a.output == RoutingOutput::Indices) {
    P.idx_type = static_cast<int>(a.indices_type);
    P.indices = a.indices;
    switch (a.grad_type) {  // LD is unused on this path
      case DType::F32:
        return sparse_dispatch<kDtF32, kDtF32>(P, q);
      case DType::F16:
        return sparse_dispatch<kDtF16, kDtF16>(P, q);
      case DType::BF16:
        return sparse_dispatch<kDtBF16, kDtBF16>(P, q);
      default:
        return cudaErrorInvalidValue;
    }
  }
  P.map_kind = (a.output == RoutingOutput::BitmapU8) ? 1 : 0;
  P.map = a.routing_map;
  const bool vec = (P.E % 8 == 0) && aligned16(P.inter) && aligned16(P.gin) && aligned16(P.gout) && aligned16(P.map);
  switch (a.grad_type) {
    case DType::F32:
      return dense_dispatch<kDtF32, kDtF32>(P, vec, q);
    case DType::F16:
      return dense_dispatch<kDtF16, kDtF16>(P, vec, q);
    case DType::BF16:
      return dense_dispatch<kDtBF16, kDtBF16>(P, vec, q);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t aux_scores_backward(const AuxScoresBackwardArgs& a, const Queue& q) {
  if (a.num_tokens <= 0) return cudaSuccess;
  const DeviceGuard device(q);
  if (device.status() != cudaSuccess) return device.status();
  BwdParams P;
  P.T = a.num_tokens;
  P.E = a.num_experts;
  P.k = 2;  // unused: the aux path always normalizes
  P.fn = static_cast<int>(a.score_function);
  P.aux = 1;
  P.scale = 1.0f;
  P.inter = a.intermediate;
  P.gin = a.grad_scores;
  P.gout = a.grad_logits;
  const bool vec = (P.E % 8 == 0) && aligned16(P.inter) && aligned16(P.gin) && aligned16(P.gout);
  switch (a.grad_logits_type) {
    case DType::F32:
      return aux_dispatch<kDtF32>(P, vec, q);
    case DType::F16:
      return aux_dispatch<kDtF16>(P, vec, q);
    case DType::BF16:
      return aux_dispatch<kDtBF16>(P, vec, q);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE
