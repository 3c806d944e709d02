/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The EP test matrix of docs/ep.md §12 (cases 1-8 and 10), one source for every transport: host device types run
// over MPI, Kokkos::Cuda over NCCL. Every rank runs every case; expected values come from the plain-loop oracle.
// Also ep_tools_instances (at the end; run at one and two ranks): the Kokkos Tools see every EP operation's kernels
// on the caller's instance and exactly the documented fences.
#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <KokkosToolsEvents.hpp>

#include <EpCases.hpp>
#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_Transport.hpp>
#if defined(KOKKOSMOE_HAVE_NCCL)
#include <KokkosMoE_Communicator_NCCL.hpp>
#endif
#if defined(KOKKOSMOE_HAVE_CUDA_IPC)
#include <KokkosMoE_Communicator_CudaIpc.hpp>
#endif
#if defined(KOKKOSMOE_HAVE_SHARDING)
#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_Topology.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

// ----- case 1: bootstrap ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ep_setup)

BOOST_AUTO_TEST_CASE_TEMPLATE(bootstrap_errors, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size();
  auto rule_of = [&](auto&& f) -> Rule {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.rule();
    }
    return Rule::ShapeMismatch;  // no throw: compared below against a rule that is never expected here
  };
  Communicator empty;
  BOOST_TEST(!empty.valid());
  BOOST_CHECK_THROW(empty.rank(), InvalidArgument);
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, empty, default_config(R)); })) ==
             static_cast<int>(Rule::ConfigValue));
  auto c = default_config(R);
  c.ep_size = R + 1;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::CommSize));
  c = default_config(R);
  c.num_experts = R > 1 ? 2 * R + 1 : 0;  // not a multiple of ep_size; at R = 1 simply out of range
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  c = default_config(R);
  c.topk = c.num_experts + 1;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  c = default_config(R);
  c.hidden_size = 0;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  c = default_config(R);
  c.layout = RecvLayout::ExpertMajorFixed;
  c.max_recv_tokens_per_rank = 16;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  // The SM cap: 0, below -1, and above the execution space's count (SMs, or concurrency on a host space); how it is
  // kept: an unknown SmCap, and SM partitions where the space makes none (a host space). Each is ConfigValue naming
  // its field.
  const auto cap_refused = [&](const char* field, int cap, SmCap how) {
    c = default_config(R);
    c.max_sms = cap;
    c.sm_cap = how;
    std::string msg;
    try {
      EpGroup<Exec>(exec, comm, c);
    } catch (const InvalidArgument& e) {
      msg = e.what();
      BOOST_TEST(static_cast<int>(e.rule()) == static_cast<int>(Rule::ConfigValue), msg);
    }
    BOOST_TEST(msg.find(field) != std::string::npos,
               "max_sms = " << cap << ", sm_cap = " << static_cast<int>(how) << ": " << msg);
  };
  const int processors = is_cuda<Exec>() ? 1 << 16 : exec.concurrency();
  for (int cap : {0, -2, processors + 1}) cap_refused("max_sms", cap, SmCap::Auto);
  cap_refused("sm_cap", 1, static_cast<SmCap>(7));
  if (!is_cuda<Exec>()) cap_refused("sm_cap", 1, SmCap::Partition);
  BOOST_CHECK_THROW(comm.split(-1, 0), InvalidArgument);
  // A malformed timeout in the environment is refused when a communicator is made.
  setenv("KOKKOSMOE_COMM_TIMEOUT", "soon", 1);
  BOOST_TEST(static_cast<int>(rule_of([&] { make_mpi_communicator(MPI_COMM_WORLD); })) ==
             static_cast<int>(Rule::ConfigValue));
  setenv("KOKKOSMOE_COMM_TIMEOUT", "-1", 1);
  BOOST_TEST(static_cast<int>(rule_of([&] { make_mpi_communicator(MPI_COMM_WORLD); })) ==
             static_cast<int>(Rule::ConfigValue));
  unsetenv("KOKKOSMOE_COMM_TIMEOUT");
  // Window settings: an enumerator, and the NCCL-only kinds on NCCL communicators only.
  CommConfig bad_windows;
  bad_windows.peer_windows = static_cast<PeerWindows>(9);
  BOOST_CHECK_EXCEPTION(make_mpi_communicator(MPI_COMM_WORLD, bad_windows), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::ConfigValue; });
  for (PeerWindows w : {PeerWindows::NcclSymmetric, PeerWindows::CudaIpc}) {
    CommConfig cc;
    cc.peer_windows = w;
    BOOST_CHECK_EXCEPTION(make_mpi_shm_communicator(MPI_COMM_WORLD, cc), InvalidArgument,
                          [](const InvalidArgument& e) { return e.rule() == Rule::ConfigValue; });
  }
}

// CommConfig::peer_windows = off keeps an EP group of a shared-window communicator on messages; auto writes directly.
BOOST_AUTO_TEST_CASE_TEMPLATE(peer_windows_off_means_messages, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  if (is_cuda<Exec>() || world_size() < 2) return;  // host windows need 2 ranks; NCCL windows: nccl_peer_windows
  for (PeerWindows w : {PeerWindows::Off, PeerWindows::Auto}) {
    CommConfig cc;
    cc.peer_windows = w;
    Communicator world = make_mpi_shm_communicator(MPI_COMM_WORLD, cc);
    BOOST_TEST(static_cast<int>(world.peer_windows()) == static_cast<int>(w));
    Communicator sub = world.split(0, world.rank());
    BOOST_TEST(static_cast<int>(sub.peer_windows()) == static_cast<int>(w));  // inherited by splits
    EpGroup<Exec> group(Exec(), sub, default_config(sub.size()));
    BOOST_TEST(group.direct_writes() == (w == PeerWindows::Auto), "peer_windows = " << to_string(w));
  }
}

