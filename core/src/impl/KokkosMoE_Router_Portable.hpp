/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_PORTABLE_HPP
#define KOKKOSMOE_ROUTER_PORTABLE_HPP

// The portable aux-loss kernels (PortableAux) and the check_finite helpers (PortableChecks): generic Kokkos parallel
// patterns on any execution space over the canonical typed operands of impl/KokkosMoE_Router_Operands.hpp, the
// reference and fallback implementation (docs/router.md §17). aux_scores runs one team per token, the team's
// threads stride over the experts, scores in team scratch, deterministic selection by k rounds of a max reduction
// over packed (order-preserving value, inverted index) 64-bit keys. Host spaces use teams of one thread, so every
// reduction is a plain sequential loop and the results cannot depend on the OpenMP thread count (docs/router.md
// §12). aux_loss is a fixed-order two-stage column reduction.

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_Args.hpp>  // kAuxLossRowChunk, bitmap_row_bytes
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_Router_PortableTopk.hpp>

#include <cstdint>
#include <type_traits>

namespace KokkosMoE {
namespace Impl {

/// An aux operand element as float: integer token counts convert exactly as static_cast, floats through to_float.
template <class T>
KOKKOS_INLINE_FUNCTION float value_as_float(const T& x) {
  if constexpr (std::is_integral_v<T>)
    return static_cast<float>(x);
  else
    return to_float(x);
}

template <class ExecSpace>
int team_size_for() {
  return is_host_space<ExecSpace>() ? 1 : 32;
}

// ---------------------------------------------------------------------------------------------------------------
// aux_scores (docs/router.md §10)
// ---------------------------------------------------------------------------------------------------------------
template <class ExecSpace, class Ops>
struct AuxScoresFunctor {
  using policy_type = TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  using scratch_space = typename ExecSpace::scratch_memory_space;
  using FloatScratch = Kokkos::View<float*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Ops o;
  int scratch_level;

  using KeyScratch = Kokkos::View<std::uint64_t*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static std::size_t scratch_bytes(int E, int k) {
    return FloatScratch::shmem_size(E) + KeyScratch::shmem_size(topk_key_count(k));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = o.num_experts;
    const int k = o.topk;
    const std::int64_t t = m.league_rank();
    FloatScratch s(m.team_scratch(scratch_level), E);
    if (o.score_function == ScoreFunction::Softmax) {
      row_softmax(
          TeamLoops<member_type>{m}, E, [&](const int e) { return to_float(o.logits(t, e)); }, s);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) { o.inter(t, e) = s(e); });
    } else {
      const bool sig = o.score_function == ScoreFunction::Sigmoid;
      float sum = 0;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(m, E),
          [&](const int e, float& acc) {
            const float x = to_float(o.logits(t, e));
            const float yv = sig ? sigmoid(x) : sqrt_softplus(x);
            s(e) = yv;
            o.inter(t, e) = sig ? yv : x;
            acc += yv;
          },
          sum);
      const float D = normalization_denominator(sum);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) { s(e) = s(e) / D; });
    }
    m.team_barrier();
    KeyScratch topk(m.team_scratch(scratch_level), topk_key_count(k));
    const std::uint64_t kth = select_topk(
        TeamLoops<member_type>{m}, E, k, [&](const int e) { return pack_key(s(e), e); }, topk);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      o.scores(t, e) = s(e);
      if (o.output == RoutingOutput::Bytemap) o.map(t, e) = pack_key(s(e), e) >= kth ? 1 : 0;
    });
    if (o.output == RoutingOutput::BitmapU8) {
      const std::int64_t nb = bitmap_row_bytes(E);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, static_cast<int>(nb)), [&](const int b) {
        unsigned byte = 0;
        for (int j = 0; j < 8; ++j) {
          const int e = b * 8 + j;
          if (e < E && pack_key(s(e), e) >= kth) byte |= 1u << j;
        }
        o.map(t, b) = static_cast<std::uint8_t>(byte);
      });
    }
  }
};

template <class ExecSpace, class Ops>
struct AuxScoresBackwardFunctor {
  using policy_type = TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  using G = typename Ops::grad_type;
  Ops o;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = o.num_experts;
    const std::int64_t t = m.league_rank();
    const ScoreFunction f = o.score_function;
    Sum2 sums;  // Softmax: (P, unused); Sigmoid/SqrtSoftplus: (S, Q)
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, E),
        [&](const int e, Sum2& acc) {
          const float ae = o.inter(t, e);
          const float ge = o.grad_scores(t, e);
          if (f == ScoreFunction::Softmax) {
            acc.a += ge * ae;
          } else {
            const float v = f == ScoreFunction::Sigmoid ? ae : sqrt_softplus(ae);
            acc.a += v;
            acc.b += ge * v;
          }
        },
        sums);
    const float P = sums.a, Q = sums.b;
    const float D = normalization_denominator(sums.a);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      const float ae = o.inter(t, e);
      const float ge = o.grad_scores(t, e);
      float dx;
      if (f == ScoreFunction::Softmax) {
        dx = softmax_grad(ge, ae, P);
      } else {
        const float h = ge / D - Q / (D * D);
        dx = f == ScoreFunction::Sigmoid ? sigmoid_grad(h, ae) : sqrt_softplus_grad(h, ae, sqrt_softplus(ae));
      }
      o.grad_logits(t, e) = from_float<G>(dx);
    });
  }
};

