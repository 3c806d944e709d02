/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_ROUTERTOKEN_HPP
#define KOKKOSMOE_ROUTERTOKEN_HPP

/// \file KokkosMoE_RouterToken.hpp
/// \brief Per-token routing device functions (docs/router.md §18), in the style of kokkos-kernels' Batched
/// functions: score + group-limited top-k + weights of ONE token row, callable from a user's own kernel (for
/// instance the epilogue of the gate GEMM), with the same results as topk_router_compact.
///
/// Four variants share one implementation and differ only in who works on the row:
///   SerialTokenRoute::invoke(params, logits, bias, work, ids, weights)                one thread, plain loops
///   TeamTokenRoute<Member>::invoke(member, ...)                                      the team's threads
///   TeamVectorTokenRoute<Member>::invoke(member, ...)                                threads and vector lanes
///   ThreadVectorTokenRoute<Member>::invoke(member, ...)                              one thread's vector lanes
/// and their Quantile Balancing forms (SerialTokenRouteQB, ...: the same arguments, the cutoff returned;
/// make_token_router_qb_params; docs/router.md §19). As in kokkos-kernels' Batched functions, the variant is also a
/// tag: TeamTokenRoute<Member> is TokenRoute<Member, Mode::Team> (and so on), and TokenRoute<Member, Mode::Serial>
/// is SerialTokenRoute taking the member too (and ignoring it), so that a kernel templated on its mode calls one name.
/// Team variants are collective: every thread of the team (ThreadVector: every vector lane of the calling thread)
/// calls them with the same arguments. Serial selects in one pass with an insertion buffer; the others run k rounds
/// of a max reduction; both give the same slots (selection keys are unique, docs/router.md §6).
///
/// Parameters are validated once on the host by make_token_router_params (it throws like topk_router); the
/// device functions never validate. The rows are rank-1 Views (a subview of a row-major [T, E] tensor, a scratch
/// View, ...) of E logits (float, fp16_t or bf16_t), E bias values or an empty View, k int32 ids and k float weights
/// (= scaling_factor * weight, slot order, slot 0 = best). `work` is a TokenRouterWorkspace over memory the caller
/// owns: team or thread scratch (TokenRouterWorkspace::shmem_size) or any Views of the required sizes.

#include <KokkosMoE_RouterConfig.hpp>

#include <Kokkos_Core.hpp>
#include <kokkos_ext/KokkosMoE_Float16.hpp>

#include <impl/KokkosMoE_RouterQB_Impl.hpp>
#include <impl/KokkosMoE_RouterToken_Impl.hpp>
#include <impl/KokkosMoE_Router_Validate.hpp>

#include <cstdint>

