/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// kokkosmoe-ep: the expert-parallel main job. One MoE layer step across the ranks of MPI_COMM_WORLD (one EP group):
// router forward (compact ids + weights), layout, dispatch, a deterministic linear expert, weighted combine, and the
// backward of all of it (combine, expert, dispatch, router). Checks every rank's results against a single-rank
// computation of the same step (plain loops over the rank's own routing) and prints a per-rank table of tokens,
// slots, bytes, times and GB/s. The transport: MPI messages or MPI shared windows on host execution spaces, NCCL or
// CUDA IPC over MPI on Kokkos::Cuda, or loopback: R ranks as threads of one process on one device (the remote path
// without several GPUs).
//
//   mpirun -np 2 kokkosmoe-ep [--transport mpi|shm|nccl|ipc] [--preset deepseek-v3] [--tokens 256] [--hidden H]
//                             [--dtype float|bf16] [--capacity ROWS] [--alignment A] [--iters 5] [--seed 1]
//   kokkosmoe-ep --transport loopback --ranks 8 [...]
#include <KokkosMoE_Cli.hpp>
#include <KokkosMoE_Communicator_Loopback.hpp>
#include <KokkosMoE_Communicator_MPI.hpp>
#include <KokkosMoE_EP.hpp>
#include <KokkosMoE_Router.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#if defined(KOKKOSMOE_HAVE_CUDA_IPC)
#include <KokkosMoE_Communicator_CudaIpc.hpp>
#endif
#if defined(KOKKOSMOE_HAVE_NCCL)
#include <KokkosMoE_Communicator_NCCL.hpp>
#endif

#include <Kokkos_Core.hpp>

#include <mpi.h>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace KokkosMoE;
using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;

struct Args {
  std::string preset = "deepseek-v3";
  long tokens = 256;
  long hidden = 0;  // 0: the preset's hidden size
  std::string dtype = "bf16";
  long capacity = 0;
  long alignment = 1;
  long iters = 5;
  long seed = 1;
  std::string transport;  // "" = the build's default (nccl with CUDA, else mpi)
  long ranks = 2;         // loopback
  bool fp8 = false;       // dispatch as FP8 rows (docs/ep.md §3.5)
  bool decode = false;    // the decode path: fixed layout, layout fused into the dispatch (docs/ep.md §15)
  bool help = false;
  KokkosMoE::Impl::CliKokkosArgs kokkos;
};

/// The command line, parsed before MPI or Kokkos start (the shared strict parser: docs/hostile-input.md).
Args parse(int argc, char** argv) {
  using KokkosMoE::Impl::CliFlag;
  static const std::vector<CliFlag> flags = {
      {"--preset", true, ""},    {"--tokens", true, ""},    {"--hidden", true, ""}, {"--dtype", true, ""},
      {"--capacity", true, ""},  {"--alignment", true, ""}, {"--iters", true, ""},  {"--seed", true, ""},
      {"--transport", true, ""}, {"--ranks", true, ""},     {"--fp8", false, ""},   {"--decode", false, ""},
      {"--help", false, "-h"}};
  const KokkosMoE::Impl::CliArgs cli = KokkosMoE::Impl::parse_command_line(argc, argv, flags, KOKKOS_VERSION);
  Args a;
  a.help = cli.has("--help");
  a.fp8 = cli.has("--fp8");
  a.decode = cli.has("--decode");
  a.preset = cli.choice("--preset", router_preset_names(), a.preset);
  a.tokens = cli.integer("--tokens", 0, 1 << 24, a.tokens);
  a.hidden = cli.integer("--hidden", 1, 1 << 16, 0);
  a.dtype = cli.choice("--dtype", {"float", "bf16"}, a.dtype);
  a.capacity = cli.integer("--capacity", 0, INT_MAX, 0);
  a.alignment = cli.integer("--alignment", 1, 1 << 16, 1);
  a.iters = cli.integer("--iters", 1, 1000, a.iters);
  a.seed = cli.integer("--seed", 0, INT_MAX, a.seed);
  a.transport = cli.choice("--transport", {"mpi", "shm", "loopback", "nccl", "ipc"}, "");
  a.ranks = cli.integer("--ranks", 1, 64, a.ranks);
  if (a.fp8) {
    const long H = a.hidden > 0 ? a.hidden : router_preset(a.preset).hidden_size;
    if (H % kFp8BlockChannels != 0)
      throw KokkosMoE::Impl::CliUsageError("--fp8 needs a hidden size that is a multiple of " +
                                           std::to_string(kFp8BlockChannels) + ", got " + std::to_string(H));
  }
  if (a.decode) {
    using KokkosMoE::Impl::CliUsageError;
    if (a.tokens > KokkosMoE::EpDecodeLimits::max_tokens_per_rank)
      throw CliUsageError("--decode takes at most " + std::to_string(KokkosMoE::EpDecodeLimits::max_tokens_per_rank) +
                          " tokens per rank, got " + std::to_string(a.tokens));
    if (cli.has("--capacity") || cli.has("--alignment"))
      throw CliUsageError(
          "--decode sizes its own receive rows (the fixed layout): --capacity and --alignment do not "
          "apply");
    if (a.fp8) throw CliUsageError("--decode sends the rows as they are: --fp8 does not apply");
  }
  a.kokkos = cli.kokkos();
  KokkosMoE::Impl::cli_check_kokkos_environment(a.kokkos);
  return a;
}

