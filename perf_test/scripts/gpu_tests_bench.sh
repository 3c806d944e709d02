#!/usr/bin/env bash
# The GPU machine's tests, sanitizers, topology check, main job, router benchmarks and PyTorch reference, in phases
# that each fit one device call. Usage: gpu_tests_bench.sh BIN_DIR OUT_DIR [PHASE]
# BIN_DIR holds the CUDA-build binaries (KokkosMoE_CoreTests, KokkosMoE_ShardingTests, KokkosMoE_ShardingLiveTest,
# kokkosmoe-topo, kokkosmoe-plan, kokkosmoe-route, KokkosMoE_RouterBenchmarks, libbenchmark.so.1debian) plus
# router_reference.py; every log and result lands in OUT_DIR. PHASE: tests (the fast GPU tier: the core suites on
# Serial + Cuda, sanitizers, topology, main job), fulltier (docs/router.md §16.3 full tier, KOKKOSMOE_TEST_TIER=full),
# bench (benchmarks and the PyTorch reference, back to back), profile (ncu of the DeepSeek-V3 and large kernels)
# or all (every phase but fulltier). Each phase fits one 10-minute device call; steps whose binaries are not in
# BIN_DIR are skipped.
set -u
bin=$(cd "$1" && pwd)
out=$2
phase=${3:-all}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMP_PROC_BIND=false LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step() { echo "=== $(date -u +%H:%M:%S) $*"; }
cd "$out"

step "device"; nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
nvidia-smi topo -m | tee nvidia-smi-topo.txt

if [ "$phase" = tests ] || [ "$phase" = all ]; then
step "core tests (Serial + Cuda, specialization and generic path)"
"$bin/KokkosMoE_CoreTests" --report_level=short --log_level=warning >core-tests.log 2>&1
echo "core tests exit $?"; tail -5 core-tests.log

step "compute-sanitizer memcheck / racecheck (router suites)"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/KokkosMoE_CoreTests" \
  --run_test=router_ties,router_nonfinite,router_edges,aux_loss,router_cuda_graph --report_level=short >memcheck.log 2>&1
echo "memcheck exit $?"; tail -4 memcheck.log
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/KokkosMoE_CoreTests" \
  --run_test=router_ties,router_nonfinite --report_level=short >racecheck.log 2>&1
echo "racecheck exit $?"; tail -4 racecheck.log

if [ -x "$bin/kokkosmoe-topo" ]; then
step "topology"
"$bin/kokkosmoe-topo" | tee topo.txt
"$bin/kokkosmoe-topo" --capture h200_capture.xml; echo "capture exit $?"
"$bin/kokkosmoe-topo" --xml h200_capture.xml --json >topo-capture.json; echo "reload exit $?"
"$bin/KokkosMoE_ShardingLiveTest" >sharding-live.log 2>&1; echo "sharding live test exit $?"; tail -5 sharding-live.log
"$bin/kokkosmoe-plan" --preset deepseek-v3 --tokens-per-rank 4096 | tee plan.txt
fi

step "main job"
"$bin/kokkosmoe-route" --preset deepseek-v3 --tokens 262144 --dtype bf16 | tee route.txt

fi
if [ "$phase" = fulltier ]; then
step "full tier (docs/router.md §16.3) on the Cuda device type: KokkosMoE_CoreTests --run_test=router_full_tier/*Cuda*"
KOKKOSMOE_TEST_TIER=full timeout 560 "$bin/KokkosMoE_CoreTests" --run_test='router_full_tier/*Cuda*' --report_level=short \
  --log_level=message >full-tier.log 2>&1
echo "full tier exit $?"; grep -E "full-tier cases|test cases|assertions|error" full-tier.log | head -20
fi
if [ "$phase" = bench ] || [ "$phase" = all ]; then
step "benchmarks"
(cd "$bin" && ./KokkosMoE_RouterBenchmarks --benchmark_out="$out/h200_router.json" --benchmark_out_format=json \
   >"$out/bench.log" 2>&1); echo "bench exit $?"; tail -3 bench.log

step "pytorch reference"
PYTHONUNBUFFERED=1 timeout 240 python3 "$bin/router_reference.py" --dtypes bf16 --out h200_torch.json >torch.log 2>&1
echo "torch exit $?"; tail -3 torch.log
fi
if [ "$phase" = profile ] || [ "$phase" = all ]; then
# ncu_one OP PRESET T SECTIONS...: one launch of OP's kernel in its benchmark, report in ncu_OP_PRESET_bf16_TT.txt
ncu_one() {
  local op=$1 preset=$2 T=$3 kern=topk_fwd rep; shift 3
  [ "${op%_*}" = bwd ] && kern=bwd_
  rep="ncu_${op}_${preset%%-*}_bf16_T${T}.txt"
  (cd "$bin" && timeout 240 ncu "$@" -k regex:$kern --launch-count 1 ./KokkosMoE_RouterBenchmarks \
     --benchmark_filter="router/$op/$preset/bf16/auto/warm/T:$T/") >"$rep" 2>&1
  echo "ncu $op $preset T=$T exit $?"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Executed Instructions  |Registers Per|Achieved Occupancy" "$rep"
}
step "ncu: DeepSeek-V3 and large bf16 T=65536 (full set, one launch each)"
for op in fwd_dense bwd_dense bwd_compact; do ncu_one $op deepseek-v3 65536 --set full; done
ncu_one fwd_dense large 65536 --set full
step "ncu: DeepSeek-V3 bf16 T=4096 dense forward and backward (kernel duration against the fenced time, §17)"
for op in fwd_dense bwd_dense; do ncu_one $op deepseek-v3 4096 --section SpeedOfLight --section LaunchStats --section Occupancy; done
fi
step "done"
