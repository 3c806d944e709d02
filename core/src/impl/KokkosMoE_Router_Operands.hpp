/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_OPERANDS_HPP
#define KOKKOSMOE_ROUTER_OPERANDS_HPP

// Canonical typed operands of the router operations, top-k and aux loss (docs/conventions.md §4). The public entry
// points validate the user's Views and convert them to these unmanaged, row-major Views of the execution space's memory
// space (the kokkos-kernels pattern of KokkosBlas1_dot.hpp): one instantiation per element-type combination, whatever
// the user's View template arguments were. Implementations consume them through the spec of
// impl/KokkosMoE_Router_Spec.hpp; nothing below the public boundary sees a void pointer or a dtype tag, and raw
// pointers appear only where cuda/ lowers these Views for the native kernels.

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_Args.hpp>  // RoutingOutput

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

template <class ExecSpace>
struct CanonicalViews {
  using device_type = Kokkos::Device<ExecSpace, typename ExecSpace::memory_space>;
  using traits = Kokkos::MemoryTraits<Kokkos::Unmanaged>;
  template <class T>
  using In0 = Kokkos::View<const T, device_type, traits>;
  template <class T>
  using Out0 = Kokkos::View<T, device_type, traits>;
  template <class T>
  using In1 = Kokkos::View<const T*, device_type, traits>;
  template <class T>
  using Out1 = Kokkos::View<T*, device_type, traits>;
  template <class T>
  using In2 = Kokkos::View<const T**, Kokkos::LayoutRight, device_type, traits>;
  template <class T>
  using Out2 = Kokkos::View<T**, Kokkos::LayoutRight, device_type, traits>;
};

/// Converts a validated, contiguous rank-2 View to its canonical unmanaged form.
template <class Canonical, class V>
Canonical canonical2(const V& v) {
  return Canonical(v.data(), v.extent(0), v.extent(1));
}
template <class Canonical, class V>
Canonical canonical1(const V& v) {
  return Canonical(v.data(), v.extent(0));
}
template <class Canonical, class V>
Canonical canonical0(const V& v) {
  return Canonical(v.data());
}

/// What every top-k forward reads: the token parameters, the logits and the optional expert bias.
template <class ExecSpace, class Scalar, class BiasScalar>
struct TopkForwardInputs {
  using V = CanonicalViews<ExecSpace>;
  using scalar_type = Scalar;
  using bias_type = BiasScalar;
  TokenParams params;
  std::int64_t num_tokens = 0;
  typename V::template In2<Scalar> logits;    ///< [T, E]
  typename V::template In1<BiasScalar> bias;  ///< [E] or empty
};

/// What the dense forwards (topk_router, topk_router_indices) write besides their routing: probs and the FP32
/// intermediate the backward reads.
template <class ExecSpace, class Scalar, class BiasScalar>
struct TopkDenseOutputs : TopkForwardInputs<ExecSpace, Scalar, BiasScalar> {
  using V = CanonicalViews<ExecSpace>;
  typename V::template Out2<Scalar> probs;  ///< [T, E]
  typename V::template Out2<float> inter;   ///< [T, E]
};

/// The top-k forward operations (docs/conventions.md §4), one operand type each, holding the Views that operation
/// writes and nothing else: topk_router (a routing map in either format: one operation, so that the two formats share
/// every instruction and their probs and intermediate are bit-identical, docs/router.md §16.1), topk_router_indices
/// and topk_router_compact.
enum class TopkForwardOp : std::uint8_t { Map, Indices, Compact };

/// topk_router.
template <class ExecSpace, class Scalar, class BiasScalar>
struct MapForwardOperands : TopkDenseOutputs<ExecSpace, Scalar, BiasScalar> {
  static constexpr TopkForwardOp op = TopkForwardOp::Map;
  bool bitmap = false;                                                  ///< RoutingMapFormat::BitmapU8
  typename CanonicalViews<ExecSpace>::template Out2<std::uint8_t> map;  ///< [T, E] or, bitmap, [T, ceil(E/8)]
  RoutingOutput output() const { return bitmap ? RoutingOutput::BitmapU8 : RoutingOutput::Bytemap; }
};

/// topk_router_indices: Index is int16_t, int32_t or int64_t.
template <class ExecSpace, class Scalar, class BiasScalar, class Index>
struct IndicesForwardOperands : TopkDenseOutputs<ExecSpace, Scalar, BiasScalar> {
  static constexpr TopkForwardOp op = TopkForwardOp::Indices;
  static constexpr RoutingOutput output() { return RoutingOutput::Indices; }
  using index_type = Index;
  typename CanonicalViews<ExecSpace>::template Out2<Index> indices;  ///< [T, k] in slot order
};

