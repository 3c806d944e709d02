/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The remote path on one device (docs/ep.md §7.3, §9): R loopback ranks, each a host thread with its own stream,
// DeepSeek-V3 routing from the real router, bf16 rows, every token row written straight into the peer's window.
// Rank 0 reports; the others run the same calls. All R ranks share the device, so the bytes that count against the
// device copy are those of every rank together (agg_move_GBps, frac_copy).
#include "BenchEpLoopback.hpp"

#include <KokkosMoE_Communicator_Loopback.hpp>
#include <KokkosMoE_EP.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#if defined(KOKKOSMOE_HAVE_SHARDING)
#include <KokkosMoE_Planner.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include "KokkosMoE_PerfHelpers.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace KokkosMoE {
namespace Perf {
#if defined(KOKKOS_ENABLE_CUDA)
namespace {

using Exec = Kokkos::Cuda;
using Mem = Exec::memory_space;
using Row = bf16_t;
constexpr int kIters = 20;

class Meeting {
 public:
  explicit Meeting(int n) : m_n(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_mu);
    const std::uint64_t gen = m_gen;
    if (++m_arrived == m_n) {
      m_arrived = 0;
      ++m_gen;
      m_cv.notify_all();
      return;
    }
    m_cv.wait(lock, [&] { return m_gen != gen; });
  }

 private:
  int m_n, m_arrived = 0;
  std::uint64_t m_gen = 0;
  std::mutex m_mu;
  std::condition_variable m_cv;
};

enum class LOp { Dispatch, Combine, CombineBackward, DispatchBackward, DispatchFp8, Layout, Decode, DecodeFp8 };

/// The receive layout of a run: eager, capacity (1.5x the even share, drops allowed), or the fixed expert-major
/// layout of the decode path (docs/ep.md §15).
enum class LMode { Eager, Capacity, Fixed };
constexpr const char* lmode_name(LMode m) {
  return m == LMode::Eager ? "eager" : (m == LMode::Capacity ? "capacity" : "fixed");
}

/// One rank's step state; every copy goes through the rank's instance (no global fence while peers wait on it).
struct Rank {
  Exec exec;
  EpGroupConfig cfg;
  std::unique_ptr<EpGroup<Exec>> group;
  std::unique_ptr<EpHandle<Exec>> handle;
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> w, grad_w;
  Kokkos::View<Row**, Kokkos::LayoutRight, Mem> x, y, grad_y, grad_x, recv_x, out, grad_out;
  Kokkos::View<float*, Mem> recv_w;
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> recv_q;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> recv_scales;
  double move_rows = 0;     // rows this rank's dispatch (or combine) must read and write
  double move_dots = 0;     // rows the Weighted combine backward must read and write: move_rows and every slot's out
  double move_fp8 = 0;      // bytes the FP8 dispatch must read and write (bf16 rows in, FP8 rows out)
  double remote_slots = 0;  // kept slots whose expert is on another rank (what one row per slot would send)
  double planner_rows = 0;  // make_plan's model: tokens times the expected number of other ranks a token reaches