#if defined(KOKKOS_ENABLE_CUDA) && (defined(KOKKOSMOE_HAVE_NCCL) || defined(KOKKOSMOE_HAVE_CUDA_IPC))
void device_barrier(const Communicator& comm) {
  Kokkos::View<int*, Kokkos::CudaSpace> one("one", 1), all("all", comm.size());
  Kokkos::Cuda exec;
  exec.fence();
  comm.impl_transport()->allgather("barrier", one.data(), all.data(), sizeof(int), exec.cuda_stream());
  comm.impl_transport()->wait("barrier", exec.cuda_stream());
}

/// A device window of \p comm (docs/ep.md §7.2): zero-filled, every rank's part addressable, a write into the next
/// rank's part seen there, released collectively.
void check_device_window(const Communicator& comm, const std::string& what, std::shared_ptr<Impl::PeerWindow> win,
                         std::size_t bytes) {
  using Mem = Kokkos::CudaSpace;
  const int R = comm.size(), me = comm.rank();
  BOOST_REQUIRE_MESSAGE(win != nullptr, what << ": no window on one node");
  BOOST_TEST(win->bytes == bytes);
  BOOST_REQUIRE(win->base.size() == static_cast<std::size_t>(R));
  const std::size_t n = bytes / sizeof(int);
  using Ints = Kokkos::View<int*, Mem, Kokkos::MemoryUnmanaged>;
  Ints mine(reinterpret_cast<int*>(win->base[me]), n), next(reinterpret_cast<int*>(win->base[(me + 1) % R]), n);
  int nonzero = 0;
  Kokkos::parallel_reduce(
      "nonzero", Kokkos::RangePolicy<Kokkos::Cuda>(0, n), KOKKOS_LAMBDA(std::size_t i, int& c) { c += mine(i) != 0; },
      nonzero);
  BOOST_TEST(nonzero == 0, what << ": a new window is zero-filled");
  Kokkos::fence();
  device_barrier(comm);
  const int tag = 1000 + me;
  Kokkos::parallel_for(
      "write_next", Kokkos::RangePolicy<Kokkos::Cuda>(0, n),
      KOKKOS_LAMBDA(std::size_t i) { next(i) = tag + static_cast<int>(i % 7); });
  Kokkos::fence();
  device_barrier(comm);
  const int from = 1000 + (me + R - 1) % R;
  int wrong = 0;
  Kokkos::parallel_reduce(
      "check", Kokkos::RangePolicy<Kokkos::Cuda>(0, n),
      KOKKOS_LAMBDA(std::size_t i, int& c) { c += mine(i) != from + static_cast<int>(i % 7); }, wrong);
  BOOST_TEST(wrong == 0, what << ": rows written by the previous rank");
  win.reset();  // collective release
  BOOST_TEST(!comm.aborted());
}
#endif

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_NCCL)
// The NCCL windows of every kind, at the ranks this run has (one on one GPU). Symmetric windows need NCCL >= 2.28 at
// run time; an older library must refuse them with CommError(Library) and auto must still give a window (CUDA IPC).
BOOST_AUTO_TEST_CASE(nccl_peer_windows) {
  if (launch_size() > 0) return;  // one process per GPU without MPI: the id exchange serves the cached world only
  if (test_transport() == TestTransport::Ipc) return;  // NCCL cannot hold two ranks of one GPU: cuda_ipc_peer_windows
  const int device = Kokkos::DefaultExecutionSpace().cuda_device();
  int version = 0;
  ncclGetVersion(&version);
  for (PeerWindows w : {PeerWindows::NcclSymmetric, PeerWindows::CudaIpc, PeerWindows::Auto}) {
    CommConfig cc;
    cc.peer_windows = w;
    Communicator comm = make_nccl_communicator(host_world(), device, cc);
    const std::size_t bytes = (std::size_t(3) << 20) + 123;  // not a multiple of NCCL's 4 KiB granularity
    std::shared_ptr<Impl::PeerWindow> win;
    try {
      win = comm.impl_transport()->make_window("nccl_peer_windows", bytes);
    } catch (const CommError& e) {
      const bool old_nccl = w == PeerWindows::NcclSymmetric && version < 22800;
      BOOST_TEST(old_nccl, to_string(w) << " windows with NCCL " << version << ": " << e.what());
      BOOST_TEST(static_cast<int>(e.cause()) == static_cast<int>(CommFailure::Library));
      continue;
    }
    check_device_window(comm, to_string(w), std::move(win), bytes);
  }
}
#endif

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_CUDA_IPC)
// The CUDA-IPC transport's windows (docs/ep.md §7.5) at the ranks this run has, every rank in its own process: auto
// and ipc map every peer (one open IPC handle per rank of another process while the window lives, none after), off
// makes none; NCCL's symmetric kind is refused.
BOOST_AUTO_TEST_CASE(cuda_ipc_peer_windows) {
  if (launch_size() > 0) return;  // needs the MPI world
  const int device = Kokkos::DefaultExecutionSpace().cuda_device();
  for (PeerWindows w : {PeerWindows::CudaIpc, PeerWindows::Auto, PeerWindows::Off}) {
    CommConfig cc;
    cc.peer_windows = w;
    Communicator comm = make_cuda_ipc_communicator(host_world(), device, cc);
    BOOST_TEST(static_cast<int>(comm.transport()) == static_cast<int>(CommTransport::CudaIpc));
    BOOST_TEST(comm.device() == device);
    const std::size_t bytes = (std::size_t(1) << 20) + 123;
    auto win = comm.impl_transport()->make_window("cuda_ipc_peer_windows", bytes);
    if (w == PeerWindows::Off) {
      BOOST_TEST(win == nullptr, "peer_windows = off makes no window");
      continue;
    }
    BOOST_TEST(comm.stats().peer_mappings == comm.size() - 1, to_string(w) << ": one mapping per peer process");
    check_device_window(comm, to_string(w), std::move(win), bytes);
    BOOST_TEST(comm.stats().peer_mappings == 0, to_string(w) << ": every mapping closed with the window");
  }
  CommConfig nccl_only;
  nccl_only.peer_windows = PeerWindows::NcclSymmetric;
  BOOST_CHECK_EXCEPTION(make_cuda_ipc_communicator(host_world(), device, nccl_only), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::ConfigValue; });
  BOOST_CHECK_EXCEPTION(make_cuda_ipc_communicator(host_world(), -1), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::ConfigValue; });
  BOOST_CHECK_EXCEPTION(make_cuda_ipc_communicator(Communicator(), device), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::TransportMismatch; });
}
#endif