/// topk_router_compact.
template <class ExecSpace, class Scalar, class BiasScalar>
struct CompactForwardOperands : TopkForwardInputs<ExecSpace, Scalar, BiasScalar> {
  static constexpr TopkForwardOp op = TopkForwardOp::Compact;
  static constexpr RoutingOutput output() { return RoutingOutput::Compact; }
  using V = CanonicalViews<ExecSpace>;
  typename V::template Out2<std::int32_t> ids;  ///< [T, k]
  typename V::template Out2<float> weights;     ///< [T, k]
};

/// Backward from a routing map (Bytemap or BitmapU8) or from dense indices (Indices): grad_logits has grad_probs'
/// type G.
template <class ExecSpace, class G, class Index>
struct TopkBackwardOperands {
  using V = CanonicalViews<ExecSpace>;
  using grad_type = G;
  using index_type = Index;
  TokenParams params;
  RoutingOutput output = RoutingOutput::Bytemap;
  std::int64_t num_tokens = 0;
  typename V::template In2<std::uint8_t> map;  ///< Bytemap [T, E] / BitmapU8 [T, ceil(E/8)]
  typename V::template In2<Index> indices;     ///< [T, k] (Indices)
  typename V::template In2<float> inter;       ///< [T, E]
  typename V::template In2<G> grad_probs;      ///< [T, E]
  typename V::template Out2<G> grad_logits;    ///< [T, E]
};

/// Backward of the compact forward: logits + ids + grad_weights -> grad_logits (the logits' type).
template <class ExecSpace, class Scalar, class GW>
struct CompactBackwardOperands {
  using V = CanonicalViews<ExecSpace>;
  using scalar_type = Scalar;
  using grad_weights_type = GW;
  TokenParams params;
  std::int64_t num_tokens = 0;
  typename V::template In2<Scalar> logits;        ///< [T, E]
  typename V::template In2<std::int32_t> ids;     ///< [T, k]
  typename V::template In2<GW> grad_weights;      ///< [T, k]
  typename V::template Out2<Scalar> grad_logits;  ///< [T, E]
};

/// aux_scores forward (docs/router.md §10): logits -> FP32 scores, routing map, FP32 intermediate.
template <class ExecSpace, class Scalar>
struct AuxScoresOperands {
  using V = CanonicalViews<ExecSpace>;
  using scalar_type = Scalar;
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  RoutingOutput output = RoutingOutput::Bytemap;  ///< Bytemap or BitmapU8
  typename V::template In2<Scalar> logits;        ///< [T, E]
  typename V::template Out2<float> scores;        ///< [T, E]
  typename V::template Out2<std::uint8_t> map;    ///< [T, E] Bytemap / [T, ceil(E/8)] BitmapU8
  typename V::template Out2<float> inter;         ///< [T, E]
};

/// aux_scores backward: intermediate + grad_scores (FP32) -> grad_logits (the logits' type G).
template <class ExecSpace, class G>
struct AuxScoresBackwardOperands {
  using V = CanonicalViews<ExecSpace>;
  using grad_type = G;
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  ScoreFunction score_function = ScoreFunction::Softmax;
  typename V::template In2<float> inter;        ///< [T, E]
  typename V::template In2<float> grad_scores;  ///< [T, E]
  typename V::template Out2<G> grad_logits;     ///< [T, E]
};

/// aux_loss forward (docs/router.md §11): probs P, tokens_per_expert Tpe (an integer type, bf16_t or float); the
/// loss has the probs' type.
template <class ExecSpace, class P, class Tpe>
struct AuxLossOperands {
  using V = CanonicalViews<ExecSpace>;
  using probs_type = P;
  using tpe_type = Tpe;
  std::int64_t rows = 0;  ///< R (may be 0)
  std::int64_t cols = 0;  ///< C = m * E
  int num_experts = 1;
  int topk = 1;
  float coeff = 0.0f;
  typename V::template In2<P> probs;                               ///< [R, C]
  typename V::template In1<Tpe> tokens_per_expert;                 ///< [C]
  std::int64_t total_num_tokens = 0;                               ///< host-side total (when the device one is empty)
  typename V::template In0<std::int64_t> total_num_tokens_device;  ///< rank-0, read on the device, or empty
  typename V::template Out0<P> loss;                               ///< rank-0
  typename V::template Out1<float> const_buf;                      ///< [2]: {Const, FP32 loss before the cast}
  typename V::template Out1<float> workspace;                      ///< aux_loss_workspace_floats(R, C) or more
};

/// aux_loss backward: grad_probs (G) = const_buf[0] * tokens_per_expert (Tpe) * grad_loss (GL: float or G).
template <class ExecSpace, class G, class GL, class Tpe>
struct AuxLossBackwardOperands {
  using V = CanonicalViews<ExecSpace>;
  using grad_type = G;
  using grad_loss_type = GL;
  using tpe_type = Tpe;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  typename V::template In1<float> const_buf;        ///< [2]
  typename V::template In1<Tpe> tokens_per_expert;  ///< [C]
  typename V::template In0<GL> grad_loss;           ///< rank-0
  typename V::template Out2<G> grad_probs;          ///< [R, C]
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
