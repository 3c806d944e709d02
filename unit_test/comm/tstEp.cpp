/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The EP test matrix of docs/ep.md §12 (cases 1-8 and 10), one source for every transport: host device types run
// over MPI, Kokkos::Cuda over NCCL. Every rank runs every case; expected values come from the plain-loop oracle.
#include <KokkosMoE_EnableDeviceTypes.hpp>

#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_Transport.hpp>
#if defined(KOKKOSMOE_HAVE_NCCL)
#include <KokkosMoE_Communicator_NCCL.hpp>
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
#include <random>
#include <set>
#include <string>
#include <vector>

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

EpGroupConfig default_config(int ep_size) {
  // docs/ep.md §12: 2 local experts, hidden 32, top-k 2, 4 tokens per shard.
  EpGroupConfig c;
  c.ep_size = ep_size;
  c.num_experts = 2 * ep_size;
  c.hidden = 32;
  c.top_k = 2;
  c.max_tokens_per_rank = 4;
  return c;
}

std::vector<RankInputs> group_inputs(const EpGroupConfig& c, Routing routing, std::uint64_t seed, bool bf16,
                                     bool vary_tokens) {
  std::vector<RankInputs> in;
  for (int r = 0; r < c.ep_size; ++r) {
    int T = c.max_tokens_per_rank;
    if (vary_tokens) T = (r == 1 % c.ep_size && c.ep_size > 1) ? 0 : c.max_tokens_per_rank - (r % 3);
    in.push_back(make_inputs(c, routing, r, T, seed, bf16));
  }
  return in;
}

bool close(float got, float want, bool bf16) {
  const float tol = bf16 ? 5e-2f : 1e-5f;
  return std::fabs(got - want) <= tol + tol * std::fabs(want);
}

std::string where(const char* what, std::size_t i) { return std::string(what) + "[" + std::to_string(i) + "]"; }

void compare(const char* what, const std::vector<float>& got, const std::vector<float>& want, bool bf16,
             std::size_t n) {
  BOOST_TEST_REQUIRE(got.size() >= n, what << ": " << got.size() << " values, expected >= " << n);
  int bad = 0;
  for (std::size_t i = 0; i < n && bad < 5; ++i)
    if (!close(got[i], want[i], bf16)) {
      ++bad;
      BOOST_TEST(false, where(what, i) << " = " << got[i] << ", expected " << want[i]);
    }
}

template <class Exec, class Scalar>
void check_step(const EpGroupConfig& c, Routing routing, CombineMode mode, std::uint64_t seed, bool vary_tokens,
                const std::string& label) {
  BOOST_TEST_CONTEXT(label << " mode " << to_string(mode) << " dtype "
                           << (std::is_same<Scalar, bf16_t>::value ? "bf16" : "fp32") << " routing "
                           << static_cast<int>(routing)) {
    Exec exec;
    const Communicator& comm = ep_comm<Exec>();
    constexpr bool bf16 = std::is_same<Scalar, bf16_t>::value;
    const auto in = group_inputs(c, routing, seed, bf16, vary_tokens);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const StepOutputs got = run_step<Exec, Scalar>(exec, group, handle, in[comm.rank()], mode);
    const StepOutputs want = expected_step(c, in, comm.rank(), mode, bf16);
    BOOST_TEST(got.recv_rows == want.recv_rows);
    BOOST_TEST(got.recv_expert == want.recv_expert, boost::test_tools::per_element());
    const std::size_t NH = static_cast<std::size_t>(want.recv_rows) * c.hidden;
    compare("recv_x", got.recv_x, want.recv_x, bf16, NH);
    compare("recv_w", got.recv_w, want.recv_w, false, want.recv_rows);
    compare("y", got.y, want.y, bf16, want.y.size());
    compare("grad_out", got.grad_out, want.grad_out, bf16, NH);
    if (mode == CombineMode::Weighted)
      compare("grad_w (combine)", got.grad_w_combine, want.grad_w_combine, bf16, want.grad_w_combine.size());
    compare("grad_x", got.grad_x, want.grad_x, bf16, want.grad_x.size());
    compare("grad_w (dispatch)", got.grad_w_dispatch, want.grad_w_dispatch, false, want.grad_w_dispatch.size());
    BOOST_TEST(got.tokens_per_expert == want.tokens_per_expert, boost::test_tools::per_element());
    BOOST_TEST(got.tokens_per_rank == want.tokens_per_rank, boost::test_tools::per_element());
    BOOST_TEST(got.token_in_rank == want.token_in_rank, boost::test_tools::per_element());
    BOOST_TEST(got.counts == want.counts, boost::test_tools::per_element());
    BOOST_TEST(got.offsets == want.offsets, boost::test_tools::per_element());
    BOOST_TEST(got.slot_kept == want.slot_kept, boost::test_tools::per_element());
    BOOST_TEST(got.offsets.back() <= got.recv_rows);
    BOOST_TEST(got.status.recv_demand == want.status.recv_demand);
    BOOST_TEST(got.status.dropped_slots == want.status.dropped_slots);
    BOOST_TEST(got.status.dropped_recv_slots == want.status.dropped_recv_slots);
  }
}