BOOST_AUTO_TEST_CASE_TEMPLATE(transport_mismatch, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  if (!is_cuda<Exec>()) {
    // A host space needs an MPI communicator: the NCCL one of a CUDA build is refused.
#if defined(KOKKOS_ENABLE_CUDA)
    const Communicator& nccl = ep_comm<Kokkos::Cuda>();
    BOOST_CHECK_EXCEPTION(EpGroup<Exec>(Exec(), nccl, default_config(nccl.size())), InvalidArgument,
                          [](const InvalidArgument& e) { return e.rule() == Rule::TransportMismatch; });
#endif
    return;
  }
  // Kokkos::Cuda needs an NCCL communicator: the MPI one is refused.
  const Communicator& mpi = ep_comm<Kokkos::DefaultHostExecutionSpace>();
  BOOST_CHECK_EXCEPTION(EpGroup<Exec>(Exec(), mpi, default_config(mpi.size())), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::TransportMismatch; });
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mismatched_configs_fail_on_every_rank, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Communicator& comm = ep_comm<Exec>();
  if (comm.size() < 2) return;  // one rank cannot disagree with itself; the 2- and 4-rank runs cover it
  auto c = default_config(comm.size());
  if (comm.rank() == comm.size() - 1) c.hidden_size = 48;
  BOOST_CHECK_EXCEPTION(EpGroup<Exec>(Exec(), comm, c), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::CommConfigMismatch; });
}

// A configuration that is invalid on one rank only: that rank gets its own error, every other rank a
// CommConfigMismatch naming it, all within 2 s (not the communicator's timeout), and the communicator still works.
BOOST_AUTO_TEST_CASE_TEMPLATE(invalid_config_on_one_rank_fails_fast_everywhere, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  struct Bad {
    const char* what;
    int rank;
    Rule own;
    void (*apply)(EpGroupConfig&, int R);
  };
  const Bad cases[] = {
      {"hidden_size = 0 on rank 0", 0, Rule::ConfigValue, [](EpGroupConfig& c, int) { c.hidden_size = 0; }},
      {"ep_size = R + 1 on the last rank", R - 1, Rule::CommSize, [](EpGroupConfig& c, int n) { c.ep_size = n + 1; }},
      {"topk > num_experts on the last rank", R - 1, Rule::ConfigValue,
       [](EpGroupConfig& c, int) { c.topk = c.num_experts + 1; }},
      // The deprecated names beside different values of the fields they name.
      {"hidden (deprecated) != hidden_size on the last rank", R - 1, Rule::ConfigValue,
       [](EpGroupConfig& c, int) { c.hidden.value = c.hidden_size + 1; }},
      {"top_k (deprecated) != topk on rank 0", 0, Rule::ConfigValue,
       [](EpGroupConfig& c, int) { c.top_k.value = c.topk + 1; }},
      {"max_sms = 0 on rank 0", 0, Rule::ConfigValue, [](EpGroupConfig& c, int) { c.max_sms = 0; }},
  };
  for (const Bad& b : cases) {
    BOOST_TEST_CONTEXT(b.what << " (" << R << " ranks)") {
      auto c = default_config(R);
      c.hidden_size = 8;
      if (me == b.rank) b.apply(c, R);
      const auto t0 = std::chrono::steady_clock::now();
      Rule got = Rule::ShapeMismatch;
      std::string msg;
      try {
        EpGroup<Exec> group(exec, comm, c);
      } catch (const InvalidArgument& e) {
        got = e.rule();
        msg = e.what();
      }
      const double dt = seconds_since(t0);
      BOOST_TEST(dt < 2.0, "the typed error took " << dt << " s");
      if (me == b.rank) {
        BOOST_TEST(static_cast<int>(got) == static_cast<int>(b.own), msg);
      } else {
        BOOST_TEST(static_cast<int>(got) == static_cast<int>(Rule::CommConfigMismatch), msg);
        BOOST_TEST(msg.find("rank(s) " + std::to_string(b.rank)) != std::string::npos, msg);
      }
    }
  }
  // Nobody was left behind in a collective: a valid group and a step still work on every rank.
  const auto c = default_config(R);
  step_still_matches_oracle(exec, comm, c, group_inputs(c, Routing::Uniform, 17, false, false),
                            "y after the failed constructions");
}

// The former field names (EpGroupConfig::hidden, ::top_k) still configure a group, with a deprecation warning: the
// group takes their values where hidden_size and topk are 0, and its config() holds both names.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
BOOST_AUTO_TEST_CASE_TEMPLATE(deprecated_field_names_configure_a_group, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const auto want = default_config(comm.size());
  auto c = want;
  c.hidden_size = 0;
  c.topk = 0;
  c.hidden = want.hidden_size;
  c.top_k = want.topk;
  EpGroup<Exec> group(exec, comm, c);
  BOOST_TEST(group.config().hidden_size == want.hidden_size);
  BOOST_TEST(group.config().topk == want.topk);
  BOOST_TEST(static_cast<int>(group.config().hidden) == want.hidden_size);
  BOOST_TEST(static_cast<int>(group.config().top_k) == want.topk);
  auto handle = group.make_handle();
  const auto in = group_inputs(want, Routing::Skewed, 19, false, false);
  const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Weighted);
  const StepOutputs expected = expected_step(want, in, comm.rank(), CombineMode::Weighted, false);
  compare("y of a group configured through the deprecated names", got.y, expected.y, false, expected.y.size());
}
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

