#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs tests/comm/mpi_ranks.cc's program as N ranks under mpirun on
# loopback (CTest's comm.mpi_ranks.* and engine.dp_ranks.* tests, tests/CMakeLists.txt).
#   run_mpi_ranks.sh MPIEXEC N PROGRAM all|killed FILTER
# all: the gtest FILTER's tests on every rank; passes when mpirun exits 0
#   and all N ranks report their tests passed.
# killed: FILTER's one test under --enable-recovery (else mpirun kills the
#   job itself when a rank dies); the last rank kills itself, and the N-1
#   others must pass, that is end with an error naming it within the
#   timeout, and each print "expected error: Unavailable...".
# Run as root (containers, CI), mpirun needs --allow-run-as-root.
set -u
mpiexec=$1 n=$2 prog=$3 mode=$4 filter=$5
flags="--oversubscribe -n $n --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
[ "$(id -u)" -eq 0 ] && flags="$flags --allow-run-as-root"
case $mode in
  all) want=$n ;;
  killed) want=$((n - 1)); flags="$flags --enable-recovery" ;;
  *) echo "run_mpi_ranks.sh: mode is all or killed, not $mode" >&2; exit 2 ;;
esac
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# (timeout: a hang is a failure too, not a stuck CI job.)
timeout 240 "$mpiexec" $flags "$prog" --gtest_filter="$filter" --gtest_color=no >"$out" 2>&1
rc=$?
cat "$out"
passed=$(grep -c '^\[  PASSED  \] [1-9]' "$out")  # (0 tests run is no pass)
failed=$(grep -c '^\[  FAILED  \]' "$out")
echo "run_mpi_ranks.sh: mpirun exit $rc; $passed of $want rank(s) passed, $failed failure line(s)"
[ "$passed" -eq "$want" ] && [ "$failed" -eq 0 ] || exit 1
[ "$mode" = killed ] || [ "$rc" -eq 0 ] || exit 1
if [ "$mode" = killed ]; then
  [ "$(grep -c 'expected error: Unavailable' "$out")" -eq "$want" ] || { echo "run_mpi_ranks.sh: not every survivor reported the error" >&2; exit 1; }
fi
exit 0