/// After a failure every rank survived: a new group and a Weighted step on \p in match the oracle's y.
template <class Exec>
void step_still_matches_oracle(const Exec& exec, const Communicator& comm, const EpGroupConfig& c,
                               const std::vector<RankInputs>& in, const char* what) {
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Weighted);
  const StepOutputs want = expected_step(c, in, comm.rank(), CombineMode::Weighted, false);
  compare(what, got.y, want.y, false, want.y.size());
}

/// Inputs with the given expert ids (-1 = empty slot) and seeded rows and weights.
RankInputs explicit_inputs(const EpGroupConfig& c, int rank, const std::vector<int>& idx, std::uint64_t seed) {
  const int T = static_cast<int>(idx.size()) / c.top_k;
  RankInputs in = make_inputs(c, Routing::Uniform, rank, T, seed, false);
  in.idx = idx;
  return in;
}

/// Capacity mode at its smallest: L local experts per rank, hidden 8, top-1, 2 tokens per rank, one receive row.
EpGroupConfig tiny_capacity_config(int R, int L) {
  EpGroupConfig c;
  c.ep_size = R;
  c.num_experts = L * R;
  c.hidden = 8;
  c.top_k = 1;
  c.max_tokens_per_rank = 2;
  c.max_recv_tokens_per_rank = 1;
  return c;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class Exec>
bool is_cuda() {
#if defined(KOKKOS_ENABLE_CUDA)
  return std::is_same<Exec, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

}  // namespace

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
  c.top_k = c.num_experts + 1;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  c = default_config(R);
  c.hidden = 0;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
  c = default_config(R);
  c.layout = RecvLayout::ExpertMajorFixed;
  c.max_recv_tokens_per_rank = 16;
  BOOST_TEST(static_cast<int>(rule_of([&] { EpGroup<Exec>(exec, comm, c); })) == static_cast<int>(Rule::ConfigValue));
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

#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_NCCL)
// The NCCL windows (docs/ep.md §7.2) of every kind, at the ranks this run has (one on one GPU): zero-filled, every
// rank's part addressable, a write into the next rank's part seen there, released collectively. Symmetric windows
// need NCCL >= 2.28 at run time; an older library must refuse them with CommError(Library) and auto must still give
// a window (CUDA IPC).
void nccl_barrier(const Communicator& comm) {
  Kokkos::View<int*, Kokkos::CudaSpace> one("one", 1), all("all", comm.size());
  Kokkos::Cuda exec;
  exec.fence();
  comm.impl_transport()->allgather("barrier", one.data(), all.data(), sizeof(int), exec.cuda_stream());
  comm.impl_transport()->wait("barrier", exec.cuda_stream());
}

BOOST_AUTO_TEST_CASE(nccl_peer_windows) {
  if (launch_size() > 0) return;  // one process per GPU without MPI: the id exchange serves the cached world only
  using Mem = Kokkos::CudaSpace;
  const int device = Kokkos::DefaultExecutionSpace().cuda_device();
  int version = 0;
  ncclGetVersion(&version);
  for (PeerWindows w : {PeerWindows::NcclSymmetric, PeerWindows::CudaIpc, PeerWindows::Auto}) {
    CommConfig cc;
    cc.peer_windows = w;
    Communicator comm = make_nccl_communicator(host_world(), device, cc);
    const int R = comm.size(), me = comm.rank();
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
    BOOST_REQUIRE_MESSAGE(win != nullptr, to_string(w) << ": no window on one node");
    BOOST_TEST(win->bytes == bytes);
    BOOST_REQUIRE(win->base.size() == static_cast<std::size_t>(R));
    const std::size_t n = bytes / sizeof(int);
    using Ints = Kokkos::View<int*, Mem, Kokkos::MemoryUnmanaged>;
    Ints mine(reinterpret_cast<int*>(win->base[me]), n), next(reinterpret_cast<int*>(win->base[(me + 1) % R]), n);
    int nonzero = 0;
    Kokkos::parallel_reduce(
        "nonzero", Kokkos::RangePolicy<Kokkos::Cuda>(0, n), KOKKOS_LAMBDA(std::size_t i, int& c) { c += mine(i) != 0; },
        nonzero);
    BOOST_TEST(nonzero == 0, to_string(w) << ": a new window is zero-filled");
    Kokkos::fence();
    nccl_barrier(comm);
    const int tag = 1000 + me;
    Kokkos::parallel_for(
        "write_next", Kokkos::RangePolicy<Kokkos::Cuda>(0, n),
        KOKKOS_LAMBDA(std::size_t i) { next(i) = tag + static_cast<int>(i % 7); });
    Kokkos::fence();
    nccl_barrier(comm);
    const int from = 1000 + (me + R - 1) % R;
    int wrong = 0;
    Kokkos::parallel_reduce(
        "check", Kokkos::RangePolicy<Kokkos::Cuda>(0, n),
        KOKKOS_LAMBDA(std::size_t i, int& c) { c += mine(i) != from + static_cast<int>(i % 7); }, wrong);
    BOOST_TEST(wrong == 0, to_string(w) << ": rows written by the previous rank");
    win.reset();  // collective release
    BOOST_TEST(!comm.aborted());
  }
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
  if (comm.rank() == comm.size() - 1) c.hidden = 48;
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
      {"hidden = 0 on rank 0", 0, Rule::ConfigValue, [](EpGroupConfig& c, int) { c.hidden = 0; }},
      {"ep_size = R + 1 on the last rank", R - 1, Rule::CommSize, [](EpGroupConfig& c, int n) { c.ep_size = n + 1; }},
      {"top_k > num_experts on the last rank", R - 1, Rule::ConfigValue,
       [](EpGroupConfig& c, int) { c.top_k = c.num_experts + 1; }},
  };
  for (const Bad& b : cases) {
    BOOST_TEST_CONTEXT(b.what << " (" << R << " ranks)") {
      auto c = default_config(R);
      c.hidden = 8;
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
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> rx("rx", a.num_recv_rows(), c.hidden);
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
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", 64, c.hidden);
  Kokkos::View<float*, Mem> rw("rw", 64);
  // Dispatch before any layout.
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, s.x, s.w, rx, rw), InvalidArgument, rule(Rule::HandleState));
  // T > max_tokens_per_rank (the send capacity), wrong K.
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> big("big", c.max_tokens_per_rank + 1, c.top_k);
  BOOST_CHECK_EXCEPTION(ep_layout(exec, h, big), InvalidArgument, rule(Rule::ShapeMismatch));
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> wide("wide", 2, c.top_k + 1);
  BOOST_CHECK_EXCEPTION(ep_layout(exec, h, wide), InvalidArgument, rule(Rule::ShapeMismatch));
  ep_layout(exec, h, s.idx);
  const int N = h.num_recv_rows();
  // x with the wrong row count or hidden size; recv_x too small.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x_bad("x_bad", s.x.extent(0) + 1, c.hidden);
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, x_bad, s.w, rx, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> x_h("x_h", s.x.extent(0), c.hidden + 1);
  BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, x_h, s.w, rx, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  if (N > 0) {
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx_small("rx_small", N - 1, c.hidden);
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, s.x, s.w, rx_small, rw), InvalidArgument, rule(Rule::ShapeMismatch));
  }
  // A strided (non-contiguous) x: every other column of a wider View.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> wider("wider", s.x.extent(0), 2 * c.hidden);
  auto strided = Kokkos::subview(wider, Kokkos::ALL, std::make_pair(0, c.hidden));
  if (s.x.extent(0) > 1)
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, strided, s.w, rx, rw), InvalidArgument, rule(Rule::NotContiguous));
  // A column-major x.
  Kokkos::View<float**, Kokkos::LayoutLeft, Mem> left("left", s.x.extent(0), c.hidden);
  if (s.x.extent(0) > 1)
    BOOST_CHECK_EXCEPTION(ep_dispatch(exec, h, left, s.w, rx, rw), InvalidArgument, rule(Rule::NotContiguous));
  // Combine with a bad mode value.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> y("y", s.x.extent(0), c.hidden);
  BOOST_CHECK_EXCEPTION(ep_combine(exec, h, static_cast<CombineMode>(7), rx, s.w, y), InvalidArgument,
                        rule(Rule::ConfigValue));
  ep_synchronize(exec, h);
  // Expert ids >= E and < -1 on one rank: every rank gets the typed error (the counts carry the finding).
  for (int bad : {c.num_experts, -2, 1 << 30}) {
    auto hi = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.idx);
    if (comm.rank() == 0 && hi.extent(0) > 0) hi(0, 0) = bad;
    Kokkos::deep_copy(s.idx, hi);
    BOOST_CHECK_EXCEPTION(ep_layout(exec, h, s.idx), InvalidArgument, rule(Rule::ExpertIdRange));
  }
  // Capacity mode: the finding surfaces at the next synchronization; those slots were treated as -1.
  auto cc = c;
  cc.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.top_k * c.ep_size;
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
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> rx("rx", handle.num_recv_rows(), c.hidden);
  Kokkos::View<float*, typename Exec::memory_space> rw("rw", handle.num_recv_rows());
  ep_dispatch(exec, handle, s.x, s.w, rx, rw);
  ep_synchronize(exec, handle);
  const auto want = expected_step(c, in, me, CombineMode::Sum, false);
  compare("recv_x", to_host_floats(rx), want.recv_x, false, want.recv_x.size());
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> gx("gx", s.x.extent(0), c.hidden);
  Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space> gw("gw", s.x.extent(0), c.top_k);
  ep_dispatch_backward(exec, handle, rx, rw, gx, gw);
  ep_synchronize(exec, handle);
}

