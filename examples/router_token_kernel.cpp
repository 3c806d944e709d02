/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The per-token routing device functions (KokkosMoE_RouterToken.hpp, docs/router.md §18) called from the user's own
// kernel, for instance the epilogue of the gate GEMM: one team per token routes its row with the team's threads,
// its workspace in team scratch, and gives what topk_router_compact gives (checked here against it).
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterToken.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  const Exec exec;
  const int T = 16, E = 64, K = 4;
  Kokkos::View<float**, Kokkos::LayoutRight> logits("logits", T, E), weights("weights", T, K),
      library_weights("library_weights", T, K);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight> ids("ids", T, K), library_ids("library_ids", T, K);
  Kokkos::parallel_for(
      "fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {T, E}),
      KOKKOS_LAMBDA(int t, int e) { logits(t, e) = static_cast<float>((11 * t + 5 * e) % E) / E - 0.5f; });
  KokkosMoE::RouterConfig cfg;
  cfg.topk = K;
  cfg.score_function = KokkosMoE::ScoreFunction::Softmax;

  //! [router-token]
  using Policy = Kokkos::TeamPolicy<Exec>;
  using Work = KokkosMoE::TokenRouterWorkspace<Exec::scratch_memory_space>;
  const KokkosMoE::TokenRouterParams p = KokkosMoE::make_token_router_params(cfg, E, /*has_bias=*/false);
  const Kokkos::View<const float*> no_bias;
  Policy policy(exec, T, Kokkos::AUTO);
  policy.set_scratch_size(0, Kokkos::PerTeam(Work::shmem_size(p)));
  Kokkos::parallel_for(
      "my_gate_epilogue", policy, KOKKOS_LAMBDA(const Policy::member_type& team) {
        const int t = team.league_rank();
        const Work work(team.team_scratch(0), p);
        KokkosMoE::TeamTokenRoute<Policy::member_type>::invoke(team, p, Kokkos::subview(logits, t, Kokkos::ALL),
                                                               no_bias, work, Kokkos::subview(ids, t, Kokkos::ALL),
                                                               Kokkos::subview(weights, t, Kokkos::ALL));
      });
  //! [router-token]

  KokkosMoE::topk_router_compact(exec, cfg, logits, library_ids, library_weights);
  int differ = 0;
  Kokkos::parallel_reduce(
      "compare", Kokkos::RangePolicy<Exec>(exec, 0, T),
      KOKKOS_LAMBDA(int t, int& n) {
        for (int i = 0; i < K; ++i) n += ids(t, i) != library_ids(t, i) ? 1 : 0;
      },
      differ);
  std::printf("router_token_kernel: %s\n", differ == 0 ? "OK" : "WRONG");
  return differ == 0 ? 0 : 1;
}