// ----- case 2: handle separation -----------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(handles_never_alias, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const auto c = default_config(comm.size());
  EpGroup<Exec> group(exec, comm, c);
  auto a = group.make_handle({true, "layer 0"});
  auto b = group.make_handle({true, "layer 1"});
  std::set<const void*> seen;
  for (const void* p : a.impl_buffers()) seen.insert(p);
  for (const void* p : b.impl_buffers()) BOOST_TEST(seen.count(p) == 0u);
  BOOST_TEST(group.handle_bytes() > 0u);
  // Two layers in flight: layer 0's backward after layer 1's layout still uses layer 0's layout.
  const auto in0 = group_inputs(c, Routing::Uniform, 11, false, false);
  const auto in1 = group_inputs(c, Routing::Skewed, 12, false, false);
  StepViews<Exec, float> s0(c, in0[comm.rank()]), s1(c, in1[comm.rank()]);
  ep_layout(exec, a, s0.idx);
  ep_layout(exec, b, s1.idx);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> rx("rx", a.num_recv_rows(), c.hidden_size);
  Kokkos::View<float*, typename Exec::memory_space> rw("rw", a.num_recv_rows());
  ep_dispatch(exec, a, s0.x, s0.w, rx, rw);
  const auto want = expected_step(c, in0, comm.rank(), CombineMode::Sum, false);
  compare("recv_x (layer 0 after layer 1's layout)", to_host_floats(rx), want.recv_x, false, want.recv_x.size());
  // Handle reuse: a training handle takes no new layout before its backward ran.
  BOOST_CHECK_EXCEPTION(ep_layout(exec, a, s1.idx), InvalidArgument,
                        [](const InvalidArgument& e) { return e.rule() == Rule::HandleReuse; });
  ep_synchronize(exec, a);
}

// ----- bad input -----------------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(bad_input_is_a_typed_error, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const auto c = default_config(comm.size());
  EpGroup<Exec> group(exec, comm, c);
  auto h = group.make_handle({false, "bad input"});
  const auto in = group_inputs(c, Routing::Uniform, 21, false, false);
  StepViews<Exec, float> s(c, in[comm.rank()]);
  auto rule = [](Rule r) { return [r](const InvalidArgument& e) { return e.rule() == r; }; };
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", 64, c.hidden_size);
  Kokkos::View<float*, Mem> rw("rw", 64);
  // Dispatch before any layout.
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, s.x, s.w, rx, rw), InvalidArgument, rule(Rule::HandleState));
  // T > max_tokens_per_rank (the send capacity), wrong K.
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> big("big", c.max_tokens_per_rank + 1, c.topk);
  BOOST_CHECK_EXCEPTION(ep_layout(exec, h, big), InvalidArgument, rule(Rule::ShapeMismatch));
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> wide("wide", 2, c.topk + 1);
  BOOST_CHECK_EXCEPTION(ep_layout(exec, h, wide), InvalidArgument, rule(Rule::ShapeMismatch));
  ep_layout(exec, h, s.idx);
  const int N = h.num_recv_rows();
  // x with the wrong row count or hidden size; recv_x too small.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x_bad("x_bad", s.x.extent(0) + 1, c.hidden_size);
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, x_bad, s.w, rx, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x_h("x_h", s.x.extent(0), c.hidden_size + 1);
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, x_h, s.w, rx, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  if (N > 0) {
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx_small("rx_small", N - 1, c.hidden_size);
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, s.x, s.w, rx_small, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  }
  // A strided (non-contiguous) x: every other column of a wider View.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> wider("wider", s.x.extent(0), 2 * c.hidden_size);
  auto strided = Kokkos::subview(wider, Kokkos::ALL, std::make_pair(0, c.hidden_size));
  if (s.x.extent(0) > 1)
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, strided, s.w, rx, rw), InvalidArgument, rule(Rule::NotContiguous));
  // A column-major x.
  Kokkos::View<float**, Kokkos::LayoutLeft, Mem> left("left", s.x.extent(0), c.hidden_size);
  if (s.x.extent(0) > 1)
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, left, s.w, rx, rw), InvalidArgument, rule(Rule::NotContiguous));
  // Combine with a bad mode value.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> y("y", s.x.extent(0), c.hidden_size);
  BOOST_CHECK_EXCEPTION(ep_combine(exec, h, static_cast<CombineMode>(7), rx, s.w, y), InvalidArgument,
                        rule(Rule::ConfigValue));
  ep_synchronize(exec, h);
  // Expert ids >= E and < -1 on one rank: every rank gets the typed error (the counts carry the finding), and the
  // layouts that threw add nothing to the expert load.
  const auto load_before = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h.expert_load());
  for (int bad : {c.num_experts, -2, 1 << 30}) {
    auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.idx);
    if (comm.rank() == 0 && hi.extent(0) > 0) hi(0, 0) = bad;
    Kokkos::deep_copy(s.idx, hi);
    BOOST_CHECK_EXCEPTION(ep_layout(exec, h, s.idx), InvalidArgument, rule(Rule::ExpertIdRange));
  }
  const auto load_after = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h.expert_load());
  for (std::size_t l = 0; l < load_after.extent(0); ++l)
    BOOST_TEST(load_after(l) == load_before(l), "expert load of local expert " << l);
  // Capacity mode: the finding surfaces at the next synchronization; those slots were treated as -1.
  auto cc = c;
  cc.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * c.ep_size;
  EpGroup<Exec> cgroup(exec, comm, cc);
  auto ch = cgroup.make_handle({false, "capacity"});
  ep_layout(exec, ch, s.idx);
  BOOST_CHECK_EXCEPTION(ep_synchronize(exec, ch), InvalidArgument, rule(Rule::ExpertIdRange));
}