BOOST_AUTO_TEST_SUITE_END()

// ----- case 3: layout outputs ----------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ep_layout_outputs)

BOOST_AUTO_TEST_CASE_TEMPLATE(layout_matches_host_histogram, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 37;
  c.expert_alignment = 8;
  c.top_k = 2;
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
      c.hidden = layer.hidden_size;
      c.top_k = layer.topk;
      c.max_tokens_per_rank = static_cast<int>(layer.tokens_per_rank);
      RankInputs in;
      in.T = c.max_tokens_per_rank;
      in.idx.resize(static_cast<std::size_t>(in.T) * c.top_k);
      in.w.assign(in.idx.size(), 0.5f);
      in.x.assign(static_cast<std::size_t>(in.T) * c.hidden, 1.0f);
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
        for (int k = 0; k < c.top_k; ++k) in.idx[static_cast<std::size_t>(t) * c.top_k + k] = pool[k];
      }
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({false, "planner"});
      StepViews<Exec, float> sv(exec, c, in);
      ep_layout(exec, handle, sv.idx);
      const int N = handle.num_recv_rows();
      using Mem = typename Exec::memory_space;
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden);
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

// ----- cases 4 and 5: round trips, gradients, the oracle over the adversarial matrix ---------------------------------
BOOST_AUTO_TEST_SUITE(ep_dispatch_combine)

