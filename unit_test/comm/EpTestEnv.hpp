/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_TEST_EPTESTENV_HPP
#define KOKKOSMOE_TEST_EPTESTENV_HPP

// The EP tests' world: MPI is initialized by the test main (utf_main_mpi.cpp); host device types run over an MPI
// communicator of MPI_COMM_WORLD, Kokkos::Cuda over an NCCL communicator bootstrapped through it. Started by
// multi_gpu_launch.sh instead (one process per GPU, no mpirun: KOKKOSMOE_LAUNCH_RANK, _SIZE and _ID_FILE set), the
// NCCL world spans the launched processes and its unique id travels through a file; host types then run on one
// rank. The mesh is KOKKOSMOE_TEST_EP_MESH=DPxEP, by default DP2 x EP2 on 4 ranks and DP1 x EP(world) otherwise
// (docs/ep.md §12).

#include <KokkosMoE_Communicator.hpp>
#include <KokkosMoE_Communicator_MPI.hpp>
#if defined(KOKKOSMOE_HAVE_NCCL)
#include <KokkosMoE_Communicator_NCCL.hpp>
#endif
#if defined(KOKKOSMOE_HAVE_CUDA_IPC)
#include <KokkosMoE_Communicator_CudaIpc.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace KokkosMoE::Test {

struct Mesh {
  int dp = 1, ep = 1;
};

inline Mesh test_mesh(int world) {
  Mesh m;
  if (const char* env = std::getenv("KOKKOSMOE_TEST_EP_MESH"); env != nullptr && *env != '\0') {
    const std::string s(env);
    const auto x = s.find_first_of("xX");
    if (x == std::string::npos) throw std::runtime_error("KOKKOSMOE_TEST_EP_MESH='" + s + "' is not DPxEP");
    m.dp = std::stoi(s.substr(0, x));
    m.ep = std::stoi(s.substr(x + 1));
  } else if (world == 4) {
    m.dp = 2;
    m.ep = 2;
  } else {
    m.dp = 1;
    m.ep = world;
  }
  if (m.dp < 1 || m.ep < 1 || m.dp * m.ep != world)
    throw std::runtime_error("the EP test mesh DP" + std::to_string(m.dp) + " x EP" + std::to_string(m.ep) +
                             " does not match the " + std::to_string(world) + " ranks of MPI_COMM_WORLD");
  return m;
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// The launcher's rank and size (multi_gpu_launch.sh), or -1 when not launched by it.
inline int launch_rank() {
  const char* r = std::getenv("KOKKOSMOE_LAUNCH_RANK");
  return r != nullptr && *r != '\0' ? std::atoi(r) : -1;
}
inline int launch_size() {
  const char* n = std::getenv("KOKKOSMOE_LAUNCH_SIZE");
  return n != nullptr && *n != '\0' ? std::atoi(n) : -1;
}

#if defined(KOKKOSMOE_HAVE_NCCL)
/// Rank 0 writes the unique id to KOKKOSMOE_LAUNCH_ID_FILE (atomically, by rename); the others wait for it with the
/// communicator's timeout.
inline ncclUniqueId exchange_id_by_file(int rank) {
  const std::string path = std::getenv("KOKKOSMOE_LAUNCH_ID_FILE");
  ncclUniqueId id{};
  if (rank == 0) {
    id = make_nccl_unique_id();
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof id);
    std::rename(tmp.c_str(), path.c_str());
    return id;
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path, std::ios::binary);
    if (in.read(reinterpret_cast<char*>(&id), sizeof id)) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw std::runtime_error("rank " + std::to_string(rank) + ": no NCCL unique id in " + path + " after 120 s");
}
#endif

/// The transports under test, KOKKOSMOE_TEST_TRANSPORT: mpi (point-to-point on host spaces, NCCL on Kokkos::Cuda;
/// the default), shm (MPI shared windows on host spaces, direct writes) or ipc (point-to-point on host spaces, the
/// CUDA-IPC transport over MPI on Kokkos::Cuda).
enum class TestTransport { Mpi, Shm, Ipc };
inline TestTransport test_transport() {
  const char* t = std::getenv("KOKKOSMOE_TEST_TRANSPORT");
  if (t == nullptr || *t == '\0' || std::string(t) == "mpi") return TestTransport::Mpi;
  if (std::string(t) == "shm") return TestTransport::Shm;
  if (std::string(t) == "ipc") return TestTransport::Ipc;
  throw std::runtime_error(std::string("KOKKOSMOE_TEST_TRANSPORT='") + t + "' is not mpi, shm or ipc");
}
inline bool test_shm() { return test_transport() == TestTransport::Shm; }

