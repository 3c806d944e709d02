/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_PORTABLE_HPP
#define KOKKOSMOE_ROUTER_PORTABLE_HPP

// The portable router: generic Kokkos parallel patterns on any execution space. It is the reference and fallback
// implementation (docs/router.md §17): one team per token, the team's threads stride over the experts, scores in team
// scratch, deterministic selection by k rounds of a max reduction over packed (order-preserving value, inverted
// index) 64-bit keys. Host spaces use teams of one thread, so every reduction is a plain sequential loop and the
// results cannot depend on the OpenMP thread count (docs/router.md §12).

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_Args.hpp>
#include <impl/KokkosMoE_Router_PortableTopk.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

/// Reads element i of a type-erased float/fp16/bf16/int array as float.
KOKKOS_INLINE_FUNCTION float load_as_float(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::F16:
      return to_float(static_cast<const fp16_t*>(p)[i]);
    case DType::BF16:
      return to_float(static_cast<const bf16_t*>(p)[i]);
    case DType::I16:
      return static_cast<float>(static_cast<const std::int16_t*>(p)[i]);
    case DType::I32:
      return static_cast<float>(static_cast<const std::int32_t*>(p)[i]);
    case DType::I64:
      return static_cast<float>(static_cast<const std::int64_t*>(p)[i]);
    case DType::U8:
      return static_cast<float>(static_cast<const std::uint8_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

/// Stores a float (rounded once, to nearest even) into a type-erased float/fp16/bf16 array.
KOKKOS_INLINE_FUNCTION void store_float(void* p, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::F16:
      static_cast<fp16_t*>(p)[i] = fp16_t(v);
      break;
    case DType::BF16:
      static_cast<bf16_t*>(p)[i] = bf16_t(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

template <class ExecSpace>
int team_size_for() {
  return is_host_space<ExecSpace>() ? 1 : 32;
}

// ---------------------------------------------------------------------------------------------------------------
// aux_scores (docs/router.md §10)
// ---------------------------------------------------------------------------------------------------------------
template <class ExecSpace>
struct AuxScoresFunctor {
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  using scratch_space = typename ExecSpace::scratch_memory_space;
  using FloatScratch = Kokkos::View<float*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  AuxScoresArgs a;
  int scratch_level;

  using KeyScratch = Kokkos::View<std::uint64_t*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static std::size_t scratch_bytes(int E, int k) {
    return FloatScratch::shmem_size(E) + KeyScratch::shmem_size(topk_key_count(k));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = a.num_experts;
    const int k = a.topk;
    const std::int64_t t = m.league_rank();
    const std::int64_t row = t * E;
    FloatScratch s(m.team_scratch(scratch_level), E);
    if (a.score_function == ScoreFunction::Softmax) {
      row_softmax(
          TeamLoops<member_type>{m}, E, [&](const int e) { return load_as_float(a.logits, a.logits_type, row + e); },
          s);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) { a.intermediate[row + e] = s(e); });
    } else {
      const bool sig = a.score_function == ScoreFunction::Sigmoid;
      float sum = 0;
      Kokkos::parallel_reduce(
          Kokkos::TeamThreadRange(m, E),
          [&](const int e, float& acc) {
            const float x = load_as_float(a.logits, a.logits_type, row + e);
            const float yv = sig ? sigmoid(x) : sqrt_softplus(x);
            s(e) = yv;
            a.intermediate[row + e] = sig ? yv : x;
            acc += yv;
          },
          sum);
      const float D = sum + kEps;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) { s(e) = s(e) / D; });
    }
    m.team_barrier();
    KeyScratch topk(m.team_scratch(scratch_level), topk_key_count(k));
    const std::uint64_t kth = select_topk(
        TeamLoops<member_type>{m}, E, k, [&](const int e) { return pack_key(s(e), e); }, topk);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      a.scores[row + e] = s(e);
      if (a.output == RoutingOutput::Bytemap) a.routing_map[row + e] = pack_key(s(e), e) >= kth ? 1 : 0;
    });
    if (a.output == RoutingOutput::BitmapU8) {
      const std::int64_t nb = bitmap_row_bytes(E);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, static_cast<int>(nb)), [&](const int b) {
        unsigned byte = 0;
        for (int j = 0; j < 8; ++j) {
          const int e = b * 8 + j;
          if (e < E && pack_key(s(e), e) >= kth) byte |= 1u << j;
        }
        a.routing_map[t * nb + b] = static_cast<std::uint8_t>(byte);
      });
    }
  }
};