BOOST_AUTO_TEST_CASE_TEMPLATE(step_matches_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const int R = ep_comm<Exec>().size();
  auto c = default_config(R);
  auto c2 = c;
  c2.num_experts = 3 * R;
  c2.hidden = 37;  // not a multiple of 16 bytes: the element-wise path
  c2.top_k = 3;
  c2.max_tokens_per_rank = 50;
  c2.expert_alignment = 4;
  for (Routing r : {Routing::Uniform, Routing::Skewed, Routing::AllToOneExpert, Routing::SomeExpertsEmpty,
                    Routing::WithMinusOne, Routing::Duplicates}) {
    for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
      check_step<Exec, float>(c, r, m, 100 + static_cast<int>(r), false, "default shape");
      check_step<Exec, bf16_t>(c2, r, m, 200 + static_cast<int>(r), true, "odd shape, T varies (T = 0 on rank 1)");
    }
  }
  // Capacity mode with room for everything, and the fixed expert-major layout.
  auto cap = c2;
  cap.max_recv_tokens_per_rank = cap.max_tokens_per_rank * cap.top_k * R + 64;
  check_step<Exec, float>(cap, Routing::Skewed, CombineMode::Weighted, 300, true, "capacity mode");
  check_step<Exec, bf16_t>(cap, Routing::Uniform, CombineMode::Sum, 301, false, "capacity mode");
  auto fixed = c;
  fixed.layout = RecvLayout::ExpertMajorFixed;
  check_step<Exec, bf16_t>(fixed, Routing::Uniform, CombineMode::Weighted, 302, false, "fixed layout");
  check_step<Exec, float>(fixed, Routing::AllToOneExpert, CombineMode::Sum, 303, true, "fixed layout");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(identity_expert_round_trip, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 12;
  for (Routing r : {Routing::Uniform, Routing::Skewed}) {
    const auto in = group_inputs(c, r, 51, false, false);
    const RankInputs& mine = in[comm.rank()];
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "identity"});
    // 3-D input [batch = 3, sequence = 4, hidden] flattened to [12, hidden] without a copy.
    Kokkos::View<float***, Kokkos::LayoutRight, Mem> x3("x3", 3, 4, c.hidden);
    StepViews<Exec, float> s(c, mine);
    Kokkos::deep_copy(
        x3, Kokkos::View<float***, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged>(s.x.data(), 3, 4, c.hidden));
    Kokkos::View<float**, Kokkos::LayoutRight, Mem, Kokkos::MemoryUnmanaged> x2(x3.data(), 12, c.hidden);
    // Normalized weights: the Weighted combine of the identity expert gives the input back.
    auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), s.w);
    for (int t = 0; t < mine.T; ++t) {
      float sum = 0;
      for (int k = 0; k < c.top_k; ++k) sum += hw(t, k);
      for (int k = 0; k < c.top_k; ++k) hw(t, k) /= sum;
    }
    Kokkos::deep_copy(s.w, hw);
    ep_layout(exec, handle, s.idx);
    const int N = handle.num_recv_rows();
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden);
    Kokkos::View<float*, Mem> rw("rw", N);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> y("y", mine.T, c.hidden), ysum("ysum", mine.T, c.hidden);
    ep_dispatch(exec, handle, x2, s.w, rx, rw);
    ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
    ep_combine(exec, handle, CombineMode::Sum, rx, Kokkos::View<float**, Kokkos::LayoutRight, Mem>(), ysum);
    ep_synchronize(exec, handle);
    auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
    auto hs = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ysum);
    for (int t = 0; t < mine.T; ++t)
      for (int h = 0; h < c.hidden; ++h) {
        const float xv = mine.x[static_cast<std::size_t>(t) * c.hidden + h];
        BOOST_TEST(close(hy(t, h), xv, false), "y(" << t << ", " << h << ") = " << hy(t, h) << ", x = " << xv);
        BOOST_TEST(close(hs(t, h), c.top_k * xv, false));
      }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(closed_form_gradients, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  using Mem = typename Exec::memory_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 9;
  const auto in = group_inputs(c, Routing::Uniform, 61, false, false);
  const RankInputs& mine = in[comm.rank()];
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  StepViews<Exec, float> s(c, mine);
  ep_layout(exec, handle, s.idx);
  const int N = handle.num_recv_rows(), T = mine.T, K = c.top_k, H = c.hidden;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, H), gout("gout", N, H), gx("gx", T, H);
  Kokkos::View<float*, Mem> rw("rw", N);
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> gw("gw", T, K), gwc("gwc", T, K), uni("uni", T, K);
  ep_dispatch(exec, handle, s.x, s.w, rx, rw);
  // Dispatch backward with every slot's upstream gradient its own token: grad_x = K * x; grad_w = recv_w.
  ep_dispatch_backward(exec, handle, rx, rw, gx, gw);
  // Combine backward with uniform weights 1/K: grad_out = grad_y / K; grad_w = dot(grad_y, out).
  Kokkos::deep_copy(uni, 1.0f / K);
  ep_combine_backward(exec, handle, CombineMode::Weighted, s.x, uni, rx, gout, gwc);
  ep_synchronize(exec, handle);
  auto hgx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gx);
  auto hgw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gw);
  auto hgwc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gwc);
  auto hgo = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), gout);
  auto hrx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rx);
  for (int t = 0; t < T; ++t) {
    float xx = 0;
    for (int h = 0; h < H; ++h) {
      const float xv = mine.x[static_cast<std::size_t>(t) * H + h];
      xx += xv * xv;
      BOOST_TEST(close(hgx(t, h), K * xv, false));
    }
    for (int k = 0; k < K; ++k) {
      BOOST_TEST(close(hgw(t, k), mine.w[static_cast<std::size_t>(t) * K + k], false));
      BOOST_TEST(std::fabs(hgwc(t, k) - xx) <= 1e-4f * (1 + xx));  // out = x (identity) so dot = |x|^2
    }
  }
  for (int r = 0; r < N; ++r)
    for (int h = 0; h < H; ++h) BOOST_TEST(close(hgo(r, h), hrx(r, h) / K, false));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(same_bits_every_run, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 40;
  c.top_k = 2;
  const auto in = group_inputs(c, Routing::Skewed, 71, true, true);
  EpGroup<Exec> group(exec, comm, c);
  auto h1 = group.make_handle();
  auto h2 = group.make_handle();
  const auto a = run_step<Exec, bf16_t>(exec, group, h1, in[comm.rank()], CombineMode::Weighted);
  const auto b = run_step<Exec, bf16_t>(exec, group, h2, in[comm.rank()], CombineMode::Weighted);
  BOOST_TEST(a.recv_x == b.recv_x);
  BOOST_TEST(a.y == b.y);
  BOOST_TEST(a.grad_x == b.grad_x);
  BOOST_TEST(a.grad_w_combine == b.grad_w_combine);
  BOOST_TEST(a.grad_out == b.grad_out);
}