// ----- ownership: the group and its handles keep the transport alive -----------------------------------------------
BOOST_AUTO_TEST_CASE_TEMPLATE(group_outlives_its_communicator, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const auto c = default_config(ep_comm<Exec>().size());
  const auto in = group_inputs(c, Routing::Uniform, 31, false, false);
  std::unique_ptr<EpGroup<Exec>> group;
  {
    Communicator split = ep_comm<Exec>().split(0, ep_comm<Exec>().rank());  // destroyed before the step runs
    group = std::make_unique<EpGroup<Exec>>(exec, split, c);
  }
  auto handle = group->make_handle();
  const int me = group->rank();
  group.reset();  // the handle alone keeps the group state and the transport
  StepViews<Exec, float> s(c, in[me]);
  ep_layout(exec, handle, s.idx);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> rx("rx", handle.num_recv_rows(),
                                                                             c.hidden_size);
  Kokkos::View<float*, typename Exec::memory_space> rw("rw", handle.num_recv_rows());
  ep_dispatch(exec, handle, s.x, s.w, rx, rw);
  ep_synchronize(exec, handle);
  const auto want = expected_step(c, in, me, CombineMode::Sum, false);
  compare("recv_x", to_host_floats(rx), want.recv_x, false, want.recv_x.size());
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> gx("gx", s.x.extent(0), c.hidden_size);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> gw("gw", s.x.extent(0), c.topk);
  ep_dispatch_backward(exec, handle, rx, rw, gx, gw);
  ep_synchronize(exec, handle);
}

BOOST_AUTO_TEST_SUITE_END()

// ----- case 3: layout outputs ----------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ep_layout_outputs)

// The work shapes the kernels derive from a step's size, against their rules written out: a layout chunk holds at
// most 32 tokens and 2048 slots; a decode-sized row splits into blocks of at least kSplitUnits units (the last may
// be short, none empty) while the kernel keeps at most the teams it asks for, and a row too narrow to split or a
// step of as many tokens as teams keeps one block per token.
BOOST_AUTO_TEST_CASE(work_shapes_follow_their_rules) {
  for (int k : {1, 2, 8, 9, 64, 65, 100, 2047, 2048, 5000}) {
    const int c = Impl::layout_chunk(k);
    BOOST_TEST(c >= 1, "top_k " << k);
    BOOST_TEST(c <= 32, "top_k " << k);
    BOOST_TEST((c == 1 || static_cast<long long>(c) * k <= 2048), "top_k " << k);
    BOOST_TEST((c == 32 || static_cast<long long>(c + 1) * k > 2048), "top_k " << k << ": the largest chunk that fits");
  }
  for (int teams : {1, 512, 528, 792, 1024})
    for (int units : {1, 127, 128, 129, 256, 896, 1030, 3584})
      for (int T : {1, 2, 3, 40, 127, 128, 129, 500, 1023, 1024, 4096}) {
        const Impl::RowSplit r = Impl::row_split(T, units, teams);
        const std::string at =
            "T " + std::to_string(T) + ", units " + std::to_string(units) + ", teams " + std::to_string(teams);
        BOOST_TEST(r.blocks >= 1, at);
        BOOST_TEST(r.begin(r.blocks - 1) < units, at << ": no empty block");
        BOOST_TEST(r.end(r.blocks - 1, units) == units, at << ": the blocks cover the row");
        if (r.blocks > 1) {
          BOOST_TEST(static_cast<long long>(r.blocks) * T <= teams, at << ": at most the teams asked for");
          BOOST_TEST(units / r.blocks >= Impl::kSplitUnits, at << ": blocks of at least kSplitUnits units");
        }
        const bool can_split = units / Impl::kSplitUnits >= 2 && 2LL * T <= teams;
        BOOST_TEST((r.blocks > 1) == can_split, at << ": splits exactly where two blocks fit");
      }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(layout_matches_host_histogram, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 37;
  c.expert_alignment = 8;
  c.topk = 2;
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::AllToOneExpert, Routing::WithMinusOne}) {
    const auto in = group_inputs(c, r, 41, false, true);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "layout"});
    StepViews<Exec, float> s(c, in[comm.rank()]);
    ep_layout(exec, handle, s.idx);
    const auto want = expected_step(c, in, comm.rank(), CombineMode::Sum, false);
    BOOST_TEST(handle.num_recv_rows() == want.recv_rows);
    BOOST_TEST(handle.num_recv_rows() % c.expert_alignment == 0);
    BOOST_TEST(to_host<int>(handle.tokens_per_expert()) == want.tokens_per_expert, boost::test_tools::per_element());
    BOOST_TEST(to_host<int>(handle.tokens_per_rank()) == want.tokens_per_rank, boost::test_tools::per_element());
    BOOST_TEST(to_host<std::uint8_t>(handle.token_in_rank()) == want.token_in_rank, boost::test_tools::per_element());
    BOOST_TEST(to_host<int>(handle.count_matrix()) == want.counts, boost::test_tools::per_element());
    BOOST_TEST(to_host<int>(handle.recv_expert()) == want.recv_expert, boost::test_tools::per_element());
    // The receive counts per local expert are the column sums of the count matrix.
    const auto rc = to_host<int>(handle.recv_counts());
    const int L = group.num_local_experts(), E = c.num_experts;
    for (int l = 0; l < L; ++l) {
      int n = 0;
      for (int i = 0; i < comm.size(); ++i)
        n += want.counts[static_cast<std::size_t>(i) * (E + 1) + comm.rank() * L + l];
      BOOST_TEST(rc[l] == n);
    }
    ep_synchronize(exec, handle);
  }
}

