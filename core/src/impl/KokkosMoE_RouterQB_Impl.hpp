/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERQB_IMPL_HPP
#define KOKKOSMOE_ROUTERQB_IMPL_HPP

// Quantile Balancing (docs/router.md §19) below the public boundary of KokkosMoE_RouterQB.hpp: the operands, the
// validation in §19.3's order, the bin-bound check, and the portable Kokkos kernels (every backend) of the two QB
// by-products of a Sigmoid forward that has already written the routing and `intermediate`:
//  * the cutoff: the biased score s = y + b of order[k], the best expert after the k routed ones under §6's total
//    order. The routed set is the top k of that order, so order[k] is the best unrouted (key, index) pair: one
//    reduction over the experts a routing map leaves out, or, for dense indices, over the pairs below the last
//    slot's. s is recomputed from the saved y with the same single FP32 add, so it is the selection's own.
//  * the histogram: one count per (token, expert) in bin qb_bin(cutoff - y) (impl/KokkosMoE_RouterMath.hpp),
//    added with integer atomics, whose sums do not depend on their order, in a second kernel (the kernel of
//    qb_histogram_accumulate) that counts a slice of experts over a chunk of tokens in team scratch and adds each
//    non-zero count once. Both histogram modes run it: one global atomic per pair in the cutoff kernel (the
//    reference's fused mode) was slower on the shapes measured (docs/router.md §19.8).

#include <KokkosMoE_Error.hpp>
#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_Spec.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

#include <algorithm>
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

/// The histogram pass's operands from a forward's QB operands (TwoPass).
template <class ExecSpace, class BiasScalar, class Index>
QbHistogramOperands<ExecSpace> histogram_operands(const QbOperands<ExecSpace, BiasScalar, Index>& q) {
  QbHistogramOperands<ExecSpace> h;
  h.num_tokens = q.num_tokens;
  h.num_experts = q.num_experts;
  h.inter = q.inter;
  h.cutoff = q.cutoff;
  h.bounds = q.bounds;
  h.hist = q.hist;
  return h;
}

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

