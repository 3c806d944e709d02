/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The public per-token routing functions (KokkosMoE_RouterToken.hpp, docs/router.md §18) called from a user kernel:
// each variant (Serial, Team, TeamVector, ThreadVector) on every backend against the double-precision oracle
// (selected experts exact, weights within the §16.1 tolerance), and the four variants agreeing bit for bit with one
// another (on a device, Softmax pre weights only within tolerance: their row sum is a reduction in the variant's
// order). Workspaces come from team scratch, thread scratch and plain device Views. Each variant runs twice: by its
// own name (TeamTokenRoute, ...) and by its Mode tag (TokenRoute<Member, Mode::Team>, ...), bit for bit the same.

#include <KokkosMoE_EnableDeviceTypes.hpp>
#include <KokkosMoE_RouterToken.hpp>

#include <boost/test/unit_test.hpp>

#include "RouterOracle.hpp"
#include "RouterTestUtils.hpp"

using namespace KokkosMoETest;
using Oracle::Score;

namespace {

// A Mode tag runs its variant's loops (KokkosBatched's Mode::Serial, Team, TeamVector; and ThreadVector).
using HostMember = Kokkos::TeamPolicy<Kokkos::DefaultHostExecutionSpace>::member_type;
template <class ArgMode>
using LoopsOf = typename KokkosMoE::Impl::ModeLoops<HostMember, ArgMode>::type;
static_assert(std::is_same<LoopsOf<KokkosMoE::Mode::Serial>, KokkosMoE::Impl::SerialLoops>::value, "Mode::Serial");
static_assert(std::is_same<LoopsOf<KokkosMoE::Mode::Team>, KokkosMoE::Impl::TeamLoops<HostMember>>::value,
              "Mode::Team");
static_assert(std::is_same<LoopsOf<KokkosMoE::Mode::TeamVector>, KokkosMoE::Impl::TeamVectorLoops<HostMember>>::value,
              "Mode::TeamVector");
static_assert(
    std::is_same<LoopsOf<KokkosMoE::Mode::ThreadVector>, KokkosMoE::Impl::ThreadVectorLoops<HostMember>>::value,
    "Mode::ThreadVector");

enum class Variant { Serial, Team, TeamVector, ThreadVector };
constexpr Variant kVariants[] = {Variant::Serial, Variant::Team, Variant::TeamVector, Variant::ThreadVector};
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::Serial:
      return "Serial";
    case Variant::Team:
      return "Team";
    case Variant::TeamVector:
      return "TeamVector";
    case Variant::ThreadVector:
      return "ThreadVector";
  }
  return "?";
}

/// A user kernel: one team per token (ThreadVector: one token per team thread), the workspace in scratch.
template <class D, class S, class B>
struct RouteKernel {
  using Exec = typename D::execution_space;
  using member_type = typename Kokkos::TeamPolicy<Exec>::member_type;
  using Work = KokkosMoE::TokenRouterWorkspace<typename Exec::scratch_memory_space>;
  Variant variant;
  KokkosMoE::TokenRouterParams p;
  V2<D, const S> logits;
  V1<D, const B> bias;
  V2<D, std::int32_t> ids;
  V2<D, float> weights;
  int tokens_per_team;
  bool tagged = false;  // TokenRoute<member_type, Mode::...> instead of the variant's own name

  KOKKOS_INLINE_FUNCTION void operator()(const member_type& m) const {
    using KokkosMoE::Mode;
    if (variant == Variant::ThreadVector) {
      const int t = m.league_rank() * tokens_per_team + m.team_rank();
      if (t >= static_cast<int>(logits.extent(0))) return;
      const Work w(m.thread_scratch(0), p);
      if (tagged) {
        KokkosMoE::TokenRoute<member_type, Mode::ThreadVector>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                                       row(weights, t));
      } else {
        KokkosMoE::ThreadVectorTokenRoute<member_type>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                               row(weights, t));
      }
      return;
    }
    const int t = m.league_rank();
    const Work w(m.team_scratch(0), p);
    if (variant == Variant::Serial) {
      Kokkos::single(Kokkos::PerTeam(m), [&]() {
        if (tagged) {
          KokkosMoE::TokenRoute<member_type, Mode::Serial>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                                   row(weights, t));
        } else {
          KokkosMoE::SerialTokenRoute::invoke(p, row(logits, t), bias, w, row(ids, t), row(weights, t));
        }
      });
    } else if (variant == Variant::Team) {
      if (tagged) {
        KokkosMoE::TokenRoute<member_type, Mode::Team>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                               row(weights, t));
      } else {
        KokkosMoE::TeamTokenRoute<member_type>::invoke(m, p, row(logits, t), bias, w, row(ids, t), row(weights, t));
      }
    } else if (tagged) {
      KokkosMoE::TokenRoute<member_type, Mode::TeamVector>::invoke(m, p, row(logits, t), bias, w, row(ids, t),
                                                                   row(weights, t));
    } else {
      KokkosMoE::TeamVectorTokenRoute<member_type>::invoke(m, p, row(logits, t), bias, w, row(ids, t), row(weights, t));
    }
  }
  template <class V>
  KOKKOS_INLINE_FUNCTION static auto row(const V& v, int t) {
    return Kokkos::subview(v, t, Kokkos::ALL);
  }
};