const char* kUsage =
    "usage: mpirun -np R kokkosmoe-ep [options]\n"
    "  --preset NAME     router preset (default deepseek-v3): its E, top-k, grouping and hidden size\n"
    "  --tokens N        tokens per rank (default 256)\n"
    "  --hidden H        token row elements (default: the preset's)\n"
    "  --dtype float|bf16  token rows (default bf16)\n"
    "  --capacity ROWS   receive capacity per rank (capacity mode, drop on overflow); 0 = eager (default)\n"
    "  --alignment A     rows per expert slab padded to a multiple of A (default 1)\n"
    "  --iters N         timed repetitions, median reported (default 5)\n"
    "  --seed S          input seed (default 1)\n"
    "  --transport T     mpi (point-to-point) | shm (MPI shared windows, direct writes) on host spaces, nccl |\n"
    "                    ipc (CUDA IPC windows over MPI, ranks may share a GPU) on Kokkos::Cuda (the default\n"
    "                    of each: mpi, nccl), loopback: --ranks ranks as threads of this process\n"
    "  --ranks R         loopback ranks (default 2); without mpirun\n"
    "  --fp8             dispatch the rows as FP8 E4M3 with a scale per 128 channels (H a multiple of 128); the\n"
    "                    expert reads them dequantized, the check uses the same quantized rows\n"
    "  --decode          the decode path: the fixed expert-major layout and ep_decode_dispatch (the layout fused\n"
    "                    into the dispatch, no host wait); at most 256 tokens per rank\n";

