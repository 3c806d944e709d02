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

#include <impl/KokkosMoE_Router_Args.hpp>
#include <impl/KokkosMoE_RouterMath.hpp>

#include <cstdint>

namespace KokkosMoE {
namespace Impl {

template <class T>
struct TypeTag {
  using type = T;
};

/// Calls f(TypeTag<T>{}) for the floating type named by t.
template <class F>
void with_float_type(DType t, F&& f) {
  switch (t) {
    case DType::F16:
      f(TypeTag<fp16_t>{});
      break;
    case DType::BF16:
      f(TypeTag<bf16_t>{});
      break;
    default:
      f(TypeTag<float>{});
      break;
  }
}

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

KOKKOS_INLINE_FUNCTION std::int64_t load_index(const void* p, DType t, std::int64_t i) {
  switch (t) {
    case DType::I16:
      return static_cast<const std::int16_t*>(p)[i];
    case DType::I64:
      return static_cast<const std::int64_t*>(p)[i];
    default:
      return static_cast<const std::int32_t*>(p)[i];
  }
}

KOKKOS_INLINE_FUNCTION void store_index(void* p, DType t, std::int64_t i, std::int64_t v) {
  switch (t) {
    case DType::I16:
      static_cast<std::int16_t*>(p)[i] = static_cast<std::int16_t>(v);
      break;
    case DType::I64:
      static_cast<std::int64_t*>(p)[i] = v;
      break;
    default:
      static_cast<std::int32_t*>(p)[i] = static_cast<std::int32_t>(v);
      break;
  }
}


/// Max of packed keys (Kokkos' Max reducer on uint64_t; MaxFirstLoc does not exist in Kokkos 3.4).
template <class Member, class KeyOf>
KOKKOS_INLINE_FUNCTION std::uint64_t team_max_key(const Member& m, int n, const KeyOf& key_of) {
  std::uint64_t best = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, n),
      [&](const int e, std::uint64_t& acc) {
        const std::uint64_t k = key_of(e);
        if (k > acc) acc = k;
      },
      Kokkos::Max<std::uint64_t>(best));
  return best;
}

/// Fills keys[0..k) with the k largest non-zero keys among key_of(0..n), in descending order, and returns the
/// k-th. Keys are unique (they embed the index), so the result does not depend on how it is computed: teams of one
/// thread (host spaces) make a single pass with an insertion buffer, larger teams run k rounds of a max reduction.
template <class Member, class KeyOf, class KeyScratch>
KOKKOS_INLINE_FUNCTION std::uint64_t team_topk_keys(const Member& m, int n, int k, const KeyOf& key_of,
                                                    const KeyScratch& keys) {
  if (m.team_size() == 1) {
    int filled = 0;
    for (int e = 0; e < n; ++e) {
      const std::uint64_t key = key_of(e);
      if (key == 0 || (filled == k && key <= keys(k - 1))) continue;
      int pos = filled < k ? filled++ : k - 1;
      for (; pos > 0 && keys(pos - 1) < key; --pos) keys(pos) = keys(pos - 1);
      keys(pos) = key;
    }
    return keys(k - 1);
  }
  std::uint64_t prev = ~std::uint64_t(0);
  for (int i = 0; i < k; ++i) {
    const std::uint64_t best = team_max_key(m, n, [&](const int e) {
      const std::uint64_t key = key_of(e);
      return key < prev ? key : std::uint64_t(0);
    });
    Kokkos::single(Kokkos::PerTeam(m), [&]() { keys(i) = best; });
    prev = best;
  }
  m.team_barrier();
  return prev;
}