  Rank(const Exec& e, const Communicator& comm, int T, LMode mode, int max_sms, Meeting& meet,
       SmCap sm_cap = SmCap::Auto, int wire_buffers = 1)
      : exec(e) {
    const RouterPreset preset = router_preset("deepseek-v3");
    const int E = preset.num_experts, K = preset.config.topk, H = 7168, R = comm.size(), me = comm.rank();
    cfg.ep_size = R;
    cfg.num_experts = E;
    cfg.hidden_size = H;
    cfg.topk = K;
    cfg.max_tokens_per_rank = T;
    // Capacity: 1.5x the even share of slots per rank, drops allowed (the router's load is near even).
    const bool capacity = mode == LMode::Capacity;
    cfg.max_recv_tokens_per_rank = capacity ? T * K * 3 / 2 : 0;
    cfg.drop_on_overflow = capacity;
    if (mode == LMode::Fixed) cfg.layout = RecvLayout::ExpertMajorFixed;
    cfg.max_sms = max_sms;
    cfg.sm_cap = sm_cap;
    cfg.wire_buffers = wire_buffers;
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> logits("logits", T, E);
    Kokkos::View<float*, Mem> bias("bias", E);
    fill_normal(logits, 17 + me, 0.0f, 1.0f);
    fill_uniform(bias, 18, -0.02f, 0.02f);
    ids = decltype(ids)("ids", T, K);
    w = decltype(w)("w", T, K);
    grad_w = decltype(grad_w)("grad_w", T, K);
    x = decltype(x)("x", T, H);
    y = decltype(y)("y", T, H);
    grad_y = decltype(grad_y)("grad_y", T, H);
    grad_x = decltype(grad_x)("grad_x", T, H);
    fill_uniform(x, 19 + me, -1.0f, 1.0f);
    fill_uniform(grad_y, 20 + me, -1.0f, 1.0f);
    topk_router_compact(exec, preset.config, logits, bias, ids, w);
    exec.fence();
    Kokkos::fence();
    meet.wait();  // nobody fences globally from here on
    group = std::make_unique<EpGroup<Exec>>(exec, comm, cfg);
    handle = std::make_unique<EpHandle<Exec>>(group->make_handle({false, "loopback bench"}));
    ep_layout(exec, *handle, ids);
    ep_synchronize(exec, *handle);
    const int N = handle->num_recv_rows();
    auto host = [&](const auto& v) {
      Kokkos::View<int*, Kokkos::HostSpace> h("KokkosMoE::perf::host_copy", v.extent(0));
      Kokkos::deep_copy(exec, h, v);
      exec.fence();
      return h;
    };
    auto rc = host(handle->recv_counts());
    auto tpe = host(handle->tokens_per_expert());
    auto tpr = host(handle->tokens_per_rank());
    const int L = group->num_local_experts();
    double recv = 0, local = 0, sent = 0;
    for (std::size_t l = 0; l < rc.extent(0); ++l) recv += rc(l);
    for (int ee = 0; ee < E; ++ee)
      if (ee / L == me) local += tpe(ee);
    for (int r = 0; r < R; ++r) sent += r == me ? 0 : tpr(r);
    for (int ee = 0; ee < E; ++ee)
      if (ee / L != me) remote_slots += tpe(ee);
#if defined(KOKKOSMOE_HAVE_SHARDING)
    const std::vector<double> hit = rank_hit_probabilities(moe_layer_from_preset(preset, T), R);
    for (int r = 0; r < R; ++r) planner_rows += r == me ? 0.0 : hit[static_cast<std::size_t>(r)] * T;
#endif
    // Read each token, write each local slot row, write each remote token row into the peer's window; the peer reads
    // it and writes its remote slot rows (the combine mirrors it). Over all ranks, rows sent = rows arrived.
    move_rows = T + local + 2.0 * sent + (recv - local);
    move_dots = move_rows + recv;
    move_fp8 = T * H * sizeof(Row) + (local + 2.0 * sent + (recv - local)) * (H + H / 32);
    meet.wait();
    recv_x = decltype(recv_x)("recv_x", N, H);
    recv_q = decltype(recv_q)("recv_q", N, H);
    recv_scales = decltype(recv_scales)("recv_scales", N, H / kFp8BlockChannels);
    out = decltype(out)("out", N, H);
    grad_out = decltype(grad_out)("grad_out", N, H);
    recv_w = decltype(recv_w)("recv_w", N);
    Kokkos::fence();
    meet.wait();
  }

  /// The bytes op must read and write on this rank (docs/ep.md §9).
  double move_bytes(LOp op) const {
    if (op == LOp::Layout) return 0;  // no rows: device time only
    if (op == LOp::DispatchFp8 || op == LOp::DecodeFp8) return move_fp8;
    return (op == LOp::CombineBackward ? move_dots : move_rows) * 7168 * sizeof(Row);
  }

