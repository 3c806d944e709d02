/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Boost.Test main of the multi-process EP suites: MPI (MPI_THREAD_FUNNELED), then Kokkos, by a global fixture; the
// test communicators are released before either is finalized. Every rank runs every test case; a failure on any
// rank fails that rank's exit code, and mpirun reports it.
#define BOOST_TEST_MODULE KokkosMoE comm
#include <Kokkos_Core.hpp>

#include <EpTestEnv.hpp>
#include <boost/test/unit_test.hpp>
#include <mpi.h>

namespace {
struct MpiKokkosEnvironment {
  MpiKokkosEnvironment() {
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
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(MpiKokkosEnvironment);