/// Fills row(e), e < n, with the softmax of load(e) (docs/router.md §5.1: max, then sum of exp(x - M), then a multiply
/// by 1/sum). Team-collective; each entry is read and rewritten by the thread that owns it in TeamThreadRange.
template <class Member, class Load, class Row>
KOKKOS_INLINE_FUNCTION void team_row_softmax(const Member& m, int n, const Load& load, const Row& row) {
  float M = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, n),
      [&](const int e, float& acc) {
        const float x = load(e);
        row(e) = x;
        if (x > acc) acc = x;
      },
      Kokkos::Max<float>(M));
  float sum = 0;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(m, n), [&](const int e, float& acc) { acc += softmax_term(row(e), M); }, sum);
  const float inv = 1.0f / sum;
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n), [&](const int e) { row(e) = softmax_term(row(e), M) * inv; });
}

/// Two sums reduced together (nested multi-value reductions are not in Kokkos 3.4).
struct Sum2 {
  float a = 0.0f, b = 0.0f;
  KOKKOS_INLINE_FUNCTION Sum2& operator+=(const Sum2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

template <class ExecSpace>
int team_size_for() {
  return is_host_space<ExecSpace>() ? 1 : 32;
}

// ---------------------------------------------------------------------------------------------------------------
// topk_router forward
// ---------------------------------------------------------------------------------------------------------------
template <class ExecSpace, class Scalar>
struct TopkForwardFunctor {
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  using scratch_space = typename ExecSpace::scratch_memory_space;
  template <class T>
  using ScratchView = Kokkos::View<T*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  TopkForwardArgs a;
  int scratch_level;

  static std::size_t scratch_bytes(int E, int G, int k) {
    return ScratchView<float>::shmem_size(E) * 2 + ScratchView<float>::shmem_size(G > 0 ? G : 1) +
           ScratchView<int>::shmem_size(G > 0 ? G : 1) + ScratchView<std::uint64_t>::shmem_size(k);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = a.num_experts;
    const int k = a.config.topk;
    const bool grouped = a.config.group_topk > 0;
    const int G = grouped ? a.config.num_groups : 1;
    const ScoreFunction f = a.config.score_function;
    const bool pre = a.config.use_pre_softmax;
    const std::int64_t t = m.league_rank();
    const std::int64_t row = t * E;
    const Scalar* logits = static_cast<const Scalar*>(a.logits);

    ScratchView<float> s(m.team_scratch(scratch_level), E);  // selection score
    ScratchView<float> y(m.team_scratch(scratch_level), E);  // activation (or raw logit for Softmax post)
    ScratchView<float> gscore(m.team_scratch(scratch_level), G);
    ScratchView<int> gsel(m.team_scratch(scratch_level), G);
    ScratchView<std::uint64_t> topk(m.team_scratch(scratch_level), k);  // selected keys, slot order

    // 1. activations and selection scores (docs/router.md §5.1)
    if (f == ScoreFunction::Softmax) {
      if (pre) {
        team_row_softmax(
            m, E, [&](const int e) { return to_float(logits[row + e]); }, y);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) { s(e) = y(e); });
      } else {
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
          const float x = to_float(logits[row + e]);
          y(e) = x;
          s(e) = x;
        });
      }
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
        const float x = to_float(logits[row + e]);
        const float act = f == ScoreFunction::Sigmoid ? sigmoid(x) : sqrt_softplus(x);
        y(e) = act;
        s(e) = a.bias ? act + load_as_float(a.bias, a.bias_type, e) : act;
      });
    }
    m.team_barrier();

    // 2. group-limited eligibility (docs/router.md §5.3)
    if (grouped) {
      const int group_size = E / G;
      const int kg = k / a.config.group_topk;
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, G), [&](const int g) {
        float sum = 0.0f;
        std::uint64_t prev = ~std::uint64_t(0);
        for (int j = 0; j < kg; ++j) {
          std::uint64_t best = 0;
          for (int e = g * group_size; e < g * group_size + group_size; ++e) {
            const std::uint64_t key = pack_key(s(e), e);
            if (key < prev && key > best) best = key;
          }
          sum += s(key_index(best));
          prev = best;
        }
        gscore(g) = sum;
        gsel(g) = 0;
      });
      m.team_barrier();
      Kokkos::single(Kokkos::PerTeam(m), [&]() {
        std::uint64_t prev = ~std::uint64_t(0);
        for (int j = 0; j < a.config.group_topk; ++j) {
          std::uint64_t best = 0;
          for (int g = 0; g < G; ++g) {
            const std::uint64_t key = pack_key(gscore(g), g);
            if (key < prev && key > best) best = key;
          }
          gsel(key_index(best)) = 1;
          prev = best;
        }
      });
      m.team_barrier();
    }
    const int gs = E / G;
    auto eligible_key = [&](const int e) -> std::uint64_t {
      return (!grouped || gsel(e / gs)) ? pack_key(s(e), e) : std::uint64_t(0);
    };

    // 3. top-k over the eligible experts (value desc, then lower index)
    const std::uint64_t kth_key = team_topk_keys(m, E, k, eligible_key, topk);
    auto sel = [&](const int i) { return key_index(topk(i)); };

    // 4. weights of the selected experts (every thread computes the same scalars, in slot order)
    const bool post = f == ScoreFunction::Softmax && !pre;
    float norm = 1.0f;  // Sigmoid/SqrtSoftplus: denominator; Softmax post: 1/sum
    float post_max = 0.0f;
    if (post) {
      post_max = y(sel(0));
      for (int i = 1; i < k; ++i) post_max = y(sel(i)) > post_max ? y(sel(i)) : post_max;
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += softmax_term(y(sel(i)), post_max);
      norm = 1.0f / sum;
    } else if (f != ScoreFunction::Softmax && k > 1) {
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += y(sel(i));
      norm = sum + kEps;
    }
    const bool normalize = f != ScoreFunction::Softmax && k > 1;
    const float scale = a.config.scaling_factor;
    auto weight_of = [&](const int e) -> float {
      if (post) return softmax_term(y(e), post_max) * norm;
      return normalize ? y(e) / norm : y(e);
    };

    // 5. outputs
    if (a.output == RoutingOutput::Compact) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, k), [&](const int i) {
        a.ids[t * k + i] = sel(i);
        a.weights[t * k + i] = scale * weight_of(sel(i));
      });
      return;
    }
    Scalar* probs = static_cast<Scalar*>(a.probs);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      const std::uint64_t key = eligible_key(e);
      const bool routed = key != 0 && key >= kth_key;
      const float w = routed ? weight_of(e) : 0.0f;
      probs[row + e] = from_float<Scalar>(routed ? scale * w : 0.0f);
      float inter;
      if (f == ScoreFunction::SqrtSoftplus) {
        inter = to_float(logits[row + e]);
      } else if (post) {
        inter = routed ? w : neg_inf();
      } else {
        inter = y(e);
      }
      a.intermediate[row + e] = inter;
      if (a.output == RoutingOutput::Bytemap) a.routing_map[row + e] = routed ? 1 : 0;
    });
    if (a.output == RoutingOutput::BitmapU8) {
      const std::int64_t nb = bitmap_row_bytes(E);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, static_cast<int>(nb)), [&](const int b) {
        unsigned byte = 0;
        for (int j = 0; j < 8; ++j) {
          const int e = b * 8 + j;
          if (e < E) {
            const std::uint64_t key = eligible_key(e);
            if (key != 0 && key >= kth_key) byte |= 1u << j;
          }
        }
        a.routing_map[t * nb + b] = static_cast<std::uint8_t>(byte);
      });
    } else if (a.output == RoutingOutput::Indices) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(m, k),
                           [&](const int i) { store_index(a.indices, a.indices_type, t * k + i, sel(i)); });
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// topk_router backward (docs/router.md §9) and the compact backward (§5.5)
// ---------------------------------------------------------------------------------------------------------------

