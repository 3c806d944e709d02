/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Top-k routing of a small batch, forward and backward, on the default execution space: DeepSeek-V3-style sigmoid
// scores with an expert bias, a routing map, and the gradient of the logits from a gradient of the probabilities.
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight>;
  const Exec exec;
  const int T = 16, E = 32;  // tokens, experts
  Matrix logits("logits", T, E), probs("probs", T, E), intermediate("intermediate", T, E);
  Matrix grad_probs("grad_probs", T, E), grad_logits("grad_logits", T, E);
  Kokkos::View<float*> bias("bias", E);
  Kokkos::View<std::uint8_t**, Kokkos::LayoutRight> routing_map("routing_map", T, E);
  Kokkos::parallel_for(
      "fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {T, E}), KOKKOS_LAMBDA(int t, int e) {
        logits(t, e) = static_cast<float>((7 * t + 3 * e) % E) / E;  // distinct in every row
        grad_probs(t, e) = 1.0f;
      });

  //! [router]
  KokkosMoE::RouterConfig cfg;  // topk, score_function, use_pre_softmax, num_groups, group_topk, ...
  cfg.topk = 8;
  cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  KokkosMoE::topk_router(exec, cfg, logits, bias, probs, routing_map, intermediate);  // [T,E] Views
  KokkosMoE::topk_router_backward(exec, cfg, routing_map, intermediate, grad_probs, grad_logits);
  //! [router]

  // Each token selected exactly topk experts.
  int wrong_rows = 0;
  Kokkos::parallel_reduce(
      "count", Kokkos::RangePolicy<Exec>(exec, 0, T),
      KOKKOS_LAMBDA(int t, int& wrong) {
        int selected = 0;
        for (int e = 0; e < E; ++e) selected += routing_map(t, e);
        wrong += selected != 8 ? 1 : 0;
      },
      wrong_rows);
  std::printf("router_forward_backward: %s\n", wrong_rows == 0 ? "OK" : "WRONG");
  return wrong_rows == 0 ? 0 : 1;
}
