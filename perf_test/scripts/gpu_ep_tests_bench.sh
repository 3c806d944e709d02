#!/usr/bin/env bash
# The EP layer (comm/) on the GPU machine: tests, sanitizers, the main job, the benchmarks and ncu kernel durations.
#   gpu_ep_tests_bench.sh BIN_DIR OUT_DIR [suites|tests|ipc|sanitize|sanitize-loopback|bench|profile|profile-loopback|all]
# suites: the NCCL one-rank suites only; tests: suites, loopback, FP8, launcher, main jobs; ipc: ranks as processes on
# this GPU through the CUDA-IPC transport (suites at np 2-4, faults, main jobs, memcheck at np 2).
# bench runs every EP benchmark, or those KOKKOSMOE_BENCH_FILTER (a --benchmark_filter regex) names.
# BIN_DIR holds the CUDA-build binaries KokkosMoE_CommTests, KokkosMoE_CommLoopbackTests, KokkosMoE_Fp8Tests,
# kokkosmoe-ep, KokkosMoE_CommBenchmarks (+
# libbenchmark.so.1debian, libmpi_cxx.so.40). NCCL comes from PyTorch's environment there. Logs go to OUT_DIR.
set -uo pipefail
bin=$(cd "$1" && pwd)
out=$2
phase=${3:-all}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_PROC_BIND=false KOKKOSMOE_COMM_TIMEOUT=120
nccl_lib=$(dirname "$(find /opt/torch/.venv -name 'libnccl.so.2' 2>/dev/null | head -n 1)")
export LD_LIBRARY_PATH="$bin:$nccl_lib:${LD_LIBRARY_PATH:-}"
step() { printf '\n===== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)" | tee -a "$out/steps.log"; }
mpi1=(mpirun -np 1 --bind-to none -x LD_LIBRARY_PATH -x NCCL_NVLS_ENABLE -x KOKKOSMOE_COMM_TIMEOUT)

step "machine"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; echo "NCCL from $nccl_lib"; \
  ls "$nccl_lib"; date -u; } 2>&1 | tee -a "$out/steps.log"

if [ "$phase" = suites ] || [ "$phase" = tests ] || [ "$phase" = all ]; then
  step "EP suites on Serial + Cuda (NCCL, one rank)"
  timeout 300 "${mpi1[@]}" "$bin/KokkosMoE_CommTests" --report_level=short --log_level=warning >"$out/comm-tests.log" 2>&1
  echo "exit $?" | tee -a "$out/comm-tests.log"; tail -8 "$out/comm-tests.log"
fi

if [ "$phase" = tests ] || [ "$phase" = all ]; then
  step "loopback ranks on this GPU: steps at R = 1, 2, 3, 4, 8, faults, graph capture at R = 8 (10 s deadline)"
  KOKKOSMOE_COMM_TIMEOUT=10 timeout 300 "$bin/KokkosMoE_CommLoopbackTests" --report_level=short \
    --log_level=test_suite >"$out/loopback-tests.log" 2>&1
  echo "exit $?" | tee -a "$out/loopback-tests.log"; tail -6 "$out/loopback-tests.log"
  step "FP8 rows on Serial and Cuda"
  timeout 120 "$bin/KokkosMoE_Fp8Tests" --report_level=short >"$out/fp8-tests.log" 2>&1
  echo "exit $?" | tee -a "$out/fp8-tests.log"; tail -4 "$out/fp8-tests.log"
  step "multi-GPU suites through the launcher on one GPU (must report skipped with the gate's reason)"
  bash "$here/unit_test/comm/multi_gpu_launch.sh" 2 60 -- "$bin/KokkosMoE_CommTests" --run_test=ep_setup \
    >"$out/multi-gpu-dry-run.log" 2>&1
  echo "launcher exit $? (77 = skipped)" | tee -a "$out/multi-gpu-dry-run.log"; cat "$out/multi-gpu-dry-run.log"
  step "main job: kokkosmoe-ep, DeepSeek-V3, 4096 tokens, bf16 (eager, then capacity)"
  timeout 120 "${mpi1[@]}" "$bin/kokkosmoe-ep" --tokens 4096 --iters 5 2>&1 | tee "$out/ep.txt"
  timeout 120 "${mpi1[@]}" "$bin/kokkosmoe-ep" --tokens 4096 --iters 5 --capacity 40000 2>&1 | tee -a "$out/ep.txt"
  step "main job over loopback: 8 ranks on this GPU (eager, then capacity)"
  (cd "$bin" && timeout 120 ./kokkosmoe-ep --transport loopback --ranks 8 --tokens 4096 --iters 3 2>&1 | tee -a "$out/ep.txt")
  (cd "$bin" && timeout 120 ./kokkosmoe-ep --transport loopback --ranks 8 --tokens 4096 --iters 3 --capacity 50000 2>&1 \
    | tee -a "$out/ep.txt")
  step "main job with FP8 dispatch: one rank over NCCL, then loopback at 8 ranks (eager, then capacity)"
  timeout 120 "${mpi1[@]}" "$bin/kokkosmoe-ep" --tokens 4096 --iters 3 --fp8 2>&1 | tee -a "$out/ep.txt"
  (cd "$bin" && timeout 120 ./kokkosmoe-ep --transport loopback --ranks 8 --tokens 4096 --iters 3 --fp8 2>&1 \
    | tee -a "$out/ep.txt")
  (cd "$bin" && timeout 120 ./kokkosmoe-ep --transport loopback --ranks 8 --tokens 4096 --iters 3 --fp8 \
    --capacity 50000 2>&1 | tee -a "$out/ep.txt")
