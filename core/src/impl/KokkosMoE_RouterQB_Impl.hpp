/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERQB_IMPL_HPP
#define KOKKOSMOE_ROUTERQB_IMPL_HPP

// Quantile Balancing (docs/router.md §19) below the public boundary of KokkosMoE_RouterQB.hpp: the operands, the
// validation in §19.3's order, the bin-bound check, and the portable Kokkos kernels (every backend) of the two QB
// by-products of a Sigmoid forward that has already written the routing and `intermediate`:
//  * the cutoff: the biased score s = y + b of order[k], the best expert after the k routed ones under §6's total
//    order. The routed set is the top k of that order, so order[k] is the best (key, index) pair below the worst
//    routed one: one reduction finds the worst routed pair (the last slot for dense indices), a second the best
//    pair below it. s is recomputed from the saved y with the same single FP32 add, so it is the selection's own.
//  * the histogram: one count per (token, expert) in bin qb_bin(cutoff - y) (impl/KokkosMoE_RouterMath.hpp),
//    added with integer atomics, whose sums do not depend on their order: FusedAtomic adds them in the cutoff
//    kernel, TwoPass in a second kernel over (token, expert) pairs (the kernel of qb_histogram_accumulate).

#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

namespace KokkosMoE {

namespace Impl {

/// The operands of the QB pass after a forward: Index is the dense-index type (int32_t for the map outputs).
template <class ExecSpace, class BiasScalar, class Index>
struct QbOperands {
  using V = CanonicalViews<ExecSpace>;
  RoutingOutput output = RoutingOutput::Bytemap;  ///< Bytemap, BitmapU8 or Indices
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  int topk = 0;
  bool fused = true;                             ///< FusedAtomic: the counts in the cutoff kernel
  typename V::template In2<float> inter;         ///< [T, E] y = sigmoid(x)
  typename V::template In1<BiasScalar> bias;     ///< [E]
  typename V::template In2<std::uint8_t> map;    ///< [T, E] Bytemap / [T, ceil(E/8)] BitmapU8
  typename V::template In2<Index> indices;       ///< [T, k] slot order (Indices)
  typename V::template In1<float> bounds;        ///< [2] = {lower, upper}
  typename V::template Out1<float> cutoff;       ///< [T]
  typename V::template Out2<std::int32_t> hist;  ///< [E, num_bins], accumulated
};

/// The histogram pass alone (TwoPass, qb_histogram_accumulate).
template <class ExecSpace>
struct QbHistogramOperands {
  using V = CanonicalViews<ExecSpace>;
  std::int64_t num_tokens = 0;
  int num_experts = 0;
  typename V::template In2<float> inter;         ///< [T, E]
  typename V::template In1<float> cutoff;        ///< [T]
  typename V::template In1<float> bounds;        ///< [2]
  typename V::template Out2<std::int32_t> hist;  ///< [E, num_bins]
};

// ---- validation (docs/router.md §19.3) ------------------------------------------------------------------------

/// Rules 2-7 of §19.3, after the shapes (rule 1) and before the rest of the router's configuration checks.
inline void check_qb_rules(const char* fn, const RouterConfig& c, std::int64_t E, bool has_bias,
                           std::int64_t num_bins) {
  if (c.score_function != ScoreFunction::Sigmoid)
    fail(fn, "score_function", Rule::QbRequiresSigmoid, "Quantile Balancing requires score_function = Sigmoid");
  if (c.use_pre_softmax)
    fail(fn, "use_pre_softmax", Rule::PreSoftmaxRequiresSoftmax,
         "use_pre_softmax = true requires score_function = Softmax");
  if (c.group_topk > 0)
    fail(fn, "group_topk", Rule::QbGroupingUnsupported,
         "Quantile Balancing has no group-limited routing: group_topk (" + std::to_string(c.group_topk) +
             ") must be <= 0");
  if (c.topk < 1 || c.topk > E - 1)
    fail(fn, "topk", Rule::QbTopkRange,
         "topk (" + std::to_string(c.topk) + ") must be in [1, num_experts - 1 = " + std::to_string(E - 1) +
             "]: Quantile Balancing selects topk + 1 experts");
  if (!has_bias) fail(fn, "expert_bias", Rule::QbRequiresBias, "Quantile Balancing requires an expert bias");
  if (num_bins < 1)
    fail(fn, "histogram", Rule::QbBinCountPositive,
         "histogram must have at least one bin per expert (extent(1) = " + std::to_string(num_bins) + ")");
}

inline void check_qb_mode(const char* fn, QbHistogramMode m) {
  if (m != QbHistogramMode::TwoPass && m != QbHistogramMode::FusedAtomic)
    fail(fn, "qb.histogram_mode", Rule::ConfigValue,
         "histogram_mode (" + std::to_string(static_cast<int>(m)) + ") is not a QbHistogramMode enumerator");
}

/// The static rules of the bin bounds, cutoff and histogram Views.
template <class ExecSpace, class BoundsView, class CutoffView, class HistView>
constexpr void static_check_qb_views() {
  static_check_view<ExecSpace, BoundsView, 1>();
  static_check_view<ExecSpace, CutoffView, 1>();
  static_check_view<ExecSpace, HistView, 2>();
  static_assert(std::is_same_v<typename BoundsView::non_const_value_type, float>,
                "KokkosMoE: bin_bounds must be float");
  static_assert(std::is_same_v<typename HistView::value_type, std::int32_t>,
                "KokkosMoE: histogram must be int32_t (non-const)");
}

/// Rule 9 of §19.3 (§19.6): both bounds finite and lower < upper. Copies them to the host through \p exec and
/// fences it.
template <class ExecSpace, class BoundsView>
void check_bin_bounds(const char* fn, const ExecSpace& exec, const BoundsView& bounds) {
  float host[2] = {0.0f, 0.0f};
  Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> h(host, 2);
  Kokkos::deep_copy(
      exec, h,
      Kokkos::View<const float*, typename BoundsView::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          bounds.data(), 2));
  exec.fence();
  if (!std::isfinite(host[0]) || !std::isfinite(host[1]) || !(host[0] < host[1])) {
    std::ostringstream os;
    os << "bin_bounds = {" << host[0] << ", " << host[1] << "} must be finite with lower < upper";
    fail(fn, "bin_bounds", Rule::QbBinBounds, os.str());
  }
}

// ---- portable kernels -----------------------------------------------------------------------------------------

template <class ExecSpace>
struct PortableQb {
  using team_policy = Kokkos::TeamPolicy<ExecSpace>;
  using member = typename team_policy::member_type;

