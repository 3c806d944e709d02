/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// The shared main of the KokkosMoE benchmark binaries (docs/conventions.md §7): initializes Kokkos, parses the
// --kokkosmoe_* options, records the configuration (Kokkos, execution space, compiler, GPU model and driver, git
// hash, copy baseline and launch floor) into the Google Benchmark context, registers the benchmarks and runs them.
// Google Benchmark's flags work as usual, e.g. --benchmark_out=r.json --benchmark_out_format=json.

#include <Kokkos_Core.hpp>

#include <benchmark/benchmark.h>

#include "KokkosMoE_PerfGitInfo.hpp"
#include "KokkosMoE_PerfHelpers.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <cstdio>
#include <cstring>
#include <string>

#ifndef KOKKOSMOE_PERF_BUILD_TYPE
#define KOKKOSMOE_PERF_BUILD_TYPE "unknown"
#endif
#ifndef KOKKOSMOE_PERF_COMPILER
#define KOKKOSMOE_PERF_COMPILER "unknown"
#endif

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

void record_context() {
  using KokkosMoE::Perf::ExecSpace;
  benchmark::AddCustomContext("kokkosmoe_git", KOKKOSMOE_PERF_GIT_HASH);
  benchmark::AddCustomContext("kokkosmoe_build_type", KOKKOSMOE_PERF_BUILD_TYPE);
  benchmark::AddCustomContext("compiler", KOKKOSMOE_PERF_COMPILER);
  benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION / 10000) + "." +
                                                    std::to_string(KOKKOS_VERSION / 100 % 100) + "." +
                                                    std::to_string(KOKKOS_VERSION % 100));
  benchmark::AddCustomContext("execution_space", ExecSpace::name());
  benchmark::AddCustomContext("execution_space_concurrency", std::to_string(ExecSpace().concurrency()));
  benchmark::AddCustomContext("host_execution_space", Kokkos::DefaultHostExecutionSpace::name());
#if defined(KOKKOS_ENABLE_CUDA)
  // The GPU of the instance the benchmarks run on (ExecSpace() is that instance), not the thread's current device.
  const int device = ExecSpace().cuda_device();
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    benchmark::AddCustomContext("gpu", prop.name);
    benchmark::AddCustomContext("gpu_compute_capability",
                                std::to_string(prop.major) + "." + std::to_string(prop.minor));
    benchmark::AddCustomContext("gpu_sm_count", std::to_string(prop.multiProcessorCount));
    benchmark::AddCustomContext("gpu_memory_GiB", fmt("%.1f", prop.totalGlobalMem / double(1 << 30)));
    benchmark::AddCustomContext("gpu_l2_MB", fmt("%.1f", prop.l2CacheSize / 1e6));
  }
  benchmark::AddCustomContext("cuda_driver_version",
                              std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10));
  benchmark::AddCustomContext("cuda_runtime_version",
                              std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10));
#else
  benchmark::AddCustomContext("gpu", "none");
#endif
  // Measured once per process; every benchmark's frac_copy and target_ratio counters use these values.
  benchmark::AddCustomContext("copy_baseline_bytes", std::to_string(KokkosMoE::Perf::copy_baseline_bytes()));
  benchmark::AddCustomContext("copy_baseline_GBps", fmt("%.2f", KokkosMoE::Perf::copy_bandwidth_GBps()));
  benchmark::AddCustomContext("t_floor_us", fmt("%.3f", KokkosMoE::Perf::empty_kernel_us()));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      KokkosMoE::Perf::print_options_help();
      std::printf("\n");
      benchmark::Initialize(&argc, argv);  // prints Google Benchmark's help and exits
      return 0;
    }
  Kokkos::initialize(argc, argv);
  int rc = 0;
  if (!KokkosMoE::Perf::parse_options(argc, argv)) {
    rc = 2;
  } else {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
      rc = 1;
    } else {
      record_context();
      KokkosMoE::Perf::run_registrars();
      benchmark::RunSpecifiedBenchmarks();
      KokkosMoE::Perf::run_cleanups();  // cached Views must go before Kokkos::finalize
    }
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  return rc;
}
