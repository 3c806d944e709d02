/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_PORTABLETOPK_HPP
#define KOKKOSMOE_ROUTER_PORTABLETOPK_HPP

// The portable top-k router kernels (docs/router.md §17), built from the per-token functions of
// impl/KokkosMoE_RouterToken_Impl.hpp. The mapping of tokens onto the hardware depends on the backend:
//   * host spaces: a team of one thread takes a block of tokens; each token runs the Serial variant (one pass with
//     an insertion buffer, sums in expert order), and the dense outputs are written as a fill of the non-selected
//     value followed by a scatter of the k selected entries, so the fill loops vectorize. Results do not depend on
//     the thread count (§12).
//   * devices: each team thread owns one token and its vector lanes (up to 32, fewer for small E) stride over the
//     experts (the ThreadVector variant): several tokens per team, reductions within a warp, no team barrier. A token
//     of at most 16 experts runs on one thread instead, its rows in registers.
// The map-based backward reads only what it needs where the score function allows it (Sigmoid, SqrtSoftplus,
// Softmax post: the gradient of a non-selected expert is +0): the map, then the selected entries of grad_probs and
// the intermediate. Softmax pre streams the dense rows (every expert has a gradient).

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>
#include <kokkos_ext/KokkosMoE_KokkosCompat.hpp>