/// The few collectives of the job itself (timing barriers, the table, the verdict): MPI_COMM_WORLD, or the threads of
/// a loopback job.
class JobComm {
 public:
  JobComm() = default;  // MPI_COMM_WORLD
  explicit JobComm(int threads) : m_shared(std::make_shared<Shared>(threads)) {}
  void barrier() {
    if (!m_shared) {
      MPI_Barrier(MPI_COMM_WORLD);
      return;
    }
    m_shared->meet();
  }
  /// Rank 0 gets every rank's line in rank order.
  std::vector<std::string> gather(int rank, const std::string& line) {
    if (!m_shared) {
      int R = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &R);
      char buf[1024] = {};
      std::snprintf(buf, sizeof buf, "%s", line.c_str());
      std::vector<char> all(static_cast<std::size_t>(R) * sizeof buf);
      MPI_Gather(buf, sizeof buf, MPI_CHAR, all.data(), sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
      std::vector<std::string> out;
      for (int r = 0; r < R; ++r) out.emplace_back(all.data() + static_cast<std::size_t>(r) * sizeof buf);
      return out;
    }
    m_shared->lines[rank] = line;
    m_shared->meet();
    std::vector<std::string> out = m_shared->lines;
    m_shared->meet();
    return out;
  }
  int all_min(int rank, int v) {
    if (!m_shared) {
      int out = 0;
      MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      return out;
    }
    m_shared->ints[rank] = v;
    m_shared->meet();
    const int out = *std::min_element(m_shared->ints.begin(), m_shared->ints.end());
    m_shared->meet();
    return out;
  }
  void max3(int rank, const double* v, double* out) {
    if (!m_shared) {
      MPI_Reduce(v, out, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      return;
    }
    for (int i = 0; i < 3; ++i) m_shared->dbl[3 * rank + i] = v[i];
    m_shared->meet();
    for (int i = 0; i < 3; ++i) {
      out[i] = 0;
      for (std::size_t r = 0; r < m_shared->lines.size(); ++r) out[i] = std::max(out[i], m_shared->dbl[3 * r + i]);
    }
    m_shared->meet();
  }

 private:
  struct Shared {
    explicit Shared(int n) : n(n), lines(n), ints(n), dbl(3 * static_cast<std::size_t>(n)) {}
    int n, arrived = 0;
    std::uint64_t gen = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> lines;
    std::vector<int> ints;
    std::vector<double> dbl;
    void meet() {
      std::unique_lock<std::mutex> lock(mu);
      const std::uint64_t g = gen;
      if (++arrived == n) {
        arrived = 0;
        ++gen;
        cv.notify_all();
        return;
      }
      cv.wait(lock, [&] { return gen != g; });
    }
  };
  std::shared_ptr<Shared> m_shared;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class Scalar>
int run(const Args& args, const Exec& exec, const Communicator& comm, int world_rank, JobComm& job) {
  const RouterPreset preset = router_preset(args.preset);
  const int R = comm.size(), me = comm.rank();
  const int T = static_cast<int>(args.tokens), E = preset.num_experts, K = preset.config.topk;
  const int H = static_cast<int>(args.hidden > 0 ? args.hidden : preset.hidden_size);
  constexpr bool is_bf16 = std::is_same<Scalar, bf16_t>::value;
  EpGroupConfig c;
  c.ep_size = R;
  c.num_experts = E;
  c.hidden_size = H;
  c.topk = K;
  c.max_tokens_per_rank = std::max(T, 1);
  c.max_recv_tokens_per_rank = static_cast<int>(args.capacity);
  c.expert_alignment = static_cast<int>(args.alignment);
  c.drop_on_overflow = args.capacity > 0;
  if (args.decode) c.layout = RecvLayout::ExpertMajorFixed;
  EpGroup<Exec> group(exec, comm, c);
  auto handle = group.make_handle({true, "layer 0"});
  const int L = group.num_local_experts();

  // Router inputs and the token rows, seeded per rank.
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> logits("logits", T, E), weights("weights", T, K),
      grad_w("grad_w", T, K), grad_logits("grad_logits", T, E);
  Kokkos::View<float*, Mem> bias("bias", preset.has_bias ? E : 0);
  Kokkos::View<int**, Kokkos::LayoutRight, Mem> ids("ids", T, K);
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> x("x", T, H), y("y", T, H), grad_y("grad_y", T, H),
      grad_x("grad_x", T, H);
  {
    std::mt19937_64 gen(static_cast<std::uint64_t>(args.seed) * 1315423911ull + static_cast<std::uint64_t>(me));
    std::normal_distribution<float> n01(0.0f, 1.0f);
    auto hl = Kokkos::create_mirror_view(logits);
    for (int t = 0; t < T; ++t)
      for (int e = 0; e < E; ++e) hl(t, e) = n01(gen);
    Kokkos::deep_copy(logits, hl);
    auto hb = Kokkos::create_mirror_view(bias);
    for (std::size_t e = 0; e < hb.extent(0); ++e) hb(e) = 0.02f * (n01(gen) * 0.5f);
    Kokkos::deep_copy(bias, hb);
    auto hx = Kokkos::create_mirror_view(x);
    auto hg = Kokkos::create_mirror_view(grad_y);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        hx(t, h) = Scalar(0.25f * n01(gen));
        hg(t, h) = Scalar(0.125f * n01(gen));
      }
    Kokkos::deep_copy(x, hx);
    Kokkos::deep_copy(grad_y, hg);
  }
  RouterConfig rc = preset.config;
  if (preset.has_bias) {
    topk_router_compact(exec, rc, logits, bias, ids, weights);
  } else {
    topk_router_compact(exec, rc, logits, Kokkos::View<const float*, Mem>(), ids, weights);
  }

  std::vector<double> t_layout, t_dispatch, t_combine, t_combine_bwd, t_dispatch_bwd;
  Kokkos::View<Scalar**, Kokkos::LayoutRight, Mem> recv_x, out, grad_out, grad_recv_x;
  Kokkos::View<float*, Mem> recv_w;
  Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> recv_q;
  Kokkos::View<float**, Kokkos::LayoutRight, Mem> recv_scales;
  int N = 0;
  auto timed = [&](std::vector<double>& acc, auto&& f) {
    exec.fence();
    job.barrier();
    Kokkos::Timer timer;
    f();
    ep_synchronize(exec, handle);
    acc.push_back(timer.seconds());
  };
  for (long it = 0; it < args.iters; ++it) {
    if (!args.decode) timed(t_layout, [&] { ep_layout(exec, handle, ids); });
    const int rows = args.decode ? group.capacity_rows() : handle.num_recv_rows();
    if (rows != N || recv_x.extent(0) == 0) {
      N = rows;
      recv_x = decltype(recv_x)("recv_x", N, H);
      out = decltype(out)("out", N, H);
      grad_out = decltype(grad_out)("grad_out", N, H);
      grad_recv_x = decltype(grad_recv_x)("grad_recv_x", N, H);
      recv_w = decltype(recv_w)("recv_w", N);
      if (args.fp8) {
        recv_q = decltype(recv_q)("recv_q", N, H);
        recv_scales = decltype(recv_scales)("recv_scales", N, H / kFp8BlockChannels);
      }
    }
    if (args.fp8) {
      timed(t_dispatch, [&] { ep_dispatch(exec, handle, x, weights, fp8_rows(recv_q, recv_scales), recv_w); });
      dequantize_fp8_rows(exec, recv_q, recv_scales, recv_x);
    } else if (args.decode) {
      timed(t_dispatch, [&] { ep_decode_dispatch(exec, handle, ids, x, weights, recv_x, recv_w); });
    } else {
      timed(t_dispatch, [&] { ep_dispatch(exec, handle, x, weights, recv_x, recv_w); });
    }
    // The expert: out = a_e * x + b_e, a_e = 1 + (e % 5) / 8, b_e = (e % 3) / 16.
    auto recv_expert = handle.recv_expert();
    auto rx = recv_x;
    auto o = out;
    Kokkos::parallel_for(
        "kokkosmoe-ep::expert", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(N) * H),
        KOKKOS_LAMBDA(std::int64_t i) {
          const int r = static_cast<int>(i / H), h = static_cast<int>(i % H), l = recv_expert(r);
          const int e = me * L + (l < 0 ? 0 : l);
          o(r, h) = Scalar(l < 0 ? 0.0f : static_cast<float>(rx(r, h)) * (1.0f + (e % 5) * 0.125f) + (e % 3) * 0.0625f);
        });
    timed(t_combine, [&] { ep_combine(exec, handle, CombineMode::Weighted, out, weights, y); });
    timed(t_combine_bwd,
          [&] { ep_combine_backward(exec, handle, CombineMode::Weighted, grad_y, weights, out, grad_out, grad_w); });
    auto go = grad_out;
    auto grx = grad_recv_x;
    Kokkos::parallel_for(
        "kokkosmoe-ep::expert_backward", Kokkos::RangePolicy<Exec>(exec, 0, static_cast<std::int64_t>(N) * H),
        KOKKOS_LAMBDA(std::int64_t i) {
          const int r = static_cast<int>(i / H), h = static_cast<int>(i % H), l = recv_expert(r);
          const int e = me * L + (l < 0 ? 0 : l);
          grx(r, h) = Scalar(l < 0 ? 0.0f : static_cast<float>(go(r, h)) * (1.0f + (e % 5) * 0.125f));
        });
    timed(t_dispatch_bwd, [&] {
      ep_dispatch_backward(exec, handle, grad_recv_x, Kokkos::View<const float*, Mem>(), grad_x,
                           Kokkos::View<float**, Kokkos::LayoutRight, Mem>());
    });
  }
  topk_router_compact_backward(exec, rc, logits, ids, grad_w, grad_logits);
  exec.fence();

