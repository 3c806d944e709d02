/*
 * KokkosMoE: Mixture-of-Experts routing for Kokkos. SPDX-License-Identifier: Apache-2.0
 */
// Planner speed: one make_plan() for realistic fabrics of 1..1024 GPUs must take < 10 ms, and for
// any NVLink graph of up to 128 GPUs < 1 s.
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

#include <algorithm>
#include <chrono>
#include <random>
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

// Realistic fabrics other than HGX-8, each times enough nodes for ~1024 GPUs: a 16-GPU DGX-2-like node
// (12 NVSwitches, two baseboards), the 8+2 mixed host (8 NVSwitch GPUs, 2 PCIe-only ones left out), the DGX-1
// cube mesh, and a 72-GPU NVL72-like NVSwitch domain (one complete graph per node).
NvlinkTopology fabric(int which) {
  const std::string dir = std::string(KOKKOSMOE_TEST_FIXTURES) + "/";
  switch (which) {
    case 0:
      return load_topology_xml_file(dir + "dgx2_like_16gpu_12sw.xml");
    case 1:
      return load_topology_xml_file(dir + "hgx_h100_8gpu_plus_2pcie.xml");
    case 2:
      return load_topology_xml_file(dir + "dgx1_like_mesh_8gpu.xml");
    default: {
      NvlinkTopology t;
      const int n = 72;
      t.gpus.resize(n);
      t.pairs.assign(n * n, GpuPair{});
      for (int i = 0; i < n; ++i) {
        t.gpus[i].id = i;
        t.gpus[i].pci = PciAddress{static_cast<std::uint32_t>(i / 4), static_cast<std::uint8_t>(i % 4), 0, 0};
        t.gpus[i].links_to_switch = 18;
        t.gpus[i].numa_nodes = {i / 36};
        t.gpus[i].model = "NVIDIA GB200";
      }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j)
          if (i != j) {
            t.pairs[i * n + j].switch_links = 18;
            t.pairs[i * n + j].nvlink_p2p = true;
          }
      t.nvlink_known = true;
      t.islands = nvlink_islands(t);
      t.cliques = nvlink_cliques(t);
      return t;
    }
  }
}

void BM_MakePlanFabric(benchmark::State& state) {
  static const char* const names[] = {"dgx2-16", "hgx8+2pcie", "dgx1-mesh", "nvl72"};
  const int which = static_cast<int>(state.range(0));
  PlanRequest req;
  req.cluster.node = fabric(which);
  req.cluster.num_nodes = std::max(1, 1024 / req.cluster.node.num_gpus());
  req.cluster.inter_node_gbps = 48.0;
  req.layer = layer("deepseek-v3");
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
  state.SetLabel(std::string(names[which]) + " x " + std::to_string(req.cluster.num_nodes) + " = " +
                 std::to_string(req.cluster.num_nodes * req.cluster.node.num_gpus()) + " GPUs");
}

// Any NVLink graph up to 128 GPUs (budget 1 s): one node whose pairs are direct-linked with probability
// density/100 (1-4 links each, seeded), NUMA by halves, cliques left to the planner.
void BM_MakePlanRandomGraph(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const double p = static_cast<double>(state.range(1)) / 100.0;
  std::mt19937 rng(static_cast<unsigned>(n * 1000 + state.range(1)));
  NvlinkTopology t;
  t.gpus.resize(n);
  t.pairs.assign(static_cast<std::size_t>(n) * n, GpuPair{});
  for (int i = 0; i < n; ++i) {
    t.gpus[i].id = i;
    t.gpus[i].pci = PciAddress{0, static_cast<std::uint8_t>(i), 0, 0};
    t.gpus[i].numa_nodes = {i < n / 2 ? 0 : 1};
  }
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j)
      if (std::uniform_real_distribution<double>(0, 1)(rng) < p) {
        GpuPair& a = t.pairs[static_cast<std::size_t>(i) * n + j];
        a.direct_links = static_cast<std::uint16_t>(1 + rng() % 4);
        a.nvlink_p2p = true;
        a.nvlink_mbps = a.direct_links * 25000u;
        t.pairs[static_cast<std::size_t>(j) * n + i] = a;
      }
  t.nvlink_known = true;
  PlanRequest req;
  req.cluster.node = t;
  req.layer = layer("deepseek-v3");
  double total = 0, worst = 0;
  int ep = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const Plan plan = make_plan(req);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ep = plan.ep_size();
    benchmark::DoNotOptimize(plan.ranks.data());
    state.SetIterationTime(s);
    total += s;
    worst = std::max(worst, s);
  }
  state.counters["ms_per_plan"] = total / state.iterations() * 1e3;
  state.counters["worst_ms"] = worst * 1e3;
  state.counters["under_1s"] = worst < 1.0 ? 1 : 0;
  state.counters["ep"] = ep;
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
BENCHMARK(BM_MakePlanFabric)->ArgName("fabric")->DenseRange(0, 3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MakePlanRandomGraph)
    ->ArgNames({"gpus", "density%"})
    ->ArgsProduct({{32, 64, 96, 128}, {3, 10, 50, 90, 100}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PlanToJson)->ArgName("gpus")->Arg(16)->Arg(1024)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
