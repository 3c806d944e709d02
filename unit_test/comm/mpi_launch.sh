#!/usr/bin/env bash
# Multi-process test launcher (docs/ep.md §12): runs CMD on NP MPI ranks (oversubscribed, root allowed), one log per
# rank, everything killed after TIMEOUT seconds. Passes when mpirun succeeds and rank 0's log ends with a summary
# line; with --fault REGEX it passes when rank 0's log matches REGEX (the other ranks are expected to fail or hang).
# With --expect REGEX, rank 0's log must match REGEX instead of a Boost.Test summary. On failure it prints every
# rank's log.
#   mpi_launch.sh NP TIMEOUT [--fault REGEX | --expect REGEX] -- CMD [ARGS...]
set -uo pipefail
np=$1 timeout_s=$2
shift 2
fault=""
expect='\*\*\* No errors detected|Test module .* has passed'
if [ "${1:-}" = "--fault" ]; then fault=$2; shift 2; fi
if [ "${1:-}" = "--expect" ]; then expect=$2; shift 2; fi
[ "${1:-}" = "--" ] && shift
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_PROC_BIND=${OMP_PROC_BIND:-false}
logs=$(mktemp -d "${TMPDIR:-/tmp}/kokkosmoe-mpi.XXXXXX")
trap 'rm -rf "$logs"' EXIT
mca=(--mca btl self,vader --mca btl_vader_single_copy_mechanism none)
[ -n "$fault" ] && mca+=(--mca orte_abort_on_non_zero_status 0)
pass=()
for v in OMP_NUM_THREADS OMP_PROC_BIND NCCL_NVLS_ENABLE KOKKOSMOE_COMM_TIMEOUT KOKKOSMOE_TEST_EP_MESH KOKKOSMOE_TEST_TRANSPORT \
  LD_LIBRARY_PATH; do
  [ -n "${!v+x}" ] && pass+=(-x "$v")
done
start=$(date +%s)
timeout --kill-after=10 "$timeout_s" mpirun -np "$np" --oversubscribe --bind-to none "${mca[@]}" \
  "${pass[@]}" \
  bash -c 'exec "$0" "$@" >"'"$logs"'/rank${OMPI_COMM_WORLD_RANK}.log" 2>&1' "$@" >"$logs/mpirun.log" 2>&1
rc=$?
elapsed=$(( $(date +%s) - start ))
show_all() {
  for f in "$logs"/rank*.log "$logs/mpirun.log"; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f") -----"
    cat "$f"
  done
}
echo "----- rank0.log (np=$np, ${elapsed} s, mpirun exit $rc) -----"
cat "$logs/rank0.log" 2>/dev/null
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "mpi_launch: killed after ${timeout_s} s (hang); every rank's log follows"
  show_all
  exit 1
fi
if [ -n "$fault" ]; then
  if grep -Eq "$fault" "$logs/rank0.log" 2>/dev/null; then
    echo "mpi_launch: fault test passed in ${elapsed} s"
    exit 0
  fi
  echo "mpi_launch: rank 0 did not report /$fault/"
  show_all
  exit 1
fi
# Every test case skipped (unit_test/SkipReport.hpp): every rank exits 77, mpirun passes it on, so does this.
if [ "$rc" = 77 ] && grep -q '^SKIPPED:' "$logs/rank0.log"; then
  exit 77
fi
if [ "$rc" != 0 ] || ! grep -Eq "$expect" "$logs/rank0.log"; then
  echo "mpi_launch: failed (mpirun exit $rc, or no summary line from rank 0)"
  show_all
  exit 1
fi
exit 0