  // The single-rank computation of the same step from this rank's own routing (with FP8 rows: of the rows as the
  // experts saw them, quantized and dequantized).
  if (args.fp8) {
    Kokkos::View<fp8_e4m3_t**, Kokkos::LayoutRight, Mem> xq("xq", T, H);
    Kokkos::View<float**, Kokkos::LayoutRight, Mem> xs("xs", T, H / kFp8BlockChannels);
    quantize_fp8_rows(exec, x, xq, xs);
    dequantize_fp8_rows(exec, xq, xs, x);
    exec.fence();
  }
  auto hx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), x);
  auto hy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), y);
  auto hgy = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_y);
  auto hgx = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_x);
  auto hgw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_w);
  auto hid = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), ids);
  auto hw = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), weights);
  auto hgl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), grad_logits);
  // Capacity mode drops slots past the receive capacity: they contribute nothing and get zero gradients.
  auto kept = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle.slot_kept());
  auto rnd = [&](float v) { return is_bf16 ? static_cast<float>(bf16_t(v)) : v; };
  double err_y = 0, err_gx = 0, err_gw = 0;
  bool finite = true;
  for (int t = 0; t < T; ++t) {
    for (int h = 0; h < H; ++h) {
      float acc = 0, gacc = 0;
      for (int k = 0; k < K; ++k) {
        const int e = hid(t, k);
        if (e < 0 || kept(static_cast<std::size_t>(t) * K + k) == 0) continue;
        const float a = 1.0f + (e % 5) * 0.125f, b = (e % 3) * 0.0625f;
        acc += hw(t, k) * rnd(static_cast<float>(hx(t, h)) * a + b);
        gacc += rnd(rnd(hw(t, k) * static_cast<float>(hgy(t, h))) * a);
      }
      err_y = std::max(err_y, static_cast<double>(std::fabs(static_cast<float>(hy(t, h)) - rnd(acc))));
      err_gx = std::max(err_gx, static_cast<double>(std::fabs(static_cast<float>(hgx(t, h)) - rnd(gacc))));
    }
    for (int k = 0; k < K; ++k) {
      const int e = hid(t, k);
      float d = 0;
      if (e >= 0 && kept(static_cast<std::size_t>(t) * K + k) != 0)
        for (int h = 0; h < H; ++h)
          d += static_cast<float>(hgy(t, h)) *
               rnd(static_cast<float>(hx(t, h)) * (1.0f + (e % 5) * 0.125f) + (e % 3) * 0.0625f);
      err_gw = std::max(err_gw, static_cast<double>(std::fabs(hgw(t, k) - d)) / (1.0 + std::fabs(d)));
    }
    for (int e = 0; e < E; ++e) finite = finite && std::isfinite(hgl(t, e));
  }
  const double tol = is_bf16 ? 5e-2 : 1e-4;
  const bool pass = err_y <= tol && err_gx <= tol && err_gw <= 1e-3 && finite;

  // This rank's row of the table.
  auto tpr = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle.tokens_per_rank());
  auto tpe = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle.tokens_per_expert());
  auto rcnt = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle.recv_counts());
  long slots = 0, local = 0, sent_tokens = 0;
  for (int e = 0; e < E; ++e) {
    slots += tpe(e);
    if (e / L == me) local += tpe(e);
  }
  for (int r = 0; r < R; ++r) sent_tokens += tpr(r);
  long recv_slots = 0;
  std::string per_expert;
  for (int l = 0; l < L; ++l) {
    recv_slots += rcnt(l);
    if (l < 8) per_expert += (per_expert.empty() ? "" : ",") + std::to_string(rcnt(l));
  }
  if (L > 8) per_expert += ",...";
  // Rows actually received: capacity mode's dropped slots are counted in the demand above, not moved.
  recv_slots -= ep_synchronize(exec, handle).dropped_recv_slots;
  const double row_bytes = static_cast<double>(H) * sizeof(Scalar);
  const double bytes = static_cast<double>(recv_slots) * row_bytes;  // docs/ep.md §9: received rows, local included
  const double td = median(t_dispatch), tc = median(t_combine), tcb = median(t_combine_bwd),
               tdb = median(t_dispatch_bwd), tl = median(t_layout);
  char line[1024];
  std::snprintf(line, sizeof line,
                "%4d %6d %7ld %7ld %7ld %8ld  %-22s %9.2f %9.1f %9.1f %9.1f %9.1f %9.1f %8.2f %8.2f  %s", world_rank, T,
                slots, local, sent_tokens, recv_slots, per_expert.c_str(), bytes / 1e6, tl * 1e6, td * 1e6, tc * 1e6,
                tcb * 1e6, tdb * 1e6, td > 0 ? bytes / td / 1e9 : 0.0, tc > 0 ? bytes / tc / 1e9 : 0.0,
                pass ? "PASS" : "FAIL");
  const std::vector<std::string> all = job.gather(world_rank, line);
  const int pass_min = job.all_min(world_rank, pass ? 1 : 0);
  double errs[3] = {err_y, err_gx, err_gw}, errs_max[3];
  job.max3(world_rank, errs, errs_max);
  const ByteCount wire = group.stats().bytes["ep_dispatch"];
  // Rank 0's cumulative statistics (kept on the device across the steps, read once here).
  auto load = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), handle.expert_load());
  auto waits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), group.peer_wait_ns());
  std::int64_t load_min = L > 0 ? load(0) : 0, load_max = load_min, load_sum = 0, wait_max = 0;
  for (int l = 0; l < L; ++l) {
    load_min = std::min<std::int64_t>(load_min, load(l));
    load_max = std::max<std::int64_t>(load_max, load(l));
    load_sum += load(l);
  }
  for (int r = 0; r < R; ++r) wait_max = std::max<std::int64_t>(wait_max, waits(r));
  if (world_rank == 0) {
    std::printf(
        "kokkosmoe-ep: %s (E = %d, top-%d, %d local experts per rank), %d ranks over %s, %s rows of %d, %s mode\n",
        preset.name.c_str(), E, K, L, R, to_string(comm.transport()), is_bf16 ? "bf16" : "fp32", H,
        args.decode         ? "decode (fixed layout, layout fused into the dispatch)"
        : args.capacity > 0 ? ("capacity (" + std::to_string(args.capacity) + " rows, drop)").c_str()
                            : "eager");
    std::printf("execution space %s; times are medians of %ld steps (fenced wall time, ep_synchronize included)\n",
                Exec::name(), args.iters);
    std::printf(
        "rank tokens   slots   local  tok->r recvslot  recv per local expert  recv MB  layout us dispatch "
        "us combine us comb.bwd  disp.bwd disp GB/s comb GB/s  check\n");
    for (const std::string& l : all) std::printf("%s\n", l.c_str());
    std::printf("rank 0's dispatch: %.1f wire bytes per token (%.1f logical) over %ld steps\n",
                T > 0 ? static_cast<double>(wire.wire) / args.iters / T : 0.0,
                T > 0 ? static_cast<double>(wire.logical) / args.iters / T : 0.0, args.iters);
    std::printf(
        "rank 0's cumulative expert load (every layout of the run): min %lld, mean %.1f, max %lld slots per local "
        "expert; longest wait for one peer %.1f us in total\n",
        static_cast<long long>(load_min), L > 0 ? static_cast<double>(load_sum) / L : 0.0,
        static_cast<long long>(load_max), static_cast<double>(wait_max) / 1e3);
    std::printf(
        "check against the single-rank computation: max |y err| %.3g, |grad_x err| %.3g, rel |grad_w err| %.3g, "
        "router grad_logits finite: %s -> %s\n",
        errs_max[0], errs_max[1], errs_max[2], finite ? "yes" : "no", pass_min ? "PASS" : "FAIL");
    std::printf("GB/s: logical bandwidth of docs/ep.md §9 (received rows x H x %zu B, the rank's own included)\n",
                sizeof(Scalar));
  }
  return pass_min ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Usage errors end here, before MPI or Kokkos start: one line, exit 2 (on every rank of an mpirun job).
  Args args;
  const int usage = KokkosMoE::Impl::cli_main("kokkosmoe-ep", [&] {
    args = parse(argc, argv);
    return 0;
  });
  if (usage != 0) return usage;
  if (args.help) {
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
    if (r == nullptr || std::strcmp(r, "0") == 0) std::printf("%s", kUsage);
    return 0;
  }
  // Loopback ranks share one device (docs/ep.md §7.3).
  if (args.transport == "loopback") prepare_loopback_environment();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  const std::vector<std::string> kargs = args.kokkos.argv_for("kokkosmoe-ep", KOKKOS_VERSION);
  std::vector<char*> kargv;
  for (const std::string& k : kargs) kargv.push_back(const_cast<char*>(k.c_str()));
  int kargc = static_cast<int>(kargv.size());
  Kokkos::initialize(kargc, kargv.data());
  int rc = 1;
  constexpr bool on_cuda =
