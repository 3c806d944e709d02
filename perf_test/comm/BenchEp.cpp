/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// EP benchmarks (docs/ep.md §9, docs/conventions.md §7): layout, dispatch, combine and both backwards for the
// DeepSeek-V3 shape (4096 tokens per rank, hidden 7168, bf16, top-8 of 256 with the real group-limited router) and
// decode (128 tokens per rank), eager and capacity mode; in the same run the device copy of the same bytes, raw
// send/recv and the all-to-all of the same bytes through the library's transport. Every rank runs every benchmark with
// a fixed iteration count (the ranks must issue the same collectives); rank 0 reports.
//
// Counters: GB/s = logical bandwidth (received rows x H x 2 B, the rank's own included) / time; move_GBps = bytes the
// operation must read and write on this rank / time; frac_copy = move_GBps / the copy baseline of the same run;
// device_us = CUDA-event time on the instance's stream with a spin kernel queued first (median), GPUs only.
#include <KokkosMoE_Communicator_Loopback.hpp>
#include <KokkosMoE_Communicator_MPI.hpp>
#include <KokkosMoE_EP.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>

#include <impl/KokkosMoE_Transport.hpp>
#if defined(KOKKOSMOE_HAVE_NCCL)
#include <KokkosMoE_Communicator_NCCL.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>
#include <mpi.h>

#include "BenchEpLoopback.hpp"
#include "KokkosMoE_PerfGitInfo.hpp"
#include "KokkosMoE_PerfHelpers.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace KokkosMoE;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using Row = bf16_t;
constexpr int kIters = 20;

std::unique_ptr<Communicator> g_comm;

/// Median device time in microseconds of `op` (Perf::device_time_us: CUDA events around each call on the instance's
/// stream, a spin kernel queued first); 0 on host spaces.
template <class Op>
double device_us(const Exec& exec, Op&& op) {
  return Perf::device_time_us(exec, kIters, [&](std::int64_t) { op(); });
}

struct Fixture {
  EpGroupConfig cfg;
  std::unique_ptr<EpGroup<Exec>> group;
  std::unique_ptr<EpHandle<Exec>> handle;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> w, grad_w;
  Kokkos::View<Row**, Kokkos::LayoutRight, Mem> x, y, grad_y, grad_x, recv_x, out, grad_out;
  Kokkos::View<float*, Mem> recv_w;
  long recv_slots = 0, slots = 0, local_slots = 0;

  Fixture(int T, bool capacity) {
    const Communicator& comm = *g_comm;
    const RouterPreset preset = router_preset("deepseek-v3");
    const int E = preset.num_experts, K = preset.config.topk, H = 7168;
    cfg.ep_size = comm.size();
    cfg.num_experts = E;
    cfg.hidden_size = H;
    cfg.topk = K;
    cfg.max_tokens_per_rank = T;
    // Capacity: the worst case of an even share (all of the ranks' slots), so nothing drops.
    cfg.max_recv_tokens_per_rank = capacity ? T * K * comm.size() : 0;
    Exec exec;
    group = std::make_unique<EpGroup<Exec>>(exec, comm, cfg);
    handle = std::make_unique<EpHandle<Exec>>(group->make_handle({false, "bench"}));
    // Routing from the real router: group-limited top-8 of 256 on normal logits, with the expert bias.
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> logits("logits", T, E);
    Kokkos::View<float*, Mem> bias("bias", E);
    Perf::fill_normal(logits, 17 + comm.rank(), 0.0f, 1.0f);
    Perf::fill_uniform(bias, 18, -0.02f, 0.02f);
    ids = decltype(ids)("ids", T, K);
    w = decltype(w)("w", T, K);
    grad_w = decltype(grad_w)("grad_w", T, K);
    topk_router_compact(exec, preset.config, logits, bias, ids, w);
    x = decltype(x)("x", T, H);
    y = decltype(y)("y", T, H);
    grad_y = decltype(grad_y)("grad_y", T, H);
    grad_x = decltype(grad_x)("grad_x", T, H);
    Perf::fill_uniform(x, 19 + comm.rank(), -1.0f, 1.0f);
    Perf::fill_uniform(grad_y, 20 + comm.rank(), -1.0f, 1.0f);
    ep_layout(exec, *handle, ids);
    ep_synchronize(exec, *handle);
    const int N = handle->num_recv_rows();
    recv_x = decltype(recv_x)("recv_x", N, H);
    out = decltype(out)("out", N, H);
    grad_out = decltype(grad_out)("grad_out", N, H);
    recv_w = decltype(recv_w)("recv_w", N);
    auto rc = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle->recv_counts());
    for (std::size_t l = 0; l < rc.extent(0); ++l) recv_slots += rc(l);
    auto tpe = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle->tokens_per_expert());
    const int L = group->num_local_experts();
    for (int e = 0; e < E; ++e) {
      slots += tpe(e);
      if (e / L == comm.rank()) local_slots += tpe(e);
    }
    Kokkos::deep_copy(out, recv_x);
  }
  double row_bytes() const { return static_cast<double>(cfg.hidden_size) * sizeof(Row); }
};

