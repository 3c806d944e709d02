/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#include "KokkosMoE_PerfHelpers.hpp"

#include <kokkos_ext/KokkosMoE_Float16.hpp>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace KokkosMoE {
namespace Perf {

Options& options() {
  static Options o;
  return o;
}

namespace {

bool parse_double(const char* s, double& out) {
  char* end = nullptr;
  out = std::strtod(s, &end);
  return end != s && *end == '\0';
}

bool parse_tokens(const std::string& s, std::vector<std::int64_t>& out) {
  out.clear();
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v >= (1ll << 31)) return false;
    out.push_back(v);
  }
  return !out.empty();
}

std::vector<void (*)()>& registrars() {
  static std::vector<void (*)()> r;
  return r;
}
std::vector<void (*)()>& cleanups() {
  static std::vector<void (*)()> c;
  return c;
}

template <class T>
double median(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct EmptyFunctor {
  KOKKOS_INLINE_FUNCTION void operator()(const int) const {}
};

double time_empty_kernel(const ExecSpace& exec) {
  exec.fence();
  Kokkos::Timer timer;
  Kokkos::parallel_for("KokkosMoE::perf::empty", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1), EmptyFunctor{});
  exec.fence();
  return timer.seconds();
}

using CopyView = Kokkos::View<float*, MemSpace>;

double time_copy(const ExecSpace& exec, const CopyView& dst, const CopyView& src) {
  exec.fence();
  Kokkos::Timer timer;
  Kokkos::deep_copy(exec, dst, src);
  exec.fence();
  return timer.seconds();
}

// BM_CopyBaseline: the copy baseline as a benchmark of its own, so it appears in the JSON beside the kernels.
// bytes_per_token is not meaningful here; the "tokens" are the floats copied, 8 bytes each (read + write).
void BM_CopyBaseline(benchmark::State& state) {
  ExecSpace exec;
  const std::size_t n = copy_baseline_bytes() / sizeof(float);
  CopyView src(Kokkos::view_alloc(std::string("KokkosMoE::perf::copy_src"), Kokkos::WithoutInitializing), n);
  CopyView dst(Kokkos::view_alloc(std::string("KokkosMoE::perf::copy_dst"), Kokkos::WithoutInitializing), n);
  fill_uniform(src, 1, -1.0f, 1.0f);
  fill_uniform(dst, 2, -1.0f, 1.0f);
  time_copy(exec, dst, src);  // warm-up
  const double seconds = timed_loop(state, exec, [&](std::int64_t) { Kokkos::deep_copy(exec, dst, src); });
  set_counters(state, static_cast<std::int64_t>(n), 2.0 * sizeof(float), seconds);
  state.SetLabel("deep_copy of " + std::to_string(copy_baseline_bytes() >> 20) + " MiB, read+write counted");
}

// BM_EmptyKernel: the launch floor t_floor (docs/router.md §17).
void BM_EmptyKernel(benchmark::State& state) {
  ExecSpace exec;
  for (int i = 0; i < 10; ++i) time_empty_kernel(exec);
  timed_loop(state, exec, [&](std::int64_t) {
    Kokkos::parallel_for("KokkosMoE::perf::empty", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1), EmptyFunctor{});
  });
  state.SetLabel("empty parallel_for(1) on " + std::string(ExecSpace::name()) + ", fenced");
}

void register_baselines() {
  benchmark::RegisterBenchmark("BM_CopyBaseline", BM_CopyBaseline)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(std::max(options().min_time, 0.05));
  benchmark::RegisterBenchmark("BM_EmptyKernel", BM_EmptyKernel)
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(std::max(options().min_time, 0.05));
}

}  // namespace

bool parse_options(int& argc, char** argv) {
  bool ok = true;
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* flag) -> const char* {
      const std::size_t n = std::strlen(flag);
      return arg.compare(0, n, flag) == 0 && arg.size() > n && arg[n] == '=' ? argv[i] + n + 1 : nullptr;
    };
    if (const char* v = value("--kokkosmoe_min_time")) {
      double t = 0;
      if (!parse_double(v, t) || t < 0) {
        std::fprintf(stderr, "error: --kokkosmoe_min_time expects seconds >= 0, got '%s'\n", v);
        ok = false;
      }
      options().min_time = t;
    } else if (const char* v = value("--kokkosmoe_tokens")) {
      if (!parse_tokens(v, options().tokens)) {
        std::fprintf(stderr,
                     "error: --kokkosmoe_tokens expects a comma-separated list of counts in [1, 2^31), got '%s'\n", v);
        ok = false;
      }
    } else if (const char* v = value("--kokkosmoe_cold")) {
      if (std::strcmp(v, "0") != 0 && std::strcmp(v, "1") != 0) {
        std::fprintf(stderr, "error: --kokkosmoe_cold expects 0 or 1, got '%s'\n", v);
        ok = false;
      }
      options().cold = std::strcmp(v, "1") == 0;
    } else if (arg.rfind("--kokkosmoe_", 0) == 0) {
      std::fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
      print_options_help();
      ok = false;
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  argv[argc] = nullptr;
  return ok;
}

void print_options_help() {
  std::printf(
      "KokkosMoE benchmark options (besides Google Benchmark's --benchmark_* and Kokkos' --kokkos-* flags):\n"
      "  --kokkosmoe_min_time=S     minimum run time of each benchmark in seconds (default %.2f here; 0: one\n"
      "                             timed iteration, for smoke runs)\n"
      "  --kokkosmoe_tokens=a,b,..  token counts T (default 4096,16384,65536 [+262144 on a GPU])\n"
      "  --kokkosmoe_cold=0|1       register the cold-cache variants (default: 1 on a GPU, 0 on the host)\n",
      Options{}.min_time);
}