#if defined(KOKKOS_ENABLE_CUDA)
      std::is_same<Exec, Kokkos::Cuda>::value;
#else
      false;
#endif
  const std::string transport = args.transport.empty() ? (on_cuda ? "nccl" : "mpi") : args.transport;
  auto step = [&](const Exec& exec, const Communicator& comm, int rank, JobComm& job) {
    return args.dtype == "bf16" ? run<bf16_t>(args, exec, comm, rank, job) : run<float>(args, exec, comm, rank, job);
  };
  try {
    if (transport == "loopback") {
      if (!on_cuda)
        throw std::runtime_error(
            "--transport loopback needs Kokkos::Cuda as the default execution space in this build (host loopback "
            "ranks need independent Kokkos::Serial instances; use --transport shm under mpirun on CPUs)");
      if (world_size != 1)
        throw std::runtime_error("--transport loopback runs in one process: start it without mpirun");
#if defined(KOKKOS_ENABLE_CUDA)
      const int R = static_cast<int>(args.ranks);
      std::vector<Communicator> comms = make_loopback_communicators(R, Kokkos::Cuda().cuda_device());
      std::vector<cudaStream_t> streams(static_cast<std::size_t>(R));
      for (auto& st : streams) cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      JobComm job(R);
      std::vector<int> rcs(static_cast<std::size_t>(R), 1);
      std::vector<std::thread> threads;
      for (int r = 0; r < R; ++r)
        threads.emplace_back([&, r] {
          try {
            rcs[r] = step(Kokkos::Cuda(streams[r]), comms[r], r, job);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "kokkosmoe-ep: loopback rank %d: %s\n", r, e.what());
          }
        });
      for (auto& t : threads) t.join();
      for (auto& st : streams) cudaStreamDestroy(st);
      rc = *std::max_element(rcs.begin(), rcs.end());
#endif
    } else {
      JobComm job;
      if (transport == "nccl") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_NCCL)
        Communicator host = make_mpi_communicator(MPI_COMM_WORLD);
        rc = step(Exec(), make_nccl_communicator(host, Kokkos::DefaultExecutionSpace().cuda_device()), world_rank, job);
