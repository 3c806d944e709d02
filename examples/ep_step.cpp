/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// One expert-parallel MoE step over MPI (docs/ep.md), one rank per process: route the rank's tokens, lay out and
// dispatch them to the ranks that hold their experts, run a stand-in expert (it doubles its rows), combine the
// weighted outputs back into the tokens' rows. Host execution spaces run over MPI (Kokkos::Cuda takes an NCCL
// communicator, make_nccl_communicator). Run with mpirun -np R.
#include <KokkosMoE_Communicator_MPI.hpp>
#include <KokkosMoE_EP.hpp>
#include <KokkosMoE_Router.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

// A named function of external linkage: nvcc takes extended lambdas only in such functions.
int step() {
  using Exec = Kokkos::DefaultHostExecutionSpace;
  using Rows = Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space>;
  const Exec exec;
  const int T = 8, H = 16, K = 2;  // tokens of this rank, hidden size, experts per token
  auto world = KokkosMoE::make_mpi_communicator(MPI_COMM_WORLD);
  const int E = 4 * world.size(), me = world.rank();
  Rows logits("logits", T, E), x("x", T, H), y("y", T, H), weights("weights", T, K);
  Kokkos::View<std::int32_t**, Kokkos::LayoutRight, Exec::memory_space> ids("ids", T, K);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Exec>(exec, 0, T), KOKKOS_LAMBDA(int t) {
        for (int e = 0; e < E; ++e) logits(t, e) = static_cast<float>((3 * t + 5 * e + me) % E);
        for (int h = 0; h < H; ++h) x(t, h) = static_cast<float>(me * 100 + t) + 0.01f * h;
      });
  KokkosMoE::RouterConfig cfg;
  cfg.topk = K;  // softmax after the top-k: each token's weights sum to 1

  //! [ep-step]
  KokkosMoE::EpGroupConfig config;  // every rank passes the same values
  config.ep_size = world.size();
  config.num_experts = E;
  config.hidden_size = H;
  config.topk = K;
  config.max_tokens_per_rank = T;
  KokkosMoE::EpGroup<Exec> group(exec, world, config);
  auto layer0 = group.make_handle();  // one handle per layer

  KokkosMoE::topk_router_compact(exec, cfg, logits, ids, weights);  // [T, K] ids + FP32 weights
  KokkosMoE::ep_layout(exec, layer0, ids);                          // counts, offsets, slot maps
  const int N = layer0.num_recv_rows();                             // eager mode: exact
  Rows recv_x("recv_x", N, H), out("out", N, H);
  Kokkos::View<float*, Exec::memory_space> recv_w("recv_w", N);
  KokkosMoE::ep_dispatch(exec, layer0, x, weights, recv_x, recv_w);  // expert-major rows
  /* experts: grouped GEMM over recv_x using layer0.expert_offsets(); here each doubles its rows */
  Kokkos::parallel_for(
      "expert", Kokkos::RangePolicy<Exec>(exec, 0, N), KOKKOS_LAMBDA(int r) {
        for (int h = 0; h < H; ++h) out(r, h) = 2.0f * recv_x(r, h);
      });
  KokkosMoE::ep_combine(exec, layer0, KokkosMoE::CombineMode::Weighted, out, weights, y);
  //! [ep-step]
  exec.fence();

  // y = sum over the token's slots of weight * 2 x = 2 x.
  int wrong = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) wrong += std::fabs(y(t, h) - 2.0f * x(t, h)) > 1e-4f * std::fabs(x(t, h)) ? 1 : 0;
  int wrong_anywhere = 0;
  MPI_Allreduce(&wrong, &wrong_anywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (me == 0) std::printf("ep_step: %s (%d ranks)\n", wrong_anywhere == 0 ? "OK" : "WRONG", world.size());
  return wrong_anywhere == 0 ? 0 : 1;
}

int main(int argc, char* argv[]) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  {
    Kokkos::ScopeGuard guard(argc, argv);
    rc = step();  // the group and the communicator go before Kokkos and MPI
  }
  MPI_Finalize();
  return rc;
}
