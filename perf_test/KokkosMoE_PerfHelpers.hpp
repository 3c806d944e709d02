/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
#ifndef KOKKOSMOE_PERFHELPERS_HPP
#define KOKKOSMOE_PERFHELPERS_HPP

/// \file KokkosMoE_PerfHelpers.hpp
/// \brief Shared pieces of the Google Benchmark perf tests (docs/conventions.md §7): options, the once-per-process copy
/// baseline and launch floor, seeded input generation, the fenced manual-time loop and the standard counters.
///
/// Every benchmark of every component reports, besides Google Benchmark's own columns:
///   GB/s             bytes the operation must move (its documented bytes-per-token formula times T) / time
///   tokens/s         T / time
///   bytes_per_token  the formula's value
///   frac_copy        GB/s / the copy baseline's GB/s (read + write bytes), measured once per process
///   target_ratio     time / (t_floor + bytes / (0.85 * copy GB/s)), docs/router.md §17: <= 1 meets the target
/// where t_floor is the launch floor (an empty fenced kernel) measured once per process. GPU benchmarks add the
/// CUDA-event device time of device_time_us as `device_us`.

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace KokkosMoE {
namespace Perf {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;

/// True when the default execution space runs on the host (Serial, OpenMP, Threads).
constexpr bool default_space_is_host() { return Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible; }

/// L2 size the cold variants must defeat (H100/H200: 50 MB); cold runs rotate over more than 4x this.
constexpr double kL2Bytes = 50.0e6;

// --- options ----------------------------------------------------------------------------------------------------

/// Options of the KokkosMoE benchmark binaries (besides Google Benchmark's and Kokkos' own flags).
struct Options {
  double min_time = default_space_is_host() ? 0.05 : 0.1;  ///< --kokkosmoe_min_time=S per benchmark; 0: 1 iteration
  std::vector<std::int64_t> tokens;                        ///< --kokkosmoe_tokens=a,b,...; empty: the defaults
  bool cold = !default_space_is_host();                    ///< --kokkosmoe_cold=0|1: register the cold variants
};
Options& options();

/// Removes the --kokkosmoe_* flags from argv. Returns false (and prints why) on a malformed value.
bool parse_options(int& argc, char** argv);
/// Prints the --kokkosmoe_* flags.
void print_options_help();

/// Token counts of the required sets: {4096, 16384, 65536}, plus 262144 when the default space is not a host
/// space (GPU); --kokkosmoe_tokens overrides them.
std::vector<std::int64_t> token_counts();

// --- registration and cleanup -----------------------------------------------------------------------------------

/// Registers a function that registers benchmarks; BenchmarkMain calls them after Kokkos and Google Benchmark are
/// initialized (the benchmark set may depend on the options). Use at namespace scope:
///   static const bool registered = KokkosMoE::Perf::add_registrar(&register_my_benchmarks);
bool add_registrar(void (*fn)());
void run_registrars();
/// Registers a function that frees cached Kokkos allocations; BenchmarkMain calls them before Kokkos::finalize.
bool add_cleanup(void (*fn)());
void run_cleanups();

/// The one-slot fixture cache of a benchmark file: Google Benchmark calls a benchmark function several times while it
/// sizes the iteration count, so a fixture (allocation, fill, prerequisite calls, warm-up) is built once per
/// benchmark instance, named by `key`, and kept until the next instance needs the memory. Register `release` with
/// add_cleanup.
template <class Fixture>
struct FixtureSlot {
  static std::unique_ptr<Fixture>& fixture() {
    static std::unique_ptr<Fixture> f;
    return f;
  }
  static std::string& key() {
    static std::string k;
    return k;
  }
  static void release() {
    fixture().reset();
    key().clear();
  }
};

/// An uninitialized row-major [rows, cols] View of the default memory space labelled "KokkosMoE::perf::<label>".
template <class T>
Kokkos::View<T**, Kokkos::LayoutRight, MemSpace> alloc2(const char* label, std::int64_t rows, std::int64_t cols) {
  return Kokkos::View<T**, Kokkos::LayoutRight, MemSpace>(
      Kokkos::view_alloc(std::string("KokkosMoE::perf::") + label, Kokkos::WithoutInitializing), rows, cols);
}

// --- baselines (measured once per process, on first use) --------------------------------------------------------

/// Copy bandwidth of the default execution space in GB/s, read + write bytes counted (2 * bytes / time), median of
/// several Kokkos::deep_copy calls between two contiguous float Views: 256 MiB each on the host, 1 GiB each on a
/// device (device-to-device).
double copy_bandwidth_GBps();
/// Bytes per buffer of the copy baseline.
std::size_t copy_baseline_bytes();
/// Launch floor t_floor in microseconds: median time of an empty one-iteration parallel_for on the default
/// execution space, fenced, timed like every benchmark.
double empty_kernel_us();

// --- inputs -----------------------------------------------------------------------------------------------------

/// splitmix64 finalizer: a counter-based hash, so a fill is parallel, seeded and independent of the thread count.
KOKKOS_INLINE_FUNCTION std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// Uniform in [0, 1) with 24 random bits, element i of stream seed.
KOKKOS_INLINE_FUNCTION float uniform01(std::uint64_t seed, std::uint64_t i) {
  return static_cast<float>(mix64(mix64(seed) ^ i) >> 40) * (1.0f / 16777216.0f);
}

/// Fills every element of a contiguous View with lo + (hi - lo) * uniform01(seed, i), converted to the View's type
/// (float, fp16_t, bf16_t or an integer type), on the View's execution space. Every element is drawn
/// independently, so rows differ: different tokens select different experts (docs/router.md §16.2: not degenerate).
template <class View>
void fill_uniform(const View& v, std::uint64_t seed, float lo, float hi) {
  using T = typename View::non_const_value_type;
  using Exec = typename View::execution_space;
  T* p = v.data();
  const std::int64_t n = static_cast<std::int64_t>(v.span());
  Kokkos::parallel_for(
      "KokkosMoE::perf::fill_uniform", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) { p[i] = static_cast<T>(lo + (hi - lo) * uniform01(seed, i)); });
}

/// Fills every element with an approximately normal value, mean + stddev * z, z the Irwin-Hall sum of four
/// uniform01 draws rescaled to unit variance (|z| <= 3.46; cheap, no transcendental functions, same bits on every
/// backend up to the final conversion). Router logits of real models are roughly normal; per-element draws keep
/// rows distinct.
template <class View>
void fill_normal(const View& v, std::uint64_t seed, float mean, float stddev) {
  using T = typename View::non_const_value_type;
  using Exec = typename View::execution_space;
  T* p = v.data();
  const std::int64_t n = static_cast<std::int64_t>(v.span());
  Kokkos::parallel_for(
      "KokkosMoE::perf::fill_normal", Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, n),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::uint64_t j = 4 * static_cast<std::uint64_t>(i);
        const float z = uniform01(seed, j) + uniform01(seed, j + 1) + uniform01(seed, j + 2) + uniform01(seed, j + 3);
        p[i] = static_cast<T>(mean + stddev * 1.7320508f * (z - 2.0f));
      });
}

