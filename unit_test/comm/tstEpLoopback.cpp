/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The remote path of the EP layer in one process (docs/ep.md §7.3, §12): R loopback ranks, each a host thread with its
// own execution space instance, writing token rows into each other's windows. Each thread runs the step of its rank
// and compares it with the plain-loop oracle; Boost.Test is not thread-safe, so the threads return their findings
// as text and the main thread asserts on them. Kokkos::Cuda always; Kokkos::Serial where Kokkos runs independent
// Serial instances (Kokkos >= 4).
#include <KokkosMoE_Communicator_Loopback.hpp>

#include <EpInterleave.hpp>
#include <EpStep.hpp>
#include <boost/test/unit_test.hpp>
#include <impl/KokkosMoE_EP_Signal.hpp>
#include <impl/KokkosMoE_Transport.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

using namespace KokkosMoE;
using namespace KokkosMoE::Test;

namespace {

// Loopback ranks on one device (docs/ep.md §7.3): set before the test main initializes Kokkos (and with it CUDA).
const bool g_loopback_environment = [] {
  prepare_loopback_environment();
  return true;
}();

/// A reusable barrier of the test's own (C++17 has none), with a deadline: false (and withdrawn) past it.
class Meeting {
 public:
  explicit Meeting(int n) : m_n(n) {}
  bool wait(std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(m_mu);
    const std::uint64_t gen = m_gen;
    if (++m_arrived == m_n) {
      m_arrived = 0;
      ++m_gen;
      m_cv.notify_all();
      return true;
    }
    if (m_cv.wait_for(lock, limit, [&] { return m_gen != gen; })) return true;
    --m_arrived;
    return false;
  }

 private:
  int m_n, m_arrived = 0;
  std::uint64_t m_gen = 0;
  std::mutex m_mu;
  std::condition_variable m_cv;
};

/// One execution space instance per rank.
template <class Exec>
struct Instances {
  std::vector<Exec> exec;
#if defined(KOKKOS_ENABLE_CUDA)
  std::vector<cudaStream_t> streams;
#endif
  explicit Instances(int R) {
#if defined(KOKKOS_ENABLE_CUDA)
    if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) {
      for (int r = 0; r < R; ++r) {
        cudaStream_t s = nullptr;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        streams.push_back(s);
        exec.emplace_back(s);
      }
      return;
    }
#endif
#if defined(KOKKOSMOE_HAVE_SERIAL_INSTANCES)
    if constexpr (std::is_same<Exec, Kokkos::Serial>::value)
      for (int r = 0; r < R; ++r) exec.push_back(Impl::new_serial_instance());
#endif
  }
  ~Instances() {
    exec.clear();
#if defined(KOKKOS_ENABLE_CUDA)
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
#endif
  }
};

template <class Exec>
int loopback_device() {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (std::is_same<Exec, Kokkos::Cuda>::value) return Kokkos::Cuda().cuda_device();
#endif
  return -1;
}

