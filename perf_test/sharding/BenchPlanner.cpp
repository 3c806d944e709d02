/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Planner speed (issue 5): one make_plan() for 1..1024 GPUs must take < 10 ms.
//
//   KokkosMoE_PlannerBenchmarks [--benchmark_filter=...]
//
// Worlds of fewer than 8 GPUs are the first n GPUs of the HGX H100 fixture (one node); 8 and more are that node
// times gpus/8. Each iteration is one complete make_plan() call (every candidate EP size, its EP groups, routing
// statistics and cost model, the rank table and the router sharding specs); wall-clock, manual time. Counters:
// ms per plan and "under_10ms" (1 when the mean is below the 10 ms budget). Presets: deepseek-v3 (E = 256, grouped)
// and large (E = 1024, k = 32: EP up to 1024). Items processed = ranks planned.

#include <KokkosMoE_Planner.hpp>
#include <KokkosMoE_RouterPresets.hpp>
#include <KokkosMoE_Topology.hpp>

#include <benchmark/benchmark.h>

#include <chrono>
#include <string>

namespace {

using namespace KokkosMoE;

// The first n GPUs of a node, as a node of its own.
NvlinkTopology first_gpus(const NvlinkTopology& t, int n) {
  NvlinkTopology s = t;
  s.gpus.resize(n);
  s.pairs.clear();
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) s.pairs.push_back(t.pair(i, j));
  s.islands = nvlink_islands(s);
  s.cliques = nvlink_cliques(s);
  return s;
}

MoeLayerConfig layer(const char* preset) {
  // The same facts as docs/router.md §15 (the presets live in kokkosmoe_core, which this benchmark does not link).
  MoeLayerConfig l;
  l.name = preset;
  l.tokens_per_rank = 4096;
  if (std::string(preset) == "deepseek-v3") {
    l.num_experts = 256;
    l.topk = 8;
    l.num_groups = 8;
    l.group_topk = 4;
    l.hidden_size = 7168;
  } else {  // large
    l.num_experts = 1024;
    l.topk = 32;
    l.hidden_size = 4096;
  }
  return l;
}

void BM_MakePlan(benchmark::State& state, const char* preset) {
  const int gpus = static_cast<int>(state.range(0));
  const NvlinkTopology hgx = load_topology_xml_file(std::string(KOKKOSMOE_TEST_FIXTURES) + "/hgx_h100_8gpu_4sw.xml");
  PlanRequest req;
  req.cluster.node = gpus < 8 ? first_gpus(hgx, gpus) : hgx;
  req.cluster.num_nodes = gpus < 8 ? 1 : gpus / 8;
  req.cluster.inter_node_gbps = 48.0;
  req.layer = layer(preset);
  double total = 0;
  int ep = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const Plan p = make_plan(req);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ep = p.ep_size();
    benchmark::DoNotOptimize(p.ranks.data());
    state.SetIterationTime(s);
    total += s;
  }
  const double ms = total / state.iterations() * 1e3;
  state.counters["ms_per_plan"] = ms;
  state.counters["under_10ms"] = ms < 10.0 ? 1 : 0;
  state.counters["ep"] = ep;
  state.SetItemsProcessed(static_cast<std::int64_t>(gpus) * state.iterations());
  state.SetLabel(std::string(preset) + ", " + std::to_string(gpus) + " GPUs");
}

void BM_PlanToJson(benchmark::State& state) {
  PlanRequest req;
  req.cluster.node = load_topology_xml_file(std::string(KOKKOSMOE_TEST_FIXTURES) + "/hgx_h100_8gpu_4sw.xml");
  req.cluster.num_nodes = static_cast<int>(state.range(0)) / 8;
  req.cluster.inter_node_gbps = 48.0;
  req.layer = layer("deepseek-v3");
  const Plan p = make_plan(req);
  std::size_t bytes = 0;
  for (auto _ : state) {
    const std::string j = plan_to_json(p);
    bytes = j.size();
    benchmark::DoNotOptimize(j.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}

}  // namespace

BENCHMARK_CAPTURE(BM_MakePlan, deepseek_v3, "deepseek-v3")
    ->ArgName("gpus")
    ->RangeMultiplier(2)
    ->Range(1, 1024)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_MakePlan, large, "large")
    ->ArgName("gpus")
    ->RangeMultiplier(2)
    ->Range(1, 1024)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanToJson)->ArgName("gpus")->Arg(16)->Arg(1024)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