/// Per-token gradient scalars of §9 and the derivative that turns h into dx.
struct GradTerms {
  ScoreFunction f;
  bool pre;
  int k;
  float D = 0, Q = 0, P = 0;

  /// v of §9 from the saved activation a (Sigmoid: a; SqrtSoftplus: a is the raw logit).
  KOKKOS_INLINE_FUNCTION float v_of(float a) const { return f == ScoreFunction::Sigmoid ? a : sqrt_softplus(a); }

  /// dx of a routed expert with saved activation a and incoming g (already times scaling_factor).
  KOKKOS_INLINE_FUNCTION float routed(float a, float g) const {
    if (f == ScoreFunction::Softmax) return softmax_grad(g, a, P);
    const float h = k > 1 ? g / D - Q / (D * D) : g;
    if (f == ScoreFunction::Sigmoid) return sigmoid_grad(h, a);
    return sqrt_softplus_grad(h, a, sqrt_softplus(a));
  }
  /// dx of a non-routed expert: exactly +0.0, except Softmax pre (-a*P).
  KOKKOS_INLINE_FUNCTION float unrouted(float a) const {
    return (f == ScoreFunction::Softmax && pre) ? softmax_grad(0.0f, a, P) : 0.0f;
  }
};

template <class ExecSpace>
struct TopkBackwardFunctor {
  using policy_type = Kokkos::TeamPolicy<ExecSpace>;
  using member_type = typename policy_type::member_type;
  using scratch_space = typename ExecSpace::scratch_memory_space;
  using FloatScratch = Kokkos::View<float*, scratch_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  TopkBackwardArgs a;
  int scratch_level;

