/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_PORTABLETOKENS_HPP
#define KOKKOSMOE_ROUTER_PORTABLETOKENS_HPP

// What the portable top-k router kernels share (impl/KokkosMoE_Router_PortableTopk.hpp): how tokens map onto the
// hardware (TokenGeometry), the backward's per-token gradient scalars and the host prefetch hint.

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_KernelChoice.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_RowChunks.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// GCC / Clang builtins in host code (__builtin_ctzll, __builtin_prefetch): the one place that says where they exist.
#if defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KOKKOSMOE_IMPL_HOST_GNU_BUILTINS 1
#endif

namespace KokkosMoE {
namespace Impl {

/// Two sums reduced together (nested multi-value reductions are not in Kokkos 3.4).
struct Sum2 {
  float a = 0.0f, b = 0.0f;
  KOKKOS_INLINE_FUNCTION Sum2& operator+=(const Sum2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

/// Per-token gradient scalars of docs/router.md §9 and the derivative that turns them into dx.
struct GradTerms {
  ScoreFunction f;
  bool pre;
  int k;
  float D = 0, Q = 0, P = 0;

  KOKKOS_INLINE_FUNCTION static GradTerms of(const TokenParams& p) {
    GradTerms g;
    g.f = p.score_function;
    g.pre = p.use_pre_softmax;
    g.k = p.topk;
    return g;
  }
  KOKKOS_INLINE_FUNCTION void set_sums(float S, float Q_, float P_) {
    D = normalization_denominator(S);
    Q = Q_;
    P = P_;
  }
  /// v of §9 from the saved activation a (Sigmoid: a; SqrtSoftplus: a is the raw logit).
  KOKKOS_INLINE_FUNCTION float v_of(float a) const { return f == ScoreFunction::Sigmoid ? a : sqrt_softplus(a); }
  /// Adds expert e's terms to the sums (P for Softmax; S and Q otherwise).
  KOKKOS_INLINE_FUNCTION void accumulate(Sum2& acc, float a, float g) const {
    if (f == ScoreFunction::Softmax) {
      acc.a += g * a;
    } else {
      const float v = v_of(a);
      acc.a += v;
      acc.b += g * v;
    }
  }
  KOKKOS_INLINE_FUNCTION void finish(const Sum2& s) {
    if (f == ScoreFunction::Softmax)
      set_sums(0.0f, 0.0f, s.a);
    else
      set_sums(s.a, s.b, 0.0f);
  }
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

/// Cache-line size assumed by the host prefetches.
constexpr std::size_t kHostCacheLine = 64;

/// A read-prefetch hint for host code (GCC and Clang); nothing elsewhere.
KOKKOS_INLINE_FUNCTION void prefetch_host(const void* p) {
#if defined(KOKKOSMOE_IMPL_HOST_GNU_BUILTINS)
  __builtin_prefetch(p, 0, 3);
#else
  (void)p;
#endif
}

/// Launch geometry of the per-token kernels: host spaces take blocks of tokens per one-thread team; devices put
/// one token on each team thread, with vector_length lanes per token.
template <class ExecSpace>
struct TokenGeometry {
  static constexpr bool host = is_host_space<ExecSpace>();
  static constexpr int kHostTokensPerTeam = 8;
  /// On a device a token of at most this many experts runs on one thread (the Serial variant: no lane exchanges,
  /// 32 tokens per warp, the rows in registers).
  static constexpr int kThreadTokenExperts = 16;
  int vector_length = 1;
  int team_size = 1;
  int tokens_per_team = 1;
  bool serial_tokens = host;  ///< each token on one thread: the host, and on devices the token kernels for small E
  /// Devices, one token per thread: the register slots of its rows (8 or 16, set by with_rows); 0: none, the Serial
  /// variant as on the host. Each count is a kernel of its own, so each gets its own register allocation.
  int rows = 0;

  /// Gives a device's one-thread tokens rows in registers (operations whose outputs are dense rows).
  TokenGeometry with_rows(int num_experts) const {
    TokenGeometry g = *this;
    if (!host && serial_tokens) g.rows = num_experts <= 8 ? 8 : kThreadTokenExperts;
    return g;
  }

  /// The geometry of the forward. On a device: one thread per token for E <= kThreadTokenExperts; else about 16
  /// experts per lane (each lane keeps its four best keys in registers and a selection round is one lane
  /// reduction) and at least k lanes, so that a lane rarely gives up more keys than its list holds.
  static TokenGeometry forward(const TokenParams& p, const KernelChoice& choice) {
    const int E = p.num_experts;
    return token_kernel(p, E / 16 > p.topk ? E / 16 : p.topk, choice);
  }

  /// The geometry of the compact backward. It recomputes the forward's activations, so it takes the forward's
  /// variant where that matters (token_kernel); otherwise its work is per selected slot: about two slots per lane,
  /// at least 8 lanes.
  static TokenGeometry compact_backward(const TokenParams& p, const KernelChoice& choice) {
    return token_kernel(p, p.topk / 2 > 8 ? p.topk / 2 : 8, choice);
  }

  /// The forward's and the compact backward's geometry with about `lanes` lanes per token (a power of two up to
  /// 32). Host spaces: blocks of tokens (of()). Devices: one thread per token for E <= kThreadTokenExperts, and of()
  /// for Softmax pre, whose row sum is a lane reduction whose order (hence bits) the lane count sets;
  /// KernelChoice::portable_lanes_only puts every token on lanes.
  static TokenGeometry token_kernel(const TokenParams& p, int lanes, const KernelChoice& choice) {
    const int E = p.num_experts;
    if (host) return of(E);
    if (E <= kThreadTokenExperts && !choice.portable_lanes_only) return thread_per_token();
    if (p.softmax_pre()) return of(E);
    return with_lanes(lanes_for(lanes));
  }

  /// The geometry of the backward from a map or from dense indices. On a device: one thread per token for
  /// E <= kThreadTokenExperts (its rows in registers; the map backward's sums then run in the order of the lane
  /// variant's reduction, TopkBackwardKernel::map_thread), else of().
  static TokenGeometry backward(const TokenParams& p, const KernelChoice& choice) {
    if (!host && p.num_experts <= kThreadTokenExperts && !choice.portable_lanes_only) return thread_per_token();
    return of(p.num_experts);
  }

  /// Geometry of the map backward: one lane per expert up to 32. Its sums are lane reductions, so the lane count
  /// sets their bits.
  static TokenGeometry of(int num_experts) {
    if (host) {
      TokenGeometry g;
      g.tokens_per_team = kHostTokensPerTeam;
      return g;
    }
    return with_lanes(lanes_for(num_experts));
  }

  /// The smallest power of two >= n, at most 32.
  static int lanes_for(int n) {
    int v = 1;
    while (v < 32 && v < n) v *= 2;
    return v;
  }
  /// Device geometry: v lanes per token, 128 / v tokens (team threads) per team.
  static TokenGeometry with_lanes(int v) {
    TokenGeometry g;
    g.vector_length = v;
    g.team_size = 128 / v;
    g.tokens_per_team = g.team_size;
    g.serial_tokens = false;
    return g;
  }
  /// Device geometry of one token per thread (the Serial variant, 32 tokens per warp).
  static TokenGeometry thread_per_token() {
    TokenGeometry g;
    g.team_size = 128;
    g.tokens_per_team = 128;
    g.serial_tokens = true;
    return g;
  }

  /// A policy with per-token scratch of `bytes`: per team on the host, per thread on a device; level 0 while it
  /// fits in 32 KB per team, level 1 otherwise.
  TeamPolicy<ExecSpace> policy(const ExecSpace& exec, std::int64_t T, std::size_t bytes, int& level) const {
    const std::int64_t league = (T + tokens_per_team - 1) / tokens_per_team;
    TeamPolicy<ExecSpace> p(exec, static_cast<int>(league), team_size, vector_length);
    level = (host || bytes * static_cast<std::size_t>(team_size) <= 32 * 1024) ? 0 : 1;
    if (bytes > 0) {
      if (host)
        p.set_scratch_size(level, Kokkos::PerTeam(bytes));
      else
        p.set_scratch_size(level, Kokkos::PerThread(bytes));
    }
    return p;
  }

  /// Scratch handle of the calling token: the team's on the host, the thread's on a device.
  template <class Member>
  KOKKOS_INLINE_FUNCTION static auto scratch(const Member& m, int level) {
    if constexpr (host)
      return m.team_scratch(level);
    else
      return m.thread_scratch(level);
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