// ---------------------------------------------------------------------------------------------------------------
// aux_loss (docs/router.md §11): fixed-order two-stage column reduction, no atomics
// ---------------------------------------------------------------------------------------------------------------
template <class Ops>
struct AuxLossPartialFunctor {  // workspace[chunk * C + c] = sum of probs[r, c] over the chunk's rows, in row order
  Ops o;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t C = o.cols;
    const std::int64_t chunk = i / C, c = i % C;
    const std::int64_t r0 = chunk * kAuxLossRowChunk;
    const std::int64_t r1 = r0 + kAuxLossRowChunk < o.rows ? r0 + kAuxLossRowChunk : o.rows;
    float acc = 0.0f;
    for (std::int64_t r = r0; r < r1; ++r) acc += to_float(o.probs(r, c));
    o.workspace(i) = acc;
  }
};

template <class Ops>
struct AuxLossColumnFunctor {  // column sums, chunks in order, into the workspace tail
  Ops o;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c) const {
    const std::int64_t chunks = (o.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
    float acc = 0.0f;
    for (std::int64_t j = 0; j < chunks; ++j) acc += o.workspace(j * o.cols + c);
    o.workspace(chunks * o.cols + c) = acc;
  }
};

template <class Ops>
struct AuxLossFinalFunctor {  // one thread: Const and the loss, columns in order
  using P = typename Ops::probs_type;
  Ops o;
  KOKKOS_INLINE_FUNCTION void operator()(const int) const {
    const std::int64_t chunks = (o.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
    const float total = o.total_num_tokens_device.data() ? static_cast<float>(o.total_num_tokens_device())
                                                         : static_cast<float>(o.total_num_tokens);
    const float cst = ((static_cast<float>(o.num_experts) * o.coeff) / static_cast<float>(o.topk)) / total / total;
    float acc = 0.0f;
    for (std::int64_t c = 0; c < o.cols; ++c)
      acc += o.workspace(chunks * o.cols + c) * value_as_float(o.tokens_per_expert(c));
    const float loss = cst * acc;
    o.const_buf(0) = cst;
    o.const_buf(1) = loss;
    o.loss() = from_float<P>(loss);
  }
};

/// grad_probs[r, c] = Const * tokens_per_expert[c] * grad_loss over blocks of rows: one team per block, the block
/// flattened row-major over its threads, so that adjacent threads write adjacent columns on a device (an MDRange
/// maps the row index to adjacent Cuda threads whatever its iteration order, so its stores would stride by a row).
template <class Ops>
struct AuxLossBackwardFunctor {
  using G = typename Ops::grad_type;
  Ops o;
  int rows_per_team;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const std::int64_t r0 = static_cast<std::int64_t>(m.league_rank()) * rows_per_team;
    const std::int64_t left = o.rows - r0;
    const int nr = left < rows_per_team ? static_cast<int>(left) : rows_per_team;
    const int cols = static_cast<int>(o.cols);
    const float g = to_float(o.grad_loss());
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nr * cols), [&](const int j) {
      const int c = j % cols;
      o.grad_probs(r0 + j / cols, c) = from_float<G>(o.const_buf(0) * value_as_float(o.tokens_per_expert(c)) * g);
    });
  }
};

template <class Values>
struct FirstNonFiniteFunctor {
  Values v;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& first) const {
    const std::int64_t cols = static_cast<std::int64_t>(v.extent(1));
    const std::uint32_t bits = float_bits(to_float(v(i / cols, i % cols)));
    if ((bits & 0x7f800000u) == 0x7f800000u && i < first) first = i;
  }
};

template <class Values, class Out>
struct ReadOneFunctor {
  Values v;
  std::int64_t index;
  Out out;
  KOKKOS_INLINE_FUNCTION void operator()(const int) const {
    const std::int64_t cols = static_cast<std::int64_t>(v.extent(1));
    out() = to_float(v(index / cols, index % cols));
  }
};

/// Chooses team-scratch level 0 (fast, limited) or 1 (large) for a per-token scratch need.
template <class ExecSpace>
int scratch_level_for(std::size_t bytes) {
  if (is_host_space<ExecSpace>()) return 0;
  return bytes <= 32 * 1024 ? 0 : 1;
}