/// The enumerators of a QbConfig.
inline void check_qb_config(const char* fn, const QbConfig& qb) {
  const QbHistogramMode m = qb.histogram_mode;
  if (m != QbHistogramMode::TwoPass && m != QbHistogramMode::FusedAtomic)
    fail(fn, "qb.histogram_mode", Rule::ConfigValue,
         "histogram_mode (" + std::to_string(static_cast<int>(m)) + ") is not a QbHistogramMode enumerator");
  if (qb.implementation != Implementation::Auto && qb.implementation != Implementation::Portable)
    fail(fn, "qb.implementation", Rule::ConfigValue,
         "implementation (" + std::to_string(static_cast<int>(qb.implementation)) +
             ") must be Auto (0) or Portable (1)");
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
  static constexpr bool kHost =
      Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename ExecSpace::memory_space>::accessible;
  /// Devices: a token per team thread, its experts over a warp's vector lanes; host spaces: one thread per token.
  static constexpr int kLanes = kHost ? 1 : 32;
  static constexpr int kTokensPerTeam = kHost ? 1 : 4;
  /// The histogram pass keeps the counts of a slice of experts for a chunk of tokens in team scratch and adds them
  /// to the histogram once per chunk: at most this many bytes of scratch per team, chunks of this many tokens.
  static constexpr int kScratchBytes = 40 * 1024;
  static constexpr std::int64_t kChunkTokens = 2048;

  /// The cutoff of every token.
  template <class Ops>
  static void cutoff(const ExecSpace& exec, const Ops& o) {
    const int E = o.num_experts, k = o.topk;
    const std::int64_t T = o.num_tokens;
    const RoutingOutput out = o.output;
    const auto inter = o.inter;
    const auto bias = o.bias;
    const auto map = o.map;
    const auto indices = o.indices;
    const auto cut = o.cutoff;
    const team_policy policy(exec, static_cast<int>((T + kTokensPerTeam - 1) / kTokensPerTeam), kTokensPerTeam, kLanes);
    Kokkos::parallel_for(
        "KokkosMoE::topk_router_qb::cutoff[portable]", policy, KOKKOS_LAMBDA(const member& team) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kTokensPerTeam), [&](int i) {
            const std::int64_t t = static_cast<std::int64_t>(team.league_rank()) * kTokensPerTeam + i;
            if (t >= T) return;
            auto score = [&](int e) { return inter(t, e) + to_float(bias(e)); };
            // order[k]: the routed set is order[0..k), so order[k] is the best unrouted (key, index) pair. Maps name
            // the unrouted experts; dense indices name the routed ones in slot order, so there it is the best pair
            // below the last slot's (there is one: topk <= E - 1).
            std::uint64_t next = 0;
            if (out == RoutingOutput::Indices) {
              const int w = static_cast<int>(indices(t, k - 1));
              const std::uint64_t worst = pack_key(score(w), w);
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, E),
                  [&](int e, std::uint64_t& m) {
                    const std::uint64_t key = pack_key(score(e), e);
                    if (key < worst && key > m) m = key;
                  },
                  Kokkos::Max<std::uint64_t>(next));
            } else {
              Kokkos::parallel_reduce(
                  Kokkos::ThreadVectorRange(team, E),
                  [&](int e, std::uint64_t& m) {
                    const bool routed =
                        out == RoutingOutput::Bytemap ? map(t, e) != 0 : ((map(t, e >> 3) >> (e & 7)) & 1u) != 0;
                    if (!routed) {
                      const std::uint64_t key = pack_key(score(e), e);
                      if (key > m) m = key;
                    }
                  },
                  Kokkos::Max<std::uint64_t>(next));
            }
            const float c = score(key_index(next));
            Kokkos::single(Kokkos::PerThread(team), [&] { cut(t) = c; });
          });
        });
  }

  /// One count per (token, expert) pair from the saved intermediate and cutoff. A team takes a slice of experts
  /// and a chunk of tokens, counts them in scratch, then adds the non-zero counts to the histogram; histograms too
  /// wide for one expert's counts in scratch take one global atomic per pair.
  template <class Ops>
  static void histogram(const ExecSpace& exec, const Ops& o) {
    const int E = o.num_experts;
    const std::int64_t T = o.num_tokens;
    const auto inter = o.inter;
    const auto cut = o.cutoff;
    const auto bounds = o.bounds;
    const auto hist = o.hist;
    const int num_bins = static_cast<int>(hist.extent(1));
    const std::int64_t per_expert = 4 * static_cast<std::int64_t>(num_bins);
    if (per_expert > kScratchBytes) {
      Kokkos::parallel_for(
          "KokkosMoE::qb_histogram_accumulate[portable,global]",
          Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>(exec, 0, T * E),
          KOKKOS_LAMBDA(std::int64_t i) {
            const std::int64_t t = i / E;
            const int e = static_cast<int>(i - t * E);
            const float lower = bounds(0), scale = qb_bin_scale(lower, bounds(1), num_bins);
            Kokkos::atomic_add(&hist(e, qb_bin(cut(t) - inter(t, e), lower, scale, num_bins)), 1);
          });
      return;
    }
    const int W = static_cast<int>(std::min<std::int64_t>({8, E, kScratchBytes / per_expert}));
    const int slices = (E + W - 1) / W;
    const std::int64_t chunks = (T + kChunkTokens - 1) / kChunkTokens;
    using Scratch = Kokkos::View<int*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryUnmanaged>;
    const int cells = W * num_bins;
    team_policy policy(exec, static_cast<int>(slices * chunks), kHost ? 1 : 256);
    policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(cells)));
    Kokkos::parallel_for(
        "KokkosMoE::qb_histogram_accumulate[portable]", policy, KOKKOS_LAMBDA(const member& team) {
          const int slice = static_cast<int>(team.league_rank() % slices);
          const std::int64_t t0 = (team.league_rank() / slices) * kChunkTokens;
          const std::int64_t t1 = t0 + kChunkTokens < T ? t0 + kChunkTokens : T;
          const int e0 = slice * W, w = E - e0 < W ? E - e0 : W;
          const Scratch counts(team.team_scratch(0), cells);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cells), [&](int i) { counts(i) = 0; });
          team.team_barrier();
          const float lower = bounds(0), scale = qb_bin_scale(lower, bounds(1), num_bins);
          // a token per team thread, its slice's experts in a row (no division per pair)
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t1 - t0), [&](std::int64_t i) {
            const std::int64_t t = t0 + i;
            const float c = cut(t);
            for (int j = 0; j < w; ++j) {
              int& n = counts(j * num_bins + qb_bin(c - inter(t, e0 + j), lower, scale, num_bins));
              if constexpr (kHost)
                ++n;  // a team is one thread on host spaces
              else
                Kokkos::atomic_add(&n, 1);
            }
          });
          team.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, w * num_bins), [&](int i) {
            const int c = counts(i);
            if (c != 0) Kokkos::atomic_add(&hist(e0 + i / num_bins, i % num_bins), c);
          });
        });
  }
};

/// The QB operations: the generic specialization runs the router's forward and the portable histogram kernel; a
/// vendor specialization (cuda/KokkosMoE_RouterQB_CudaSpec.hpp) replaces it where one exists, whose forward may also
/// write the cutoff.
template <class ExecSpace>
struct QbSpec {
  /// The router's forward; true when it also wrote the cutoff (never here: the QB pass computes it).
  template <class Ops>
  static bool forward(const ExecSpace& exec, const RouterConfig& config, const Ops& o, float*) {
    TopkSpec<ExecSpace>::forward(exec, config, o);
    return false;
  }
  template <class Ops>
  static void histogram(const ExecSpace& exec, const Ops& h) {
    PortableQb<ExecSpace>::histogram(exec, h);
  }
};

/// The histogram pass of \p impl's choice (Implementation::Portable forces the portable kernel).
template <class ExecSpace, class Ops>
void qb_histogram_pass(const ExecSpace& exec, Implementation impl, const Ops& h) {
  if (impl == Implementation::Auto)
    QbSpec<ExecSpace>::histogram(exec, h);
  else
    PortableQb<ExecSpace>::histogram(exec, h);
}

}  // namespace Impl
}  // namespace KokkosMoE

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda/KokkosMoE_RouterQB_CudaSpec.hpp>
#endif

#endif