#include <impl/KokkosMoE_RouterMath.hpp>
#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_Operands.hpp>
#include <impl/KokkosMoE_RowChunks.hpp>
#include <impl/KokkosMoE_TestSeam.hpp>

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
  static TokenGeometry forward(const TokenParams& p) {
    const int E = p.num_experts;
    return token_kernel(p, E / 16 > p.topk ? E / 16 : p.topk);
  }

  /// The geometry of the compact backward. It recomputes the forward's activations, so it takes the forward's
  /// variant where that matters (token_kernel); otherwise its work is per selected slot: about two slots per lane,
  /// at least 8 lanes.
  static TokenGeometry compact_backward(const TokenParams& p) {
    return token_kernel(p, p.topk / 2 > 8 ? p.topk / 2 : 8);
  }

  /// The forward's and the compact backward's geometry with about `lanes` lanes per token (a power of two up to
  /// 32). Host spaces: blocks of tokens (of()). Devices: one thread per token for E <= kThreadTokenExperts, and of()
  /// for Softmax pre, whose row sum is a lane reduction whose order (hence bits) the lane count sets.
  static TokenGeometry token_kernel(const TokenParams& p, int lanes) {
    const int E = p.num_experts;
    if (host) return of(E);
    if (E <= kThreadTokenExperts && !TestSeam::portable_device_tokens.lanes_only) return thread_per_token();
    if (p.softmax_pre()) return of(E);
    return with_lanes(lanes_for(lanes));
  }

  /// The geometry of the backward from a map or from dense indices. On a device: one thread per token for
  /// E <= kThreadTokenExperts (its rows in registers; the map backward's sums then run in the order of the lane
  /// variant's reduction, TopkBackwardKernel::map_thread), else of().
  static TokenGeometry backward(const TokenParams& p) {
    if (!host && p.num_experts <= kThreadTokenExperts && !TestSeam::portable_device_tokens.lanes_only)
      return thread_per_token();
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

// ---------------------------------------------------------------------------------------------------------------
// forward
// ---------------------------------------------------------------------------------------------------------------
/// SerialTokens: each token on one thread with the Serial variant (host spaces; devices for small E), else on one
/// team thread's vector lanes with the ThreadVector variant. Rows > 0: on a device, the dense outputs built in Rows
/// register slots and stored whole (TokenGeometry::rows).
template <class ExecSpace, class Ops, bool SerialTokens, int Rows>
struct TopkForwardKernel {
  using Geometry = TokenGeometry<ExecSpace>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Work = TokenWork<typename ExecSpace::scratch_memory_space>;
  using Scalar = typename Ops::scalar_type;
  using Index = typename Ops::index_type;

  Ops o;
  int tokens_per_team;
  int level;

  /// Per-token scratch bytes; none for one token per device thread, whose rows are thread-local arrays.
  static std::size_t scratch_bytes(const TokenParams& p) {
    if (!Geometry::host && SerialTokens) return 0;
    return Work::shmem_size(p, SerialTokens ? Work::serial_key_count(p) : Work::key_count(p));
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    if constexpr (Geometry::host) {
      const Work w(Geometry::scratch(m, level), o.params, Work::serial_key_count(o.params));
      const std::int64_t t0 = static_cast<std::int64_t>(m.league_rank()) * tokens_per_team;
      const std::int64_t t1 = t0 + tokens_per_team < o.num_tokens ? t0 + tokens_per_team : o.num_tokens;
      for (std::int64_t t = t0; t < t1; ++t) serial_token(t, w);
    } else {
      const std::int64_t t = static_cast<std::int64_t>(m.league_rank()) * m.team_size() + m.team_rank();
      if (t >= o.num_tokens) return;
      if constexpr (SerialTokens) {
        // thread-local arrays: a device interleaves them across the warp's threads (conflict-free, coalesced),
        // where per-thread scratch rows would put a warp's accesses on a few shared-memory banks
        constexpr int n = Geometry::kThreadTokenExperts;
        float act[n], score[n], group[n];
        int gsel[n];
        std::uint64_t keys[n];
        const TokenParams& p = o.params;
        using FRow = typename Work::template Row<float>;
        const Work w(FRow(act, p.num_experts), FRow(score, p.has_bias ? p.num_experts : 0),
                     FRow(group, p.grouped() ? p.num_groups : 0),
                     typename Work::template Row<int>(gsel, p.grouped() ? p.num_groups : 0),
                     typename Work::template Row<std::uint64_t>(keys, p.topk));
        if constexpr (Rows > 0)
          thread_token<Rows>(t, w);
        else
          serial_token(t, w);
      } else {
        device_token(m, t, Work(Geometry::scratch(m, level), o.params));
      }
    }
  }

  KOKKOS_INLINE_FUNCTION void serial_token(std::int64_t t, const Work& w) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    const auto x = Kokkos::subview(o.logits, t, Kokkos::ALL);
    const TokenChoice c = route_token(SerialLoops{}, p, x, o.bias, w);
    if (o.output == RoutingOutput::Compact) {
      for (int i = 0; i < k; ++i) {
        const int e = key_index(w.keys(i));
        o.ids(t, i) = e;
        o.weights(t, i) = scale * c.weight(w.act(e));
      }
      return;
    }
    // the non-selected values everywhere, then the k selected entries; rows as locals, so that the stores cannot be
    // taken to alias the operands and the fill loops vectorize
    const auto probs = Kokkos::subview(o.probs, t, Kokkos::ALL);
    const auto inter = Kokkos::subview(o.inter, t, Kokkos::ALL);
    const auto map = Kokkos::subview(o.map, t, Kokkos::ALL);
    const Scalar zero = from_float<Scalar>(0.0f);
    for (int e = 0; e < E; ++e) probs(e) = zero;
    if (p.score_function == ScoreFunction::SqrtSoftplus) {
      for (int e = 0; e < E; ++e) inter(e) = to_float(x(e));
    } else if (p.softmax_post()) {
      const float ninf = neg_inf();
      for (int e = 0; e < E; ++e) inter(e) = ninf;
    } else {
      for (int e = 0; e < E; ++e) inter(e) = w.act(e);
    }
    if (o.output == RoutingOutput::Bytemap) {
      for (int e = 0; e < E; ++e) map(e) = 0;
    } else if (o.output == RoutingOutput::BitmapU8) {
      const int nb = static_cast<int>(bitmap_row_bytes(E));
      for (int b = 0; b < nb; ++b) map(b) = 0;
    }
    for (int i = 0; i < k; ++i) {
      const int e = key_index(w.keys(i));
      const float we = c.weight(w.act(e));
      probs(e) = from_float<Scalar>(scale * we);
      if (c.mode == TokenChoice::Post) inter(e) = we;
      if (o.output == RoutingOutput::Bytemap) {
        map(e) = 1;
      } else if (o.output == RoutingOutput::BitmapU8) {
        map(e / 8) = static_cast<std::uint8_t>(map(e / 8) | (1u << (e % 8)));
      } else {
        o.indices(t, i) = static_cast<Index>(e);
      }
    }
  }

  /// A token's logits row held by its thread.
  struct LocalRow {
    const Scalar* x;
    KOKKOS_INLINE_FUNCTION Scalar operator()(int e) const { return x[e]; }
  };

  /// Device, one token per thread (E <= N), a dense output: serial_token's outputs, with the logits row loaded and
  /// the dense rows stored whole (in vector accesses where they are so aligned), each entry computed as serial_token
  /// computes it.
  template <int N>
  KOKKOS_INLINE_FUNCTION void thread_token(std::int64_t t, const Work& w) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    Scalar xr[N];
    load_row(&o.logits(t, 0), E, xr);
    const TokenChoice c = route_token(SerialLoops{}, p, LocalRow{xr}, o.bias, w);
    unsigned sel = 0;
    for (int i = 0; i < k; ++i) {
      const int e = key_index(w.keys(i));
      sel |= 1u << e;
      if (o.output == RoutingOutput::Indices) o.indices(t, i) = static_cast<Index>(e);
    }
    const bool ssp = p.score_function == ScoreFunction::SqrtSoftplus, post = p.softmax_post();
    Scalar pr[N];
    float ir[N];
    std::uint8_t mr[N];
    for (int e = 0; e < N; ++e) {
      const bool routed = (sel >> e) & 1u;
      const float a = e < E ? w.act(e) : 0.0f;
      const float we = routed ? c.weight(a) : 0.0f;
      pr[e] = from_float<Scalar>(routed ? scale * we : 0.0f);
      ir[e] = (routed && c.mode == TokenChoice::Post) ? we : ssp ? to_float(xr[e]) : post ? neg_inf() : a;
      mr[e] = routed ? 1 : 0;
    }
    store_row(&o.probs(t, 0), E, pr);
    store_row(&o.inter(t, 0), E, ir);
    if (o.output == RoutingOutput::Bytemap) {
      store_row(&o.map(t, 0), E, mr);
    } else if (o.output == RoutingOutput::BitmapU8) {
      for (int b = 0; b < (E + 7) / 8; ++b) o.map(t, b) = static_cast<std::uint8_t>(sel >> (8 * b));
    }
  }

  KOKKOS_INLINE_FUNCTION void device_token(const member_type& m, std::int64_t t, const Work& w) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    const ThreadVectorLoops<member_type> L{m};
    const auto x = Kokkos::subview(o.logits, t, Kokkos::ALL);
    const TokenChoice c = route_token(L, p, x, o.bias, w);
    if (o.output == RoutingOutput::Compact) {
      L.for_each(k, [&](const int i) {
        const int e = key_index(w.keys(i));
        o.ids(t, i) = e;
        o.weights(t, i) = scale * c.weight(w.act(e));
      });
      return;
    }
    const bool post = c.mode == TokenChoice::Post;
    const bool ssp = p.score_function == ScoreFunction::SqrtSoftplus;
    L.for_each(E, [&](const int e) {
      const std::uint64_t key = w.eligible_key(p, e);
      const bool routed = key != 0 && key >= c.kth;
      const float we = routed ? c.weight(w.act(e)) : 0.0f;
      o.probs(t, e) = from_float<Scalar>(routed ? scale * we : 0.0f);
      o.inter(t, e) = ssp ? to_float(x(e)) : post ? (routed ? we : neg_inf()) : w.act(e);
      if (o.output == RoutingOutput::Bytemap) o.map(t, e) = routed ? 1 : 0;
    });
    if (o.output == RoutingOutput::BitmapU8) {
      L.for_each(static_cast<int>(bitmap_row_bytes(E)), [&](const int b) {
        unsigned byte = 0;
        for (int j = 0; j < 8; ++j) {
          const int e = b * 8 + j;
          if (e < E) {
            const std::uint64_t key = w.eligible_key(p, e);
            if (key != 0 && key >= c.kth) byte |= 1u << j;
          }
        }
        o.map(t, b) = static_cast<std::uint8_t>(byte);
      });
    } else if (o.output == RoutingOutput::Indices) {
      L.for_each(k, [&](const int i) { o.indices(t, i) = static_cast<Index>(key_index(w.keys(i))); });
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// backward from a routing map or dense indices (docs/router.md §9)
// ---------------------------------------------------------------------------------------------------------------
/// SerialTokens: each token on one thread (host spaces; devices for small E), else on one team thread's vector lanes.
/// Rows > 0: on a device, a map's token in Rows register slots (map_thread); the launcher gives dense indices none.
template <class ExecSpace, class Ops, bool SerialTokens, int Rows>
struct TopkBackwardKernel {
  using Geometry = TokenGeometry<ExecSpace>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using G = typename Ops::grad_type;

  Ops o;
  int tokens_per_team;
  int level;

  static std::size_t scratch_bytes(const TokenParams&) { return 0; }

  KOKKOS_INLINE_FUNCTION bool routed_in_map(std::int64_t t, int e) const {
    if (o.output == RoutingOutput::Bytemap) return o.map(t, e) != 0;
    return (o.map(t, e / 8) >> (e % 8)) & 1u;
  }
  KOKKOS_INLINE_FUNCTION float grad_in(std::int64_t t, int e) const {
    return to_float(o.grad_probs(t, e)) * o.params.scaling_factor;
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    if constexpr (Geometry::host) {
      const std::int64_t t0 = static_cast<std::int64_t>(m.league_rank()) * tokens_per_team;
      const std::int64_t t1 = t0 + tokens_per_team < o.num_tokens ? t0 + tokens_per_team : o.num_tokens;
      if (o.output != RoutingOutput::Indices && !o.params.softmax_pre()) return map_host_block(t0, t1);
      for (std::int64_t t = t0; t < t1; ++t) {
        if (o.output == RoutingOutput::Indices)
          indices(SerialLoops{}, t);
        else
          map_host(t);
      }
    } else {
      const std::int64_t t = static_cast<std::int64_t>(m.league_rank()) * m.team_size() + m.team_rank();
      if (t >= o.num_tokens) return;
      if constexpr (SerialTokens) {
        if constexpr (Rows > 0)
          map_thread<Rows>(t);
        else
          indices(SerialLoops{}, t);
      } else {
        const ThreadVectorLoops<member_type> L{m};
        if (o.output == RoutingOutput::Indices)
          indices(L, t);
        else
          map_device(L, t);
      }
    }
  }

  /// Calls f(e) for every routed expert of token t, in expert order, 64 experts at a time: the flags of a stretch
  /// of 64 are gathered into one word without branches, so the only branches are one per routed expert and one per
  /// word. Both map formats become the same masks first, so f is expanded once: the two formats then give
  /// bit-identical gradients, NaN signs included (which operand order the compiler picks for a product of two NaNs
  /// decides the sign of the result).
  template <class MapRow, class F>
  KOKKOS_INLINE_FUNCTION void for_each_routed(const MapRow& map, const F& f) const {
    const int nb = static_cast<int>(bitmap_row_bytes(o.params.num_experts));
    for (int b0 = 0; b0 < nb; b0 += 8) {
      std::uint64_t mask = 0;
      if (b0 + 8 <= nb) {  // a whole word: a constant trip count, unrolled
        for (int j = 0; j < 8; ++j) mask |= static_cast<std::uint64_t>(block_mask(map, b0 + j)) << (8 * j);
      } else {
        for (int j = 0; b0 + j < nb; ++j) mask |= static_cast<std::uint64_t>(block_mask(map, b0 + j)) << (8 * j);
      }
      for (; mask != 0; mask &= mask - 1u) f(b0 * 8 + lowest_bit(mask));
    }
  }
  /// The routed flags of experts 8b .. 8b + 7 of a map row (bit j: expert 8b + j; none past the row).
  template <class MapRow>
  KOKKOS_INLINE_FUNCTION unsigned block_mask(const MapRow& map, int b) const {
    const int E = o.params.num_experts, e0 = b * 8, n = E - e0 < 8 ? E - e0 : 8;
    if (o.output != RoutingOutput::Bytemap) return map(b) & ((1u << n) - 1u);
    if (n == 8) return nonzero_byte_mask(&map(e0));
    unsigned mask = 0;
    for (int j = 0; j < n; ++j) mask |= (map(e0 + j) != 0 ? 1u : 0u) << j;
    return mask;
  }

  /// Bit j set where byte j of the eight at p is not zero.
  KOKKOS_INLINE_FUNCTION static unsigned nonzero_byte_mask(const std::uint8_t* p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    std::uint64_t w;
    std::memcpy(&w, p, sizeof(w));
    constexpr std::uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full, kHigh = 0x8080808080808080ull;
    const std::uint64_t nz = (((w & kLow7) + kLow7) | w) & kHigh;             // the high bit of every non-zero byte
    return static_cast<unsigned>(((nz >> 7) * 0x0102040810204080ull) >> 56);  // gathered into one byte
#else
    unsigned mask = 0;
    for (int j = 0; j < 8; ++j) mask |= (p[j] != 0 ? 1u : 0u) << j;
    return mask;
#endif
  }
  /// Index of the lowest set bit of a non-zero mask.
  KOKKOS_INLINE_FUNCTION static int lowest_bit(std::uint64_t mask) {
#if defined(KOKKOSMOE_IMPL_HOST_GNU_BUILTINS)
    return __builtin_ctzll(mask);
#else
    const std::uint64_t b = mask & (~mask + 1u);
    return ((b & 0xaaaaaaaaaaaaaaaaull) != 0 ? 1 : 0) | ((b & 0xccccccccccccccccull) != 0 ? 2 : 0) |
           ((b & 0xf0f0f0f0f0f0f0f0ull) != 0 ? 4 : 0) | ((b & 0xff00ff00ff00ff00ull) != 0 ? 8 : 0) |
           ((b & 0xffff0000ffff0000ull) != 0 ? 16 : 0) | ((b & 0xffffffff00000000ull) != 0 ? 32 : 0);
#endif
  }

  // Host: sums over the routed experts in expert order; all but Softmax pre read only the routed entries. The rows
  // are locals: stores through them cannot be taken to alias the operands, so nothing is reloaded and the fill
  // vectorizes.
  KOKKOS_INLINE_FUNCTION void map_host(std::int64_t t) const {
    const int E = o.params.num_experts;
    const float scale = o.params.scaling_factor;
    const auto map = Kokkos::subview(o.map, t, Kokkos::ALL);
    const auto inter = Kokkos::subview(o.inter, t, Kokkos::ALL);
    const auto gp = Kokkos::subview(o.grad_probs, t, Kokkos::ALL);
    const auto gl = Kokkos::subview(o.grad_logits, t, Kokkos::ALL);
    const auto gin = [&](const int e) { return to_float(gp(e)) * scale; };
    GradTerms g = GradTerms::of(o.params);
    Sum2 sums;
    if (o.params.softmax_pre()) {
      // every expert's gradient; the flags come from the same 8-bit masks for both formats
      const int nb = static_cast<int>(bitmap_row_bytes(E));
      for_each_routed(map, [&](const int e) { g.accumulate(sums, inter(e), gin(e)); });
      g.finish(sums);
      for (int b = 0; b < nb; ++b) {
        const unsigned mask = block_mask(map, b);
        const int e0 = b * 8, n = E - e0 < 8 ? E - e0 : 8;
        for (int j = 0; j < n; ++j) {
          const float ae = inter(e0 + j);
          gl(e0 + j) = from_float<G>(((mask >> j) & 1u) ? g.routed(ae, gin(e0 + j)) : g.unrouted(ae));
        }
      }
      return;
    }
    for_each_routed(map, [&](const int e) { g.accumulate(sums, inter(e), gin(e)); });
    g.finish(sums);
    // +0.0 is the all-zero bit pattern of every gradient type: the row is cleared as bytes (a plain loop over a
    // 16-bit struct type does not vectorize)
    static_assert(std::is_trivially_copyable_v<G>, "gradient types are plain bit patterns");
    std::memset(gl.data(), 0, static_cast<std::size_t>(E) * sizeof(G));
    for_each_routed(map, [&](const int e) { gl(e) = from_float<G>(g.routed(inter(e), gin(e))); });
  }

  /// Host, the tokens of a team together (a map, not Softmax pre): each token's routed experts are listed from its
  /// map first, then the gathers of all the tokens are interleaved slot by slot, so that several tokens' cache misses
  /// are in flight at once. Each token's sums still run over its routed experts in expert order: map_host's bits. A
  /// token with more routed experts than a list holds takes map_host.
  static constexpr int kBlockTokens = TokenGeometry<ExecSpace>::kHostTokensPerTeam;
  static constexpr int kBlockRouted = 32;
  KOKKOS_INLINE_FUNCTION void map_host_block(std::int64_t t0, std::int64_t t1) const {
    const int nt = static_cast<int>(t1 - t0), E = o.params.num_experts;
    int count[kBlockTokens];
    int list[kBlockTokens][kBlockRouted];
    int most = 0;
    for (int u = 0; u < nt; ++u) {
      int c = 0;
      for_each_routed(Kokkos::subview(o.map, t0 + u, Kokkos::ALL), [&](const int e) {
        if (c < kBlockRouted) list[u][c] = e;
        ++c;
      });
      count[u] = c;
      if (c <= kBlockRouted && c > most) most = c;
    }
    GradTerms g[kBlockTokens];
    Sum2 sums[kBlockTokens];
    for (int u = 0; u < nt; ++u) g[u] = GradTerms::of(o.params);
    for (int i = 0; i < most; ++i) {
      for (int u = 0; u < nt; ++u) {
        if (i >= count[u] || count[u] > kBlockRouted) continue;
        const std::int64_t t = t0 + u;
        const int e = list[u][i];
        g[u].accumulate(sums[u], o.inter(t, e), grad_in(t, e));
      }
    }
    for (int u = 0; u < nt; ++u) {
      const std::int64_t t = t0 + u;
      if (count[u] > kBlockRouted) {
        map_host(t);
        continue;
      }
      g[u].finish(sums[u]);
      const auto gl = Kokkos::subview(o.grad_logits, t, Kokkos::ALL);
      std::memset(gl.data(), 0, static_cast<std::size_t>(E) * sizeof(G));  // +0.0 (see map_host)
      for (int i = 0; i < count[u]; ++i) {
        const int e = list[u][i];
        gl(e) = from_float<G>(g[u].routed(o.inter(t, e), grad_in(t, e)));
      }
    }
  }

  // Device, one token per thread (E <= N): the token's rows in registers, N slots (slot e: expert e), read and
  // written whole (in vector accesses where they are so aligned). The sums are the pairwise tree of the lane variant's
  // reduction (map_device) over N slots: slot l adds slot l + w for w = N/2, ..., 1. Over lanes_for(E) <= N lanes it is
  // the same tree with fewer +0 slots; a slot is never -0 (+0 + x is +0 for x = -0), and adding +0 changes no other
  // value, so both variants give the same bits.
  template <int N>
  KOKKOS_INLINE_FUNCTION void map_thread(std::int64_t t) const {
    const int E = o.params.num_experts;
    const bool dense = o.params.softmax_pre();
    unsigned mask = 0;
    if (o.output == RoutingOutput::Bytemap) {
      std::uint8_t flags[N];
      load_row(&o.map(t, 0), E, flags);
      for (int e = 0; e < N; ++e) mask |= (flags[e] != 0 ? 1u : 0u) << e;
    } else {
      for (int b = 0; b < (E + 7) / 8; ++b) mask |= static_cast<unsigned>(o.map(t, b)) << (8 * b);
    }
    mask &= (1u << E) - 1u;
    // whole rows: at E <= 16 a row spans at most two 32-byte sectors, so gathering only the routed entries would
    // not read fewer sectors; the non-routed values are loaded but never used (§9)
    float a[N];
    G gp[N];
    load_row(&o.inter(t, 0), E, a);
    load_row(&o.grad_probs(t, 0), E, gp);
    const float scale = o.params.scaling_factor;
    GradTerms g = GradTerms::of(o.params);
    Sum2 s[N];
    for (int e = 0; e < N; ++e)
      if ((mask >> e) & 1u) g.accumulate(s[e], a[e], to_float(gp[e]) * scale);
    for (int w = N / 2; w >= 1; w /= 2)
      for (int l = 0; l < w; ++l) s[l] += s[l + w];
    g.finish(s[0]);
    G dx[N];
    for (int e = 0; e < N; ++e) {
      const float gin = to_float(gp[e]) * scale;
      dx[e] = from_float<G>(((mask >> e) & 1u) ? g.routed(a[e], gin) : dense ? g.unrouted(a[e]) : 0.0f);
    }
    store_row(&o.grad_logits(t, 0), E, dx);
  }

  // Device: the lanes read the map; only lanes of routed experts (all lanes for Softmax pre) read the dense rows.
  template <class Loops>
  KOKKOS_INLINE_FUNCTION void map_device(const Loops& L, std::int64_t t) const {
    const int E = o.params.num_experts;
    GradTerms g = GradTerms::of(o.params);
    const bool dense = o.params.softmax_pre();
    Sum2 sums;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(L.m, E),
        [&](const int e, Sum2& acc) {
          if (routed_in_map(t, e)) g.accumulate(acc, o.inter(t, e), grad_in(t, e));
        },
        sums);
    g.finish(sums);
    L.for_each(E, [&](const int e) {
      float dx;
      if (routed_in_map(t, e))
        dx = g.routed(o.inter(t, e), grad_in(t, e));
      else
        dx = dense ? g.unrouted(o.inter(t, e)) : 0.0f;
      o.grad_logits(t, e) = from_float<G>(dx);
    });
  }

  // Dense indices: sums over the k slots in slot order, the non-selected value everywhere, then the k entries.
  template <class Loops>
  KOKKOS_INLINE_FUNCTION void indices(const Loops& L, std::int64_t t) const {
    const int E = o.params.num_experts, k = o.params.topk;
    GradTerms g = GradTerms::of(o.params);
    Sum2 sums;
    for (int i = 0; i < k; ++i) {
      const int e = static_cast<int>(o.indices(t, i));
      g.accumulate(sums, o.inter(t, e), grad_in(t, e));
    }
    g.finish(sums);
    const bool dense = o.params.softmax_pre();
    L.for_each(E, [&](const int e) { o.grad_logits(t, e) = from_float<G>(dense ? g.unrouted(o.inter(t, e)) : 0.0f); });
    L.barrier();
    L.for_each(k, [&](const int i) {
      const int e = static_cast<int>(o.indices(t, i));
      o.grad_logits(t, e) = from_float<G>(g.routed(o.inter(t, e), grad_in(t, e)));
    });
  }
};