/// Whether an EP group over \p comm writes rows straight into its peers' windows (no library call moves them).
inline bool writes_directly(const Communicator& comm) {
  if (comm.size() < 2) return false;
  return comm.transport() == CommTransport::MpiShm || comm.transport() == CommTransport::Loopback ||
         (comm.transport() == CommTransport::CudaIpc && comm.peer_windows() != PeerWindows::Off);
}

/// The mesh of the host (MPI) world: one rank per process under multi_gpu_launch.sh.
inline Mesh host_mesh() { return launch_size() > 0 ? Mesh{} : test_mesh(world_size()); }

/// Communicators shared by the test cases of one process, released before MPI and Kokkos finalize.
struct CommCache {
  std::unique_ptr<Communicator> host_world, host_ep, host_dp;
  std::unique_ptr<Communicator> nccl_world, nccl_ep, nccl_dp;  // the device transport (NCCL or CUDA IPC)
  static CommCache& get() {
    static CommCache c;
    return c;
  }
  void release() {
    nccl_ep.reset();
    nccl_dp.reset();
    nccl_world.reset();
    host_ep.reset();
    host_dp.reset();
    host_world.reset();
  }
};

/// The EP communicator of this rank's DP slice for ExecSpace's transport.
template <class ExecSpace>
const Communicator& ep_comm() {
  CommCache& c = CommCache::get();
  const Mesh mesh = host_mesh();
  const int r = world_rank();
  if (!c.host_world) {
    c.host_world = std::make_unique<Communicator>(test_shm() ? make_mpi_shm_communicator(MPI_COMM_WORLD)
                                                             : make_mpi_communicator(MPI_COMM_WORLD));
    c.host_ep = std::make_unique<Communicator>(c.host_world->split(r / mesh.ep, r % mesh.ep));
    c.host_dp = std::make_unique<Communicator>(c.host_world->split(r % mesh.ep, r / mesh.ep));
  }
#if defined(KOKKOS_ENABLE_CUDA) && (defined(KOKKOSMOE_HAVE_NCCL) || defined(KOKKOSMOE_HAVE_CUDA_IPC))
  if constexpr (std::is_same<ExecSpace, Kokkos::Cuda>::value) {
    if (!c.nccl_world) {
      const int device = Kokkos::DefaultExecutionSpace().cuda_device();
      if (test_transport() == TestTransport::Ipc) {
#if defined(KOKKOSMOE_HAVE_CUDA_IPC)
        c.nccl_world = std::make_unique<Communicator>(make_cuda_ipc_communicator(*c.host_world, device));
#else
        throw std::runtime_error("KOKKOSMOE_TEST_TRANSPORT=ipc needs a build with the CUDA-IPC transport");
#endif
      } else if (launch_size() > 0) {
#if defined(KOKKOSMOE_HAVE_NCCL)
        const int lr = launch_rank(), ln = launch_size();
        c.nccl_world = std::make_unique<Communicator>(make_nccl_communicator(exchange_id_by_file(lr), lr, ln, device));
      } else {
        c.nccl_world = std::make_unique<Communicator>(make_nccl_communicator(*c.host_world, device));
#else
        throw std::runtime_error("Kokkos::Cuda over MPI ranks needs NCCL or KOKKOSMOE_TEST_TRANSPORT=ipc");
#endif
      }
      const Mesh gm = test_mesh(c.nccl_world->size());
      const int gr = c.nccl_world->rank();
      c.nccl_ep = std::make_unique<Communicator>(c.nccl_world->split(gr / gm.ep, gr % gm.ep));
      c.nccl_dp = std::make_unique<Communicator>(c.nccl_world->split(gr % gm.ep, gr / gm.ep));
    }
    return *c.nccl_ep;
  }
#endif
  return *c.host_ep;
}

inline const Communicator& host_world() {
  ep_comm<Kokkos::DefaultHostExecutionSpace>();
  return *CommCache::get().host_world;
}

inline const Communicator& host_dp() {
  ep_comm<Kokkos::DefaultHostExecutionSpace>();
  return *CommCache::get().host_dp;
}

}  // namespace KokkosMoE::Test

#endif