BOOST_AUTO_TEST_SUITE_END()

// ----- cases 6, 7, 8 and 10 ----------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(ep_capacity_and_streams)

BOOST_AUTO_TEST_CASE_TEMPLATE(no_stray_communication, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  for (bool capacity : {false, true}) {
    auto c = default_config(comm.size());
    if (capacity) c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.top_k * c.ep_size;
    const auto in = group_inputs(c, Routing::Uniform, 81, false, false);
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const CommStats before = group.stats();
    run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Weighted);
    const CommStats after = group.stats();
    const int R = comm.size();
    // One count exchange and the layout's meta; dispatch and dispatch backward: one transfer each; the Weighted
    // combine and combine backward: two each (the weights to the experts' ranks, then the rows back; the rows with
    // their weights, then the dots back). Weights and weight gradients ride in their rows' trailers (docs/ep.md §3).
    // Direct writes into shared windows need no library call at all: the counts travel through the window too.
    const bool windows = comm.transport() == CommTransport::MpiShm && R > 1;
    BOOST_TEST(after.allgathers - before.allgathers == (windows ? 0 : 1));
    const std::int64_t transfers = R == 1 || windows ? 0 : 7;
    BOOST_TEST(after.alltoalls - before.alltoalls == (capacity ? transfers : 0));
    BOOST_TEST(after.exchanges - before.exchanges == (capacity ? 0 : transfers));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(wire_bytes_are_exact, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  const bool windows = comm.transport() == CommTransport::MpiShm;
  auto c = default_config(R);
  c.top_k = 3;
  c.num_experts = 3 * R;
  c.max_tokens_per_rank = 10;
  const auto in = group_inputs(c, Routing::Uniform, 97, false, false);
  // The oracle of docs/ep.md §9: one FP32 row per (token, remote rank it reaches), trailer of K floats.
  const int L = c.num_experts / R, H = c.hidden;
  std::int64_t rows = 0, slots = 0;
  for (int t = 0; t < in[me].T; ++t) {
    std::set<int> ranks;
    for (int k = 0; k < c.top_k; ++k) {
      const int e = in[me].idx[static_cast<std::size_t>(t) * c.top_k + k];
      if (e >= 0 && e / L != me) {
        ranks.insert(e / L);
        ++slots;
      }
    }
    rows += static_cast<std::int64_t>(ranks.size());
  }
  const std::int64_t pitch = (4 * H + 15) / 16 * 16 + (4 * c.top_k + 15) / 16 * 16;
  const std::int64_t signals = windows ? 16 * (R - 1) : 0;
  std::int64_t eager_wire = 0;
  for (bool capacity : {false, true}) {
    BOOST_TEST_CONTEXT((capacity ? "capacity" : "eager") << " mode") {
      auto cc = c;
      if (capacity) cc.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.top_k * R;
      EpGroup<Exec> group(exec, comm, cc);
      auto handle = group.make_handle();
      const ByteCount before = group.stats().bytes["ep_dispatch"];
      run_step<Exec, float>(exec, group, handle, in[me], CombineMode::Sum);
      const ByteCount after = group.stats().bytes["ep_dispatch"];
      const std::int64_t logical = after.logical - before.logical, wire = after.wire - before.wire;
      BOOST_TEST(logical == rows * 4 * H);
      BOOST_TEST(logical <= slots * 4 * H);  // deduplicated: never more than one row per remote slot
      if (!capacity) {
        BOOST_TEST(wire == (R == 1 ? 0 : rows * pitch + signals));
        eager_wire = wire;
      } else if (windows || R == 1) {
        BOOST_TEST(wire == eager_wire);  // direct writes send only real rows in capacity mode too
      } else {
        BOOST_TEST(wire == static_cast<std::int64_t>(R - 1) * c.max_tokens_per_rank * pitch);  // whole blocks
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(one_stream, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  const auto in = group_inputs(c, Routing::Uniform, 91, false, false);
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    {
      Kokkos::Cuda exec(stream);
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle();
      const CommStats before = group.stats();
      run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
      const CommStats after = group.stats();
      // Every library call of the step went to the instance's stream.
      BOOST_TEST(std::count(after.streams.begin(), after.streams.end(), static_cast<void*>(stream)) == 1);
      BOOST_TEST(after.calls > before.calls);
    }
    cudaStreamDestroy(stream);
    return;
  }
#endif
  Exec exec;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
  const CommStats s = group.stats();
  BOOST_TEST(s.streams.size() == 1u);
  BOOST_TEST(s.streams[0] == nullptr);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(drop_on_overflow, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  auto c = default_config(comm.size());
  c.max_tokens_per_rank = 16;
  c.max_recv_tokens_per_rank = 6;  // smaller than the skewed demand on rank 0
  c.drop_on_overflow = true;
  for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
    check_step<Exec, float>(c, Routing::Skewed, m, 401, false, "drop");
    check_step<Exec, bf16_t>(c, Routing::AllToOneExpert, m, 402, false, "drop");
  }
  // The reported demand exceeds the capacity where slots were dropped.
  const auto in = group_inputs(c, Routing::AllToOneExpert, 403, false, false);
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  const auto got = run_step<Exec, float>(exec, group, handle, in[comm.rank()], CombineMode::Sum);
  const auto want = expected_step(c, in, comm.rank(), CombineMode::Sum, false);
  BOOST_TEST(got.status.recv_demand == want.status.recv_demand);
  if (comm.rank() == comm.size() - 1) BOOST_TEST(got.status.recv_demand > c.max_recv_tokens_per_rank);
  // Without drop_on_overflow the same step fails at the synchronization on every rank when any rank overflowed;
  // each reports its own overflow, or the lowest rank that overflowed.
  c.drop_on_overflow = false;
  EpGroup<Exec> strict(exec, comm, c);
  auto sh = strict.make_handle({false, "strict"});
  StepViews<Exec, float> s(c, in[comm.rank()]);
  ep_layout(exec, sh, s.idx);
  const OracleLayout o = oracle_layout(c, in);
  int culprit = -1;
  for (int j = comm.size() - 1; j >= 0; --j)
    if (o.dropped_recv[j] > 0) culprit = j;
  if (o.dropped_recv[comm.rank()] > 0) culprit = comm.rank();
  if (culprit >= 0) {
    BOOST_CHECK_EXCEPTION(ep_synchronize(exec, sh), CapacityOverflow, [&](const CapacityOverflow& e) {
      return e.capacity() == c.max_recv_tokens_per_rank && e.rank() == culprit && e.demand() == o.demand[culprit];
    });
  } else {
    BOOST_CHECK_NO_THROW(ep_synchronize(exec, sh));
  }
}

// The minimal case of a kept row that was never written (3 ranks; any R >= 2 runs it): E = 4R, K = 1, B = 2,
// capacity 1, drop on overflow. Rank 0 routes nothing, rank 1 sends its 2 tokens to expert 1, rank 2 one token to
// expert 0 (experts 0 and 1 live on rank 0). Rank 0 keeps rank 2's row in row 0; rank 2's combine returns the
// expert's output for it. The segments of rank 1's overflowing slots must not hide rank 2's segment from the
// receive side's search (3, 5 and 6 ranks are where they did).
BOOST_AUTO_TEST_CASE_TEMPLATE(kept_rows_arrive_at_every_world_size, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  EpGroupConfig c = tiny_capacity_config(R, 4);
  c.drop_on_overflow = true;
  std::vector<RankInputs> in;
  for (int r = 0; r < R; ++r) {
    std::vector<int> idx = {-1, -1};
    if (r == 1) idx = {1, 1};
    if (r == 2) idx = {0, -1};
    in.push_back(explicit_inputs(c, r, idx, 601));
  }
  for (CombineMode m : {CombineMode::Sum, CombineMode::Weighted}) {
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle();
    const StepOutputs got = run_step<Exec, float>(exec, group, handle, in[me], m);
    const StepOutputs want = expected_step(c, in, me, m, false);
    compare("recv_x", got.recv_x, want.recv_x, false, want.recv_x.size());
    compare("y", got.y, want.y, false, want.y.size());
    BOOST_TEST(got.recv_expert == want.recv_expert, boost::test_tools::per_element());
    BOOST_TEST(got.status.dropped_slots == want.status.dropped_slots);
    BOOST_TEST(got.status.dropped_recv_slots == want.status.dropped_recv_slots);
    if (R >= 3 && me == 0) {
      // Row 0 is rank 2's token 0 (expert 0 comes first); rank 1's two rows for expert 1 are past the capacity.
      BOOST_TEST(got.recv_expert[0] == 0);
      for (int h = 0; h < c.hidden; ++h) BOOST_TEST(got.recv_x[h] == in[2].x[h]);
      BOOST_TEST(got.status.dropped_recv_slots == 2);
      BOOST_TEST(got.status.recv_demand == 3);
    }
    if (R >= 3 && me == 2) {
      const float cf = m == CombineMode::Weighted ? in[2].w[0] : 1.0f;
      for (int h = 0; h < c.hidden; ++h) BOOST_TEST(close(got.y[h], cf * expert_fn(in[2].x[h], 0, false), false));
    }
    if (R >= 2 && me == 1) BOOST_TEST(got.status.dropped_slots == (R >= 3 ? 2 : 1));
  }
}

// Overflow without drop: the receiver whose demand exceeds its capacity throws CapacityOverflow with its own
// demand, and so does every other rank (naming that rank), so no rank goes on alone into the next collective.
BOOST_AUTO_TEST_CASE_TEMPLATE(overflow_raises_on_every_rank, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  Exec exec;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size(), me = comm.rank();
  EpGroupConfig c = tiny_capacity_config(R, 2);
  const int victim = 1 % R;       // rank 1, or rank 0 itself at one rank
  const int expert = victim * 2;  // its first local expert
  std::vector<RankInputs> in;
  for (int r = 0; r < R; ++r)
    in.push_back(explicit_inputs(c, r, r == 0 ? std::vector<int>{expert, expert} : std::vector<int>{-1, -1}, 602));
  for (bool drop : {false, true}) {
    c.drop_on_overflow = drop;
    EpGroup<Exec> group(exec, comm, c);
    auto handle = group.make_handle({false, "overflow"});
    StepViews<Exec, float> sv(c, in[me]);
    const auto t0 = std::chrono::steady_clock::now();
    ep_layout(exec, handle, sv.idx);
    if (!drop) {
      BOOST_CHECK_EXCEPTION(ep_synchronize(exec, handle), CapacityOverflow, [&](const CapacityOverflow& e) {
        BOOST_TEST_MESSAGE("rank " << me << ": " << e.what());
        return e.rank() == victim && e.demand() == 2 && e.capacity() == 1;
      });
      BOOST_TEST(seconds_since(t0) < 2.0);
    } else {
      const EpStatus st = ep_synchronize(exec, handle);
      BOOST_TEST(st.recv_demand == (me == victim ? 2 : 0));
      BOOST_TEST(st.dropped_recv_slots == (me == victim ? 1 : 0));
      BOOST_TEST(st.dropped_slots == (me == 0 ? 1 : 0));
    }
  }
  // Every rank is still in step: a full step against the oracle.
  c.drop_on_overflow = true;
  step_still_matches_oracle(exec, comm, c, in, "y after the overflow");
}

// Randomized capacity-mode steps with drops against the oracle: shapes, alignment, capacity, layout, routing, mode
// and row type drawn from one seed (the same on every rank), at every world size the suites run at.
BOOST_AUTO_TEST_CASE_TEMPLATE(randomized_capacity_steps_match_oracle, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  const Communicator& comm = ep_comm<Exec>();
  const int R = comm.size();
  std::mt19937 gen(7001u + static_cast<unsigned>(R));
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  const Routing routings[] = {Routing::Uniform,          Routing::Skewed,       Routing::AllToOneExpert,
                              Routing::SomeExpertsEmpty, Routing::WithMinusOne, Routing::Duplicates};
  const int cases = 24;
  int dropped_somewhere = 0;
  for (int i = 0; i < cases; ++i) {
    EpGroupConfig c;
    c.ep_size = R;
    c.num_experts = R * pick(1, 6);
    c.top_k = pick(1, std::min(4, c.num_experts));
    c.hidden = i % 3 == 0 ? 13 : 16;  // 13: the element-wise path
    c.max_tokens_per_rank = pick(1, 10);
    const bool fixed = i % 5 == 4;
    c.layout = fixed ? RecvLayout::ExpertMajorFixed : RecvLayout::ExpertMajor;
    c.expert_alignment = fixed ? 1 : std::vector<int>{1, 2, 3, 4}[pick(0, 3)];
    // Mostly below the demand, so that slots drop: the room left after the first experts' rows is what the
    // receiver keeps.
    c.max_recv_tokens_per_rank = fixed ? 0 : pick(1, c.max_tokens_per_rank * c.top_k * R / (i % 2 == 0 ? 4 : 1) + 1);
    c.drop_on_overflow = true;
    const Routing routing = fixed ? Routing::Duplicates : routings[pick(0, 5)];
    const CombineMode mode = i % 2 == 0 ? CombineMode::Weighted : CombineMode::Sum;
    const std::string label = "random case " + std::to_string(i) + " (E " + std::to_string(c.num_experts) + ", K " +
                              std::to_string(c.top_k) + ", B " + std::to_string(c.max_tokens_per_rank) + ", C " +
                              std::to_string(c.max_recv_tokens_per_rank) + ", A " + std::to_string(c.expert_alignment) +
                              (fixed ? ", fixed" : "") + ")";
    const bool vary = i % 3 == 2 && c.max_tokens_per_rank >= 3;  // T = B - (rank % 3), T = 0 on rank 1
    const auto in = group_inputs(c, routing, 7100 + i, i % 4 == 1, vary);
    const OracleLayout o = oracle_layout(c, in);
    for (int d : o.dropped_recv) dropped_somewhere += d > 0;
    if (i % 4 == 1) {
      check_step<Exec, bf16_t>(c, routing, mode, 7100 + i, vary, label);
    } else {
      check_step<Exec, float>(c, routing, mode, 7100 + i, vary, label);
    }
  }
  BOOST_TEST(dropped_somewhere > 0, "no random case dropped a slot: the drop paths went untested");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(graph_capture_replays_new_routing, DeviceType, KOKKOSMOE_DEVICE_TYPES) {
  using Exec = typename DeviceType::execution_space;
  if (!is_cuda<Exec>()) {
    BOOST_TEST_MESSAGE(
        "graph capture needs Kokkos::Cuda; capacity mode's no-sync property is covered by "
        "no_stray_communication on host spaces");
    return;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
    using Mem = typename Exec::memory_space;
    const Communicator& comm = ep_comm<Exec>();
    auto c = default_config(comm.size());
    c.max_tokens_per_rank = 24;
    c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.top_k * c.ep_size;
    cudaStream_t stream = nullptr;
    cudaStreamCreate(&stream);
    {
      Kokkos::Cuda exec(stream);
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({false, "graph"});
      const auto in1 = group_inputs(c, Routing::Uniform, 501, false, false);
      const auto in2 = group_inputs(c, Routing::Skewed, 502, false, false);
      StepViews<Exec, float> s(c, in1[comm.rank()]);
      const int N = group.capacity_rows();
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden), y("y", s.x.extent(0), c.hidden);
      Kokkos::View<float*, Mem> rw("rw", N);
      // Warm up once eagerly (Kokkos' lazy first-launch setup), then capture layout, dispatch and combine.
      ep_layout(exec, handle, s.idx);
      ep_dispatch(exec, handle, s.x, s.w, rx, rw);
      ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
      ep_synchronize(exec, handle);
      cudaGraph_t graph = nullptr;
      BOOST_TEST_REQUIRE(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      ep_layout(exec, handle, s.idx);
      ep_dispatch(exec, handle, s.x, s.w, rx, rw);
      ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
      BOOST_TEST_REQUIRE(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
      cudaGraphExec_t inst = nullptr;
      BOOST_TEST_REQUIRE(cudaGraphInstantiate(&inst, graph, 0) == cudaSuccess);
      // New routing and tokens in the same buffers, then replay.
      StepViews<Exec, float> s2(c, in2[comm.rank()]);
      Kokkos::deep_copy(s.idx, s2.idx);
      Kokkos::deep_copy(s.w, s2.w);
      Kokkos::deep_copy(s.x, s2.x);
      Kokkos::fence();
      BOOST_TEST_REQUIRE(cudaGraphLaunch(inst, stream) == cudaSuccess);
      ep_synchronize(exec, handle);
      const auto want = expected_step(c, in2, comm.rank(), CombineMode::Weighted, false);
      compare("recv_x (replayed)", to_host_floats(rx), want.recv_x, false, want.recv_x.size());
      // The captured combine ran on the received rows themselves (an identity expert): y = sum of w * x.
      const std::vector<float> y_identity = identity_combine(c, in2, comm.rank());
      compare("y (replayed)", to_host_floats(y), y_identity, false, y_identity.size());
      cudaGraphExecDestroy(inst);
      cudaGraphDestroy(graph);
    }
    cudaStreamDestroy(stream);
  }
#endif
}

BOOST_AUTO_TEST_CASE(dp_and_ep_groups_follow_the_mesh) {
  const Communicator& world = host_world();
  const Test::Mesh mesh = host_mesh();
  const Communicator& ep = ep_comm<Kokkos::DefaultHostExecutionSpace>();
  const Communicator& dp = host_dp();
  BOOST_TEST(ep.size() == mesh.ep);
  BOOST_TEST(dp.size() == mesh.dp);
  BOOST_TEST(ep.rank() == world.rank() % mesh.ep);
  BOOST_TEST(dp.rank() == world.rank() / mesh.ep);
}

BOOST_AUTO_TEST_SUITE_END()