enum class Op { LayoutOnly, Dispatch, Combine, CombineBackward, DispatchBackward };
const char* op_name(Op o) {
  switch (o) {
    case Op::LayoutOnly:
      return "layout";
    case Op::Dispatch:
      return "dispatch";
    case Op::Combine:
      return "combine";
    case Op::CombineBackward:
      return "combine_bwd";
    case Op::DispatchBackward:
      return "dispatch_bwd";
  }
  return "?";
}

void BM_Ep(benchmark::State& state, Op op, int T, bool capacity) {
  Exec exec;
  Fixture f(T, capacity);
  auto run = [&] {
    switch (op) {
      case Op::LayoutOnly:
        ep_layout(exec, *f.handle, f.ids);
        break;
      case Op::Dispatch:
        ep_dispatch(exec, *f.handle, f.x, f.w, f.recv_x, f.recv_w);
        break;
      case Op::Combine:
        ep_combine(exec, *f.handle, CombineMode::Weighted, f.out, f.w, f.y);
        break;
      case Op::CombineBackward:
        ep_combine_backward(exec, *f.handle, CombineMode::Weighted, f.grad_y, f.w, f.out, f.grad_out, f.grad_w);
        break;
      case Op::DispatchBackward:
        ep_dispatch_backward(exec, *f.handle, f.out, Kokkos::View<const float*, Mem>(), f.grad_x,
                             Kokkos::View<float**, Kokkos::LayoutRight, Mem>());
        break;
    }
  };
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = Perf::timed_loop(state, exec, [&](std::int64_t) { run(); });
  ep_synchronize(exec, *f.handle);
  MPI_Barrier(MPI_COMM_WORLD);
  const double dev = device_us(exec, run);
  ep_synchronize(exec, *f.handle);
  const double per = seconds / static_cast<double>(state.iterations());
  const double rb = f.row_bytes();
  // Bytes this rank must read and write: the pack reads each token once and writes each slot row; the unpack or
  // reduce reads each slot row and writes each token (or receive row).
  double move = 0, logical = 0;
  switch (op) {
    case Op::LayoutOnly:
      move = static_cast<double>(T) * f.cfg.topk * 4 * 2;
      logical = 0;
      break;
    case Op::Dispatch:
      move = (static_cast<double>(T) + f.slots) * rb + (f.recv_slots - f.local_slots) * rb * 2;
      logical = f.recv_slots * rb;
      break;
    case Op::CombineBackward:
      // Weighted: the expert outputs are read too (the weight gradient is their dot product with grad_y).
      move = (static_cast<double>(T) + 2.0 * f.slots) * rb + (f.recv_slots - f.local_slots) * rb * 2;
      logical = f.recv_slots * rb;
      break;
    case Op::Combine:
    case Op::DispatchBackward:
      move = (static_cast<double>(T) + f.slots) * rb + (f.recv_slots - f.local_slots) * rb * 2;
      logical = f.slots * rb;
      break;
  }
  state.counters["T"] = T;
  state.counters["ranks"] = f.cfg.ep_size;
  state.counters["recv_slots"] = static_cast<double>(f.recv_slots);
  state.counters["logical_bytes"] = logical;
  state.counters["GB/s"] = logical / per / 1e9;
  state.counters["move_GBps"] = move / per / 1e9;
  state.counters["frac_copy"] = move / per / 1e9 / Perf::copy_bandwidth_GBps();
  state.counters["device_us"] = dev;
  if (dev > 0) {
    state.counters["device_GBps"] = logical / (dev * 1e-6) / 1e9;
    state.counters["device_frac_copy"] = move / (dev * 1e-6) / 1e9 / Perf::copy_bandwidth_GBps();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(logical) * state.iterations());
  state.SetItemsProcessed(static_cast<std::int64_t>(T) * state.iterations());
}