namespace KokkosMoE {

/// Validated routing parameters of one token (device-copyable). Build with make_token_router_params.
using TokenRouterParams = Impl::TokenParams;

/// Validates \p config for \p num_experts experts (and an expert bias iff \p has_bias) exactly as topk_router does.
/// \throws KokkosMoE::InvalidArgument naming the field and the rule (docs/router.md §4)
inline TokenRouterParams make_token_router_params(const RouterConfig& config, int num_experts, bool has_bias) {
  constexpr const char* fn = "make_token_router_params";
  Impl::check_counts(fn, 1, num_experts);
  Impl::check_router_config(fn, config, num_experts, has_bias);
  return Impl::token_params(config, num_experts, has_bias);
}

/// Per-token workspace over memory the caller owns: act [E], score [E] (only with a bias; otherwise the scores are
/// the activations), group scores and flags [G] (only when grouped) and the k selected keys.
template <class MemorySpace>
using TokenRouterWorkspace = Impl::TokenWork<MemorySpace>;

namespace Impl {
template <class Loops, class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
KOKKOS_INLINE_FUNCTION void token_route_compact(const Loops& loops, const TokenParams& p, const LogitsRow& logits,
                                                const BiasRow& bias, const Work& work, const IdsRow& ids,
                                                const WeightsRow& weights) {
  const TokenChoice c = route_token(loops, p, logits, bias, work);
  loops.for_each(p.topk, [&](const int i) {
    const int e = key_index(work.keys(i));
    ids(i) = e;
    weights(i) = p.scaling_factor * c.weight(work.act(e));
  });
}
}  // namespace Impl

/// One thread routes one token.
struct SerialTokenRoute {
  template <class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
  KOKKOS_INLINE_FUNCTION static void invoke(const TokenRouterParams& p, const LogitsRow& logits, const BiasRow& bias,
                                            const Work& work, const IdsRow& ids, const WeightsRow& weights) {
    Impl::token_route_compact(Impl::SerialLoops{}, p, logits, bias, work, ids, weights);
  }
};

/// Who works on a token row, as a template argument (kokkos-kernels' KokkosBatched::Mode): TokenRoute<Member, Mode::X>
/// and TokenRouteQB<Member, Mode::X> run the variant X above.
struct Mode {
  struct Serial {
    static const char* name() { return "Serial"; }
  };
  struct Team {
    static const char* name() { return "Team"; }
  };
  struct TeamVector {
    static const char* name() { return "TeamVector"; }
  };
  struct ThreadVector {
    static const char* name() { return "ThreadVector"; }
  };
};

namespace Impl {
/// The loops of a mode: what distributes the experts of one row among the callers.
template <class Member, class ArgMode>
struct ModeLoops;
template <class Member>
struct ModeLoops<Member, Mode::Serial> {
  using type = SerialLoops;
  KOKKOS_INLINE_FUNCTION static type make(const Member&) { return type{}; }
};
template <class Member>
struct ModeLoops<Member, Mode::Team> {
  using type = TeamLoops<Member>;
  KOKKOS_INLINE_FUNCTION static type make(const Member& m) { return type{m}; }
};
template <class Member>
struct ModeLoops<Member, Mode::TeamVector> {
  using type = TeamVectorLoops<Member>;
  KOKKOS_INLINE_FUNCTION static type make(const Member& m) { return type{m}; }
};
template <class Member>
struct ModeLoops<Member, Mode::ThreadVector> {
  using type = ThreadVectorLoops<Member>;
  KOKKOS_INLINE_FUNCTION static type make(const Member& m) { return type{m}; }
};
}  // namespace Impl

/// The variant of \p ArgMode (Mode::Serial, Team, TeamVector or ThreadVector) routes one token (Mode::Serial: as
/// SerialTokenRoute, the member ignored).
template <class MemberType, class ArgMode>
struct TokenRoute {
  template <class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
  KOKKOS_INLINE_FUNCTION static void invoke(const MemberType& member, const TokenRouterParams& p,
                                            const LogitsRow& logits, const BiasRow& bias, const Work& work,
                                            const IdsRow& ids, const WeightsRow& weights) {
    Impl::token_route_compact(Impl::ModeLoops<MemberType, ArgMode>::make(member), p, logits, bias, work, ids, weights);
  }
};

/// The threads of a team route one token (TeamThreadRange over the experts).
template <class MemberType>
using TeamTokenRoute = TokenRoute<MemberType, Mode::Team>;
/// The threads and vector lanes of a team route one token (TeamVectorRange over the experts).
template <class MemberType>
using TeamVectorTokenRoute = TokenRoute<MemberType, Mode::TeamVector>;
/// The vector lanes of the calling team thread route one token (ThreadVectorRange over the experts): several
/// tokens per team, one per thread.
template <class MemberType>
using ThreadVectorTokenRoute = TokenRoute<MemberType, Mode::ThreadVector>;

// ---- Quantile Balancing (docs/router.md §19) --------------------------------------------------------------------

/// Validates \p config for the QB variants (Sigmoid, an expert bias, no grouping, no pre-softmax,
/// 1 <= topk <= num_experts - 1, then every rule of topk_router) for \p num_experts experts.
/// \throws KokkosMoE::InvalidArgument naming the field and the rule (docs/router.md §19.3)
inline TokenRouterParams make_token_router_qb_params(const RouterConfig& config, int num_experts) {
  constexpr const char* fn = "make_token_router_qb_params";
  Impl::check_counts(fn, 1, num_experts);
  Impl::check_qb_rules(fn, config, num_experts, true, 1);
  Impl::check_router_config(fn, config, num_experts, true);
  return Impl::token_params(config, num_experts, true);
}

namespace Impl {
/// Routes one token as token_route_compact and returns its cutoff: the score of the best (key, index) pair below
/// the k-th selected one, i.e. order[k] (docs/router.md §19.4), on every calling thread and lane.
template <class Loops, class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
KOKKOS_INLINE_FUNCTION float token_route_qb(const Loops& loops, const TokenParams& p, const LogitsRow& logits,
                                            const BiasRow& bias, const Work& work, const IdsRow& ids,
                                            const WeightsRow& weights) {
  token_route_compact(loops, p, logits, bias, work, ids, weights);
  const std::uint64_t worst = work.keys(p.topk - 1);
  const std::uint64_t next = loops.max_key(p.num_experts, [&](const int e) {
    const std::uint64_t key = pack_key(work.s(p, e), e);
    return key < worst ? key : std::uint64_t(0);
  });
  return work.s(p, key_index(next));
}
}  // namespace Impl

/// QB for one token on one thread: the outputs of SerialTokenRoute, and the cutoff as the return value. The
/// histogram count of expert e is the caller's: bin qb_bin(cutoff - work.act(e), ...) of docs/router.md §19.5.
/// \p p from make_token_router_qb_params; \p bias is required.
struct SerialTokenRouteQB {
  template <class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
  KOKKOS_INLINE_FUNCTION static float invoke(const TokenRouterParams& p, const LogitsRow& logits, const BiasRow& bias,
                                             const Work& work, const IdsRow& ids, const WeightsRow& weights) {
    return Impl::token_route_qb(Impl::SerialLoops{}, p, logits, bias, work, ids, weights);
  }
};

/// QB for one token by the variant of \p ArgMode (Mode::Serial, Team, TeamVector or ThreadVector); every calling
/// thread and lane gets the cutoff (Mode::Serial: as SerialTokenRouteQB, the member ignored).
template <class MemberType, class ArgMode>
struct TokenRouteQB {
  template <class LogitsRow, class BiasRow, class Work, class IdsRow, class WeightsRow>
  KOKKOS_INLINE_FUNCTION static float invoke(const MemberType& member, const TokenRouterParams& p,
                                             const LogitsRow& logits, const BiasRow& bias, const Work& work,
                                             const IdsRow& ids, const WeightsRow& weights) {
    return Impl::token_route_qb(Impl::ModeLoops<MemberType, ArgMode>::make(member), p, logits, bias, work, ids,
                                weights);
  }
};

/// QB for one token on the threads of a team (TeamThreadRange); every thread gets the cutoff.
template <class MemberType>
using TeamTokenRouteQB = TokenRouteQB<MemberType, Mode::Team>;
/// QB for one token on the threads and vector lanes of a team (TeamVectorRange).
template <class MemberType>
using TeamVectorTokenRouteQB = TokenRouteQB<MemberType, Mode::TeamVector>;
/// QB for one token on the vector lanes of the calling team thread (ThreadVectorRange).
template <class MemberType>
using ThreadVectorTokenRouteQB = TokenRouteQB<MemberType, Mode::ThreadVector>;

}  // namespace KokkosMoE

#endif