fi

if [ "$phase" = ipc ] || [ "$phase" = all ]; then
  launch="$here/unit_test/comm/mpi_launch.sh"
  for np in ${KOKKOSMOE_IPC_NP:-2 3 4}; do
    for suite in ep_setup ep_layout_outputs ep_dispatch_combine ep_capacity_and_streams ep_interleaved_layers \
      ep_fail_fast; do
      filter="$suite/*Cuda*"
      [ "$suite" = ep_setup ] && filter="$suite/*Cuda*,cuda_ipc_peer_windows"
      step "CUDA IPC over MPI, np $np, every rank on this GPU: $filter"
      KOKKOSMOE_TEST_TRANSPORT=ipc timeout 400 bash "$launch" "$np" 380 -- "$bin/KokkosMoE_CommTests" \
        --run_test="$filter" --report_level=short >"$out/ipc-np$np-$suite.log" 2>&1
      echo "exit $?" | tee -a "$out/ipc-np$np-$suite.log"; grep -E "^\*\*\*|test cases|exit|error" "$out/ipc-np$np-$suite.log" | head -8
    done
    for mode in stall exit; do
      step "CUDA IPC fault at np $np: rank 1 ${mode}s (5 s deadline)"
      KOKKOSMOE_COMM_TIMEOUT=5 timeout 120 bash "$launch" "$np" 90 --fault "FAULT TEST PASSED" -- \
        "$bin/KokkosMoE_CommFaultTest" "$mode" ipc >"$out/ipc-fault-np$np-$mode.log" 2>&1
      echo "exit $?" | tee -a "$out/ipc-fault-np$np-$mode.log"; grep -E "rank 0|fault test" "$out/ipc-fault-np$np-$mode.log"
    done
  done
  for np in 2 4; do
    step "main job over CUDA IPC at np $np: eager, capacity, decode"
    for extra in "" "--capacity 600" "--decode"; do
      timeout 200 bash "$launch" "$np" 180 --expect "single-rank computation: .* -> PASS" -- "$bin/kokkosmoe-ep" \
        --transport ipc --tokens 128 --hidden 1024 --iters 2 $extra >"$out/ipc-ep-np$np.log" 2>&1
      echo "np $np $extra: exit $?" | tee -a "$out/ipc-ep.txt"; grep -E "single-rank computation|ep_dispatch|kokkosmoe-ep:" \
        "$out/ipc-ep-np$np.log" | head -6 | tee -a "$out/ipc-ep.txt"
    done
  done
  step "compute-sanitizer memcheck over the CUDA IPC suites at np 2"
  KOKKOSMOE_TEST_TRANSPORT=ipc timeout 500 bash "$launch" 2 480 -- compute-sanitizer --tool memcheck \
    --error-exitcode 9 "$bin/KokkosMoE_CommTests" --run_test='ep_dispatch_combine/*Cuda*' --report_level=short \
    >"$out/ipc-memcheck-np2.log" 2>&1
  echo "exit $?" | tee -a "$out/ipc-memcheck-np2.log"; grep -E "ERROR SUMMARY|test cases|exit" "$out/ipc-memcheck-np2.log"
fi

if [ "$phase" = sanitize ] || [ "$phase" = all ]; then
  step "compute-sanitizer memcheck over the Cuda EP cases"
  timeout 400 "${mpi1[@]}" compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$bin/KokkosMoE_CommTests" \
    --run_test='*/*Cuda*' --report_level=short >"$out/memcheck.log" 2>&1
  echo "exit $?" | tee -a "$out/memcheck.log"; grep -E "ERROR SUMMARY|test cases|exit" "$out/memcheck.log"
  step "compute-sanitizer racecheck over the Cuda dispatch/combine cases"
  timeout 400 "${mpi1[@]}" compute-sanitizer --tool racecheck --error-exitcode 9 "$bin/KokkosMoE_CommTests" \
    --run_test='ep_dispatch_combine/*Cuda*' --report_level=short >"$out/racecheck.log" 2>&1
  echo "exit $?" | tee -a "$out/racecheck.log"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases|exit" "$out/racecheck.log"
fi

