/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTER_PORTABLETOPKBACKWARD_HPP
#define KOKKOSMOE_ROUTER_PORTABLETOPKBACKWARD_HPP

// The portable top-k router's backward kernels (docs/router.md §9, §5.5), launched by PortableTopk
// (impl/KokkosMoE_Router_PortableTopk.hpp).

#include <impl/KokkosMoE_Router_PortableTokens.hpp>

namespace KokkosMoE {
namespace Impl {

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

}  // namespace Impl
}  // namespace KokkosMoE

#endif