// ---------------------------------------------------------------------------------------------------------------
// compact backward (docs/router.md §5.5): the activations are recomputed from the logits
// ---------------------------------------------------------------------------------------------------------------
/// SerialTokens: each token on one thread (host spaces; devices for small E, as the forward), else on one team
/// thread's vector lanes.
template <class ExecSpace, class Ops, bool SerialTokens, int Rows>
struct CompactBackwardKernel {
  using Geometry = TokenGeometry<ExecSpace>;
  using member_type = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using Scalar = typename Ops::scalar_type;
  using FloatRow =
      Kokkos::View<float*, typename ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

  Ops o;
  int tokens_per_team;
  int level;

  /// rowact [E] (Softmax pre), act [2k] (the selected activations, then the Softmax-post terms); none for one token
  /// per device thread (thread-local arrays, as in the forward).
  static std::size_t scratch_bytes(const TokenParams& p) {
    if (!Geometry::host && SerialTokens) return 0;
    return FloatRow::shmem_size(p.softmax_pre() ? p.num_experts : 0) + FloatRow::shmem_size(2 * p.topk);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    const TokenParams& p = o.params;
    if constexpr (Geometry::host) {
      const auto h = Geometry::scratch(m, level);
      const FloatRow rowact(h, p.softmax_pre() ? p.num_experts : 0);
      const FloatRow act(h, 2 * p.topk);
      const std::int64_t t0 = static_cast<std::int64_t>(m.league_rank()) * tokens_per_team;
      const std::int64_t t1 = t0 + tokens_per_team < o.num_tokens ? t0 + tokens_per_team : o.num_tokens;
      for (std::int64_t t = t0; t < t1; ++t) {
        if (t + 2 < o.num_tokens) prefetch_logits(t + 2);
        token(SerialLoops{}, t, rowact, act);
      }
    } else {
      const std::int64_t t = static_cast<std::int64_t>(m.league_rank()) * m.team_size() + m.team_rank();
      if (t >= o.num_tokens) return;
      if constexpr (SerialTokens) {
        constexpr int n = Geometry::kThreadTokenExperts;
        float rowact[n], act[2 * n];
        token(SerialLoops{}, t, FloatRow(rowact, p.softmax_pre() ? p.num_experts : 0), FloatRow(act, 2 * p.topk));
      } else {
        const auto h = Geometry::scratch(m, level);
        const FloatRow rowact(h, p.softmax_pre() ? p.num_experts : 0);
        const FloatRow act(h, 2 * p.topk);
        token(ThreadVectorLoops<member_type>{m}, t, rowact, act);
      }
    }
  }

