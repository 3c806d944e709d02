/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERCONFIG_HPP
#define KOKKOSMOE_ROUTERCONFIG_HPP

/// \file KokkosMoE_RouterConfig.hpp
/// \brief Value-type configuration of the router operations (docs/router.md §2, §3, §10, §11).
///
/// Plain C++ (no Kokkos, no CUDA): the structs are copied into deferred callables and native kernels.

namespace KokkosMoE {

/// Score function; numeric values equal TransformerEngine's.
enum class ScoreFunction : int { Sigmoid = 0, Softmax = 1, SqrtSoftplus = 2 };

/// Routing-map format; numeric values equal TransformerEngine's (BYTEMAP / BITMAP_U8).
enum class RoutingMapFormat : int { Bytemap = 0, BitmapU8 = 1 };

/// Which implementation runs. `Auto` picks the vendor specialization for the execution space when one exists
/// (Kokkos::Cuda) and the portable Kokkos implementation otherwise; `Portable` forces the portable one.
enum class Implementation : int { Auto = 0, Portable = 1 };

/// \brief Attributes of topk_router and its variants (docs/router.md §3).
struct RouterConfig {
  int topk = 1;                                             ///< 1 <= topk <= E
  ScoreFunction score_function = ScoreFunction::Softmax;    ///<
  bool use_pre_softmax = false;                             ///< Softmax only
  int num_groups = 0;                                       ///< G, used when group_topk > 0
  int group_topk = 0;                                       ///< gk; grouping is on iff > 0
  float scaling_factor = 1.0f;                              ///< finite
  RoutingMapFormat map_format = RoutingMapFormat::Bytemap;  ///< for the routing-map entry points
  Implementation implementation = Implementation::Auto;     ///<
  bool check_finite = false;  ///< debug: scan the logits first and throw NonFiniteInput (fences; not for hot paths)

  bool grouped() const noexcept { return group_topk > 0; }
};

/// \brief Attributes of aux_scores (docs/router.md §10): no bias, grouping, pre-softmax or scaling.
struct AuxScoresConfig {
  int topk = 1;
  ScoreFunction score_function = ScoreFunction::Softmax;
  RoutingMapFormat map_format = RoutingMapFormat::Bytemap;
  Implementation implementation = Implementation::Auto;
};

/// \brief Attributes of aux_loss (docs/router.md §11).
struct AuxLossConfig {
  int num_experts = 1;  ///< E; the probs' column count C must be a positive multiple of E
  int topk = 1;         ///< 1 <= topk <= E
  float coeff = 0.0f;   ///< finite
  Implementation implementation = Implementation::Auto;
};

/// \brief The reference's two Quantile Balancing histogram modes (docs/router.md §19.5, §19.8). Both run the same
/// passes here (one call each; counting per pair inside the forward was slower on every backend measured) and give
/// bitwise equal counts.
enum class QbHistogramMode : int {
  TwoPass = 0,      ///< the reference's two-kernel mode: the forward writes the cutoff, a second kernel counts
  FusedAtomic = 1,  ///< the reference's fused mode (counts added inside its forward); here the same passes as TwoPass
};

/// \brief Attributes of a Quantile Balancing call (docs/router.md §19.2, §19.6) beside its RouterConfig.
struct QbConfig {
  QbHistogramMode histogram_mode = QbHistogramMode::FusedAtomic;
  /// true: the call copies the two bin bounds to the host, fences the execution space and throws
  /// InvalidArgument (Rule::QbBinBounds) unless both are finite and lower < upper. false ("unchecked"): the bounds
  /// are read on the device only (no fence; capturable in a CUDA graph); the caller guarantees the rule.
  bool validate_bin_bounds = true;
  /// The QB pass (cutoff and histogram; the forward follows RouterConfig::implementation): Auto runs the native
  /// histogram kernel where one exists (Kokkos::Cuda, in both modes), Portable the generic Kokkos kernels.
  Implementation implementation = Implementation::Auto;
};

}  // namespace KokkosMoE

#endif
