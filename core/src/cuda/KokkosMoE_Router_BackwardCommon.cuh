/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_BACKWARDCOMMON_CUH
#define KOKKOSMOE_ROUTER_BACKWARDCOMMON_CUH

// What the backward kernels (KokkosMoE_Router_BackwardDense.cuh, KokkosMoE_Router_BackwardSparse.cuh) share: their
// typed parameters, the per-token coefficients of the score functions' gradients, and the map chunk loads.

#include <cuda/KokkosMoE_Router_Kernels.hpp>

#include <cuda/KokkosMoE_Router_Cuda_Common.cuh>

namespace KokkosMoE {
namespace Impl {
namespace CudaKernels {
namespace detail {

/// The sizes and the score function's rule of a backward call, as the kernels read them.
struct BwdRule {
  long long T = 0;
  int E = 0, k = 1;
  int fn = 0, pre = 0;
  float scale = 1.0f;
};
inline BwdRule lower_rule(long long T, int E, const BackwardRule& r) {
  BwdRule b;
  b.T = T;
  b.E = E;
  b.k = r.topk;
  b.fn = static_cast<int>(r.score_function);
  b.pre = r.pre_softmax ? 1 : 0;
  b.scale = r.scaling_factor;
  return b;
}

/// The streaming and sparse map kernels (map backward, aux-scores backward): GI is the incoming gradient's element
/// type (grad_probs, or FP32 grad_scores), GO grad_logits'.
template <class GI, class GO>
struct DenseBwdParams : BwdRule {
  int aux = 0;       // aux_scores backward: every expert counts as routed, always normalized
  int map_kind = 0;  // 0 Bytemap, 1 BitmapU8 (not aux)
  const unsigned char* map = nullptr;
  const float* inter = nullptr;
  const typename Elem<GI>::S* gin = nullptr;
  typename Elem<GO>::S* gout = nullptr;
};

/// bwd_sparse from dense indices: gathers the intermediate and grad_probs (element type G) at the k indices (I).
template <class G, class I>
struct IndicesBwdParams : BwdRule {
  static constexpr bool compact = false;
  using Out = G;
  using Logit = G;  // no logits on this path
  const I* indices = nullptr;
  const float* inter = nullptr;
  const typename Elem<G>::S* gin = nullptr;
  typename Elem<G>::S* gout = nullptr;
};

/// bwd_sparse in compact form: gathers the logits (L) at the ids and recomputes the activations; gradient weights GW.
template <class L, class GW>
struct CompactBwdParams : BwdRule {
  static constexpr bool compact = true;
  using Out = L;
  using Logit = L;
  const typename Elem<L>::S* logits = nullptr;
  const int* ids = nullptr;
  const typename Elem<GW>::S* gw = nullptr;
  typename Elem<L>::S* gout = nullptr;
  __device__ __forceinline__ float weight(long long i) const { return Elem<GW>::to_f(__ldg(gw + i)); }
};

/// dx of one routed (or, for Softmax pre, any) expert; sums already reduced.
struct BwdCoef {
  float D, invD, qdd, P;  // invD = 1/D: one division per token instead of one per routed expert
  bool norm;              // Sigmoid/SqrtSoftplus normalization active (k > 1 or aux)
  /// The normalization terms from the reduced sums S (weights) and Q (weight times gradient).
  __device__ __forceinline__ void set_sums(float S, float Q) {
    D = normalization_denominator(S);
    qdd = Q / (D * D);
    invD = 1.0f / D;
  }
};
__device__ __forceinline__ float dx_sig_ssp(int fn, const BwdCoef& c, bool r, float a, float v, float g) {
  if (!r) return 0.0f;
  const float h = c.norm ? g * c.invD - c.qdd : g;
  if (fn == kFnSigmoid) return sigmoid_grad(h, a);
  return sqrt_softplus_grad(h, a, v);
}

/// The coefficients from one lane's partial sums, reduced over the token's TPT lanes (fixed butterfly order).
template <int TPT>
__device__ __forceinline__ BwdCoef reduce_coef(int fn, bool norm, float S, float Q, float Ps) {
  BwdCoef cf{0.0f, 0.0f, 0.0f, 0.0f, false};
  if (fn == kFnSoftmax) {
    cf.P = seg_add_f32<TPT>(Ps);
  } else {
    cf.norm = norm;
    cf.set_sums(seg_add_f32<TPT>(S), seg_add_f32<TPT>(Q));
  }
  return cf;
}

/// One lane's map chunk of W experts (e0 .. e0 + W - 1) of token t, loaded raw (Bytemap: the W bytes; BitmapU8:
/// the byte holding them; zeros where `in` is false) and decoded to W flag bits later, so that the load can run
/// ahead of its use.
template <int W>
struct MapChunk {
  using MB = Vec<unsigned char, W>;
  typename MB::R bytes;
  unsigned char bits;
  template <class Params>
  __device__ __forceinline__ void load(const Params& P, long long t, int e0, int nb, bool in) {
    memset(&bytes, 0, sizeof(bytes));
    bits = 0;
    if (!in) return;
    if (P.map_kind == 0)
      bytes = MB::ldg(P.map + t * static_cast<long long>(P.E) + e0);
    else
      bits = __ldg(P.map + t * static_cast<long long>(nb) + (e0 >> 3));
  }
  /// Bit w: expert e0 + w is routed.
  template <class Params>
  __device__ __forceinline__ unsigned flags(const Params& P, int e0) const {
    if (P.map_kind == 0) {
      unsigned char b[W];
      MB::to_array(bytes, b);
      unsigned f = 0;
#pragma unroll
      for (int w = 0; w < W; ++w) f |= (b[w] ? 1u : 0u) << w;
      return f;
    }
    return (W == 8) ? bits : ((bits >> (e0 & 7)) & 1u);
  }
};

/// The W routed flags of the chunk at e0 of token t, read now.
template <int W, class Params>
__device__ __forceinline__ unsigned map_chunk_flags(const Params& P, long long t, int e0, int nb) {
  MapChunk<W> m;
  m.load(P, t, e0, nb, true);
  return m.flags(P, e0);
}

}  // namespace detail
}  // namespace CudaKernels
}  // namespace Impl
}  // namespace KokkosMoE

#endif