  static std::size_t scratch_bytes(int E, const TopkBackwardArgs& a) {
    // Compact backward keeps the recomputed row activations (Softmax pre) or the k selected ones.
    return a.output == RoutingOutput::Compact ? FloatScratch::shmem_size(E) + FloatScratch::shmem_size(a.config.topk)
                                              : 0;
  }

  KOKKOS_INLINE_FUNCTION bool routed_in_map(std::int64_t t, int e) const {
    const int E = a.num_experts;
    if (a.output == RoutingOutput::Bytemap) return a.routing_map[t * E + e] != 0;
    return (a.routing_map[t * bitmap_row_bytes(E) + e / 8] >> (e % 8)) & 1u;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const std::int64_t t = m.league_rank();
    if (a.output == RoutingOutput::Compact) {
      compact(m, t);
    } else if (a.output == RoutingOutput::Indices) {
      indices(m, t);
    } else {
      map(m, t);
    }
  }

  KOKKOS_INLINE_FUNCTION GradTerms terms() const {
    GradTerms g;
    g.f = a.config.score_function;
    g.pre = a.config.use_pre_softmax;
    g.k = a.config.topk;
    return g;
  }

  KOKKOS_INLINE_FUNCTION void finish_sums(GradTerms& g, float S, float Q, float P) const {
    g.D = S + kEps;
    g.Q = Q;
    g.P = P;
  }