  /// The cutoff of every token and, when o.fused, its histogram counts: one team per token.
  template <class Ops>
  static void cutoff(const ExecSpace& exec, const Ops& o) {
    const int E = o.num_experts, k = o.topk;
    const RoutingOutput out = o.output;
    const bool fused = o.fused;
    const auto inter = o.inter;
    const auto bias = o.bias;
    const auto map = o.map;
    const auto indices = o.indices;
    const auto bounds = o.bounds;
    const auto cut = o.cutoff;
    const auto hist = o.hist;
    const int num_bins = static_cast<int>(hist.extent(1));
    const team_policy policy(exec, static_cast<int>(o.num_tokens), Kokkos::AUTO);
    Kokkos::parallel_for(
        "KokkosMoE::topk_router_qb::cutoff[portable]", policy, KOKKOS_LAMBDA(const member& team) {
          const std::int64_t t = team.league_rank();
          auto score = [&](int e) { return inter(t, e) + to_float(bias(e)); };
          // The worst routed (key, index) pair.
          std::uint64_t worst = 0;
          if (out == RoutingOutput::Indices) {
            const int w = static_cast<int>(indices(t, k - 1));
            worst = pack_key(score(w), w);
          } else {
            Kokkos::parallel_reduce(
                Kokkos::TeamThreadRange(team, E),
                [&](int e, std::uint64_t& m) {
                  const bool routed =
                      out == RoutingOutput::Bytemap ? map(t, e) != 0 : ((map(t, e >> 3) >> (e & 7)) & 1u) != 0;
                  if (routed) {
                    const std::uint64_t key = pack_key(score(e), e);
                    if (key < m) m = key;
                  }
                },
                Kokkos::Min<std::uint64_t>(worst));
          }
          // order[k]: the best pair below it (there is one: topk <= E - 1).
          std::uint64_t next = 0;
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, E),
              [&](int e, std::uint64_t& m) {
                const std::uint64_t key = pack_key(score(e), e);
                if (key < worst && key > m) m = key;
              },
              Kokkos::Max<std::uint64_t>(next));
          const float c = score(key_index(next));
          Kokkos::single(Kokkos::PerTeam(team), [&] { cut(t) = c; });
          if (fused) {
            const float lower = bounds(0), scale = qb_bin_scale(lower, bounds(1), num_bins);
            Kokkos::parallel_for(Kokkos::TeamThreadRange(team, E), [&](int e) {
              Kokkos::atomic_add(&hist(e, qb_bin(c - inter(t, e), lower, scale, num_bins)), 1);
            });
          }
        });
  }

  /// One count per (token, expert) pair from the saved intermediate and cutoff.
  template <class Ops>
  static void histogram(const ExecSpace& exec, const Ops& o) {
    const std::int64_t E = o.num_experts;
    const auto inter = o.inter;
    const auto cut = o.cutoff;
    const auto bounds = o.bounds;
    const auto hist = o.hist;
    const int num_bins = static_cast<int>(hist.extent(1));
    Kokkos::parallel_for(
        "KokkosMoE::qb_histogram_accumulate[portable]",
        Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, o.num_tokens * E),
        KOKKOS_LAMBDA(std::int64_t i) {
          const std::int64_t t = i / E;
          const int e = static_cast<int>(i - t * E);
          const float lower = bounds(0), scale = qb_bin_scale(lower, bounds(1), num_bins);
          Kokkos::atomic_add(&hist(e, qb_bin(cut(t) - inter(t, e), lower, scale, num_bins)), 1);
        });
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