/// Runs body(rank, exec, comm) on R threads; the findings of every rank, "" where it found nothing wrong.
template <class Exec, class Body>
std::vector<std::string> on_ranks(int R, const CommConfig& cc, Body&& body) {
  Instances<Exec> inst(R);
  std::vector<Communicator> comms = make_loopback_communicators(R, loopback_device<Exec>(), cc);
  std::vector<std::string> found(static_cast<std::size_t>(R));
  std::vector<std::thread> threads;
  for (int r = 0; r < R; ++r)
    threads.emplace_back([&, r] {
      try {
        found[r] = body(r, inst.exec[r], comms[r]);
      } catch (const std::exception& e) {
        found[r] = std::string("exception: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return found;
}

bool near(float got, float want, bool bf16) {
  const float tol = bf16 ? 5e-2f : 1e-5f;
  return std::fabs(got - want) <= tol + tol * std::fabs(want);
}

void diff(std::ostringstream& out, const char* what, const std::vector<float>& got, const std::vector<float>& want,
          bool bf16) {
  int bad = 0;
  if (got.size() < want.size()) out << what << ": " << got.size() << " values, expected " << want.size() << "; ";
  for (std::size_t i = 0; i < want.size() && i < got.size() && bad < 3; ++i)
    if (!near(got[i], want[i], bf16)) {
      ++bad;
      out << what << "[" << i << "] = " << got[i] << ", expected " << want[i] << "; ";
    }
}
template <class T>
void diff_exact(std::ostringstream& out, const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  if (got != want) out << what << " differs; ";
}

struct Case {
  const char* name;
  Routing routing;
  CombineMode mode;
  bool bf16;
  int layout;            // 0 eager, 1 capacity (room for all), 2 capacity with drops, 3 fixed
  int hidden_size = 40;  // 160-byte FP32 rows: Chunk16 units; bf16 rows of 80 bytes; a multiple of 128: FP8 rows too
  int max_sms = -1;      // the SM cap (docs/ep.md §13)
  bool split = false;    // dispatch and combine in two halves (docs/ep.md §14)
  bool decode = false;   // ep_decode_dispatch instead of ep_layout + ep_dispatch (docs/ep.md §15; layout 3)
  SmCap sm_cap = SmCap::Auto;  // how the cap is kept: on Cuda, Auto takes an SM partition where the device makes one
  int tokens = 9;              // max_tokens_per_rank
};

EpGroupConfig case_config(int R, const Case& k) {
  EpGroupConfig c;
  c.ep_size = R;
  c.num_experts = 2 * R;
  c.hidden_size = k.hidden_size;
  c.topk = 3 < c.num_experts ? 3 : c.num_experts;
  c.max_tokens_per_rank = k.tokens;
  c.expert_alignment = k.layout == 0 ? 4 : 1;
  if (k.layout == 1) c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk * R;
  if (k.layout == 2) {
    c.max_recv_tokens_per_rank = c.max_tokens_per_rank * c.topk / 2 + 1;
    c.drop_on_overflow = true;
  }
  if (k.layout == 3) c.layout = RecvLayout::ExpertMajorFixed;
  c.max_sms = k.max_sms;
  c.sm_cap = k.sm_cap;
  return c;
}

template <class Exec, class Scalar>
std::string rank_step(const Exec& exec, const Communicator& comm, const EpGroupConfig& c,
                      const std::vector<RankInputs>& in, CombineMode mode, bool split, bool decode) {
  constexpr bool bf16 = std::is_same<Scalar, bf16_t>::value;
  const int me = comm.rank();
  const StepOutputs want = expected_step(c, in, me, mode, bf16);
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle();
  const StepOutputs got = run_step<Exec, Scalar>(exec, group, handle, in[me], mode, want.recv_rows, split, decode);
  std::ostringstream out;
  if (got.recv_rows != want.recv_rows) out << "recv_rows " << got.recv_rows << " != " << want.recv_rows << "; ";
  diff_exact(out, "recv_expert", got.recv_expert, want.recv_expert);
  diff(out, "recv_x", got.recv_x, want.recv_x, bf16);
  diff(out, "recv_w", got.recv_w, want.recv_w, false);
  diff(out, "y", got.y, want.y, bf16);
  diff(out, "grad_out", got.grad_out, want.grad_out, bf16);
  if (mode == CombineMode::Weighted) diff(out, "grad_w (combine)", got.grad_w_combine, want.grad_w_combine, bf16);
  diff(out, "grad_x", got.grad_x, want.grad_x, bf16);
  diff(out, "grad_w (dispatch)", got.grad_w_dispatch, want.grad_w_dispatch, false);
  diff_exact(out, "counts", decode ? decode_counts(c, got.counts, me) : got.counts,
             decode ? decode_counts(c, want.counts, me) : want.counts);
  diff_exact(out, "offsets", got.offsets, want.offsets);
  diff_exact(out, "slot_kept", got.slot_kept, want.slot_kept);
  if (got.status.dropped_slots != want.status.dropped_slots) out << "dropped_slots differ; ";
  if (got.status.dropped_recv_slots != want.status.dropped_recv_slots) out << "dropped_recv_slots differ; ";
  out << fp8_differences(got, want);
  const CommStats st = group.stats();
  if (comm.size() > 1 && comm.peer_windows() != PeerWindows::Off && (st.exchanges != 0 || st.alltoalls != 0))
    out << "library calls in a step over windows: " << st.exchanges << " exchanges, " << st.alltoalls
        << " all-to-alls; ";
  return out.str();
}

template <class Exec>
void steps_match_oracle() {
  const Case cases[] = {
      {"eager uniform fp32 weighted", Routing::Uniform, CombineMode::Weighted, false, 0},
      {"eager skewed bf16 sum", Routing::Skewed, CombineMode::Sum, true, 0},
      {"capacity -1 fp32 weighted", Routing::WithMinusOne, CombineMode::Weighted, false, 1},
      {"capacity drops duplicates bf16 weighted", Routing::Duplicates, CombineMode::Weighted, true, 2},
      {"fixed all-to-one fp32 sum", Routing::AllToOneExpert, CombineMode::Sum, false, 3},
      {"eager uniform bf16 weighted, FP8 rows", Routing::Uniform, CombineMode::Weighted, true, 0, 256},
      {"capacity drops fp32 weighted, FP8 rows", Routing::Duplicates, CombineMode::Weighted, false, 2, 128},
      {"eager skewed bf16 weighted, FP8 rows, SM cap 1", Routing::Skewed, CombineMode::Weighted, true, 0, 256, 1},
      {"capacity drops bf16 weighted, SM cap 2", Routing::Duplicates, CombineMode::Weighted, true, 2, 40, 2},
      {"eager uniform bf16 weighted, SM cap 16 by teams, split", Routing::Uniform, CombineMode::Weighted, true, 0, 256,
       16, true, false, SmCap::Teams},
      {"eager uniform bf16 weighted, SM cap 16, split", Routing::Uniform, CombineMode::Weighted, true, 0, 256, 16,
       true},
      {"eager skewed fp32 weighted, split send/receive", Routing::Skewed, CombineMode::Weighted, false, 0, 40, -1,
       true},
      {"capacity bf16 sum, split send/receive", Routing::Uniform, CombineMode::Sum, true, 1, 40, -1, true},
      {"decode uniform bf16 weighted", Routing::Uniform, CombineMode::Weighted, true, 3, 40, -1, false, true},
      {"decode skewed fp32 sum, FP8 rows", Routing::Skewed, CombineMode::Sum, false, 3, 128, -1, false, true},
      {"decode -1 bf16 weighted, SM cap 1", Routing::WithMinusOne, CombineMode::Weighted, true, 3, 40, 1, false, true},
      {"decode all-to-one fp32 weighted, split combine", Routing::AllToOneExpert, CombineMode::Weighted, false, 3, 40,
       -1, true, true},
      // Rows the per-token kernels split into column blocks at decode sizes (RowSplit): two blocks of bf16 Chunk16
      // units; float units (an unaligned row) in blocks whose last is short.
      {"decode skewed bf16 weighted, wide rows", Routing::Skewed, CombineMode::Weighted, true, 3, 2048, -1, false,
       true},
      {"decode -1 fp32 sum, wide unaligned rows", Routing::WithMinusOne, CombineMode::Sum, false, 3, 1030, -1, false,
       true},
      // Many tokens: the layout's many chunks and the prefix over them (docs/ep.md §3.1).
      {"eager skewed fp32 weighted, many tokens", Routing::Skewed, CombineMode::Weighted, false, 0, 16, -1, false,
       false, SmCap::Auto, 1500},
      {"capacity drops duplicates bf16 sum, many tokens", Routing::Duplicates, CombineMode::Sum, true, 2, 16, -1, false,
       false, SmCap::Auto, 1500},
  };
  // Direct writes at every R; messages (the staged path, peer_windows = off) at R = 3.
  const std::pair<int, PeerWindows> runs[] = {{1, PeerWindows::Auto}, {2, PeerWindows::Auto}, {3, PeerWindows::Auto},
                                              {4, PeerWindows::Auto}, {8, PeerWindows::Auto}, {3, PeerWindows::Off}};
  // KOKKOSMOE_TEST_LOOPBACK_R=2 (say) keeps only the runs at that R: the sanitizers' runs, whose tools slow every
  // launch down by orders of magnitude, need every kernel but not every group size.
  const char* only = std::getenv("KOKKOSMOE_TEST_LOOPBACK_R");
  for (const auto& run : runs) {
    const int R = run.first;  // a name, not a structured binding: the lambda below captures it (C++17)
    if (only != nullptr && *only != '\0' && std::atoi(only) != R) continue;
    CommConfig cc;
    cc.peer_windows = run.second;
    for (const Case& k : cases) {
      EpGroupConfig c = case_config(R, k);
      // A host space's cap counts its threads (Kokkos::Serial: one); a device's, its SMs.
#if defined(KOKKOS_ENABLE_CUDA)
      constexpr bool cuda = std::is_same<Exec, Kokkos::Cuda>::value;
#else
      constexpr bool cuda = false;
#endif
      if (c.max_sms > 0 && !cuda) c.max_sms = std::min(c.max_sms, Exec().concurrency());
      std::vector<RankInputs> in;
      for (int r = 0; r < R; ++r)
        in.push_back(make_inputs(c, k.routing, r, r == 1 ? 0 : c.max_tokens_per_rank - r % 3, 900 + R, k.bf16));
      const auto found = on_ranks<Exec>(R, cc, [&](int, const Exec& exec, const Communicator& comm) {
        return k.bf16 ? rank_step<Exec, bf16_t>(exec, comm, c, in, k.mode, k.split, k.decode)
                      : rank_step<Exec, float>(exec, comm, c, in, k.mode, k.split, k.decode);
      });
      for (int r = 0; r < R; ++r)
        BOOST_TEST(found[r].empty(), "R = " << R << " (windows " << to_string(run.second) << "), " << k.name
                                            << ", rank " << r << ": " << found[r]);
    }
  }
}

/// Two layers in flight on each rank (docs/ep.md §14, EpInterleave.hpp): two groups of different shapes, then two
/// handles of one group with two sets of wire buffers, through every interleaving of split and plain steps; each layer
/// against the oracle and, bit for bit, against its step run alone. Windows at R = 2, 3 and 8, messages at R = 3.
template <class Exec>
void interleaved_layers() {
  const std::pair<int, PeerWindows> runs[] = {
      {2, PeerWindows::Auto}, {3, PeerWindows::Auto}, {8, PeerWindows::Auto}, {3, PeerWindows::Off}};
  const char* only = std::getenv("KOKKOSMOE_TEST_LOOPBACK_R");
  for (const auto& run : runs) {
    const int R = run.first;  // a name, not a structured binding: the lambda below captures it (C++17)
    if (only != nullptr && *only != '\0' && std::atoi(only) != R) continue;
    CommConfig cc;
    cc.peer_windows = run.second;
    const auto found = on_ranks<Exec>(R, cc, [&](int, const Exec& exec, const Communicator& comm) {
      std::string f;
      {
        const auto shapes = two_shapes(R);
        EpGroup<Exec> ga(exec, comm, shapes.first), gb(exec, comm, shapes.second);
        f += interleavings_match<Exec, float, bf16_t>(exec, ga, gb, Routing::Skewed, CombineMode::Weighted,
                                                      Routing::WithMinusOne, CombineMode::Sum);
      }
      auto c = default_config(R);
      c.hidden_size = 40;
      c.max_tokens_per_rank = 5;
      c.wire_buffers = 2;
      EpGroup<Exec> g(exec, comm, c);
      f += interleavings_match<Exec, float, float>(exec, g, g, Routing::Uniform, CombineMode::Weighted,
                                                   Routing::AllToOneExpert, CombineMode::Sum);
      return f;
    });
    for (int r = 0; r < R; ++r)
      BOOST_TEST(found[r].empty(),
                 "R = " << R << " (windows " << to_string(run.second) << "), rank " << r << ": " << found[r]);
  }
}

/// Keeps \p exec busy for \p seconds (one thread spinning on the clock the wait kernels use).
template <class Exec>
void stall(const Exec& exec, double seconds) {
  const auto ns = static_cast<std::uint64_t>(seconds * 1e9);
  Kokkos::parallel_for(
      "stall", Kokkos::RangePolicy<Exec>(exec, 0, 1), KOKKOS_LAMBDA(int) {
        const std::uint64_t t0 = Impl::ep_now_ns();
        while (Impl::ep_now_ns() - t0 < ns) {
        }
      });
}

enum class Fault { Silent, DeviceStall };

template <class Exec>
void peer_that_never_signals(Fault fault) {
  // Silent: rank 1 makes the group and then never takes part. DeviceStall: rank 1 takes part, but its instance is
  // busy for longer than the deadline first, so its signals never come in time (on Cuda the others' wait kernels
  // time out; host instances stall rank 1's thread). Either way the others fail within the deadline + 2 s, naming
  // rank 1, and stay failed.
  CommConfig cc;
  cc.timeout_seconds = 2.0;
  const int R = 3;
  for (bool capacity : {false, true}) {
    auto c = case_config(R, Case{"", Routing::Uniform, CombineMode::Sum, false, capacity ? 1 : 0});
    std::vector<RankInputs> in;
    for (int r = 0; r < R; ++r) in.push_back(make_inputs(c, Routing::Uniform, r, c.max_tokens_per_rank, 77, false));
    Meeting ready(fault == Fault::Silent ? R - 1 : R);
    const auto found = on_ranks<Exec>(R, cc, [&](int me, const Exec& exec, const Communicator& comm) -> std::string {
      EpGroup<Exec> group(exec, comm, c);
      auto handle = group.make_handle({false, "fault"});
      if (me == 1 && fault == Fault::Silent) return "";
      StepViews<Exec, float> s(exec, c, in[me]);
      using Mem = typename Exec::memory_space;
      const int N = capacity ? group.capacity_rows() : c.max_tokens_per_rank * c.topk * R;
      Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size);
      Kokkos::View<float*, Mem> rw("rw", N);
      // The stall starts once every rank has its Views: a rank's own setup (allocations, whose release fences every
      // instance in Kokkos 4) must not wait for the stalled instance; only the EP calls are under test.
      if (!ready.wait()) return "the ranks did not meet before the stall";
      if (me == 1) {
        stall(exec, comm.timeout_seconds() + 4.0);  // KOKKOSMOE_COMM_TIMEOUT may override cc
        try {
          ep_layout(exec, handle, s.idx);
          ep_dispatch(exec, handle, s.x, s.w, rx, rw);
          ep_synchronize(exec, handle);
        } catch (const CommError&) {
        }
        return "";  // what rank 1 itself sees depends on when its instance comes back
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        ep_layout(exec, handle, s.idx);
        ep_dispatch(exec, handle, s.x, s.w, rx, rw);
        ep_synchronize(exec, handle);
        return "the step finished without rank 1";
      } catch (const CommError& e) {
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::ostringstream out;
        if (e.cause() != CommFailure::Timeout) out << "cause " << static_cast<int>(e.cause()) << " is not a timeout; ";
        if (sec > comm.timeout_seconds() + 2.0) out << "CommError after " << sec << " s; ";
        if (std::string(e.what()).find("rank 1") == std::string::npos) out << "the error names no rank 1: " << e.what();
        try {
          ep_layout(exec, handle, s.idx);
          ep_synchronize(exec, handle);
          out << "a later call did not fail; ";
        } catch (const CommError& e2) {
          if (e2.cause() != CommFailure::Aborted)
            out << "a later call failed with cause " << static_cast<int>(e2.cause());
        }
        return out.str();
      }
    });
    for (int r = 0; r < R; ++r)
      BOOST_TEST(found[r].empty(), (fault == Fault::Silent ? "silent" : "stalled")
                                       << " rank 1, " << (capacity ? "capacity" : "eager") << " mode, rank " << r
                                       << ": " << found[r]);
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ep_loopback)

// The loopback world's meetings (any Kokkos, no execution space): a rank at another meeting never completes the one in
// progress, every rank fails within the deadline naming the others, and later calls fail as aborted.
BOOST_AUTO_TEST_CASE(meetings_are_named) {
  CommConfig cc;
  cc.timeout_seconds = 1.0;
  std::vector<Communicator> comms = make_loopback_communicators(3, -1, cc);
  const double timeout = comms[0].timeout_seconds();  // KOKKOSMOE_COMM_TIMEOUT may override cc
  std::vector<std::string> found(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      Impl::Transport& t = *comms[r].impl_transport();
      const auto t0 = std::chrono::steady_clock::now();
      try {
        t.rendezvous(r == 1 ? "elsewhere" : "ep_dispatch");
        found[r] = "the meeting passed with a rank at another one";
        return;
      } catch (const CommError& e) {
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const std::string what = e.what();
        if (e.cause() != CommFailure::Timeout) found[r] += "not a timeout; ";
        if (sec > timeout + 2.0) found[r] += "failed after " + std::to_string(sec) + " s; ";
        // Every message names the ranks that did not come: the two at ep_dispatch name rank 1 (with where it waits
        // while it still does), rank 1 names them; all within the deadline, since meetings of other names never block.
        const std::size_t begin = what.find("timeout: "), end = what.find(" of the loopback group");
        const std::string ranks = begin == std::string::npos || end == std::string::npos || end < begin
                                      ? ""
                                      : what.substr(begin, end - begin);
        if (ranks.empty()) found[r] += "no ranks named: " + what;
        auto names = [&](int q) {
          const std::string n = "rank " + std::to_string(q);
          for (std::size_t at = ranks.find(n); at != std::string::npos; at = ranks.find(n, at + 1))
            if (at + n.size() == ranks.size() || !std::isdigit(static_cast<unsigned char>(ranks[at + n.size()])))
              return true;
          return false;
        };
        if (r != 1 && !names(1)) found[r] += "rank 1 is not named: " + what;
        if (r == 1 && !names(0) && !names(2)) found[r] += "the others are not named: " + what;
      }
      try {
        t.rendezvous("ep_combine");
        found[r] += "a later meeting did not fail";
      } catch (const CommError& e) {
        if (e.cause() != CommFailure::Aborted) found[r] += "a later meeting failed, but not as aborted";
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) BOOST_TEST(found[r].empty(), "rank " << r << ": " << found[r]);
}

BOOST_AUTO_TEST_CASE(factory_refuses_what_it_cannot_run) {
  auto rule = [](auto&& f) -> int {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return static_cast<int>(e.rule());
    }
    return -1;
  };
  const int config = static_cast<int>(Rule::ConfigValue);
  BOOST_TEST(rule([] { make_loopback_communicators(0, -1); }) == config);
  CommConfig nccl_only;
  nccl_only.peer_windows = PeerWindows::NcclSymmetric;
  BOOST_TEST(rule([&] { make_loopback_communicators(2, -1, nccl_only); }) == config);
#if defined(KOKKOS_ENABLE_CUDA)
  BOOST_TEST(rule([] { make_loopback_communicators(kMaxDeviceLoopbackRanks + 1, Kokkos::Cuda().cuda_device()); }) ==
             config);
#else
  BOOST_TEST(rule([] { make_loopback_communicators(2, 0); }) == config);  // no CUDA loopback in this build
#endif
}

#if defined(KOKKOS_ENABLE_CUDA)
BOOST_AUTO_TEST_CASE(cuda_steps_match_oracle) { steps_match_oracle<Kokkos::Cuda>(); }
BOOST_AUTO_TEST_CASE(cuda_interleaved_layers) { interleaved_layers<Kokkos::Cuda>(); }
BOOST_AUTO_TEST_CASE(cuda_peer_that_never_signals) { peer_that_never_signals<Kokkos::Cuda>(Fault::Silent); }
BOOST_AUTO_TEST_CASE(cuda_peer_whose_device_stalls) { peer_that_never_signals<Kokkos::Cuda>(Fault::DeviceStall); }

/// Capacity mode at R = 8: layout, dispatch and combine captured once per rank, replayed with new routing; \p decode:
/// the fixed layout's decode dispatch (docs/ep.md §15) and combine. \p max_sms > 0: under an SM partition of that many
/// SMs per rank (SmCap::Partition), whose stream joins the capture through the operations' fork and join events.
static void graph_capture_replays_new_routing(bool decode, int max_sms = -1) {
  using Exec = Kokkos::Cuda;
  using Mem = Exec::memory_space;
  const int R = 8;
  auto c = case_config(R, Case{"", Routing::Uniform, CombineMode::Weighted, false, decode ? 3 : 1});
  c.max_sms = max_sms;
  if (max_sms > 0) c.sm_cap = SmCap::Partition;
  std::vector<RankInputs> in1, in2;
  for (int r = 0; r < R; ++r) {
    in1.push_back(make_inputs(c, Routing::Uniform, r, c.max_tokens_per_rank, 601, false));
    in2.push_back(make_inputs(c, Routing::Skewed, r, c.max_tokens_per_rank, 602, false));
  }
  Meeting meet(R);
  const auto found = on_ranks<Exec>(R, CommConfig{}, [&](int me, const Exec& exec, const Communicator& comm) {
    EpGroup<Exec> group(exec, comm, c);
    if (max_sms > 0 && (group.partition_sms() < 1 || group.partition_sms() > max_sms))
      return "partition of " + std::to_string(group.partition_sms()) + " SMs under a cap of " + std::to_string(max_sms);
    auto handle = group.make_handle({false, "graph"});
    StepViews<Exec, float> s(exec, c, in1[me]), s2(exec, c, in2[me]);
    const int N = group.capacity_rows();
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> rx("rx", N, c.hidden_size), y("y", s.x.extent(0), c.hidden_size);
    Kokkos::View<float*, Mem> rw("rw", N);
    const auto step = [&] {
      if (decode) {
        ep_decode_dispatch(exec, handle, s.idx, s.x, s.w, rx, rw);
      } else {
        ep_layout(exec, handle, s.idx);
        ep_dispatch(exec, handle, s.x, s.w, rx, rw);
      }
      ep_combine(exec, handle, CombineMode::Weighted, rx, s.w, y);
    };
    exec.fence();
    if (!meet.wait()) return std::string("the peers never met before the first step");
    step();
    ep_synchronize(exec, handle);
    cudaStream_t stream = exec.cuda_stream();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t inst = nullptr;
    // Every rank captures before any goes on: a device-wide synchronization in one rank's thread (a View freed,
    // a global fence) would break a peer's capture in progress.
    if (!meet.wait()) return std::string("the peers never met before the capture");
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return std::string("capture");
    try {
      step();
    } catch (...) {
      cudaStreamEndCapture(stream, &graph);  // the stream leaves capture mode before the error goes on
      if (graph != nullptr) cudaGraphDestroy(graph);
      throw;
    }
    const bool captured =
        cudaStreamEndCapture(stream, &graph) == cudaSuccess && cudaGraphInstantiate(&inst, graph, 0) == cudaSuccess;
    if (!meet.wait()) return std::string("the peers never met after the capture");
    if (!captured) return std::string("capture or instantiation failed");
    Kokkos::deep_copy(exec, s.idx, s2.idx);
    Kokkos::deep_copy(exec, s.w, s2.w);
    Kokkos::deep_copy(exec, s.x, s2.x);
    if (decode) Kokkos::deep_copy(exec, rx, 0.0f);  // the masked slabs' tails are not written
    exec.fence();
    if (cudaGraphLaunch(inst, stream) != cudaSuccess) return std::string("launch");
    ep_synchronize(exec, handle);
    std::ostringstream out;
    const auto want = expected_step(c, in2, me, CombineMode::Weighted, false);
    // Rows past off(L) are never written: they hold whatever the first routing left there.
    std::vector<float> want_x = want.recv_x;
    want_x.resize(static_cast<std::size_t>(want.offsets.back()) * c.hidden_size);
    diff(out, "recv_x (replayed)", to_host_floats(exec, rx), want_x, false);
    const std::vector<float> y_identity = identity_combine(c, in2, me);
    diff(out, "y (replayed)", to_host_floats(exec, y), y_identity, false);
    cudaGraphExecDestroy(inst);
    cudaGraphDestroy(graph);
    return out.str();
  });
  for (int r = 0; r < R; ++r)
    BOOST_TEST(found[r].empty(), (decode ? "decode, " : "") << "rank " << r << ": " << found[r]);
}

BOOST_AUTO_TEST_CASE(cuda_graph_capture_replays_new_routing) { graph_capture_replays_new_routing(false); }
BOOST_AUTO_TEST_CASE(cuda_graph_capture_replays_decode) { graph_capture_replays_new_routing(true); }
#if defined(KOKKOSMOE_HAVE_SM_PARTITION)
BOOST_AUTO_TEST_CASE(cuda_graph_capture_under_sm_partitions) {
  if (Impl::sm_partition_size(Kokkos::Cuda().cuda_device(), 16) == 0) {
    BOOST_TEST_MESSAGE("skipped: the driver makes no SM partition (green context) on this device");
    return;
  }
  graph_capture_replays_new_routing(false, 16);
  graph_capture_replays_new_routing(true, 16);
}
#endif
#endif

#if defined(KOKKOSMOE_HAVE_SERIAL_INSTANCES)
BOOST_AUTO_TEST_CASE(serial_steps_match_oracle) { steps_match_oracle<Kokkos::Serial>(); }
BOOST_AUTO_TEST_CASE(serial_interleaved_layers) { interleaved_layers<Kokkos::Serial>(); }
BOOST_AUTO_TEST_CASE(serial_peer_that_never_signals) { peer_that_never_signals<Kokkos::Serial>(Fault::Silent); }
BOOST_AUTO_TEST_CASE(serial_peer_whose_device_stalls) { peer_that_never_signals<Kokkos::Serial>(Fault::DeviceStall); }
#else
// Kokkos 3.4's Serial shares one instance (and its scratch) between threads, and its OpenMP cannot run instances from
// several host threads: host loopback ranks need Kokkos >= 4 (docs/ep.md §7.3). MPI shared windows are the CPU test
// of the same kernels and signals.
boost::test_tools::assertion_result host_instances(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(false);
  r.message() << "host loopback needs independent Kokkos::Serial instances (Kokkos >= 4); this Kokkos is "
              << KOKKOS_VERSION;
  return r;
}
BOOST_AUTO_TEST_CASE(serial_steps_match_oracle, *boost::unit_test::precondition(host_instances)) {}
BOOST_AUTO_TEST_CASE(serial_interleaved_layers, *boost::unit_test::precondition(host_instances)) {}
#endif

BOOST_AUTO_TEST_SUITE_END()