template <class D, class S>
void check_case(const Oracle::Attr& a, int T, int E, bool with_bias, std::uint64_t seed) {
  using Exec = typename D::execution_space;
  const RouterInputs in = generate_router_inputs<S, float>(a, T, E, with_bias, seed);
  const std::vector<Oracle::FwdRow> ref = oracle_forward(a, in);
  const auto logits = device_values<D, S>("logits", T, E, in.x);
  V1<D, const float> bias;
  if (with_bias) bias = device_vector<D, float>("bias", in.b);
  const KokkosMoE::TokenRouterParams p = KokkosMoE::make_token_router_params(to_config(a), E, with_bias);
  const std::size_t bytes = KokkosMoE::TokenRouterWorkspace<typename Exec::scratch_memory_space>::shmem_size(p);
  const bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename D::memory_space>::accessible;
  std::vector<std::int32_t> first_ids;
  std::vector<float> first_weights;
  std::vector<std::int32_t> direct_ids;
  std::vector<float> direct_weights;
  for (const Variant v : kVariants)
    for (const bool tagged : {false, true}) {
      BOOST_TEST_CONTEXT(variant_name(v) << (tagged ? " (Mode tag)" : "") << " "
                                         << describe(a, T, E, with_bias, Num<S>::name)) {
        auto ids = make2<D, std::int32_t>("ids", T, a.topk, -1);
        auto weights = make2<D, float>("weights", T, a.topk, -1.0f);
        RouteKernel<D, S, float> kernel{v, p, logits, bias, ids, weights, 1, tagged};
        if (v == Variant::ThreadVector) {
          const int vl = host ? 1 : 8, tpt = host ? 1 : 4;
          kernel.tokens_per_team = tpt;
          Kokkos::TeamPolicy<Exec> policy(Exec{}, (T + tpt - 1) / tpt, tpt, vl);
          policy.set_scratch_size(0, Kokkos::PerThread(bytes));
          Kokkos::parallel_for("test::thread_vector_route", policy, kernel);
        } else {
          const int ts = (host || v == Variant::Serial) ? 1 : 32, vl = (!host && v == Variant::TeamVector) ? 4 : 1;
          Kokkos::TeamPolicy<Exec> policy(Exec{}, T, v == Variant::TeamVector && !host ? 8 : ts, vl);
          policy.set_scratch_size(0, Kokkos::PerTeam(bytes));
          Kokkos::parallel_for("test::team_route", policy, kernel);
        }
        Exec{}.fence();
        const std::vector<std::int32_t> got_ids = download(ids);
        const std::vector<float> got_w = download(weights);
        Mismatches log("per-token routing vs oracle");
        const Tol tol = fp32_tol(E);
        for (int t = 0; t < T; ++t)
          for (int i = 0; i < a.topk; ++i) {
            const std::size_t j = static_cast<std::size_t>(t) * a.topk + i;
            if (got_ids[j] != ref[t].idx[i] || !close(got_w[j], ref[t].weight[i], tol))
              log.add([&](std::ostream& os) {
                os << "token " << t << " slot " << i << ": id " << got_ids[j] << " (oracle " << ref[t].idx[i]
                   << "), weight " << got_w[j] << " (oracle " << ref[t].weight[i] << ")";
              });
          }
        log.report();
        if (!tagged) {
          direct_ids = got_ids;
          direct_weights = got_w;
        } else {
          BOOST_TEST(bytes_equal(got_ids, direct_ids), "ids differ from the variant's own name's");
          BOOST_TEST(bytes_equal(got_w, direct_weights), "weights differ from the variant's own name's");
        }
        if (first_ids.empty()) {
          first_ids = got_ids;
          first_weights = got_w;
        } else {
          BOOST_TEST(bytes_equal(got_ids, first_ids), "ids differ from the Serial variant's");
          // Softmax pre normalizes by a sum over all E experts, a reduction whose order is the variant's (sequential,
          // or a tree over threads or lanes) on a device: equal within the tolerance above, not bit for bit. Every
          // other weight is a function of the selected activations in slot order, the same on every variant.
          if (!(a.f == Score::Softmax && a.pre) || host)
            BOOST_TEST(bytes_equal(got_w, first_weights), "weights differ from the Serial variant's");
        }
      }
    }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(router_token)

BOOST_AUTO_TEST_CASE_TEMPLATE(variants_match_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // DeepSeek-V3 style (grouped, biased sigmoid), Softmax post and pre, SqrtSoftplus, k = 1, small E
  check_case<DeviceType, float>(make_attr(Score::Sigmoid, false, 8, 8, 4, 2.5), 64, 256, true, 1);
  check_case<DeviceType, bf16_t>(make_attr(Score::Softmax, false, 8), 64, 128, false, 2);
  check_case<DeviceType, fp16_t>(make_attr(Score::Softmax, true, 4), 64, 64, false, 3);
  check_case<DeviceType, float>(make_attr(Score::SqrtSoftplus, false, 6), 32, 96, true, 4);
  check_case<DeviceType, float>(make_attr(Score::Sigmoid, false, 1), 64, 16, false, 5);
  check_case<DeviceType, bf16_t>(make_attr(Score::Softmax, false, 2), 64, 8, false, 6);
}

BOOST_AUTO_TEST_CASE(params_validated) {
  KokkosMoE::RouterConfig c;
  c.topk = 9;
  expect_rule(KokkosMoE::Rule::TopkRange, "topk > E", [&] { (void)KokkosMoE::make_token_router_params(c, 8, false); });
  c.topk = 2;
  c.score_function = KokkosMoE::ScoreFunction::Softmax;
  expect_rule(KokkosMoE::Rule::BiasRequiresSigmoidOrSqrtSoftplus, "bias with softmax",
              [&] { (void)KokkosMoE::make_token_router_params(c, 8, true); });
}

BOOST_AUTO_TEST_SUITE_END()