template <class ExecSpace>
struct AuxScoresBackwardFunctor {
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  AuxScoresBackwardArgs a;

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = a.num_experts;
    const std::int64_t row = static_cast<std::int64_t>(m.league_rank()) * E;
    const ScoreFunction f = a.score_function;
    Sum2 sums;  // Softmax: (P, unused); Sigmoid/SqrtSoftplus: (S, Q)
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, E),
        [&](const int e, Sum2& acc) {
          const float ae = a.intermediate[row + e];
          const float ge = a.grad_scores[row + e];
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
    const float D = sums.a + kEps;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      const float ae = a.intermediate[row + e];
      const float ge = a.grad_scores[row + e];
      float dx;
      if (f == ScoreFunction::Softmax) {
        dx = softmax_grad(ge, ae, P);
      } else {
        const float h = ge / D - Q / (D * D);
        dx = f == ScoreFunction::Sigmoid ? sigmoid_grad(h, ae) : sqrt_softplus_grad(h, ae, sqrt_softplus(ae));
      }
      store_float(a.grad_logits, a.grad_logits_type, row + e, dx);
    });
  }
};

// ---------------------------------------------------------------------------------------------------------------
// aux_loss (docs/router.md §11): fixed-order two-stage column reduction, no atomics
// ---------------------------------------------------------------------------------------------------------------
struct AuxLossPartialFunctor {  // workspace[chunk * C + c] = sum of probs[r, c] over the chunk's rows, in row order
  AuxLossArgs a;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i) const {
    const std::int64_t C = a.cols;
    const std::int64_t chunk = i / C, c = i % C;
    const std::int64_t r0 = chunk * kAuxLossRowChunk;
    const std::int64_t r1 = r0 + kAuxLossRowChunk < a.rows ? r0 + kAuxLossRowChunk : a.rows;
    float acc = 0.0f;
    for (std::int64_t r = r0; r < r1; ++r) acc += load_as_float(a.probs, a.probs_type, r * C + c);
    a.workspace[i] = acc;
  }
};

struct AuxLossColumnFunctor {  // column sums, chunks in order, into the workspace tail
  AuxLossArgs a;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t c) const {
    const std::int64_t chunks = (a.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
    float acc = 0.0f;
    for (std::int64_t j = 0; j < chunks; ++j) acc += a.workspace[j * a.cols + c];
    a.workspace[chunks * a.cols + c] = acc;
  }
};