/// Raw transport of the dispatch's bytes: grouped send/recv of one block to every rank (itself included) and the
/// equal-block all-to-all, through the same communicator.
void BM_Raw(benchmark::State& state, bool alltoall, int T) {
  Exec exec;
  const Communicator& comm = *g_comm;
  const int R = comm.size();
  const double bytes_per_rank = static_cast<double>(T) * 8 * 7168 * sizeof(Row);  // every slot of the rank's tokens
  const std::size_t block = static_cast<std::size_t>(bytes_per_rank / R) / 16 * 16;
  Kokkos::View<char*, Mem> send("send", block * R), recv("recv", block * R);
  void* stream = nullptr;
#if defined(KOKKOS_ENABLE_CUDA)
  stream = exec.cuda_stream();
#endif
  Impl::Transport& t = *comm.impl_transport();
  auto run = [&] {
    if (alltoall) {
      t.alltoall("bench", send.data(), recv.data(), block, stream);
    } else {
      std::vector<Impl::PeerSegment> segs;
      for (int p = 0; p < R; ++p) segs.push_back({p, send.data() + block * p, block, recv.data() + block * p, block});
      t.exchange("bench", segs, stream);
    }
  };
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = Perf::timed_loop(state, exec, [&](std::int64_t) { run(); });
  t.wait("bench", stream);
  MPI_Barrier(MPI_COMM_WORLD);
  const double dev = device_us(exec, run);
  t.wait("bench", stream);
  const double per = seconds / static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(block) * R;
  state.counters["T"] = T;
  state.counters["ranks"] = R;
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["device_us"] = dev;
  if (dev > 0) state.counters["device_GBps"] = bytes / (dev * 1e-6) / 1e9;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

/// Host transports: MPI_Alltoallv of exactly the bytes the dispatch puts on the wire (one token row plus its trailer
/// per token and remote rank that holds one of its experts, from the same routing), the raw MPI baseline of the
/// direct writes. Counters as the dispatch's: GB/s over the logical bytes it receives.
void BM_Alltoallv(benchmark::State& state, int T) {
  Exec exec;
  Fixture f(T, false);
  const Communicator& comm = *g_comm;
  const int R = comm.size(), me = comm.rank();
  const std::size_t pitch = Impl::token_pitch(f.cfg.hidden_size * sizeof(Row), f.cfg.topk, true);  // the dispatch's
  auto tpr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), f.handle->tokens_per_rank());
  std::vector<int> scount(R), rcount(R), sdispl(R), rdispl(R);
  for (int p = 0; p < R; ++p) scount[p] = p == me ? 0 : static_cast<int>(tpr(p) * pitch);
  MPI_Alltoall(scount.data(), 1, MPI_INT, rcount.data(), 1, MPI_INT, MPI_COMM_WORLD);
  for (int p = 1; p < R; ++p) {
    sdispl[p] = sdispl[p - 1] + scount[p - 1];
    rdispl[p] = rdispl[p - 1] + rcount[p - 1];
  }
  std::vector<char> send(static_cast<std::size_t>(sdispl[R - 1] + scount[R - 1]) + 1, 1),
      recv(static_cast<std::size_t>(rdispl[R - 1] + rcount[R - 1]) + 1);
  MPI_Barrier(MPI_COMM_WORLD);
  const double seconds = Perf::timed_loop(state, exec, [&](std::int64_t) {
    MPI_Alltoallv(send.data(), scount.data(), sdispl.data(), MPI_BYTE, recv.data(), rcount.data(), rdispl.data(),
                  MPI_BYTE, MPI_COMM_WORLD);
  });
  MPI_Barrier(MPI_COMM_WORLD);
  const double per = seconds / static_cast<double>(state.iterations());
  const double logical = f.recv_slots * f.row_bytes();  // the dispatch's logical bytes, for the same GB/s
  double wire = 0;
  for (int p = 0; p < R; ++p) wire += scount[p];
  state.counters["T"] = T;
  state.counters["ranks"] = R;
  state.counters["GB/s"] = logical / per / 1e9;
  state.counters["wire_bytes"] = wire;
  state.counters["wire_GBps"] = wire / per / 1e9;
  state.SetItemsProcessed(static_cast<std::int64_t>(T) * state.iterations());
}