std::vector<std::int64_t> token_counts() {
  if (!options().tokens.empty()) return options().tokens;
  std::vector<std::int64_t> t = {4096, 16384, 65536};
  if (!default_space_is_host()) t.push_back(262144);
  return t;
}

bool add_registrar(void (*fn)()) {
  registrars().push_back(fn);
  return true;
}
void run_registrars() {
  register_baselines();  // first, so the baselines lead the console output and the JSON
  for (auto fn : registrars()) fn();
}
bool add_cleanup(void (*fn)()) {
  cleanups().push_back(fn);
  return true;
}
void run_cleanups() {
  for (auto fn : cleanups()) fn();
}

std::size_t copy_baseline_bytes() {
  return default_space_is_host() ? (std::size_t(256) << 20) : (std::size_t(1) << 30);
}

double copy_bandwidth_GBps() {
  static const double gbps = [] {
    ExecSpace exec;
    const std::size_t n = copy_baseline_bytes() / sizeof(float);
    CopyView src(Kokkos::view_alloc(std::string("KokkosMoE::perf::copy_src"), Kokkos::WithoutInitializing), n);
    CopyView dst(Kokkos::view_alloc(std::string("KokkosMoE::perf::copy_dst"), Kokkos::WithoutInitializing), n);
    fill_uniform(src, 1, -1.0f, 1.0f);
    fill_uniform(dst, 2, -1.0f, 1.0f);
    for (int i = 0; i < 2; ++i) time_copy(exec, dst, src);
    std::vector<double> t;
    for (int i = 0; i < (default_space_is_host() ? 7 : 20); ++i) t.push_back(time_copy(exec, dst, src));
    return 2.0 * static_cast<double>(n * sizeof(float)) / median(t) / 1e9;
  }();
  return gbps;
}

double empty_kernel_us() {
  static const double us = [] {
    ExecSpace exec;
    for (int i = 0; i < 20; ++i) time_empty_kernel(exec);
    std::vector<double> t;
    for (int i = 0; i < 201; ++i) t.push_back(time_empty_kernel(exec));
    return median(t) * 1e6;
  }();
  return us;
}

namespace {
template <class Space>
double device_time_on(const Space&, int, const std::function<void(std::int64_t)>&) {
  return 0.0;  // host spaces: the fenced wall time is the measurement
}
#if defined(KOKKOS_ENABLE_CUDA)
__global__ void spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
double device_time_on(const Kokkos::Cuda& exec, int iters, const std::function<void(std::int64_t)>& op) {
  if (iters < 1) return 0.0;
  const cudaStream_t s = exec.cuda_stream();
  std::vector<cudaEvent_t> ev(2 * static_cast<std::size_t>(iters));
  for (auto& e : ev) cudaEventCreate(&e);
  exec.fence();
  spin_kernel<<<1, 1, 0, s>>>(20'000'000LL);  // about 10 ms at 1.98 GHz
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(ev[2 * i], s);
    op(i);
    cudaEventRecord(ev[2 * i + 1], s);
  }
  exec.fence();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]);
    t.push_back(1e3 * ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return median(t);
}
#endif
}  // namespace

double device_time_us(const ExecSpace& exec, int iters, const std::function<void(std::int64_t)>& op) {
  return device_time_on(exec, iters, op);
}

void set_counters(benchmark::State& state, std::int64_t tokens, double bytes_per_token, double seconds) {
  const double iters = static_cast<double>(state.iterations());
  const double bytes = static_cast<double>(tokens) * bytes_per_token;
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes * iters));
  state.SetItemsProcessed(static_cast<std::int64_t>(tokens) * state.iterations());
  if (seconds <= 0 || iters <= 0) return;
  const double per_iter = seconds / iters;
  const double gbps = bytes / per_iter / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["tokens/s"] = static_cast<double>(tokens) / per_iter;
  state.counters["bytes_per_token"] = bytes_per_token;
  state.counters["frac_copy"] = gbps / copy_bandwidth_GBps();
  const double target = empty_kernel_us() * 1e-6 + bytes / (0.85 * copy_bandwidth_GBps() * 1e9);
  state.counters["target_ratio"] = per_iter / target;
}

template <>
const char* dtype_name<float>() {
  return "float";
}
template <>
const char* dtype_name<bf16_t>() {
  return "bf16";
}
template <>
const char* dtype_name<fp16_t>() {
  return "fp16";
}

namespace {
int& launches_seen() {
  static int n = 0;
  return n;
}
void count_launch(const char*, const std::uint32_t, std::uint64_t* id) {
  *id = static_cast<std::uint64_t>(++launches_seen());
}
void end_launch(std::uint64_t) {}
}  // namespace

int kernel_launches(const std::function<void()>& op) {
  namespace KTE = Kokkos::Tools::Experimental;
  Kokkos::fence();
  launches_seen() = 0;
  KTE::set_begin_parallel_for_callback(count_launch);
  KTE::set_begin_parallel_reduce_callback(count_launch);
  KTE::set_begin_parallel_scan_callback(count_launch);
  KTE::set_end_parallel_for_callback(end_launch);
  KTE::set_end_parallel_reduce_callback(end_launch);
  KTE::set_end_parallel_scan_callback(end_launch);
  op();
  KTE::set_begin_parallel_for_callback(nullptr);
  KTE::set_begin_parallel_reduce_callback(nullptr);
  KTE::set_begin_parallel_scan_callback(nullptr);
  KTE::set_end_parallel_for_callback(nullptr);
  KTE::set_end_parallel_reduce_callback(nullptr);
  KTE::set_end_parallel_scan_callback(nullptr);
  Kokkos::fence();
  return launches_seen();
}

}  // namespace Perf
}  // namespace KokkosMoE
