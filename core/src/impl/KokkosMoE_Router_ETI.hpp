/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_ETI_HPP
#define KOKKOSMOE_ROUTER_ETI_HPP

// Explicit template instantiation (ETI) of the portable router kernels (docs/conventions.md §4). The entry points of
// PortableTopk and PortableAux are instantiated once, for every shipped element-type combination and every enabled
// backend, in the sources core/CMakeLists.txt generates for kokkosmoe_core (<build>/core/eti/); with
// KOKKOSMOE_ENABLE_ETI (CMake option KokkosMoE_ENABLE_ETI) every other translation unit sees the `extern template`
// declarations below and does not instantiate them. The combinations are exactly those the public static_asserts
// allow, so no call can miss one. The lists are X-macros: PREFIX is `extern` (declaration) or empty (definition).

#include <KokkosMoE_Config.hpp>

#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_Portable.hpp>
#include <impl/KokkosMoE_Router_PortableTopk.hpp>

#include <cstdint>

// ---- one entry point, one combination ------------------------------------------------------------------------
// The operand type comes last, as __VA_ARGS__: its template arguments are separated by commas.
#define KOKKOSMOE_IMPL_ETI_ONE(PREFIX, EXEC, IMPL, FN, ...) \
  PREFIX template void ::KokkosMoE::Impl::IMPL<EXEC>::FN<__VA_ARGS__>(const EXEC&, const __VA_ARGS__&);

/// The top-k operations also take the kernel choice (impl/KokkosMoE_Router_KernelChoice.hpp).
#define KOKKOSMOE_IMPL_ETI_TOPK_ONE(PREFIX, EXEC, FN, ...)                                                     \
  PREFIX template void ::KokkosMoE::Impl::PortableTopk<EXEC>::FN<__VA_ARGS__>(const EXEC&, const __VA_ARGS__&, \
                                                                              const ::KokkosMoE::Impl::KernelChoice&);
#define KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, ...) \
  KOKKOSMOE_IMPL_ETI_TOPK_ONE(P, X, forward, ::KokkosMoE::Impl::__VA_ARGS__)
#define KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_1(P, X, G, I) \
  KOKKOSMOE_IMPL_ETI_TOPK_ONE(P, X, backward, ::KokkosMoE::Impl::TopkBackwardOperands<X, G, I>)
#define KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, S, GW) \
  KOKKOSMOE_IMPL_ETI_TOPK_ONE(P, X, compact_backward, ::KokkosMoE::Impl::CompactBackwardOperands<X, S, GW>)
#define KOKKOSMOE_IMPL_ETI_AUX_SCORES_1(P, X, S)                                                            \
  KOKKOSMOE_IMPL_ETI_ONE(P, X, PortableAux, aux_scores_forward, ::KokkosMoE::Impl::AuxScoresOperands<X, S>) \
  KOKKOSMOE_IMPL_ETI_ONE(P, X, PortableAux, aux_scores_backward, ::KokkosMoE::Impl::AuxScoresBackwardOperands<X, S>)
#define KOKKOSMOE_IMPL_ETI_AUX_LOSS_1(P, X, PR, T) \
  KOKKOSMOE_IMPL_ETI_ONE(P, X, PortableAux, aux_loss_forward, ::KokkosMoE::Impl::AuxLossOperands<X, PR, T>)
#define KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1(P, X, G, GL, T) \
  KOKKOSMOE_IMPL_ETI_ONE(P, X, PortableAux, aux_loss_backward, ::KokkosMoE::Impl::AuxLossBackwardOperands<X, G, GL, T>)