  /// Host: asks for token t's logits ahead of its gathers. Rows of fewer than 8 cache lines are left to the
  /// hardware prefetchers (the token rows are consecutive); up to 32 lines a row is fetched whole (its k gathers
  /// touch most of it); a longer one only at its k selected entries.
  KOKKOS_INLINE_FUNCTION void prefetch_logits(std::int64_t t) const {
    const std::size_t bytes = static_cast<std::size_t>(o.params.num_experts) * sizeof(Scalar);
    if (bytes < 8 * kHostCacheLine) return;
    if (bytes <= 32 * kHostCacheLine) {
      const char* row = reinterpret_cast<const char*>(&o.logits(t, 0));
      for (std::size_t b = 0; b < bytes; b += kHostCacheLine) prefetch_host(row + b);
    } else {
      for (int i = 0; i < o.params.topk; ++i) prefetch_host(&o.logits(t, o.ids(t, i)));
    }
  }

  template <class Loops>
  KOKKOS_INLINE_FUNCTION void token(const Loops& L, std::int64_t t, const FloatRow& rowact, const FloatRow& act) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    const ScoreFunction f = p.score_function;
    const bool pre = p.softmax_pre(), post = p.softmax_post();
    GradTerms g = GradTerms::of(p);
    if (pre)
      row_softmax(
          L, E, [&](const int e) { return to_float(o.logits(t, e)); }, rowact);
    L.barrier();
    // activations of the selected experts, as the forward computed them
    L.for_each(k, [&](const int i) {
      const int e = o.ids(t, i);
      const float x = to_float(o.logits(t, e));
      act(i) = f == ScoreFunction::Sigmoid ? sigmoid(x) : pre ? rowact(e) : x;
    });
    L.barrier();
    // Softmax post over the k selected logits: max and sum in slot order (as the forward), the terms in act(k + i)
    float inv = 1.0f;
    if (post) {
      float M = act(0);
      for (int i = 1; i < k; ++i) M = act(i) > M ? act(i) : M;
      L.for_each(k, [&](const int i) { act(k + i) = softmax_term(act(i), M); });
      L.barrier();
      float sum = 0;
      for (int i = 0; i < k; ++i) sum += act(k + i);
      inv = 1.0f / sum;
    }
    auto a_of = [&](const int i) { return post ? act(k + i) * inv : act(i); };
    Sum2 sums;
    for (int i = 0; i < k; ++i) g.accumulate(sums, a_of(i), to_float(o.grad_weights(t, i)) * scale);
    g.finish(sums);
    L.for_each(E, [&](const int e) { o.grad_logits(t, e) = from_float<Scalar>(pre ? g.unrouted(rowact(e)) : 0.0f); });
    L.barrier();
    L.for_each(k, [&](const int i) {
      const float gi = to_float(o.grad_weights(t, i)) * scale;
      o.grad_logits(t, o.ids(t, i)) = from_float<Scalar>(g.routed(a_of(i), gi));
    });
  }
};