  // Routing map: sums over routed experts in expert order; Bytemap and BitmapU8 share this code.
  KOKKOS_INLINE_FUNCTION void map(const member_type& m, std::int64_t t) const {
    const int E = a.num_experts;
    const std::int64_t row = t * E;
    const float scale = a.config.scaling_factor;
    GradTerms g = terms();
    // Softmax: (P, unused); Sigmoid/SqrtSoftplus: (S, Q)
    Sum2 sums;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, E),
        [&](const int e, Sum2& acc) {
          if (!routed_in_map(t, e)) return;
          const float ae = a.intermediate[row + e];
          const float ge = load_as_float(a.grad_probs, a.grad_type, row + e) * scale;
          if (g.f == ScoreFunction::Softmax) {
            acc.a += ge * ae;
          } else {
            const float v = g.v_of(ae);
            acc.a += v;
            acc.b += ge * v;
          }
        },
        sums);
    if (g.f == ScoreFunction::Softmax)
      finish_sums(g, 0.0f, 0.0f, sums.a);
    else
      finish_sums(g, sums.a, sums.b, 0.0f);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      const float ae = a.intermediate[row + e];
      const float dx = routed_in_map(t, e) ? g.routed(ae, load_as_float(a.grad_probs, a.grad_type, row + e) * scale)
                                           : g.unrouted(ae);
      store_float(a.grad_logits, a.grad_type, row + e, dx);
    });
  }

  // Dense indices: sums over the k slots in slot order.
  KOKKOS_INLINE_FUNCTION void indices(const member_type& m, std::int64_t t) const {
    const int E = a.num_experts;
    const int k = a.config.topk;
    const std::int64_t row = t * E;
    const float scale = a.config.scaling_factor;
    GradTerms g = terms();
    float S = 0, Q = 0, P = 0;
    for (int i = 0; i < k; ++i) {
      const std::int64_t e = load_index(a.indices, a.indices_type, t * k + i);
      const float ae = a.intermediate[row + e];
      const float ge = load_as_float(a.grad_probs, a.grad_type, row + e) * scale;
      if (g.f == ScoreFunction::Softmax) {
        P += ge * ae;
      } else {
        const float v = g.v_of(ae);
        S += v;
        Q += ge * v;
      }
    }
    finish_sums(g, S, Q, P);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      store_float(a.grad_logits, a.grad_type, row + e, g.unrouted(a.intermediate[row + e]));
    });
    m.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, k), [&](const int i) {
      const std::int64_t e = load_index(a.indices, a.indices_type, t * k + i);
      const float dx = g.routed(a.intermediate[row + e], load_as_float(a.grad_probs, a.grad_type, row + e) * scale);
      store_float(a.grad_logits, a.grad_type, row + e, dx);
    });
  }

  // Compact: recompute the activations from the logits (docs/router.md §5.5).
  KOKKOS_INLINE_FUNCTION void compact(const member_type& m, std::int64_t t) const {
    const int E = a.num_experts;
    const int k = a.config.topk;
    const std::int64_t row = t * E;
    const float scale = a.config.scaling_factor;
    const ScoreFunction f = a.config.score_function;
    const bool pre = f == ScoreFunction::Softmax && a.config.use_pre_softmax;
    FloatScratch rowact(m.team_scratch(scratch_level), E);
    FloatScratch act(m.team_scratch(scratch_level), k);
    GradTerms g = terms();
    if (pre)
      team_row_softmax(
          m, E, [&](const int e) { return load_as_float(a.logits, a.logits_type, row + e); }, rowact);
    m.team_barrier();
    Kokkos::single(Kokkos::PerTeam(m), [&]() {
      // activations of the selected experts, as the forward computed them
      for (int i = 0; i < k; ++i) {
        const int e = a.ids[t * k + i];
        const float x = load_as_float(a.logits, a.logits_type, row + e);
        act(i) = f == ScoreFunction::Sigmoid        ? sigmoid(x)
                 : f == ScoreFunction::SqrtSoftplus ? x
                 : pre                              ? rowact(e)
                                                    : x;
      }
      if (f == ScoreFunction::Softmax && !pre) {  // post-softmax over the k selected logits
        float M = act(0);
        for (int i = 1; i < k; ++i) M = act(i) > M ? act(i) : M;
        float sum = 0;
        for (int i = 0; i < k; ++i) sum += softmax_term(act(i), M);
        const float inv = 1.0f / sum;
        for (int i = 0; i < k; ++i) act(i) = softmax_term(act(i), M) * inv;
      }
    });
    m.team_barrier();
    float S = 0, Q = 0, P = 0;
    for (int i = 0; i < k; ++i) {
      const float gi = load_as_float(a.grad_weights, a.grad_weights_type, t * k + i) * scale;
      if (f == ScoreFunction::Softmax) {
        P += gi * act(i);
      } else {
        const float v = g.v_of(act(i));
        S += v;
        Q += gi * v;
      }
    }
    finish_sums(g, S, Q, P);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, E), [&](const int e) {
      store_float(a.grad_logits, a.logits_type, row + e, pre ? g.unrouted(rowact(e)) : 0.0f);
    });
    m.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, k), [&](const int i) {
      const float gi = load_as_float(a.grad_weights, a.grad_weights_type, t * k + i) * scale;
      store_float(a.grad_logits, a.logits_type, row + a.ids[t * k + i], g.routed(act(i), gi));
    });
  }
};

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
  static std::size_t scratch_bytes(int E, int k) { return FloatScratch::shmem_size(E) + KeyScratch::shmem_size(k); }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const int E = a.num_experts;
    const int k = a.topk;
    const std::int64_t t = m.league_rank();
    const std::int64_t row = t * E;
    FloatScratch s(m.team_scratch(scratch_level), E);
    if (a.score_function == ScoreFunction::Softmax) {
      team_row_softmax(
          m, E, [&](const int e) { return load_as_float(a.logits, a.logits_type, row + e); }, s);
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
    KeyScratch topk(m.team_scratch(scratch_level), k);
    const std::uint64_t kth = team_topk_keys(
        m, E, k, [&](const int e) { return pack_key(s(e), e); }, topk);
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

struct FirstNonFiniteFunctor {
  const void* data;
  DType type;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t i, std::int64_t& first) const {
    const std::uint32_t bits = float_bits(load_as_float(data, type, i));
    if ((bits & 0x7f800000u) == 0x7f800000u && i < first) first = i;
  }
};

