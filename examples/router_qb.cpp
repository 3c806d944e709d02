/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The Quantile Balancing router (docs/router.md §19): a Sigmoid router with an expert bias that also returns, per
// token, the biased score of the best expert it was not routed to (the cutoff), and counts for every expert the
// bias it would have needed to tie that cutoff into a histogram that a trainer reads to set the next biases. Two
// micro-batches accumulate into one histogram; the bounds are validated once, so the calls themselves never read
// device memory back and could be captured in a CUDA graph.
#include <KokkosMoE_RouterQB.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard guard(argc, argv);
  using Exec = Kokkos::DefaultExecutionSpace;
  using Matrix = Kokkos::View<float**, Kokkos::LayoutRight>;
  const Exec exec;
  const int T = 32, E = 16, K = 4, bins = 64;
  Matrix logits("logits", T, E), probs("probs", T, E), intermediate("intermediate", T, E);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight> indices("indices", T, K);
  Kokkos::View<float*> bias("expert_bias", E), bin_bounds("bin_bounds", 2), cutoff("cutoff", T);
  Kokkos::parallel_for(
      "fill", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>>(exec, {0, 0}, {T, E}),
      KOKKOS_LAMBDA(int t, int e) { logits(t, e) = static_cast<float>((7 * t + 3 * e) % 11) / 4.0f - 1.25f; });
  Kokkos::parallel_for(
      "bias", Kokkos::RangePolicy<Exec>(exec, 0, E), KOKKOS_LAMBDA(int e) {
        bias(e) = 0.01f * static_cast<float>(e % 5) - 0.02f;
        if (e == 0) {
          bin_bounds(0) = -1.05f;  // every required bias cutoff - sigmoid(x) lies in [min bias - 1, max bias + 1]
          bin_bounds(1) = 1.05f;
        }
      });

  //! [router-qb]
  KokkosMoE::RouterConfig cfg;  // Sigmoid, an expert bias, no grouping, 1 <= topk <= E - 1
  cfg.topk = K;
  cfg.score_function = KokkosMoE::ScoreFunction::Sigmoid;
  KokkosMoE::QbConfig qb;  // FusedAtomic histogram; bounds checked on every call unless validate_bin_bounds = false
  KokkosMoE::validate_qb_bin_bounds(exec, bin_bounds);  // once: the calls below then read the bounds on the device only
  qb.validate_bin_bounds = false;
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight> histogram("histogram", E, bins);  // accumulated, never cleared
  const auto half = Kokkos::make_pair(0, T / 2), rest = Kokkos::make_pair(T / 2, T);
  for (const auto rows : {half, rest})  // two micro-batches into one histogram
    KokkosMoE::topk_router_qb_indices(
        exec, cfg, qb, Kokkos::subview(logits, rows, Kokkos::ALL), bias, bin_bounds,
        Kokkos::subview(probs, rows, Kokkos::ALL), Kokkos::subview(indices, rows, Kokkos::ALL),
        Kokkos::subview(intermediate, rows, Kokkos::ALL), Kokkos::subview(cutoff, rows), histogram);
  //! [router-qb]

  // Every (token, expert) pair counted once; every cutoff at most the worst routed expert's biased score.
  auto hh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), histogram);
  auto hc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), cutoff);
  auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), intermediate);
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), indices);
  auto hb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), bias);
  long counts = 0;
  for (int e = 0; e < E; ++e)
    for (int b = 0; b < bins; ++b) counts += hh(e, b);
  bool ordered = true;
  for (int t = 0; t < T; ++t) {
    const int worst = hx(t, K - 1);
    ordered = ordered && hc(t) <= hi(t, worst) + hb(worst);
  }
  const bool ok = counts == static_cast<long>(T) * E && ordered;
  std::printf("router_qb: %s (%ld histogram counts for %d tokens x %d experts; cutoffs below the routed scores: %s)\n",
              ok ? "OK" : "WRONG", counts, T, E, ordered ? "yes" : "no");
  return ok ? 0 : 1;
}
