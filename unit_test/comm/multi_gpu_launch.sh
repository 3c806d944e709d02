#!/usr/bin/env bash
# Multi-GPU test launcher (docs/ep.md §12): one process per GPU without mpirun. The resource gate runs first (rank 0
# alone, KOKKOSMOE_GATE_ONLY): fewer than N GPUs in one NVLink clique make the run report skipped (exit 77) with the
# gate's reason. Then ranks 1..N-1 start in the background and rank 0 in the foreground, each with CUDA device =
# rank, NCCL_NVLS_ENABLE=0 and the NCCL unique id passed through a file; everything is killed after TIMEOUT seconds.
# The run fails if rank 0 fails or prints no summary line; on failure every rank's log is printed.
#   multi_gpu_launch.sh N TIMEOUT -- CMD [ARGS...]
set -uo pipefail
n=$1 timeout_s=$2
shift 2
[ "${1:-}" = "--" ] && shift
export NCCL_NVLS_ENABLE=0 KOKKOSMOE_REQUIRE_GPUS=$n
work=$(mktemp -d "${TMPDIR:-/tmp}/kokkosmoe-gpus.XXXXXX")
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
KOKKOSMOE_GATE_ONLY=1 "$@" >"$work/gate.log" 2>&1
gate=$?
cat "$work/gate.log"
if [ "$gate" = 77 ]; then exit 77; fi
if [ "$gate" != 0 ]; then echo "multi_gpu_launch: the resource gate failed (exit $gate)"; exit 1; fi
export KOKKOSMOE_LAUNCH_SIZE=$n KOKKOSMOE_LAUNCH_ID_FILE=$work/nccl_id
pids=()
for ((r = 1; r < n; ++r)); do
  KOKKOSMOE_LAUNCH_RANK=$r CUDA_VISIBLE_DEVICES=$r timeout --kill-after=5 "$timeout_s" "$@" >"$work/rank$r.log" 2>&1 &
  pids+=($!)
done
KOKKOSMOE_LAUNCH_RANK=0 CUDA_VISIBLE_DEVICES=0 timeout --kill-after=5 "$timeout_s" "$@" >"$work/rank0.log" 2>&1
rc0=$?
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
cat "$work/rank0.log"
if [ "$rc0" = 124 ] || [ "$rc0" = 137 ]; then echo "multi_gpu_launch: rank 0 killed after ${timeout_s} s"; fi
if [ "$rc0" != 0 ] || [ "$rc" != 0 ] || ! grep -Eq '\*\*\* No errors detected|Test module .* has passed' "$work/rank0.log"; then
  echo "multi_gpu_launch: failed (rank 0 exit $rc0, other ranks $rc)"
  for ((r = 1; r < n; ++r)); do echo "----- rank$r.log -----"; cat "$work/rank$r.log"; done
  exit 1
fi
exit 0