/// The portable top-k router operations on any execution space. The entry points are defined below the class, so
/// that they are not inline: an `extern template` declaration (impl/KokkosMoE_Router_ETI.hpp) does not keep a
/// compiler from instantiating an inline function.
template <class ExecSpace>
struct PortableTopk {
  using Geometry = TokenGeometry<ExecSpace>;

  template <class Ops>
  static void forward(const ExecSpace& exec, const Ops& o);
  template <class Ops>
  static void backward(const ExecSpace& exec, const Ops& o);
  template <class Ops>
  static void compact_backward(const ExecSpace& exec, const Ops& o);
};

/// Launches Kernel<ExecSpace, Ops, SerialTokens, Rows> in geometry geo: one token per thread (host spaces; on
/// devices where geo.serial_tokens, with geo.rows register slots where WithRows), else one token per team thread's
/// vector lanes. Kernels of operations that never take rows are launched without WithRows, so that no kernel with
/// rows is instantiated for them.
template <template <class, class, bool, int> class Kernel, bool WithRows, class ExecSpace, class Ops>
void launch_token_kernel(const char* label, const ExecSpace& exec, const Ops& o, const TokenGeometry<ExecSpace>& geo) {
  using Geometry = TokenGeometry<ExecSpace>;
  auto run = [&](auto serial_tokens, auto rows) {
    using K = Kernel<ExecSpace, Ops, decltype(serial_tokens)::value, decltype(rows)::value>;
    int level = 0;
    const auto policy = geo.policy(exec, o.num_tokens, K::scratch_bytes(o.params), level);
    Kokkos::parallel_for(label, policy, K{o, geo.tokens_per_team, level});
  };
  using None = std::integral_constant<int, 0>;
  if constexpr (Geometry::host) {
    run(std::true_type{}, None{});
  } else {
    if (!geo.serial_tokens) return run(std::false_type{}, None{});
    if constexpr (WithRows) {
      if (geo.rows == 8) return run(std::true_type{}, std::integral_constant<int, 8>{});
      if (geo.rows == Geometry::kThreadTokenExperts)
        return run(std::true_type{}, std::integral_constant<int, Geometry::kThreadTokenExperts>{});
    }
    run(std::true_type{}, None{});
  }
}

