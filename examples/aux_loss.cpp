/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The load-balancing auxiliary loss (docs/router.md §10-§11): the scores over all experts and their top-k map,
// the tokens each expert received, the loss with its caller-provided workspace, and the backward of both.
#include <KokkosMoE_AuxLoss.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight>;
  const Exec exec;
  const int T = 16, E = 8, K = 2;
  Matrix logits("logits", T, E), scores("scores", T, E), intermediate("intermediate", T, E);
  Matrix grad_scores("grad_scores", T, E), grad_logits("grad_logits", T, E);
  Kokkos::View<std::uint8_t**, Kokkos::LayoutRight> routing_map("routing_map", T, E);
  Kokkos::View<std::int32_t*> tokens_per_expert("tokens_per_expert", E);
  Kokkos::parallel_for(
      "fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {T, E}),
      KOKKOS_LAMBDA(int t, int e) { logits(t, e) = static_cast<float>((5 * t + e) % E) / E; });

  //! [aux-loss]
  KokkosMoE::AuxScoresConfig scfg;
  scfg.topk = K;
  scfg.score_function = KokkosMoE::ScoreFunction::Softmax;
  KokkosMoE::aux_scores(exec, scfg, logits, scores, routing_map, intermediate);  // FP32 scores over all E
  Kokkos::parallel_for(
      "tokens_per_expert", Kokkos::RangePolicy<Exec>(exec, 0, E), KOKKOS_LAMBDA(int e) {
        int n = 0;
        for (int t = 0; t < T; ++t) n += routing_map(t, e);
        tokens_per_expert(e) = n;
      });

  KokkosMoE::AuxLossConfig lcfg;
  lcfg.num_experts = E;
  lcfg.topk = K;
  lcfg.coeff = 1e-2f;
  Kokkos::View<float> loss("loss"), grad_loss("grad_loss");  // grad_loss: the upstream gradient
  Kokkos::View<float*> const_buf("const_buf", 2);
  Kokkos::View<float*> workspace("workspace", KokkosMoE::aux_loss_workspace_size(T, E));  // no allocation per call
  KokkosMoE::aux_loss(exec, lcfg, scores, tokens_per_expert, /*total_num_tokens=*/T, loss, const_buf, workspace);
  KokkosMoE::aux_loss_backward(exec, lcfg, const_buf, tokens_per_expert, grad_loss, grad_scores);
  KokkosMoE::aux_scores_backward(exec, scfg, intermediate, grad_scores, grad_logits);
  //! [aux-loss]

  // loss = (E * coeff / topk) / T^2 * sum over experts of (the expert's summed scores) * (its tokens)
  auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), scores);
  auto hn = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), tokens_per_expert);
  auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), loss);
  double want = 0.0;
  for (int e = 0; e < E; ++e) {
    double column = 0.0;
    for (int t = 0; t < T; ++t) column += hs(t, e);
    want += column * hn(e);
  }
  want *= E * 1e-2 / K / T / T;
  const bool ok = std::fabs(hl() - want) <= 1e-5 * std::fabs(want) + 1e-7;
  std::printf("aux_loss: %s (loss %g, expected %g)\n", ok ? "OK" : "WRONG", static_cast<double>(hl()), want);
  return ok ? 0 : 1;
}
