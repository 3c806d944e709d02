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

#include <impl/KokkosMoE_Router_PortableTokens.hpp>
#include <impl/KokkosMoE_Router_PortableTopkBackward.hpp>

namespace KokkosMoE {
namespace Impl {

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
  static constexpr TopkForwardOp kOp = Ops::op;

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
    const auto x = Kokkos::subview(o.logits, t, Kokkos::ALL);
    const TokenChoice c = route_token(SerialLoops{}, p, x, o.bias, w);
    if constexpr (kOp == TopkForwardOp::Compact) {
      const int k = p.topk;
      const float scale = p.scaling_factor;
      for (int i = 0; i < k; ++i) {
        const int e = key_index(w.keys(i));
        o.ids(t, i) = e;
        o.weights(t, i) = scale * c.weight(w.act(e));
      }
    } else {
      serial_dense_rows(t, x, c, w);
    }
  }

  /// serial_token's dense outputs: the non-selected values everywhere, then the k selected entries; rows as locals,
  /// so that the stores cannot be taken to alias the operands and the fill loops vectorize.
  template <class X>
  KOKKOS_INLINE_FUNCTION void serial_dense_rows(std::int64_t t, const X& x, const TokenChoice& c, const Work& w) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    const auto probs = Kokkos::subview(o.probs, t, Kokkos::ALL);
    const auto inter = Kokkos::subview(o.inter, t, Kokkos::ALL);
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
    if constexpr (kOp == TopkForwardOp::Map) {
      const int nb = o.bitmap ? static_cast<int>(bitmap_row_bytes(E)) : E;
      for (int b = 0; b < nb; ++b) o.map(t, b) = 0;
    }
    for (int i = 0; i < k; ++i) {
      const int e = key_index(w.keys(i));
      const float we = c.weight(w.act(e));
      probs(e) = from_float<Scalar>(scale * we);
      if (c.mode == TokenChoice::Post) inter(e) = we;
      if constexpr (kOp == TopkForwardOp::Indices) {
        o.indices(t, i) = static_cast<typename Ops::index_type>(e);
      } else if (o.bitmap) {
        o.map(t, e / 8) = static_cast<std::uint8_t>(o.map(t, e / 8) | (1u << (e % 8)));
      } else {
        o.map(t, e) = 1;
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
      if constexpr (kOp == TopkForwardOp::Indices) o.indices(t, i) = static_cast<typename Ops::index_type>(e);
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
    if constexpr (kOp == TopkForwardOp::Map) {
      if (o.bitmap)
        for (int b = 0; b < (E + 7) / 8; ++b) o.map(t, b) = static_cast<std::uint8_t>(sel >> (8 * b));
      else
        store_row(&o.map(t, 0), E, mr);
    }
  }

  KOKKOS_INLINE_FUNCTION void device_token(const member_type& m, std::int64_t t, const Work& w) const {
    const TokenParams& p = o.params;
    const ThreadVectorLoops<member_type> L{m};
    const auto x = Kokkos::subview(o.logits, t, Kokkos::ALL);
    const TokenChoice c = route_token(L, p, x, o.bias, w);
    if constexpr (kOp == TopkForwardOp::Compact) {
      const int k = p.topk;
      const float scale = p.scaling_factor;
      L.for_each(k, [&](const int i) {
        const int e = key_index(w.keys(i));
        o.ids(t, i) = e;
        o.weights(t, i) = scale * c.weight(w.act(e));
      });
    } else {
      device_dense_rows(L, t, x, c, w);
    }
  }

  /// device_token's dense outputs, each expert on a vector lane.
  template <class Loops, class X>
  KOKKOS_INLINE_FUNCTION void device_dense_rows(const Loops& L, std::int64_t t, const X& x, const TokenChoice& c,
                                                const Work& w) const {
    const TokenParams& p = o.params;
    const int E = p.num_experts, k = p.topk;
    const float scale = p.scaling_factor;
    const bool post = c.mode == TokenChoice::Post;
    const bool ssp = p.score_function == ScoreFunction::SqrtSoftplus;
    L.for_each(E, [&](const int e) {
      const std::uint64_t key = w.eligible_key(p, e);
      const bool routed = key != 0 && key >= c.kth;
      const float we = routed ? c.weight(w.act(e)) : 0.0f;
      o.probs(t, e) = from_float<Scalar>(routed ? scale * we : 0.0f);
      o.inter(t, e) = ssp ? to_float(x(e)) : post ? (routed ? we : neg_inf()) : w.act(e);
      if constexpr (kOp == TopkForwardOp::Map)
        if (!o.bitmap) o.map(t, e) = routed ? 1 : 0;
    });
    if constexpr (kOp == TopkForwardOp::Map) {
      if (o.bitmap) {
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
      }
    } else if constexpr (kOp == TopkForwardOp::Indices) {
      L.for_each(k,
                 [&](const int i) { o.indices(t, i) = static_cast<typename Ops::index_type>(key_index(w.keys(i))); });
    }
  }
};

/// The portable top-k router operations on any execution space. The entry points are defined below the class, so
/// that they are not inline: an `extern template` declaration (impl/KokkosMoE_Router_ETI.hpp) does not keep a
/// compiler from instantiating an inline function.
template <class ExecSpace>
struct PortableTopk {
  using Geometry = TokenGeometry<ExecSpace>;

  /// \p choice: the kernel variant among those that give the same bits (KernelChoice; default: the library's).
  template <class Ops>
  static void forward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice = {});
  template <class Ops>
  static void backward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice = {});
  template <class Ops>
  static void compact_backward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice = {});
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
void PortableTopk<ExecSpace>::forward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice) {
  ScopedRegion region("KokkosMoE::topk_router[portable]");
  const Geometry geo = Geometry::forward(o.params, choice);
  // dense outputs get rows in registers; the compact one writes 2k values per token and keeps the smaller kernel
  if constexpr (Ops::op == TopkForwardOp::Compact)
    launch_token_kernel<TopkForwardKernel, false>("KokkosMoE::topk_router_compact", exec, o, geo);
  else
    launch_token_kernel<TopkForwardKernel, true>("KokkosMoE::topk_router", exec, o,
                                                 geo.with_rows(o.params.num_experts));
}

template <class ExecSpace>
template <class Ops>
void PortableTopk<ExecSpace>::backward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice) {
  ScopedRegion region("KokkosMoE::topk_router_backward[portable]");
  const Geometry geo = Geometry::backward(o.params, choice);
  launch_token_kernel<TopkBackwardKernel, true>(
      "KokkosMoE::topk_router_backward", exec, o,
      o.output == RoutingOutput::Indices ? geo : geo.with_rows(o.params.num_experts));
}

template <class ExecSpace>
template <class Ops>
void PortableTopk<ExecSpace>::compact_backward(const ExecSpace& exec, const Ops& o, const KernelChoice& choice) {
  ScopedRegion region("KokkosMoE::topk_router_backward[portable]");
  launch_token_kernel<CompactBackwardKernel, false>("KokkosMoE::topk_router_compact_backward", exec, o,
                                                    Geometry::compact_backward(o.params, choice));
}

}  // namespace Impl
}  // namespace KokkosMoE

#endif