/// The portable aux-loss operations on any execution space (the generic AuxSpec, and Implementation::Portable);
/// explicitly instantiated with KOKKOSMOE_ENABLE_ETI (impl/KokkosMoE_Router_ETI.hpp).
template <class ExecSpace>
struct PortableAux {
  using policy_type = TeamPolicy<ExecSpace>;

  static policy_type token_policy(const ExecSpace& exec, std::int64_t T, std::size_t scratch, int& level) {
    level = scratch_level_for<ExecSpace>(scratch);
    policy_type p(exec, static_cast<int>(T), team_size_for<ExecSpace>());
    if (scratch > 0) p.set_scratch_size(level, Kokkos::PerTeam(scratch));
    return p;
  }

  template <class Ops>
  static void aux_scores_forward(const ExecSpace& exec, const Ops& o);
  template <class Ops>
  static void aux_scores_backward(const ExecSpace& exec, const Ops& o);
  template <class Ops>
  static void aux_loss_forward(const ExecSpace& exec, const Ops& o);
  template <class Ops>
  static void aux_loss_backward(const ExecSpace& exec, const Ops& o);
};

// Defined below the class, so not inline (see PortableTopk).
template <class ExecSpace>
template <class Ops>
void PortableAux<ExecSpace>::aux_scores_forward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::aux_scores[portable]");
  using Functor = AuxScoresFunctor<ExecSpace, Ops>;
  int level = 0;
  const auto policy = token_policy(exec, o.num_tokens, Functor::scratch_bytes(o.num_experts, o.topk), level);
  Kokkos::parallel_for("KokkosMoE::aux_scores", policy, Functor{o, level});
}

template <class ExecSpace>
template <class Ops>
void PortableAux<ExecSpace>::aux_scores_backward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::aux_scores_backward[portable]");
  int level = 0;
  const auto policy = token_policy(exec, o.num_tokens, 0, level);
  Kokkos::parallel_for("KokkosMoE::aux_scores_backward", policy, AuxScoresBackwardFunctor<ExecSpace, Ops>{o});
}

template <class ExecSpace>
template <class Ops>
void PortableAux<ExecSpace>::aux_loss_forward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::aux_loss[portable]");
  using Range = RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
  const std::int64_t chunks = (o.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
  Kokkos::parallel_for("KokkosMoE::aux_loss_partial", Range(exec, 0, chunks * o.cols), AuxLossPartialFunctor<Ops>{o});
  Kokkos::parallel_for("KokkosMoE::aux_loss_columns", Range(exec, 0, o.cols), AuxLossColumnFunctor<Ops>{o});
  Kokkos::parallel_for("KokkosMoE::aux_loss_final", RangePolicy<ExecSpace>(exec, 0, 1), AuxLossFinalFunctor<Ops>{o});
}

template <class ExecSpace>
template <class Ops>
void PortableAux<ExecSpace>::aux_loss_backward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::aux_loss_backward[portable]");
  if (o.rows == 0 || o.cols == 0) return;
  // about 4096 elements per team (at least one row), so nr * cols fits an int
  const int rows_per_team = o.cols >= 4096 ? 1 : static_cast<int>(4096 / o.cols);
  const std::int64_t league = (o.rows + rows_per_team - 1) / rows_per_team;
  Kokkos::parallel_for("KokkosMoE::aux_loss_backward",
                       TeamPolicy<ExecSpace>(exec, static_cast<int>(league), Kokkos::AUTO),
                       AuxLossBackwardFunctor<Ops>{o, rows_per_team});
}

/// The check_finite helpers (RouterConfig::check_finite), portable on every space.
template <class ExecSpace>
struct PortableChecks {
  /// Linear index of the first non-finite element of a [rows, cols] View, or -1. Fences (a debug check).
  template <class Values>
  static std::int64_t first_non_finite(const ExecSpace& exec, const Values& v) {
    using Range = RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::int64_t n = static_cast<std::int64_t>(v.extent(0) * v.extent(1));
    std::int64_t first = n;
    Kokkos::parallel_reduce("KokkosMoE::check_finite", Range(exec, 0, n), FirstNonFiniteFunctor<Values>{v},
                            Kokkos::Min<std::int64_t>(first));
    exec.fence();
    return first < n ? first : -1;
  }

  template <class Values>
  static float read_one(const ExecSpace& exec, const Values& v, std::int64_t index) {
    using Out = Kokkos::View<float, typename ExecSpace::memory_space>;
    Out out("KokkosMoE::read_one");
    Kokkos::parallel_for("KokkosMoE::read_one", RangePolicy<ExecSpace>(exec, 0, 1),
                         ReadOneFunctor<Values, Out>{v, index, out});
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    return h();
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
