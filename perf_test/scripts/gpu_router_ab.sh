#!/usr/bin/env bash
# Two builds of the router side by side on the GPU machine (A/B: an old and a new binary), one phase per device call.
#   gpu_router_ab.sh OLD_DIR NEW_DIR OUT_DIR tests|bench|fulltier|te|ncu|ncutime
# Each DIR holds KokkosMoE_CoreTests, KokkosMoE_RouterBenchmarks and libbenchmark.so.1debian of one commit (CUDA
# build); OLD_DIR may lack the tests, and then the new digests are compared with the files in DIGEST_REF (a folder
# of digest_<name>.<space>.txt recorded by an earlier run). tests: the new core suites on Serial + Cuda, per-output determinism digests of both binaries on every
# backend (compared bitwise), memcheck and racecheck of the new per-token and portable paths. bench: the router
# benchmarks of both binaries, alternating, T >= 16384, specialization and portable path, fenced and event time.
# fulltier: docs/router.md §16.3 full tier on Cuda with the new binary. te: TransformerEngine's router kernels
# (TE_BENCH: a run.sh of a standalone harness built outside the repository, perf_test/README.md). ncu: Nsight
# Compute sections of the backward kernels of the new binary (NCU_CASES: benchmark names; NCU_KERNEL: another kernel
# name regex, NCU_SECTIONS: other ncu section options). ncutime: the device
# duration of every native kernel launch of both binaries, averaged per kernel by Nsight Compute (the old binary
# has no event timing; NCU_TOKENS, default 16384). REPS (default 1) repeats
# the old/new benchmark alternation; BENCH_FILTER overrides the benchmark filter. Logs go to OUT_DIR.
set -u
old=$(cd "$1" && pwd)
new=$(cd "$2" && pwd)
out=$3
phase=$4
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 OMP_PROC_BIND=false
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$out/steps.log"; }
with() { local d=$1; shift; LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

step "device"; nvidia-smi -L | tee -a "$out/steps.log"

if [ "$phase" = tests ]; then
  step "new core tests (Serial + Cuda)"
  with "$new" timeout 300 "$new/KokkosMoE_CoreTests" --report_level=short --log_level=warning >"$out/core-tests.log" 2>&1
  echo "exit $?" | tee -a "$out/core-tests.log"; tail -6 "$out/core-tests.log"
  step "determinism digests, old and new"
  ref="$out"
  for b in old new; do
    d=$old; [ $b = new ] && d=$new
    if [ ! -x "$d/KokkosMoE_CoreTests" ]; then ref=${DIGEST_REF:?OLD_DIR has no tests: set DIGEST_REF}; continue; fi
    KOKKOSMOE_DETERMINISM_DUMP="$out/digest_$b" with "$d" timeout 200 "$d/KokkosMoE_CoreTests" \
      --run_test='router_determinism/thread_dump*' --report_level=short >"$out/digest_$b.log" 2>&1
    echo "$b exit $?"
  done
  for s in Serial Cuda; do
    r="$ref/digest_old.$s.txt"; [ "$ref" = "$out" ] || r="$ref/digest_new.$s.txt"
    n=$(diff "$r" "$out/digest_new.$s.txt" | grep -c '^<')
    echo "$s: $(wc -l <"$out/digest_new.$s.txt") outputs, $n differ from $r" | tee -a "$out/steps.log"
    diff "$r" "$out/digest_new.$s.txt" >"$out/digest_diff.$s.txt"
  done
  step "memcheck / racecheck (per-token functions, portable fallback, ties, non-finite)"
  with "$new" timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$new/KokkosMoE_CoreTests" \
    --run_test='router_token,router_ties,router_nonfinite,router_edges,router_cuda_streams,router_cuda_kernels' --report_level=short >"$out/memcheck.log" 2>&1
  echo "memcheck exit $?"; grep -E "ERROR SUMMARY|test cases" "$out/memcheck.log"
  with "$new" timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$new/KokkosMoE_CoreTests" \
    --run_test='router_token,router_ties' --report_level=short >"$out/racecheck.log" 2>&1
  echo "racecheck exit $?"; grep -E "RACECHECK SUMMARY|ERROR SUMMARY|test cases" "$out/racecheck.log"
fi

if [ "$phase" = bench ]; then
  f=${BENCH_FILTER:-'router/(fwd_dense|fwd_compact|bwd_dense|bwd_compact)/'}
  for r in $(seq 1 "${REPS:-1}"); do
    sfx=""; [ "${REPS:-1}" = 1 ] || sfx=".$r"
    for b in old new; do
      d=$old; [ $b = new ] && d=$new
      step "benchmarks ($b$sfx)"
      (cd "$d" && with "$d" timeout 260 ./KokkosMoE_RouterBenchmarks --benchmark_filter="$f" \
        --kokkosmoe_tokens=16384,65536,262144 --kokkosmoe_cold=0 --kokkosmoe_min_time=0.05 \
        --benchmark_out="$out/bench_$b$sfx.json" --benchmark_out_format=json) >"$out/bench_$b$sfx.log" 2>&1
      echo "$b exit $?"; tail -2 "$out/bench_$b$sfx.log"
    done
  done
fi

if [ "$phase" = fulltier ]; then
  step "full tier on Cuda (new binary)"
  KOKKOSMOE_TEST_TIER=full with "$new" timeout 560 "$new/KokkosMoE_CoreTests" --run_test='router_full_tier/*Cuda*' \
    --report_level=short --log_level=message >"$out/full-tier.log" 2>&1
  echo "full tier exit $?"; grep -E "full-tier cases|test cases|assertions|error" "$out/full-tier.log" | head -20
fi

if [ "$phase" = te ]; then
  step "TransformerEngine router kernels ($TE_BENCH)"
  timeout 400 bash "${TE_BENCH:?set TE_BENCH}" "$out" >"$out/te-run.log" 2>&1
  echo "te exit $?"; tail -3 "$out/te-run.log"
fi

if [ "$phase" = ncu ]; then
  for c in ${NCU_CASES:?set NCU_CASES}; do
    step "ncu $c"
    # shellcheck disable=SC2086  # NCU_SECTIONS is a list of options
    (cd "$new" && with "$new" timeout 120 ncu --kernel-name-base demangled --kernel-name "${NCU_KERNEL:-regex:bwd_}" \
      --launch-skip 3 --launch-count 1 ${NCU_SECTIONS:---section SpeedOfLight --section Occupancy --section LaunchStats \
      --section MemoryWorkloadAnalysis} ./KokkosMoE_RouterBenchmarks --benchmark_filter="$c" --kokkosmoe_tokens=65536 --kokkosmoe_cold=0 \
      --kokkosmoe_min_time=0.01) \
      >"$out/ncu_$(echo "$c" | tr -c 'A-Za-z0-9_\n' '_').txt" 2>&1
    echo "ncu exit $?"
  done
fi

if [ "$phase" = ncutime ]; then
  f=${BENCH_FILTER:-'router/(fwd_dense|fwd_compact|bwd_dense|bwd_compact)/.*/auto/'}
  for b in old new; do
    d=$old; [ $b = new ] && d=$new
    step "ncu kernel durations ($b)"
    (cd "$d" && with "$d" timeout 250 ncu --kernel-name 'regex:topk_fwd|bwd_' --metrics gpu__time_duration.sum \
      --cache-control none --clock-control none --print-summary per-kernel ./KokkosMoE_RouterBenchmarks \
      --benchmark_filter="$f" --kokkosmoe_tokens="${NCU_TOKENS:-16384}" --kokkosmoe_cold=0 \
      --kokkosmoe_min_time=0.001) >"$out/ncutime_$b.txt" 2>&1
    echo "$b exit $?"
  done
fi