#if defined(KOKKOSMOE_HAVE_SHARDING)
BOOST_AUTO_TEST_CASE_TEMPLATE(wire_bytes_match_the_planner, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  // docs/planner.md §4 predicts one row per token and destination rank; the layer sends exactly that. Routing drawn
  // from the planner's own models, 2048 tokens per rank: the measured dispatch bytes of every rank within 2 % of the
  // prediction (rank_hit_probabilities, and make_plan on the 8-GPU fixture where the EP size fits it).
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  if (R == 1) return;  // nothing leaves the rank: both sides are 0 (wire_bytes_are_exact covers it)
  for (RoutingModel model : {RoutingModel::Uniform, RoutingModel::GroupQuota}) {
    BOOST_TEST_CONTEXT("routing model " << to_string(model)) {
      MoeLayerConfig layer;
      layer.num_experts = 16 * R;
      layer.topk = 8;
      layer.num_groups = 8;
      layer.group_topk = model == RoutingModel::GroupQuota ? 4 : 0;
      layer.hidden_size = 1024;
      layer.dispatch_dtype = layer.combine_dtype = TokenDType::FP32;
      layer.tokens_per_rank = 2048;
      layer.routing_model = model;
      const std::vector<double> hit = rank_hit_probabilities(layer, R);
      double remote = 0;
      for (int r = 0; r < R; ++r) remote += r == me ? 0 : hit[r];
      const double row = token_row_bytes(TokenDType::FP32, layer.hidden_size);
      const double predicted = static_cast<double>(layer.tokens_per_rank) * row * remote;
      if (8 % R == 0) {
        PlanRequest req;
        req.cluster.node = load_topology_xml_file(std::string(KOKKOSMOE_TEST_FIXTURES) + "/hgx_h100_8gpu_4sw.xml");
        req.layer = layer;
        req.constraints.fixed_ep_size = R;
        const Plan plan = make_plan(req);
        BOOST_TEST(std::fabs(plan.traffic.dispatch.bytes_sent - predicted) <= 1e-6 * predicted);
      }
      // Routing from the model: GroupQuota picks group_topk of the groups, then topk / group_topk experts in each.
      std::mt19937_64 gen(4242 + me * 31 + static_cast<int>(model));
      EpGroupConfig c;
      c.ep_size = R;
      c.num_experts = layer.num_experts;
      c.hidden_size = layer.hidden_size;
      c.topk = layer.topk;
      c.max_tokens_per_rank = static_cast<int>(layer.tokens_per_rank);
      RankInputs in;
      in.T = c.max_tokens_per_rank;
      in.idx.resize(static_cast<std::size_t>(in.T) * c.topk);
      in.w.assign(in.idx.size(), 0.5f);
      in.x.assign(static_cast<std::size_t>(in.T) * c.hidden_size, 1.0f);
      const int per_group = c.num_experts / layer.num_groups;
      for (int t = 0; t < in.T; ++t) {
        std::vector<int> pool;
        if (model == RoutingModel::GroupQuota) {
          std::vector<int> groups(layer.num_groups);
          std::iota(groups.begin(), groups.end(), 0);
          std::shuffle(groups.begin(), groups.end(), gen);
          for (int g = 0; g < layer.group_topk; ++g) {
            std::vector<int> members(per_group);
            std::iota(members.begin(), members.end(), groups[g] * per_group);
            std::shuffle(members.begin(), members.end(), gen);
            pool.insert(pool.end(), members.begin(), members.begin() + layer.topk / layer.group_topk);
          }
        } else {
          std::vector<int> all(c.num_experts);
          std::iota(all.begin(), all.end(), 0);
          std::shuffle(all.begin(), all.end(), gen);
          pool.assign(all.begin(), all.begin() + layer.topk);
        }
        for (int k = 0; k < c.topk; ++k) in.idx[static_cast<std::size_t>(t) * c.topk + k] = pool[k];
      }
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({false, "planner"});
      StepViews<Exec, float> sv(exec, c, in);
      ep_layout(exec, handle, sv.idx);
      const int N = handle.num_recv_rows();
      using Mem = typename Exec::memory_space;
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size);
      Kokkos::View<float*, Mem> rw("rw", N);
      const ByteCount before = group.stats().bytes["ep_dispatch"];
      ep_dispatch(exec, handle, sv.x, sv.w, rx, rw);
      ep_synchronize(exec, handle);
      const ByteCount after = group.stats().bytes["ep_dispatch"];
      const double wire = static_cast<double>(after.wire - before.wire);
      const double logical = static_cast<double>(after.logical - before.logical);
      BOOST_TEST(std::fabs(logical - predicted) <= 0.02 * predicted,
                 "logical " << logical << " B, predicted " << predicted << " B");
      BOOST_TEST(std::fabs(wire - predicted) <= 0.02 * predicted,
                 "wire " << wire << " B, predicted " << predicted << " B");
    }
  }
}
#endif

BOOST_AUTO_TEST_SUITE_END()

// ----- the caller's instance, and the documented fences (Kokkos Tools) -------------------------------------------
// The EP operations stay on the caller's execution space instance (docs/ep.md §6, the contract of KokkosMoE_EP.hpp):
// every Kokkos kernel of the layout, the dispatches (rows, FP8 rows, the split send and its hook), the combines (one
// call and split), both backwards and the statistics resets carries the Tools device id of an instance of the
// caller's own. Which of them fence is docs/ep.md §7.4's list, which documented_fence() below states and the test
// checks both ways (each listed call fences, every other one does not), at one rank and at two (where host execution
// spaces fence for MPI and the peers). Recorded through the callbacks of unit_test/KokkosToolsEvents.hpp, as the
// router's router_tools_instances suite does. The step's Views have EpStep.hpp's types, so the operations'
// instantiations are those of run_step.
using KokkosMoETest::expect_on_instance;
using KokkosMoETest::is_tools_own_fence;
using KokkosMoETest::kernel_count;
using KokkosMoETest::RecordToolsEvents;
using KokkosMoETest::ToolsEvent;

