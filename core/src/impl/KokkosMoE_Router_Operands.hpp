/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_OPERANDS_HPP
#define KOKKOSMOE_ROUTER_OPERANDS_HPP

// Canonical typed operands of the top-k router operations (docs/conventions.md §4). The public entry points validate
// the user's Views and convert them to these unmanaged, row-major Views of the execution space's memory space (the
// kokkos-kernels pattern of KokkosBlas1_dot.hpp): one instantiation per element-type combination, whatever the
// user's View template arguments were. Implementations consume them through the spec of
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
  using In1 = Kokkos::View<const T*, device_type, traits>;
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

/// topk_router forward: the operands of every output kind (the ones the kind does not use are empty Views).
template <class ExecSpace, class Scalar, class BiasScalar, class Index>
struct TopkForwardOperands {
  using V = CanonicalViews<ExecSpace>;
  using scalar_type = Scalar;
  using bias_type = BiasScalar;
  using index_type = Index;
  TokenParams params;
  RoutingOutput output = RoutingOutput::Bytemap;
  std::int64_t num_tokens = 0;
  typename V::template In2<Scalar> logits;      ///< [T, E]
  typename V::template In1<BiasScalar> bias;    ///< [E] or empty
  typename V::template Out2<Scalar> probs;      ///< [T, E] (Bytemap, BitmapU8, Indices)
  typename V::template Out2<std::uint8_t> map;  ///< [T, E] Bytemap / [T, ceil(E/8)] BitmapU8
  typename V::template Out2<Index> indices;     ///< [T, k] (Indices)
  typename V::template Out2<float> inter;       ///< [T, E] (Bytemap, BitmapU8, Indices)
  typename V::template Out2<std::int32_t> ids;  ///< [T, k] (Compact)
  typename V::template Out2<float> weights;     ///< [T, k] (Compact)
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

}  // namespace Impl
}  // namespace KokkosMoE

#endif