// ---- the shipped combinations --------------------------------------------------------------------------------
// topk_router forward operations (routing map, dense indices I in int16/32/64, compact): logits S (float, fp16_t,
// bf16_t) x bias B (the same three).
#define KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_SB(P, X, S, B)                                   \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, MapForwardOperands<X, S, B>)                   \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, IndicesForwardOperands<X, S, B, std::int16_t>) \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, IndicesForwardOperands<X, S, B, std::int32_t>) \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, IndicesForwardOperands<X, S, B, std::int64_t>) \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_1(P, X, CompactForwardOperands<X, S, B>)
#define KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_S(P, X, S)                 \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_SB(P, X, S, float)               \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_SB(P, X, S, ::KokkosMoE::fp16_t) \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_SB(P, X, S, ::KokkosMoE::bf16_t)
// backward from a map or indices: grad G (float, fp16_t, bf16_t) x indices I; compact backward: logits S x
// grad_weights (float or S).
#define KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_G(P, X, G)         \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_1(P, X, G, std::int16_t) \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_1(P, X, G, std::int32_t) \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_1(P, X, G, std::int64_t)
#define KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD(P, X)                                          \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_G(P, X, float)                                       \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_G(P, X, ::KokkosMoE::fp16_t)                         \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD_G(P, X, ::KokkosMoE::bf16_t)                         \
  KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, float, float)                             \
  KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, ::KokkosMoE::fp16_t, float)               \
  KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, ::KokkosMoE::fp16_t, ::KokkosMoE::fp16_t) \
  KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, ::KokkosMoE::bf16_t, float)               \
  KOKKOSMOE_IMPL_ETI_COMPACT_BACKWARD_1(P, X, ::KokkosMoE::bf16_t, ::KokkosMoE::bf16_t)
// aux: scores of logits S; loss of probs PR x tokens_per_expert T (int16/32/64, bf16_t, float); loss backward of
// grad G x grad_loss (float or G) x T.
#define KOKKOSMOE_IMPL_ETI_AUX_T(M, P, X, ...) \
  M(P, X, __VA_ARGS__, std::int16_t)           \
  M(P, X, __VA_ARGS__, std::int32_t)           \
  M(P, X, __VA_ARGS__, std::int64_t)           \
  M(P, X, __VA_ARGS__, ::KokkosMoE::bf16_t)    \
  M(P, X, __VA_ARGS__, float)
#define KOKKOSMOE_IMPL_ETI_AUX(P, X)                                                                               \
  KOKKOSMOE_IMPL_ETI_AUX_SCORES_1(P, X, float)                                                                     \
  KOKKOSMOE_IMPL_ETI_AUX_SCORES_1(P, X, ::KokkosMoE::fp16_t)                                                       \
  KOKKOSMOE_IMPL_ETI_AUX_SCORES_1(P, X, ::KokkosMoE::bf16_t)                                                       \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_1, P, X, float)                                             \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_1, P, X, ::KokkosMoE::fp16_t)                               \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_1, P, X, ::KokkosMoE::bf16_t)                               \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1, P, X, float, float)                             \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1, P, X, ::KokkosMoE::fp16_t, float)               \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1, P, X, ::KokkosMoE::fp16_t, ::KokkosMoE::fp16_t) \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1, P, X, ::KokkosMoE::bf16_t, float)               \
  KOKKOSMOE_IMPL_ETI_AUX_T(KOKKOSMOE_IMPL_ETI_AUX_LOSS_BACKWARD_1, P, X, ::KokkosMoE::bf16_t, ::KokkosMoE::bf16_t)

/// Every instantiation of one backend (the generated sources split it into these parts).
#define KOKKOSMOE_IMPL_ETI_ALL(P, X)                           \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_S(P, X, float)               \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_S(P, X, ::KokkosMoE::fp16_t) \
  KOKKOSMOE_IMPL_ETI_TOPK_FORWARD_S(P, X, ::KokkosMoE::bf16_t) \
  KOKKOSMOE_IMPL_ETI_TOPK_BACKWARD(P, X)                       \
  KOKKOSMOE_IMPL_ETI_AUX(P, X)

#if defined(KOKKOSMOE_ENABLE_ETI)
#if defined(KOKKOS_ENABLE_SERIAL)
KOKKOSMOE_IMPL_ETI_ALL(extern, Kokkos::Serial)
#endif
#if defined(KOKKOS_ENABLE_OPENMP)
KOKKOSMOE_IMPL_ETI_ALL(extern, Kokkos::OpenMP)
#endif
#if defined(KOKKOS_ENABLE_CUDA)
KOKKOSMOE_IMPL_ETI_ALL(extern, Kokkos::Cuda)
#endif
#endif

#endif
