#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `strata train` as 2 ranks under mpirun on loopback, as a user starts it
# (CTest's engine.mpirun_train, tests/CMakeLists.txt): the launcher's world
# size reaches the config (the batch rule counts it), the run completes,
# rank 0 alone prints the log (one "data parallel" line, one line per step)
# and writes the checkpoint.
#   mpirun_train.sh MPIEXEC STRATA
set -u
mpiexec=$1 strata=$2
flags="--oversubscribe -n 2 --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo"
[ "$(id -u)" -eq 0 ] && flags="$flags --allow-run-as-root"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/config.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "steps_per_print": 1,
 "model": {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "seq_len": 32},
 "trainer": {"steps": 3, "eval_batches": 1}}
JSON
timeout 300 "$mpiexec" $flags "$strata" train --backend cpu --threads 1 --config "$dir/config.json" \
  --save "$dir/ckpt" >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
fail() { echo "mpirun_train.sh: $*" >&2; exit 1; }
[ $rc -eq 0 ] || fail "mpirun exited $rc"
[ "$(grep -c 'data parallel: 2 ranks' "$dir/out")" -eq 1 ] || fail "not exactly one 'data parallel: 2 ranks' line (rank 0 alone logs)"
grep -q 'this is rank 0 of 2 (mpi)' "$dir/out" || fail "rank 0's line is missing"
grep -q 'rank 1 of 2' "$dir/out" && fail "rank 1 logged"
[ -f "$dir/ckpt/latest" ] || fail "no checkpoint in --save DIR ($dir/ckpt/latest missing)"
echo "mpirun_train.sh: 2 ranks trained, rank 0 logged and saved"