if [ "$phase" = sanitize-loopback ] || [ "$phase" = all ]; then
  step "compute-sanitizer memcheck over the loopback steps"
  KOKKOSMOE_COMM_TIMEOUT=150 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$bin/KokkosMoE_CommLoopbackTests" --run_test=ep_loopback/cuda_steps_match_oracle --report_level=short \
    >"$out/memcheck-loopback.log" 2>&1
  echo "exit $?" | tee -a "$out/memcheck-loopback.log"; grep -E "ERROR SUMMARY|test cases|exit" "$out/memcheck-loopback.log"
  for tool in memcheck racecheck; do
    step "compute-sanitizer $tool over the capacity-mode graph capture at R = 8, replayed with new routing"
    KOKKOSMOE_COMM_TIMEOUT=150 timeout 240 compute-sanitizer --tool $tool --error-exitcode 9 \
      "$bin/KokkosMoE_CommLoopbackTests" --run_test=ep_loopback/cuda_graph_capture_replays_new_routing \
      --report_level=short >"$out/$tool-loopback-graph.log" 2>&1
    echo "exit $?" | tee -a "$out/$tool-loopback-graph.log"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Internal|test cases|exit" "$out/$tool-loopback-graph.log"
  done
  # At R = 8 the tool, tracking every kernel, reports "failed to track a kernel launch" (eight host threads launching
  # at once; at R = 3 it did once too), so there it checks one group of the row kernels per run.
  for spec in 2 4 8:pack_tokens 8:pack_fp8_tokens 8:expand_arrivals 8:reduce_ 8:_dots; do
    R=${spec%%:*}; flt=(); name=R$R
    if [ "$spec" != "$R" ]; then flt=(--kernel-name "kns=${spec#*:}"); name=R$R-${spec#*:}; fi
    step "compute-sanitizer racecheck over the loopback steps at R = $R (${flt[*]:-every kernel})"
    KOKKOSMOE_TEST_LOOPBACK_R=$R KOKKOSMOE_COMM_TIMEOUT=30 timeout 200 compute-sanitizer --tool racecheck "${flt[@]}" \
      --error-exitcode 9 "$bin/KokkosMoE_CommLoopbackTests" --run_test=ep_loopback/cuda_steps_match_oracle \
      --report_level=short >"$out/racecheck-loopback-$name.log" 2>&1
    echo "exit $?" | tee -a "$out/racecheck-loopback-$name.log"
    grep -E "RACECHECK SUMMARY|ERROR SUMMARY|Internal|test cases|exit" "$out/racecheck-loopback-$name.log"
  done
fi

if [ "$phase" = bench ] || [ "$phase" = all ]; then
  step "EP benchmarks (prefill 4096 and decode 128 tokens; one rank over NCCL, then loopback at R = 2, 4, 8)"
  (cd "$bin" && timeout 420 "${mpi1[@]}" ./KokkosMoE_CommBenchmarks --benchmark_out="$out/h200_comm.json" \
    --benchmark_out_format=json --benchmark_filter="${KOKKOSMOE_BENCH_FILTER:-.}") >"$out/bench.log" 2>&1
  echo "exit $?" | tee -a "$out/bench.log"; grep -E "^ep/" "$out/bench.log" | cut -c1-220
fi

if [ "$phase" = profile ] || [ "$phase" = all ]; then
  step "ncu: kernel durations of the layout, dispatch and combine (capacity mode, decode and prefill)"
  for shape in 128 4096; do
    (cd "$bin" && timeout 240 ncu --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      --print-summary per-kernel --kernel-name regex:'.*' --launch-skip 0 --launch-count 400 \
      ./KokkosMoE_CommBenchmarks --kokkosmoe_ep_tokens=$shape \
      --benchmark_filter="ep/(layout|dispatch|combine)/capacity") >"$out/ncu-$shape.txt" 2>&1
    echo "ncu exit $? (T = $shape)"
    grep -E "KokkosMoE|gpu__time_duration|dram__throughput|Kernel|ncclDevKernel" "$out/ncu-$shape.txt" | head -60
  done
fi

if [ "$phase" = profile-loopback ] || [ "$phase" = all ]; then
  # ncu serializes kernels, so a rank's receive-side wait for a peer whose pack has not run yet ends at the deadline
  # (2 s here, then CommError): the pack, expand and reduce kernels it did profile are what this step is for.
  step "ncu: DRAM bytes and time of the loopback R = 8 copy kernels (dispatch and combine, eager, 4096 tokens)"
  for op in dispatch combine; do
    (cd "$bin" && KOKKOSMOE_COMM_TIMEOUT=2 timeout 240 ncu --kernel-name-base demangled \
      --kernel-name regex:'pack_tokens|expand_arrivals|reduce_arrivals|reduce_ranks' --launch-count 24 \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active \
      ./KokkosMoE_CommBenchmarks --benchmark_filter="ep_loopback/$op/eager/R8/prefill/iter") >"$out/ncu-loopback-$op.txt" 2>&1
    echo "ncu exit $? ($op)"
    grep -E "pack_tokens|expand_arrivals|reduce_arrivals|reduce_ranks|gpu__time|dram__|warps_active" \
      "$out/ncu-loopback-$op.txt" | cut -c1-160 | head -60
  done
fi