struct AuxLossFinalFunctor {  // one thread: Const and the loss, columns in order
  AuxLossArgs a;
  KOKKOS_INLINE_FUNCTION void operator()(const int) const {
    const std::int64_t chunks = (a.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
    const float total = a.total_num_tokens_device ? static_cast<float>(*a.total_num_tokens_device)
                                                  : static_cast<float>(a.total_num_tokens);
    const float cst = ((static_cast<float>(a.num_experts) * a.coeff) / static_cast<float>(a.topk)) / total / total;
    float acc = 0.0f;
    for (std::int64_t c = 0; c < a.cols; ++c)
      acc += a.workspace[chunks * a.cols + c] * load_as_float(a.tokens_per_expert, a.tpe_type, c);
    const float loss = cst * acc;
    a.const_buf[0] = cst;
    a.const_buf[1] = loss;
    store_float(a.loss, a.probs_type, 0, loss);
  }
};

/// grad_probs[r, c] = Const * tokens_per_expert[c] * grad_loss over blocks of rows: one team per block, the block
/// flattened row-major over its threads, so that adjacent threads write adjacent columns on a device (an MDRange
/// maps the row index to adjacent Cuda threads whatever its iteration order, so its stores would stride by a row).
struct AuxLossBackwardFunctor {
  AuxLossBackwardArgs a;
  int rows_per_team;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& m) const {
    const std::int64_t r0 = static_cast<std::int64_t>(m.league_rank()) * rows_per_team;
    const std::int64_t left = a.rows - r0;
    const int nr = left < rows_per_team ? static_cast<int>(left) : rows_per_team;
    const int cols = static_cast<int>(a.cols);
    const float g = load_as_float(a.grad_loss, a.grad_loss_type, 0);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, nr * cols), [&](const int j) {
      const int c = j % cols;
      store_float(a.grad_probs, a.grad_probs_type, r0 * a.cols + j,
                  a.const_buf[0] * load_as_float(a.tokens_per_expert, a.tpe_type, c) * g);
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

template <class ExecSpace>
struct PortableRouter {
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;

  static policy_type token_policy(const ExecSpace& exec, std::int64_t T, std::size_t scratch, int& level) {
    level = scratch_level_for<ExecSpace>(scratch);
    policy_type p(exec, static_cast<int>(T), team_size_for<ExecSpace>());
    if (scratch > 0) p.set_scratch_size(level, Kokkos::PerTeam(scratch));
    return p;
  }

  static void aux_scores_forward(const ExecSpace& exec, const AuxScoresArgs& a) {
    ScopedRegion region("KokkosMoE::aux_scores[portable]");
    using Functor = AuxScoresFunctor<ExecSpace>;
    int level = 0;
    const auto policy = token_policy(exec, a.num_tokens, Functor::scratch_bytes(a.num_experts, a.topk), level);
    Kokkos::parallel_for("KokkosMoE::aux_scores", policy, Functor{a, level});
  }

  static void aux_scores_backward(const ExecSpace& exec, const AuxScoresBackwardArgs& a) {
    ScopedRegion region("KokkosMoE::aux_scores_backward[portable]");
    int level = 0;
    const auto policy = token_policy(exec, a.num_tokens, 0, level);
    Kokkos::parallel_for("KokkosMoE::aux_scores_backward", policy, AuxScoresBackwardFunctor<ExecSpace>{a});
  }

  static void aux_loss_forward(const ExecSpace& exec, const AuxLossArgs& a) {
    ScopedRegion region("KokkosMoE::aux_loss[portable]");
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    const std::int64_t chunks = (a.rows + kAuxLossRowChunk - 1) / kAuxLossRowChunk;
    Kokkos::parallel_for("KokkosMoE::aux_loss_partial", Range(exec, 0, chunks * a.cols), AuxLossPartialFunctor{a});
    Kokkos::parallel_for("KokkosMoE::aux_loss_columns", Range(exec, 0, a.cols), AuxLossColumnFunctor{a});
    Kokkos::parallel_for("KokkosMoE::aux_loss_final", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1),
                         AuxLossFinalFunctor{a});
  }

  static void aux_loss_backward(const ExecSpace& exec, const AuxLossBackwardArgs& a) {
    ScopedRegion region("KokkosMoE::aux_loss_backward[portable]");
    if (a.rows == 0 || a.cols == 0) return;
    // about 4096 elements per team (at least one row), so nr * cols fits an int
    const int rows_per_team = a.cols >= 4096 ? 1 : static_cast<int>(4096 / a.cols);
    const std::int64_t league = (a.rows + rows_per_team - 1) / rows_per_team;
    Kokkos::parallel_for("KokkosMoE::aux_loss_backward",
                         Kokkos::TeamPolicy<ExecSpace>(exec, static_cast<int>(league), Kokkos::AUTO),
                         AuxLossBackwardFunctor{a, rows_per_team});
  }

  /// Linear index of the first non-finite element of a [rows, cols] View, or -1. Fences (a debug check).
  template <class Values>
  static std::int64_t first_non_finite(const ExecSpace& exec, const Values& v) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
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
    Kokkos::parallel_for("KokkosMoE::read_one", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1),
                         ReadOneFunctor<Values, Out>{v, index, out});
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out);
    return h();
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

#endif
