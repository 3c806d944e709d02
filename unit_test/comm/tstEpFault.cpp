/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Fault test (docs/ep.md §12, "nothing hangs"): rank 1 stalls or exits in the middle of a step, after the layout and
// before the dispatch. Every other rank must fail within the communicator's timeout with CommError, and say so.
//   tstEpFault stall|exit        (under mpi_launch.sh --fault; KOKKOSMOE_COMM_TIMEOUT sets the timeout)
#include <KokkosMoE_Communicator_MPI.hpp>
#include <KokkosMoE_EP.hpp>

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3 || (std::strcmp(argv[1], "stall") != 0 && std::strcmp(argv[1], "exit") != 0) ||
      (argc == 3 && std::strcmp(argv[2], "mpi") != 0 && std::strcmp(argv[2], "shm") != 0)) {
    std::fprintf(stderr, "usage: %s stall|exit [mpi|shm]\n", argv[0]);
    return 2;
  }
  const bool stall = std::strcmp(argv[1], "stall") == 0;
  const bool shm = argc == 3 && std::strcmp(argv[2], "shm") == 0;  // direct writes: the wait is on a window counter
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Kokkos::initialize();
  int code = 1;
  {
    using Exec = Kokkos::DefaultHostExecutionSpace;
    Exec exec;
    KokkosMoE::Communicator comm =
        shm ? KokkosMoE::make_mpi_shm_communicator(MPI_COMM_WORLD) : KokkosMoE::make_mpi_communicator(MPI_COMM_WORLD);
    const int me = comm.rank(), R = comm.size();
    KokkosMoE::EpGroupConfig c;
    c.ep_size = R;
    c.num_experts = 2 * R;
    c.hidden = 64;
    c.top_k = 2;
    c.max_tokens_per_rank = 16;
    KokkosMoE::EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    Kokkos::View<int**, Kokkos::LayoutRight, Exec::memory_space> idx("idx", 16, 2);
    Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> x("x", 16, 64), w("w", 16, 2);
    for (int t = 0; t < 16; ++t) {
      idx(t, 0) = (t + me) % c.num_experts;  // every rank sends to every other rank
      idx(t, 1) = (t + me + 1) % c.num_experts;
    }
    KokkosMoE::ep_layout(exec, handle, idx);
    const int N = handle.num_recv_rows();
    Kokkos::View<float**, Kokkos::LayoutRight, Exec::memory_space> rx("rx", N, 64);
    Kokkos::View<float*, Exec::memory_space> rw("rw", N);
    if (me == 1) {
      std::fprintf(stdout, "rank 1: %s in the middle of the step\n", stall ? "stalling" : "exiting");
      std::fflush(stdout);
      if (!stall) std::_Exit(3);
      std::this_thread::sleep_for(std::chrono::seconds(120));
      std::_Exit(0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    try {
      KokkosMoE::ep_dispatch(exec, handle, x, w, rx, rw);
      KokkosMoE::ep_synchronize(exec, handle);
      std::fprintf(stdout, "rank %d: the step finished although rank 1 is gone: FAULT TEST FAILED\n", me);
    } catch (const KokkosMoE::CommError& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const bool in_time = s <= comm.timeout_seconds() + 5.0;
      const bool cause_ok =
          e.cause() == KokkosMoE::CommFailure::Timeout || e.cause() == KokkosMoE::CommFailure::PeerFailure;
      std::fprintf(stdout, "rank %d: CommError after %.2f s (timeout %.1f s): %s\n", me, s, comm.timeout_seconds(),
                   e.what());
      // Later operations on the aborted communicator fail at once with cause Aborted.
      bool aborted_ok = false;
      try {
        KokkosMoE::ep_dispatch(exec, handle, x, w, rx, rw);
      } catch (const KokkosMoE::CommError& e2) {
        aborted_ok = e2.cause() == KokkosMoE::CommFailure::Aborted;
      }
      if (in_time && cause_ok && aborted_ok && e.rank() == me && e.operation() == "ep_dispatch") {
        std::fprintf(stdout, "rank %d: FAULT TEST PASSED (%s)\n", me, stall ? "stall" : "exit");
        code = 0;
      } else {
        std::fprintf(stdout, "rank %d: FAULT TEST FAILED (in time %d, cause %d, aborted %d)\n", me, in_time, cause_ok,
                     aborted_ok);
      }
    }
    std::fflush(stdout);
  }
  // A peer is gone: MPI_Finalize could wait for it, so leave without it (the launcher judges by rank 0's log). Rank 0
  // leaves first: mpirun then ends the job, and the other survivors must not end it before rank 0 has reported.
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) std::this_thread::sleep_for(std::chrono::seconds(10));
  std::_Exit(code);
}