  void run(LOp op) {
    switch (op) {
      case LOp::Layout:
        ep_layout(exec, *handle, ids);
        break;
      case LOp::Decode:
        ep_decode_dispatch(exec, *handle, ids, x, w, recv_x, recv_w);
        break;
      case LOp::DecodeFp8:
        ep_decode_dispatch(exec, *handle, ids, x, w, fp8_rows(recv_q, recv_scales), recv_w);
        break;
      case LOp::DispatchFp8:
        ep_dispatch(exec, *handle, x, w, fp8_rows(recv_q, recv_scales), recv_w);
        break;
      case LOp::Dispatch:
        ep_dispatch(exec, *handle, x, w, recv_x, recv_w);
        break;
      case LOp::Combine:
        ep_combine(exec, *handle, CombineMode::Weighted, out, w, y);
        break;
      case LOp::CombineBackward:
        ep_combine_backward(exec, *handle, CombineMode::Weighted, grad_y, w, out, grad_out, grad_w);
        break;
      case LOp::DispatchBackward:
        ep_dispatch_backward(exec, *handle, out, Kokkos::View<const float*, Mem>(), grad_x,
                             Kokkos::View<float**, Kokkos::LayoutRight, Mem>());
        break;
    }
  }
};

void BM_Loopback(benchmark::State& state, LOp op, int R, int T, LMode mode, PeerWindows windows, int max_sms,
                 SmCap sm_cap) {
  const int device = Exec().cuda_device();
  CommConfig cc;
  cc.peer_windows = windows;
  std::vector<Communicator> comms = make_loopback_communicators(R, device, cc);
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(R));
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  Meeting meet(R);
  std::vector<double> move(static_cast<std::size_t>(R), 0.0);
  std::vector<std::string> errors(static_cast<std::size_t>(R));
  double seconds = 0, dev = 0, wire = 0, remote_slots = 0, planner_rows = 0;
  int partition_sms = 0, launches = 0;
  {
    std::vector<std::thread> peers;
    for (int r = 1; r < R; ++r)
      peers.emplace_back([&, r] {
        try {
          Rank rank(Exec(streams[r]), comms[r], T, mode, max_sms, meet, sm_cap);
          move[r] = rank.move_bytes(op);
          for (int i = 0; i < 2 * kIters + kIters; ++i) rank.run(op);  // rank 0's timed loop, device time, warm-up
          ep_synchronize(rank.exec, *rank.handle);
          meet.wait();
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    try {
      Rank rank(Exec(streams[0]), comms[0], T, mode, max_sms, meet, sm_cap);
      move[0] = rank.move_bytes(op);
      partition_sms = rank.group->partition_sms();
      remote_slots = rank.remote_slots;
      planner_rows = rank.planner_rows;
      for (int i = 0; i < kIters; ++i) rank.run(op);  // warm-up
      // The traffic counters join the communicator's at a synchronization: the warm-up's before the first reading.
      ep_synchronize(rank.exec, *rank.handle);
      const CommStats before = rank.group->stats();
      seconds = timed_loop(state, rank.exec, [&](std::int64_t) { rank.run(op); });
      dev = device_time_us(rank.exec, kIters, [&](std::int64_t) { rank.run(op); });
      ep_synchronize(rank.exec, *rank.handle);
      if (R == 1) launches = kernel_launches([&] { rank.run(op); });
      const std::string name =
          op == LOp::Dispatch || op == LOp::DispatchFp8 || op == LOp::Decode || op == LOp::DecodeFp8 ? "ep_dispatch"
          : op == LOp::Combine                                                                       ? "ep_combine"
          : op == LOp::CombineBackward ? "ep_combine_backward"
          : op == LOp::Layout          ? "ep_layout"
                                       : "ep_dispatch_backward";
      const CommStats after = rank.group->stats();
      wire =
          static_cast<double>(after.bytes.at(name).wire - (before.bytes.count(name) ? before.bytes.at(name).wire : 0)) /
          (2.0 * kIters);
      meet.wait();
    } catch (const std::exception& e) {
      errors[0] = e.what();
    }
    for (auto& p : peers) p.join();
  }
  for (auto& s : streams) cudaStreamDestroy(s);
  for (int r = 0; r < R; ++r)
    if (!errors[r].empty()) {
      state.SkipWithError(("rank " + std::to_string(r) + ": " + errors[r]).c_str());
      return;
    }
  double bytes = 0;  // every rank's bytes to move
  for (double m : move) bytes += m;
  const double per = seconds / static_cast<double>(state.iterations());
  state.counters["T"] = T;
  state.counters["ranks"] = R;
  if (max_sms > 0) state.counters["max_sms"] = max_sms;
  if (partition_sms > 0) state.counters["partition_sms"] = partition_sms;
  state.counters["wire_bytes_per_token"] = wire / T;
  if (launches > 0) state.counters["launches"] = launches;  // one rank's kernels per call (counted at R = 1 only)
  // Beside it: the bytes one row per (token, expert) slot would send, and the planner's prediction (docs/planner.md
  // §4), both for rank 0's tokens and bare rows (the wire adds each row's trailer).
  const double row_bytes = op == LOp::DispatchFp8 || op == LOp::DecodeFp8 ? 7168.0 + 7168.0 / 32 : 7168.0 * sizeof(Row);
  state.counters["slot_bytes_per_token"] = remote_slots * row_bytes / T;
  if (planner_rows > 0) state.counters["planner_bytes_per_token"] = planner_rows * row_bytes / T;
  state.counters["agg_move_GBps"] = bytes / per / 1e9;
  state.counters["device_us"] = dev;
  state.counters["device_us_per_rank"] = dev / R;  // the ranks share the device: each rank's share of its time
  if (dev > 0 && bytes > 0) {
    state.counters["device_agg_move_GBps"] = bytes / (dev * 1e-6) / 1e9;
    state.counters["frac_copy"] = bytes / (dev * 1e-6) / 1e9 / copy_bandwidth_GBps();
    // Per SM of the budget (docs/ep.md §13): every rank's cap (its partition's SMs), or the whole device uncapped.
    int device_sms = 0;
    cudaDeviceGetAttribute(&device_sms, cudaDevAttrMultiProcessorCount, device);
    const int budget =
        max_sms > 0 ? std::min(device_sms, R * (partition_sms > 0 ? partition_sms : max_sms)) : device_sms;
    state.counters["sm_budget"] = budget;
    state.counters["device_GBps_per_sm"] = bytes / (dev * 1e-6) / 1e9 / budget;
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(T) * R * state.iterations());
}

/// The stand-in for an expert GEMM: every thread runs a long chain of FMAs on registers (compute bound, as a grouped
/// GEMM's inner loop is), on its own instance.
struct ComputeKernel {
  static constexpr int kThreads = 132 * 2048, kSteps = 32768;
  Kokkos::View<float*, Mem> acc{"KokkosMoE::perf::compute", kThreads};
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    float x0 = 1.0f + 1e-7f * static_cast<float>(i), x1 = x0 * 0.5f, x2 = x0 * 0.25f, x3 = x0 * 0.125f;
    for (int k = 0; k < kSteps; ++k) {
      x0 = x0 * 0.9999f + 1e-4f;
      x1 = x1 * 0.9998f + 2e-4f;
      x2 = x2 * 0.9997f + 3e-4f;
      x3 = x3 * 0.9996f + 4e-4f;
    }
    acc(i) = x0 + x1 + x2 + x3;
  }
  void run(const Exec& exec) const {
    Kokkos::parallel_for("KokkosMoE::perf::gemm_like", Kokkos::RangePolicy<Exec>(exec, 0, kThreads), *this);
  }
};

/// Median CUDA-event time in us of \p reps runs of the compute kernel on \p exec.
double compute_us(const ComputeKernel& k, const Exec& exec, int reps) {
  std::vector<double> t;
  cudaEvent_t b, e;
  cudaEventCreate(&b);
  cudaEventCreate(&e);
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(b, exec.cuda_stream());
    k.run(exec);
    cudaEventRecord(e, exec.cuda_stream());
    cudaEventSynchronize(e);
    float ms = 0;
    cudaEventElapsedTime(&ms, b, e);
    t.push_back(1e3 * ms);
  }
  cudaEventDestroy(b);
  cudaEventDestroy(e);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Overlap (docs/ep.md §13): the compute kernel on its own instance, alone and while R loopback ranks run dispatch
/// and combine steps beside it under the SM cap; its slowdown and the EP step's time with it running.
void BM_Overlap(benchmark::State& state, int R, int T, int max_sms) {
  const int device = Exec().cuda_device();
  std::vector<Communicator> comms = make_loopback_communicators(R, device, CommConfig{});
  std::vector<cudaStream_t> streams(static_cast<std::size_t>(R) + 1);
  for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const Exec compute_exec(streams[static_cast<std::size_t>(R)]);
  const ComputeKernel kernel;
  constexpr int kReps = 7, kSteps = 10;
  double alone = 0, beside = 0, step_us = 0, runs = 0;
  std::vector<std::string> errors(static_cast<std::size_t>(R));
  Meeting meet(R + 1), setup(R);
  std::atomic<bool> done{false};
  for (auto _ : state) {
    compute_us(kernel, compute_exec, 2);  // warm-up
    alone = compute_us(kernel, compute_exec, kReps);
    std::vector<std::thread> ranks;
    for (int r = 0; r < R; ++r)
      ranks.emplace_back([&, r] {
        bool met = false;
        try {
          Rank rank(Exec(streams[static_cast<std::size_t>(r)]), comms[r], T, LMode::Eager, max_sms, setup);
          for (int i = 0; i < 2; ++i) rank.run(LOp::Dispatch), rank.run(LOp::Combine);
          ep_synchronize(rank.exec, *rank.handle);
          met = true;
          meet.wait();  // the compute kernel's timing starts with the steps
          const auto t0 = std::chrono::steady_clock::now();
          for (int i = 0; i < kSteps; ++i) rank.run(LOp::Dispatch), rank.run(LOp::Combine);
          ep_synchronize(rank.exec, *rank.handle);
          if (r == 0)
            step_us = 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
        } catch (const std::exception& e) {
          errors[r] = e.what();
          if (!met) meet.wait();
        }
        if (r == 0) done = true;
      });
    meet.wait();
    // The compute kernel runs again and again while the steps last: the median of its times beside them.
    std::vector<double> times;
    while (!done || times.empty()) times.push_back(compute_us(kernel, compute_exec, 1));
    std::sort(times.begin(), times.end());
    beside = times[times.size() / 2];
    runs = static_cast<double>(times.size());
    for (auto& t : ranks) t.join();
    state.SetIterationTime(beside * 1e-6);
  }
  for (auto& s : streams) cudaStreamDestroy(s);
  for (int r = 0; r < R; ++r)
    if (!errors[r].empty()) {
      state.SkipWithError(("rank " + std::to_string(r) + ": " + errors[r]).c_str());
      return;
    }
  state.counters["ranks"] = R;
  if (max_sms > 0) state.counters["max_sms"] = max_sms;
  state.counters["compute_alone_us"] = alone;
  state.counters["compute_beside_ep_us"] = beside;
  state.counters["compute_slowdown"] = beside / alone;
  state.counters["compute_runs_beside_ep"] = runs;
  state.counters["ep_step_us"] = step_us;  // dispatch + combine, wall time per step with the compute beside
}

/// The stand-in for a micro-batch's expert GEMMs in the training step: bound by the ALUs as a GEMM is, with a GEMM's
/// data dependence but not its memory traffic, and a GEMM's many short blocks (64 waves of a full device, 132 x 2048
/// threads each), so that a block of the communication's kernels finds a free slot within microseconds. Every thread
/// reads one element of the received rows, runs four chains of \p fmas dependent FMAs on registers (ComputeKernel's
/// loop) and writes one element of the expert output, so the compute waits for its dispatch and its combine for it.
struct ExpertKernel {
  static constexpr int kThreads = 132 * 2048 * 64;
  Kokkos::View<const Row**, Kokkos::LayoutRight, Mem> in;
  Kokkos::View<Row**, Kokkos::LayoutRight, Mem> out;
  int fmas = 1;
  KOKKOS_INLINE_FUNCTION void operator()(int i) const {
    // Neighbouring threads read neighbouring elements (one coalesced pass over the first rows).
    const std::int64_t H = static_cast<std::int64_t>(in.extent(1)),
                       e = i % (static_cast<std::int64_t>(in.extent(0)) * H);
    const std::int64_t q = e / H, h = e % H;
    float x0 = static_cast<float>(in(q, h)), x1 = x0 * 0.5f, x2 = x0 * 0.25f, x3 = x0 * 0.125f;
    for (int k = 0; k < fmas; ++k) {
      x0 = x0 * 0.9999f + 1e-4f;
      x1 = x1 * 0.9998f + 2e-4f;
      x2 = x2 * 0.9997f + 3e-4f;
      x3 = x3 * 0.9996f + 4e-4f;
    }
    out(q, h) = Row(x0 + x1 + x2 + x3);
  }
  void run(const Exec& exec) const {
    if (in.extent(0) == 0) return;
    Kokkos::parallel_for("KokkosMoE::perf::expert_gemm_like", Kokkos::RangePolicy<Exec>(exec, 0, kThreads), *this);
  }
};

/// A training step of two micro-batches in flight (docs/ep.md §13, §14), R loopback ranks: on every rank micro-batch
/// i's expert compute runs on the compute instance while micro-batch i+1's dispatch and i-1's combine run on the
/// communication instance under the SM cap (sm_cap: by teams or by SM partitions; max_sms = -1: uncapped), ordered by
/// events (the expert compute waits for its dispatch, the combine for its compute). kMicroBatches micro-batches per
/// step, alternating two handles of one group (wire_buffers = 2). Measured on rank 0 in one run: the step with the
/// compute alone, with EP alone, and overlapped; the compute's FMA chain is calibrated first so that compute alone
/// takes about what EP alone takes (where overlap has the most to win). Medians of kReps.
void BM_TrainStep(benchmark::State& state, int R, int T, int max_sms, SmCap sm_cap) {
  constexpr int kMicroBatches = 8, kReps = 5;
  const int device = Exec().cuda_device();
  std::vector<Communicator> comms = make_loopback_communicators(R, device, CommConfig{});
  std::vector<cudaStream_t> ep_streams(static_cast<std::size_t>(R)), compute_streams(static_cast<std::size_t>(R));
  for (auto& s : ep_streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (auto& s : compute_streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  Meeting meet(R);
  std::vector<std::string> errors(static_cast<std::size_t>(R));
  std::atomic<int> fmas{64};
  double ep_us = 0, compute_us_alone = 0, step_us = 0;
  int partition_sms = 0;
  std::vector<std::thread> ranks;
  for (int r = 0; r < R; ++r)
    ranks.emplace_back([&, r] {
      try {
        const Exec eexec(ep_streams[static_cast<std::size_t>(r)]), cexec(compute_streams[static_cast<std::size_t>(r)]);
        Rank rank(eexec, comms[r], T, LMode::Eager, max_sms, meet, sm_cap, 2);
        if (r == 0) partition_sms = rank.group->partition_sms();
        EpHandle<Exec> hb = rank.group->make_handle({false, "micro-batch B"});
        ep_layout(eexec, hb, rank.ids);
        const int N = rank.handle->num_recv_rows(), H = rank.cfg.hidden_size;
        using Rows = Kokkos::View<Row**, Kokkos::LayoutRight, Mem>;
        const EpHandle<Exec>* handles[2] = {rank.handle.get(), &hb};
        Rows recv_x[2] = {rank.recv_x, Rows("recv_x_b", N, H)}, out[2] = {rank.out, Rows("out_b", N, H)},
             y[2] = {rank.y, Rows("y_b", rank.x.extent(0), H)};
        Kokkos::View<float*, Mem> recv_w[2] = {rank.recv_w, Kokkos::View<float*, Mem>("recv_w_b", N)};
        cudaEvent_t disp[2], comp[2], t0, t1, join;
        for (int i = 0; i < 2; ++i) {
          cudaEventCreateWithFlags(&disp[i], cudaEventDisableTiming);
          cudaEventCreateWithFlags(&comp[i], cudaEventDisableTiming);
        }
        cudaEventCreate(&t0);
        cudaEventCreate(&t1);
        cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
        eexec.fence();
        // mode 0: the compute alone; 1: EP alone; 2: both, overlapped. Returns this rank's step in us.
        const auto step = [&](int mode) {
          meet.wait();
          cudaEventRecord(t0, eexec.cuda_stream());
          cudaStreamWaitEvent(cexec.cuda_stream(), t0, 0);
          const auto combine = [&](int i) {
            if (mode == 2) cudaStreamWaitEvent(eexec.cuda_stream(), comp[i % 2], 0);
            ep_combine(eexec, *handles[i % 2], CombineMode::Weighted, out[i % 2], rank.w, y[i % 2]);
          };
          for (int i = 0; i < kMicroBatches; ++i) {
            const int b = i % 2;
            if (mode != 0) {
              ep_dispatch(eexec, *handles[b], rank.x, rank.w, recv_x[b], recv_w[b]);
              cudaEventRecord(disp[b], eexec.cuda_stream());
            }
            if (mode != 1) {
              if (mode == 2) cudaStreamWaitEvent(cexec.cuda_stream(), disp[b], 0);
              ExpertKernel{recv_x[b], out[b], fmas.load()}.run(cexec);
              cudaEventRecord(comp[b], cexec.cuda_stream());
            }
            if (mode != 0 && i >= 1) combine(i - 1);
          }
          if (mode != 0) combine(kMicroBatches - 1);
          cudaEventRecord(join, cexec.cuda_stream());
          cudaStreamWaitEvent(eexec.cuda_stream(), join, 0);
          cudaEventRecord(t1, eexec.cuda_stream());
          cudaEventSynchronize(t1);
          float ms = 0;
          cudaEventElapsedTime(&ms, t0, t1);
          return 1e3 * static_cast<double>(ms);
        };
        const auto median = [&](int mode) {
          std::vector<double> t;
          for (int k = 0; k < kReps; ++k) t.push_back(step(mode));
          std::sort(t.begin(), t.end());
          return t[t.size() / 2];
        };
        step(1);  // warm-up
        const double ep = median(1);
        if (r == 0) ep_us = ep;
        for (int round = 0; round < 3; ++round) {  // the compute's time is not quite linear in its chain: three rounds
          const double c0 = median(0);
          meet.wait();
          if (r == 0) fmas = std::max(1, static_cast<int>(fmas.load() * ep / c0 + 0.5));
          meet.wait();
        }
        const double c = median(0);
        const double both = median(2);
        if (r == 0) compute_us_alone = c, step_us = both;
        ep_synchronize(eexec, *rank.handle);
        ep_synchronize(eexec, hb);
        for (int i = 0; i < 2; ++i) cudaEventDestroy(disp[i]), cudaEventDestroy(comp[i]);
        cudaEventDestroy(t0);
        cudaEventDestroy(t1);
        cudaEventDestroy(join);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& s : ep_streams) cudaStreamDestroy(s);
  for (auto& s : compute_streams) cudaStreamDestroy(s);
  for (int r = 0; r < R; ++r)
    if (!errors[static_cast<std::size_t>(r)].empty()) {
      state.SkipWithError(("rank " + std::to_string(r) + ": " + errors[static_cast<std::size_t>(r)]).c_str());
      return;
    }
  for (auto _ : state) state.SetIterationTime(step_us * 1e-6);
  state.counters["ranks"] = R;
  state.counters["T"] = T;
  state.counters["micro_batches"] = kMicroBatches;
  if (max_sms > 0) state.counters["max_sms"] = max_sms;
  if (partition_sms > 0) state.counters["partition_sms"] = partition_sms;
  state.counters["expert_fmas"] = fmas.load();
  state.counters["compute_alone_us"] = compute_us_alone;
  state.counters["ep_alone_us"] = ep_us;
  state.counters["step_us"] = step_us;
  state.counters["step_over_max"] = step_us / std::max(compute_us_alone, ep_us);
  state.counters["step_over_sum"] = step_us / (compute_us_alone + ep_us);
}

}  // namespace
#endif

void register_loopback_benchmarks(const std::vector<int>& tokens) {
#if defined(KOKKOS_ENABLE_CUDA)
  if (!std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value) return;
  const std::pair<LOp, const char*> ops[] = {
      {LOp::Dispatch, "dispatch"},           {LOp::Combine, "combine"},
      {LOp::CombineBackward, "combine_bwd"}, {LOp::DispatchBackward, "dispatch_bwd"},
      {LOp::DispatchFp8, "dispatch_fp8"},    {LOp::Layout, "layout"}};
  auto add = [](const std::string& label, LOp op, int R, int T, LMode mode, PeerWindows windows, int max_sms = -1,
                SmCap sm_cap = SmCap::Auto) {
    benchmark::RegisterBenchmark(label.c_str(), BM_Loopback, op, R, T, mode, windows, max_sms, sm_cap)
        ->UseManualTime()
        ->Iterations(kIters)
        ->Unit(benchmark::kMicrosecond);
  };
  for (int T : tokens) {
    const std::string shape = T >= 1024 ? "prefill" : "decode";
    for (int R : {2, 4, 8})
      for (LMode mode : {LMode::Eager, LMode::Capacity})
        for (const auto& [op, name] : ops)
          add(std::string("ep_loopback/") + name + "/" + lmode_name(mode) + "/R" + std::to_string(R) + "/" + shape, op,
              R, T, mode, PeerWindows::Auto);
    // The decode path (docs/ep.md §15) on the fixed layout, beside that layout's separate layout + dispatch: eight
    // ranks, and one (no peer: the kernels alone).
    if (T <= EpDecodeLimits::max_tokens_per_rank)
      for (int R : {8, 1})
        for (const auto& [op, name] :
             {std::make_pair(LOp::Decode, "decode"), std::make_pair(LOp::DecodeFp8, "decode_fp8"),
              std::make_pair(LOp::Layout, "layout"), std::make_pair(LOp::Dispatch, "dispatch"),
              std::make_pair(LOp::Combine, "combine")})
          add(std::string("ep_loopback/") + name + "/fixed/R" + std::to_string(R) + "/" + shape, op, R, T, LMode::Fixed,
              PeerWindows::Auto);
    // The message path over the same ranks (staging rows, host-driven copies): the baseline of the direct writes.
    for (int i = 0; i < 2; ++i)
      add(std::string("ep_loopback/") + ops[i].second + "/eager/R8/" + shape + "/messages", ops[i].first, 8, T,
          LMode::Eager, PeerWindows::Off);
    // Against the SM cap (EpGroupConfig::max_sms, docs/ep.md §13): every rank's kernels at most that many SMs, kept
    // by teams and by SM partitions, beside the uncapped kernels (device_GBps_per_sm compares them): one rank (the
    // local path) and R = 4 (the remote path; 4 x 32 SMs fit the device).
    for (int R : {1, 4})
      for (int i = 0; i < 2; ++i) {
        const std::string base =
            std::string("ep_sm_cap/") + ops[i].second + "/eager/R" + std::to_string(R) + "/" + shape;
        add(base + "/all", ops[i].first, R, T, LMode::Eager, PeerWindows::Auto);
        for (int sms : {8, 16, 24, 32}) {
          add(base + "/teams" + std::to_string(sms), ops[i].first, R, T, LMode::Eager, PeerWindows::Auto, sms,
              SmCap::Teams);
          add(base + "/partition" + std::to_string(sms), ops[i].first, R, T, LMode::Eager, PeerWindows::Auto, sms,
              SmCap::Partition);
        }
      }
    // The training step of two micro-batches in flight at R = 4: EP uncapped, and capped by teams and by partitions.
    if (T >= 1024) {
      const auto train = [&](const std::string& cap, int sms, SmCap how) {
        benchmark::RegisterBenchmark(("ep_train_step/R4/" + shape + "/" + cap).c_str(), BM_TrainStep, 4, T, sms, how)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
      };
      train("all", -1, SmCap::Auto);
      for (int sms : {4, 8, 16, 24, 32}) {
        train("teams" + std::to_string(sms), sms, SmCap::Teams);
        train("partition" + std::to_string(sms), sms, SmCap::Partition);
      }
    }
    // A compute kernel beside the EP steps, alone and with dispatch + combine at R = 8 under each cap.
    if (T >= 1024)
      for (int sms : {8, 16, 32, -1})
        benchmark::RegisterBenchmark(
            ("ep_overlap/R8/" + shape + "/" + (sms > 0 ? "sms" + std::to_string(sms) : std::string("all"))).c_str(),
            BM_Overlap, 8, T, sms)
            ->UseManualTime()
            ->Iterations(1)
            ->Unit(benchmark::kMicrosecond);
  }
#else
  (void)tokens;
#endif
}

}  // namespace Perf
}  // namespace KokkosMoE