/// The device copy of the dispatch's bytes (read + write counted), the baseline of frac_copy.
void BM_Copy(benchmark::State& state, int T) {
  Exec exec;
  const std::size_t n = static_cast<std::size_t>(T) * 8 * 7168;
  Kokkos::View<Row*, Mem> a("a", n), b("b", n);
  const double seconds = Perf::timed_loop(state, exec, [&](std::int64_t) { Kokkos::deep_copy(exec, b, a); });
  const double dev = device_us(exec, [&] { Kokkos::deep_copy(exec, b, a); });
  const double per = seconds / static_cast<double>(state.iterations());
  const double bytes = 2.0 * n * sizeof(Row);
  state.counters["GB/s"] = bytes / per / 1e9;
  state.counters["device_us"] = dev;
  if (dev > 0) state.counters["device_GBps"] = bytes / (dev * 1e-6) / 1e9;
  state.counters["copy_baseline_GBps"] = Perf::copy_bandwidth_GBps();
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

void register_all(const std::vector<int>& tokens) {
  for (int T : tokens) {
    const std::string shape = T >= 1024 ? "prefill" : "decode";
    benchmark::RegisterBenchmark(("ep/copy/" + shape).c_str(), BM_Copy, T)->UseManualTime()->Iterations(kIters);
    for (bool capacity : {false, true}) {
      const std::string mode = capacity ? "capacity" : "eager";
      for (Op op : {Op::LayoutOnly, Op::Dispatch, Op::Combine, Op::CombineBackward, Op::DispatchBackward})
        benchmark::RegisterBenchmark(("ep/" + std::string(op_name(op)) + "/" + mode + "/" + shape).c_str(), BM_Ep, op,
                                     T, capacity)
            ->UseManualTime()
            ->Iterations(kIters)
            ->Unit(benchmark::kMicrosecond);
    }
    benchmark::RegisterBenchmark(("ep/raw_sendrecv/" + shape).c_str(), BM_Raw, false, T)
        ->UseManualTime()
        ->Iterations(kIters)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark(("ep/raw_alltoall/" + shape).c_str(), BM_Raw, true, T)
        ->UseManualTime()
        ->Iterations(kIters)
        ->Unit(benchmark::kMicrosecond);
    if (g_comm->transport() != CommTransport::Nccl)
      benchmark::RegisterBenchmark(("ep/raw_alltoallv/" + shape).c_str(), BM_Alltoallv, T)
          ->UseManualTime()
          ->Iterations(kIters)
          ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The loopback benchmarks' ranks share one device (docs/ep.md §7.3).
  prepare_loopback_environment();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) return 1;
  Kokkos::initialize(argc, argv);
  int rc = 0;
  {
    // --kokkosmoe_ep_tokens=4096,128 (the default: prefill and decode); host spaces: --kokkosmoe_ep_transport=mpi
    // (messages, the default) or shm (MPI shared windows).
    std::vector<int> tokens = {4096, 128};
    std::string host_transport = "mpi";
    std::vector<char*> rest;
    for (int i = 0; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--kokkosmoe_ep_tokens=", 0) == 0) {
        tokens.clear();
        std::string list = a.substr(22);
        for (std::size_t p = 0; p <= list.size();) {
          const std::size_t q = std::min(list.find(',', p), list.size());
          tokens.push_back(std::stoi(list.substr(p, q - p)));
          p = q + 1;
        }
      } else if (a.rfind("--kokkosmoe_ep_transport=", 0) == 0) {
        host_transport = a.substr(25);
      } else if (rank != 0 && a.rfind("--benchmark_out=", 0) == 0) {
        continue;  // only rank 0 writes the JSON
      } else {
        rest.push_back(argv[i]);
      }
    }
    int n = static_cast<int>(rest.size());
    benchmark::Initialize(&n, rest.data());
    try {
      if (host_transport != "mpi" && host_transport != "shm")
        throw std::invalid_argument("--kokkosmoe_ep_transport=" + host_transport + ": expected mpi or shm");
      Communicator host =
          host_transport == "shm" ? make_mpi_shm_communicator(MPI_COMM_WORLD) : make_mpi_communicator(MPI_COMM_WORLD);
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_NCCL)
      g_comm = std::make_unique<Communicator>(make_nccl_communicator(host, Exec().cuda_device()));
#else
      g_comm = std::make_unique<Communicator>(std::move(host));
#endif
      benchmark::AddCustomContext("kokkosmoe_git", KOKKOSMOE_PERF_GIT_HASH);
      benchmark::AddCustomContext("execution_space", Exec::name());
      benchmark::AddCustomContext("transport", to_string(g_comm->transport()));
      benchmark::AddCustomContext("ranks", std::to_string(g_comm->size()));
      benchmark::AddCustomContext("copy_baseline_GBps", std::to_string(Perf::copy_bandwidth_GBps()));
      register_all(tokens);
      // One process: the remote path through loopback ranks on this device (docs/ep.md §7.3).
      if (g_comm->size() == 1) Perf::register_loopback_benchmarks(tokens);
      benchmark::RunSpecifiedBenchmarks();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "KokkosMoE_CommBenchmarks: rank %d: %s\n", rank, e.what());
      rc = 1;
    }
    g_comm.reset();
    Perf::run_cleanups();
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