namespace {

/// Whether \p op fences, by docs/ep.md §7.4's rule (the same words in the README and KokkosMoE_EP.hpp; the
/// KokkosMoE_FenceRule test compares them):
/// fence-rule:
/// No EP operation fences, except the eager layout and `ep_synchronize`, which wait for the caller's instance (under an
/// SM partition, for the group's partition instance, which the operation ordered after the caller's). On host execution
/// spaces in a group of two or more ranks, every operation that moves rows (the layout, every dispatch and combine,
/// both backwards, the send of a split form) also fences the caller's instance before MPI or a peer reads what its
/// kernels wrote, and over shared windows so does the hook of a split send. `ep_reset_statistics` never fences. No
/// operation fences another instance or all of them.
/// (end of fence-rule)
template <class Exec>
bool documented_fence(const std::string& op, bool eager, int ranks, bool windows) {
  if (op == "ep_synchronize" || (op == "ep_layout" && eager)) return true;
  if (op.rfind("ep_reset_statistics", 0) == 0) return false;
  constexpr bool host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;
  if (!host || ranks < 2) return false;
  const bool hook = op.find("hook") != std::string::npos;
  return !hook || windows;
}

/// \p expected: the call fenced (some fence other than the Tools' own), every fence of the call being one of the
/// caller's backend, never a global one; otherwise: it did not fence.
template <class Exec>
void expect_fences(const std::string& op, const std::vector<ToolsEvent>& events, const Exec& exec, bool expected) {
  const std::uint32_t want_type =
      KokkosMoE::Impl::decode_tools_device_id(Kokkos::Tools::Experimental::device_id(exec)).type;
  int fences = 0;
  BOOST_TEST_CONTEXT(op) {
    for (const ToolsEvent& e : events) {
      if (e.kind != ToolsEvent::Kind::Fence || is_tools_own_fence(e)) continue;
      ++fences;
      BOOST_TEST(KokkosMoE::Impl::decode_tools_device_id(e.device_id).type == want_type,
                 "fence \"" << e.name << "\" not on the caller's backend");
      BOOST_TEST(e.name.find("Global") == std::string::npos, "a global fence: \"" << e.name << "\"");
    }
    BOOST_TEST((fences > 0) == expected,
               (expected ? "no fence in a call documented to fence" : "a fence in a call documented not to fence")
                   << " (" << fences << " fences)");
  }
}

/// One step of every EP operation on \p exec, in eager and in capacity mode and on the decode path, at the EP
/// group's size: check(operation, fence documented, events) gets the Kokkos Tools events of each call.
template <class Exec, class Check>
void each_ep_operation(const Exec& exec, Check&& check, int max_sms = -1) {
  using Mem = typename Exec::memory_space;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size();
  // Eager, capacity, and the fixed layout's decode path (docs/ep.md §15) in place of the layout.
  for (const int mode : {0, 1, 2}) {
    const bool capacity = mode == 1, decode = mode == 2;
    BOOST_TEST_CONTEXT(Exec::name() << " at " << R << " rank(s), "
                                    << (decode ? "decode path" : (capacity ? "capacity mode" : "eager mode"))) {
      EpGroupConfig c = default_config(R);
      c.hidden_size = kFp8BlockChannels;  // one FP8 scale block per row: the FP8 dispatch runs too
      if (capacity) c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * R;
      if (decode) c.layout = RecvLayout::ExpertMajorFixed;
      if (max_sms > 0) {
        c.max_sms = max_sms;
        c.sm_cap = SmCap::Partition;
      }
      const RankInputs in = make_inputs(c, Routing::Uniform, comm.rank(), c.max_tokens_per_rank, 5, false);
      const StepViews<Exec, float> sv(exec, c, in);
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle();
      const bool eager = !capacity && !decode;
      RecordToolsEvents rec;
      auto run = [&](const std::string& op, const auto& call) {
        const std::vector<ToolsEvent> events = rec.during(call);
        check(op, documented_fence<Exec>(op, eager, R, group.direct_writes()), events, group);
      };
      if (!decode) run("ep_layout", [&] { ep_layout(exec, handle, sv.idx); });
      // The Views of the step (EpStep.hpp's types), allocated outside the recorded calls.
      const int T = in.T, H = c.hidden_size, K = c.topk, nb = H / kFp8BlockChannels;
      const int N = decode ? group.capacity_rows() : handle.num_recv_rows();
      using Rows = Kokkos::View<float**, Kokkos::LayoutRight, Mem>;
      Rows rx("recv_x", N, H), ro("out", N, H), rgo("grad_out", N, H), y("y", T, H), grad_y("grad_y", T, H),
          grad_x("grad_x", T, H), grad_wc("grad_wc", T, K), grad_wd("grad_wd", T, K), rs("recv_scales", N, nb);
      Kokkos::View<float*, Mem> rw("recv_w", N), rw8("recv_w_fp8", N);
      Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> rq("recv_q", N, H);
      Kokkos::deep_copy(exec, ro, 0.5f);
      Kokkos::deep_copy(exec, grad_y, 0.25f);
      exec.fence();
      if (decode) run("ep_decode_dispatch", [&] { ep_decode_dispatch(exec, handle, sv.idx, sv.x, sv.w, rx, rw); });
      run("ep_dispatch", [&] { ep_dispatch(exec, handle, sv.x, sv.w, rx, rw); });
      run("ep_dispatch (FP8 rows)", [&] { ep_dispatch(exec, handle, sv.x, sv.w, fp8_rows(rq, rs), rw8); });
      std::optional<EpReceiveHook<Exec>> hook;
      run("ep_dispatch_send", [&] { hook.emplace(ep_dispatch_send(exec, handle, sv.x, sv.w, rx, rw)); });
      run("ep_dispatch_send's hook", [&] { (*hook)(exec); });
      run("ep_combine", [&] { ep_combine(exec, handle, CombineMode::Weighted, ro, sv.w, y); });
      run("ep_combine_send", [&] { hook.emplace(ep_combine_send(exec, handle, CombineMode::Weighted, ro, sv.w, y)); });
      run("ep_combine_send's hook", [&] { (*hook)(exec); });
      run("ep_combine_backward",
          [&] { ep_combine_backward(exec, handle, CombineMode::Weighted, grad_y, sv.w, ro, rgo, grad_wc); });
      run("ep_dispatch_backward", [&] { ep_dispatch_backward(exec, handle, rgo, rw, grad_x, grad_wd); });
      run("ep_reset_statistics (handle)", [&] { ep_reset_statistics(exec, handle); });
      run("ep_reset_statistics (group)", [&] { ep_reset_statistics(exec, group); });
      run("ep_synchronize", [&] { ep_synchronize(exec, handle); });
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ep_tools_instances)

namespace {
/// The kernels among \p events that a backend's native code launched (docs/ep.md §3.6: reported as "...[cuda]").
int native_kernel_count(const std::vector<ToolsEvent>& events) {
  const std::string tag = "[cuda]";
  int n = 0;
  for (const ToolsEvent& e : events)
    n += e.kind != ToolsEvent::Kind::Fence && e.name.size() >= tag.size() &&
         e.name.compare(e.name.size() - tag.size(), tag.size(), tag) == 0;
  return n;
}
}  // namespace

// Every kernel of the EP operations runs on the caller's backend; the dispatch and the combine launch some (a call the
// Tools saw no kernel of would make the check vacuous). Where the backend has native kernels (docs/ep.md §3.6: on
// Kokkos::Cuda the FP8 pack and the Weighted combine backward's expert side) the operations run them, one each; on
// other backends every kernel is a Kokkos kernel. A native kernel that stopped taking the step's shapes would leave
// the Cuda test matrix checking only the portable kernels: this says which ran.
BOOST_AUTO_TEST_CASE_TEMPLATE(kernels_on_the_user_backend, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
#if defined(KOKKOS_ENABLE_CUDA)
  constexpr bool native = std::is_same<Exec, Kokkos::Cuda>::value;
#else
  constexpr bool native = false;
#endif
  const Exec exec = Impl::partitioned_instance(Exec());
  each_ep_operation(exec, [&](const std::string& op, bool, const std::vector<ToolsEvent>& events, const auto&) {
    expect_on_instance(op, events, exec, /*whole_id=*/false, /*fences_allowed=*/true);
    if (op == "ep_dispatch" || op == "ep_combine") BOOST_TEST(kernel_count(events) > 0, op << ": no kernel seen");
    const bool has_native = native && (op == "ep_dispatch (FP8 rows)" || op == "ep_combine_backward");
    BOOST_TEST(native_kernel_count(events) == (has_native ? 1 : 0),
               op << ": " << native_kernel_count(events) << " native kernels");
  });
}

// The decode path is one kernel each way (docs/ep.md §15): the decode dispatch, and the combine on its handle, at one
// rank (nothing travels) and over the windows (the kernel's teams signal and wait); over messages the layout, the
// dispatch and the transfers stay separate.
BOOST_AUTO_TEST_CASE_TEMPLATE(decode_one_kernel_each_way, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = Impl::partitioned_instance(Exec());
  bool decode = false;  // each_ep_operation runs eager, capacity, then the decode path, each ending at ep_synchronize
  int checked = 0;
  each_ep_operation(exec, [&](const std::string& op, bool, const std::vector<ToolsEvent>& events, const auto& group) {
    if (op == "ep_decode_dispatch") decode = true;
    const bool one_kernel = ep_comm<Exec>().size() == 1 || group.direct_writes();
    if (decode && one_kernel && (op == "ep_decode_dispatch" || op == "ep_combine")) {
      BOOST_TEST(kernel_count(events) == 1, op << ": " << kernel_count(events) << " kernels");
      ++checked;
    }
    if (op == "ep_synchronize") decode = false;
  });
  if (checked == 0) BOOST_TEST_MESSAGE("no decode step over windows or at one rank here: messages between ranks");
}

// ... and on the caller's instance itself, where the backend tells instances apart.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(KokkosMoETest::OwnInstanceIds{}))
BOOST_AUTO_TEST_CASE_TEMPLATE(kernels_on_the_user_instance, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = Impl::partitioned_instance(Exec());
  each_ep_operation(exec, [&](const std::string& op, bool, const std::vector<ToolsEvent>& events, const auto&) {
    expect_on_instance(op, events, exec, /*whole_id=*/true, /*fences_allowed=*/true);
  });
}

// Exactly the documented fences (docs/ep.md §7.4), on the caller's backend.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(KokkosMoETest::fences_are_reported))
BOOST_AUTO_TEST_CASE_TEMPLATE(only_the_documented_fences, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Exec exec = Impl::partitioned_instance(Exec());
  each_ep_operation(exec, [&](const std::string& op, bool fence, const std::vector<ToolsEvent>& events, const auto&) {
    expect_fences(op, events, exec, fence);
  });
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_SM_PARTITION)
// Under an SM partition (docs/ep.md §13) every kernel of every operation runs on the group's partition instance, not
// on the caller's, and no operation fences the caller's instance: the eager layout and ep_synchronize wait for the
// partition's instance, which the operation ordered after the caller's earlier work.
BOOST_TEST_DECORATOR(*boost::unit_test::precondition(KokkosMoETest::OwnInstanceIds{}))
BOOST_AUTO_TEST_CASE(cuda_kernels_on_the_partition_instance) {
  using Exec = Kokkos::Cuda;
  const Exec exec = Impl::partitioned_instance(Exec());
  if (Impl::sm_partition_size(exec.cuda_device(), 16) == 0) {
    BOOST_TEST_MESSAGE("skipped: the driver makes no SM partition (green context) on this device");
    return;
  }
  const std::uint32_t caller = Kokkos::Tools::Experimental::device_id(exec);
  each_ep_operation(
      exec,
      [&](const std::string& op, bool, const std::vector<ToolsEvent>& events, const EpGroup<Exec>& group) {
        BOOST_TEST(group.partition_sms() > 0);
        if (group.partition_sms() == 0) return;
        const Exec& lane = group.impl_state()->lane.exec();
        BOOST_TEST(Kokkos::Tools::Experimental::device_id(lane) != caller);
        expect_on_instance(op, events, lane, /*whole_id=*/true, /*fences_allowed=*/true);
        for (const ToolsEvent& e : events)
          BOOST_TEST(!(e.kind == ToolsEvent::Kind::Fence && !is_tools_own_fence(e) && e.device_id == caller),
                     op << ": fence \"" << e.name << "\" of the caller's instance");
        if (op == "ep_dispatch" || op == "ep_combine") BOOST_TEST(kernel_count(events) > 0, op << ": no kernel seen");
      },
      16);
}
#endif

BOOST_AUTO_TEST_SUITE_END()