#else
        throw std::runtime_error("--transport nccl needs a CUDA build with NCCL (Kokkos::Cuda)");
#endif
      } else if (transport == "ipc") {
#if defined(KOKKOS_ENABLE_CUDA) && defined(KOKKOSMOE_HAVE_CUDA_IPC)
        Communicator host = make_mpi_communicator(MPI_COMM_WORLD);
        rc = step(Exec(), make_cuda_ipc_communicator(host, Kokkos::DefaultExecutionSpace().cuda_device()), world_rank,
                  job);
#else
        throw std::runtime_error("--transport ipc needs a CUDA build (Kokkos::Cuda) with MPI");
#endif
      } else {
        if (on_cuda)
          throw std::runtime_error("--transport " + transport +
                                   " serves host execution spaces; Kokkos::Cuda takes nccl, ipc or loopback");
        rc =
            step(Exec(),
                 transport == "shm" ? make_mpi_shm_communicator(MPI_COMM_WORLD) : make_mpi_communicator(MPI_COMM_WORLD),
                 world_rank, job);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kokkosmoe-ep: rank %d: %s\n", world_rank, e.what());
    rc = 1;
  }
  Kokkos::finalize();
  if (rc == 1 && world_size > 1) {
    // A failed rank may leave peers waiting: end the job instead of hanging in MPI_Finalize.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return rc;
}