template <class ExecSpace>
template <class Ops>
void PortableTopk<ExecSpace>::forward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::topk_router[portable]");
  const Geometry geo = Geometry::forward(o.params);
  // dense outputs get rows in registers; the compact one writes 2k values per token and keeps the smaller kernel
  launch_token_kernel<TopkForwardKernel, true>(
      "KokkosMoE::topk_router", exec, o,
      o.output == RoutingOutput::Compact ? geo : geo.with_rows(o.params.num_experts));
}

template <class ExecSpace>
template <class Ops>
void PortableTopk<ExecSpace>::backward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::topk_router_backward[portable]");
  const Geometry geo = Geometry::backward(o.params);
  launch_token_kernel<TopkBackwardKernel, true>(
      "KokkosMoE::topk_router_backward", exec, o,
      o.output == RoutingOutput::Indices ? geo : geo.with_rows(o.params.num_experts));
}

template <class ExecSpace>
template <class Ops>
void PortableTopk<ExecSpace>::compact_backward(const ExecSpace& exec, const Ops& o) {
  ScopedRegion region("KokkosMoE::topk_router_backward[portable]");
  launch_token_kernel<CompactBackwardKernel, false>("KokkosMoE::topk_router_compact_backward", exec, o,
                                                    Geometry::compact_backward(o.params));
}

}  // namespace Impl
}  // namespace KokkosMoE

namespace Kokkos {
template <>
struct reduction_identity<KokkosMoE::Impl::Sum2> {
  KOKKOS_FORCEINLINE_FUNCTION static KokkosMoE::Impl::Sum2 sum() { return KokkosMoE::Impl::Sum2(); }
};
}  // namespace Kokkos

#endif
