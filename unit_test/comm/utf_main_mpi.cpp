/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Boost.Test main of the multi-process EP suites: MPI (MPI_THREAD_FUNNELED), then Kokkos, by a global fixture; the
// test communicators are released before either is finalized. Every rank runs every test case; a failure on any
// rank fails that rank's exit code, and mpirun reports it. A run whose every test case skips exits 77 on every rank
// with the reasons (SkipReport.hpp): mpirun and mpi_launch.sh pass that on to ctest as skipped.
#define BOOST_TEST_MODULE KokkosMoE comm
#include <Kokkos_Core.hpp>

#include <EpTestEnv.hpp>
#include <SkipReport.hpp>
#include <boost/test/unit_test.hpp>
#include <mpi.h>

#if defined(KOKKOSMOE_HAVE_SHARDING)
#include <KokkosMoE_ResourceGate.hpp>
#endif

#include <cstdio>
#include <cstdlib>

namespace {
// Multi-GPU runs (multi_gpu_launch.sh sets KOKKOSMOE_REQUIRE_GPUS=N): the planner's resource gate decides, before
// MPI or Kokkos start, whether N GPUs share one NVLink clique here; otherwise the whole executable reports skipped
// (exit 77, ctest SKIP_RETURN_CODE) with the gate's reason, never passed.
void resource_gate() {
  const char* n = std::getenv("KOKKOSMOE_REQUIRE_GPUS");
  if (n == nullptr || *n == '\0') return;
  const int need = std::atoi(n);
#if defined(KOKKOSMOE_HAVE_SHARDING)
  const KokkosMoE::GateResult gate = KokkosMoE::nvlink_clique_gate(need);
  if (!gate.satisfied) {
    std::printf("SKIPPED: the EP suite needs %d GPUs in one NVLink clique: %s\n", need, gate.reason.c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  std::string clique;
  for (int g : gate.gpus) clique += (clique.empty() ? "" : ",") + std::to_string(g);
  std::printf("resource gate: %d GPUs in one NVLink clique: {%s} (%s)\n", need, clique.c_str(), gate.reason.c_str());
#else
  std::printf("SKIPPED: the EP suite needs %d GPUs and this build has no topology detection (sharding)\n", need);
  std::exit(77);
#endif
  if (std::getenv("KOKKOSMOE_GATE_ONLY") != nullptr) std::exit(0);
}

struct MpiKokkosEnvironment {
  MpiKokkosEnvironment() {
    resource_gate();
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    Kokkos::initialize();
  }
  ~MpiKokkosEnvironment() {
    KokkosMoE::Test::CommCache::get().release();
    Kokkos::finalize();
    MPI_Finalize();
  }
};
KokkosMoETest::SkipReport skip_report;
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(MpiKokkosEnvironment);
