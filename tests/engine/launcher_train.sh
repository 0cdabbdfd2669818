#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `strata train` starting its own ranks (engine/launcher.h), as a user runs
# it (CTest's engine.launcher_train.cpu and engine.launcher_train.gpu,
# tests/CMakeLists.txt).
#   launcher_train.sh cpu MPIEXEC STRATA
#     --backend cpu --num-ranks 2 (mpirun on loopback, run by the launcher)
#     gives the losses of `mpirun -n 2 strata train` started by hand; a rank
#     that exits (STRATA_TEST_FAIL_RANK=1) ends the job within a minute with
#     the launcher's report naming rank 1 first, its exit status and its
#     stderr; SIGTERM to the launcher reaches the ranks, which stop after
#     the step, save, and exit 143; the refusals name the option to use.
#   launcher_train.sh gpu STRATA
#     --num-gpus 1 (NCCL at world size 1) gives the plain run's losses, and
#     --hostfile with "localhost slots=1" over an ssh on PATH that runs its
#     command here (a real shell, as sshd would) gives them too. Exits 77
#     (skipped) without a GPU.
set -u
mode=$1
fail() { echo "launcher_train.sh: $*" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/config.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
 "gradient_clipping": 1.0,
 "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "seq_len": 32},
 "trainer": {"steps": 3, "eval_batches": 1}}
JSON
losses() { grep -o 'step [0-9]*/[0-9]* | loss [0-9.]*' "$1"; }

if [ "$mode" = gpu ]; then
  strata=$2
  "$strata" --version | grep -q '^CUDA: yes' || { echo "skipped: strata was built without CUDA"; exit 77; }
  nvidia-smi -L 2>/dev/null | grep -q GPU || { echo "skipped: no GPU here"; exit 77; }
  port=$((20000 + $$ % 20000))
  cd "$dir" || exit 1
  timeout 300 "$strata" train --backend cuda --config config.json >plain 2>&1 || { cat plain; fail "the plain run failed"; }
  timeout 300 "$strata" train --num-gpus 1 --master-port $port --config config.json >one 2>&1
  rc=$?
  cat one
  [ $rc -eq 0 ] || fail "--num-gpus 1 exited $rc"
  grep -q 'this is rank 0 of 1 (nccl)' one || fail "--num-gpus 1 did not run the NCCL path"
  [ -n "$(losses plain)" ] || fail "no step lines in the plain run"
  [ "$(losses plain)" = "$(losses one)" ] || fail "--num-gpus 1's losses are not the plain run's"
  mkdir bin
  printf '#!/bin/sh\n# ssh HOST CMD: runs CMD here, as sshd runs it in a shell on HOST\nshift\nexec sh -c "$*"\n' >bin/ssh
  chmod +x bin/ssh
  echo "localhost slots=1" >hosts
  PATH="$dir/bin:$PATH" timeout 300 "$strata" train --hostfile hosts --master-port $((port + 1)) --config config.json \
    >ssh 2>&1
  rc=$?
  cat ssh
  [ $rc -eq 0 ] || fail "--hostfile over the local ssh exited $rc"
  [ "$(losses plain)" = "$(losses ssh)" ] || fail "--hostfile's losses are not the plain run's"
  echo "launcher_train.sh gpu: --num-gpus 1 and --hostfile (1 host, 1 slot) give the plain run's losses"
  exit 0
fi

mpiexec=$2 strata=$3
args="--oversubscribe --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
[ "$(id -u)" -eq 0 ] && args="$args --allow-run-as-root"
export STRATA_MPIRUN="$mpiexec"
cd "$dir" || exit 1

# 1. The launcher's ranks train as mpirun's do.
timeout 300 "$mpiexec" -n 2 $args "$strata" train --backend cpu --threads 1 --config config.json >direct 2>&1 ||
  { cat direct; fail "mpirun -n 2 failed"; }
timeout 300 "$strata" train --backend cpu --num-ranks 2 --launcher-args "$args" --threads 1 --config config.json \
  >launched 2>&1
rc=$?
cat launched
[ $rc -eq 0 ] || fail "--num-ranks 2 exited $rc"
[ "$(losses direct | wc -l)" -eq 3 ] || fail "mpirun -n 2 did not print 3 steps"
[ "$(losses direct)" = "$(losses launched)" ] || fail "--num-ranks 2's losses are not mpirun -n 2's"
grep -q 'this is rank 0 of 2 (mpi)' launched || fail "the ranks did not run as 2"

# 2. A rank that fails ends the job, reported first.
start=$(date +%s)
STRATA_TEST_FAIL_RANK=1 timeout 120 "$strata" train --backend cpu --num-ranks 2 --launcher-args "$args" --threads 1 \
  --config config.json >failed 2>&1
rc=$?
took=$(($(date +%s) - start))
cat failed
[ $rc -eq 3 ] || fail "a failed rank 1 gave exit $rc, not its 3"
[ $took -lt 60 ] || fail "the job took $took s to end after rank 1 failed"
report=$(grep -n '^strata: rank [0-9]* failed first' failed | head -1)
echo "$report" | grep -q 'strata: rank 1 failed first: exit status 3' || fail "the report does not name rank 1 first: $report"
sed -n "${report%%:*},\$p" failed | grep -q '\[rank 1\] strata: STRATA_TEST_FAIL_RANK=1' ||
  fail "the report does not give rank 1's stderr"

# 3. SIGTERM to the launcher reaches the ranks: they stop after the step and save.
sed 's/"steps": 3/"steps": 100000/' config.json >long.json
# --foreground: a plain `timeout` passes the TERM below to its child and
# then to its whole process group, so the launcher would see two signals
# (the second means "exit now, save nothing") and the save would race it.
timeout --foreground 300 "$strata" train --backend cpu --num-ranks 2 --launcher-args "$args" --threads 1 \
  --config long.json --save ckpt >stopped 2>&1 &
pid=$!
i=0
until grep -q 'step 2/' stopped 2>/dev/null; do
  i=$((i + 1))
  [ $i -lt 600 ] || { kill -9 $pid; fail "no step 2 within 60 s"; }
  sleep 0.1
done
kill -TERM $pid
wait $pid
rc=$?
cat stopped
[ $rc -eq 143 ] || fail "the stopped launcher exited $rc, not 143"
[ "$(grep -c 'stopping after the step under way' stopped)" -eq 2 ] || fail "not both ranks were asked to stop"
[ -f ckpt/latest ] || fail "rank 0 saved no checkpoint on the stop"

# 4. Refusals name the option to use.
"$strata" train --backend cpu --num-gpus 2 --config config.json >refused 2>&1
[ $? -eq 2 ] && grep -q -- '--num-ranks 2' refused || { cat refused; fail "--num-gpus on the CPU backend was not refused naming --num-ranks"; }
printf 'a slots=2\nb slots=two\n' >bad_hosts
"$strata" train --backend cpu --hostfile bad_hosts --config config.json >refused 2>&1
[ $? -eq 2 ] && grep -q 'hostfile bad_hosts:2: slots=two' refused || { cat refused; fail "the bad hostfile's line was not named"; }
echo "launcher_train.sh cpu: the launched ranks give mpirun's losses; a failed rank is reported first in $took s; SIGTERM stops and saves"