struct ReadOneFunctor {
  const void* data;
  DType type;
  std::int64_t index;
  float* out;
  KOKKOS_INLINE_FUNCTION void operator()(const int) const { *out = load_as_float(data, type, index); }
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

  static void topk_forward(const ExecSpace& exec, const TopkForwardArgs& a) {
    ScopedRegion region("KokkosMoE::topk_router[portable]");
    with_float_type(a.logits_type, [&](auto tag) {
      using Scalar = typename decltype(tag)::type;
      using Functor = TopkForwardFunctor<ExecSpace, Scalar>;
      const int G = a.config.group_topk > 0 ? a.config.num_groups : 1;
      const std::size_t bytes = Functor::scratch_bytes(a.num_experts, G, a.config.topk);
      int level = 0;
      const auto policy = token_policy(exec, a.num_tokens, bytes, level);
      Kokkos::parallel_for("KokkosMoE::topk_router", policy, Functor{a, level});
    });
  }

  static void topk_backward(const ExecSpace& exec, const TopkBackwardArgs& a) {
    ScopedRegion region("KokkosMoE::topk_router_backward[portable]");
    using Functor = TopkBackwardFunctor<ExecSpace>;
    int level = 0;
    const auto policy = token_policy(exec, a.num_tokens, Functor::scratch_bytes(a.num_experts, a), level);
    Kokkos::parallel_for("KokkosMoE::topk_router_backward", policy, Functor{a, level});
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

  /// Linear index of the first non-finite element, or -1. Fences (a debug check).
  static std::int64_t first_non_finite(const ExecSpace& exec, const void* data, DType type, std::int64_t rows,
                                       std::int64_t cols) {
    using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<std::int64_t>>;
    std::int64_t first = rows * cols;
    Kokkos::parallel_reduce("KokkosMoE::check_finite", Range(exec, 0, rows * cols), FirstNonFiniteFunctor{data, type},
                            Kokkos::Min<std::int64_t>(first));
    exec.fence();
    return first < rows * cols ? first : -1;
  }

  static float read_one(const ExecSpace& exec, const void* data, DType type, std::int64_t index) {
    Kokkos::View<float, typename ExecSpace::memory_space> v("KokkosMoE::read_one");
    Kokkos::parallel_for("KokkosMoE::read_one", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1),
                         ReadOneFunctor{data, type, index, v.data()});
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
    return h();
  }
};

}  // namespace Impl
}  // namespace KokkosMoE

namespace Kokkos {
template <>
struct reduction_identity<KokkosMoE::Impl::Sum2> {
  KOKKOS_FORCEINLINE_FUNCTION static KokkosMoE::Impl::Sum2 sum() { return KokkosMoE::Impl::Sum2(); }
};
}  // namespace Kokkos

#endif