// --- timing and counters ----------------------------------------------------------------------------------------

/// The timed loop of docs/conventions.md §7: fence, start the timer, run op(iteration), fence, stop; manual time.
/// Returns the total seconds over all iterations.
template <class Op>
double timed_loop(benchmark::State& state, const ExecSpace& exec, Op&& op) {
  double seconds = 0.0;
  std::int64_t i = 0;
  for (auto _ : state) {
    exec.fence();
    Kokkos::Timer timer;
    op(i++);
    exec.fence();
    const double t = timer.seconds();
    state.SetIterationTime(t);
    seconds += t;
  }
  return seconds;
}

/// Whether device_time_us measures anything: the default execution space is Kokkos::Cuda.
constexpr bool has_device_timer() {
#if defined(KOKKOS_ENABLE_CUDA)
  return std::is_same<ExecSpace, Kokkos::Cuda>::value;
#else
  return false;
#endif
}

/// Device time of one call, in microseconds, the protocol the CUDA-event references (TransformerEngine, PyTorch)
/// are timed with (docs/conventions.md §7): a spin kernel (about 10 ms) is queued on the instance's stream first,
/// so that the host enqueues the next calls while the device is still busy and its launch cost stays hidden; then
/// `iters` times event, op(i), event on that stream; the median of the event intervals. 0 where
/// has_device_timer() is false (host spaces: the fenced wall time is the measurement there).
double device_time_us(const ExecSpace& exec, int iters, const std::function<void(std::int64_t)>& op);
/// Kernels one call of op launches (Kokkos Tools' begin_parallel_for / _reduce / _scan callbacks, installed for the
/// call only): the `launches` counter. The callbacks make Kokkos 4 fence before each launch, so it is an untimed
/// pass, and only where no kernel of op waits for another thread's kernels (one rank, not loopback peers).
int kernel_launches(const std::function<void()>& op);
/// Calls per device_time_us measurement in the benchmarks.
constexpr int kDeviceTimeIters = 20;

/// Sets SetBytesProcessed / SetItemsProcessed and the explicit counters listed in the file comment for an
/// operation over \p tokens tokens that moves \p bytes_per_token bytes each.
void set_counters(benchmark::State& state, std::int64_t tokens, double bytes_per_token, double seconds);

/// "float", "bf16" or "fp16".
template <class Scalar>
const char* dtype_name();

}  // namespace Perf
}  // namespace KokkosMoE

#endif
