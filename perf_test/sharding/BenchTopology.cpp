/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Detection time of the topology model: from an hwloc XML fixture (goal <= 5 ms) and live (goal
// <= 100 ms). Live detection on a machine without NVML or GPUs measures the hwloc-only path and says so in its label.
//
//   KokkosMoE_ShardingBenchmarks [--benchmark_filter=...]
//
// Each iteration is one complete call (hwloc load + model, or dlopen + NVML + hwloc + model); timings are manual,
// wall clock. Bytes processed for the XML benchmarks are the bytes of XML parsed per call.

#include <KokkosMoE_Topology.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace {

std::string read_fixture(const std::string& name) {
  std::ifstream f(std::string(KOKKOSMOE_TEST_FIXTURES) + "/" + name + ".xml", std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <class F>
double seconds_of(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_TopologyFromXml(benchmark::State& state, const char* fixture) {
  const std::string xml = read_fixture(fixture);
  if (xml.empty()) {
    state.SkipWithError("fixture not found");
    return;
  }
  int gpus = 0;
  double total = 0;
  for (auto _ : state) {
    const double s = seconds_of([&] {
      const auto t = KokkosMoE::load_topology_xml(xml);
      gpus = t.num_gpus();
      benchmark::DoNotOptimize(t.cliques.data());
    });
    state.SetIterationTime(s);
    total += s;
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(xml.size()) * state.iterations());
  state.counters["ms"] = 1e3 * total / static_cast<double>(state.iterations());
  state.counters["GPUs"] = gpus;
  state.SetLabel(std::string(fixture) + ", from XML (goal <= 5 ms)");
}

void BM_TopologyLive(benchmark::State& state) {
  KokkosMoE::DetectOptions options;
  options.honor_env = false;
  const auto probe = KokkosMoE::detect_topology(options);
  const bool with_nvml = probe.nvlink_known;
  double total = 0;
  for (auto _ : state) {
    const double s = seconds_of([&] {
      const auto t = KokkosMoE::detect_topology(options);
      benchmark::DoNotOptimize(t.gpus.data());
    });
    state.SetIterationTime(s);
    total += s;
  }
  state.counters["ms"] = 1e3 * total / static_cast<double>(state.iterations());
  state.counters["GPUs"] = probe.num_gpus();
  state.SetLabel(with_nvml ? "live hwloc + NVML, " + std::to_string(probe.num_gpus()) + " GPU(s) (goal <= 100 ms)"
                           : "live hwloc only: no NVML/GPU on this machine, NVLinks not measured (goal <= 100 ms)");
}

}  // namespace

BENCHMARK_CAPTURE(BM_TopologyFromXml, h200_2gpu, "h200_2gpu_vm_hidden_switch")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TopologyFromXml, hgx_8gpu, "hgx_h100_8gpu_4sw")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_TopologyFromXml, dgx2_16gpu, "dgx2_like_16gpu_12sw")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TopologyLive)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto t = KokkosMoE::detect_topology([] {
    KokkosMoE::DetectOptions o;
    o.honor_env = false;
    return o;
  }());
  benchmark::AddCustomContext("hwloc", t.hwloc_version);
  benchmark::AddCustomContext("driver", t.driver_version.empty() ? "none" : t.driver_version);
  benchmark::AddCustomContext("gpu_model", t.gpus.empty() ? "none" : t.gpus[0].model);
  benchmark::AddCustomContext("gpus", std::to_string(t.num_gpus()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
