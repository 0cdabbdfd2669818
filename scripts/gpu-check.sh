#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Build and check strata on a GPU machine in one go; logs land in $OUT (or
# ./gpu-check-out). Stages are chosen by name:
#   scripts/gpu-check.sh build tests adam nvme pcie store kernels train workloads generate
#   scripts/gpu-check.sh peers-smoke peers peers-offload   (PyTorch / DeepSpeed beside strata)
#   scripts/gpu-check.sh nvmepair                           (old against new: OLD_BUILD)
# `build` builds everything (or only TARGETS="a b" when set). Each stage has
# its own timeout so one hang does not cost the rest.
# On a machine without a package registry the Debian dependencies come from
# .devdeps/ (made by scripts/pack-deps.sh, copied along with the tree), whose
# env.sh is sourced here; without it the machine's own packages are used
# (docs/gpu-machine.md).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
# Logs go to LOGS and are packed into $OUT/logs.tgz at exit (the device tool
# returns at most 8 files); summary.txt is copied beside it.
LOGS=${LOGS:-/tmp/gpu-check-logs}
mkdir -p "$OUT" "$LOGS"
trap 'cp "$LOGS/summary.txt" "$OUT/" 2>/dev/null; tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
log() { echo "== $*" | tee -a "$LOGS/summary.txt"; }
if [ -f .devdeps/env.sh ]; then
  source .devdeps/env.sh || { log "sourcing .devdeps/env.sh failed"; exit 1; }
else
  log "no .devdeps/env.sh (scripts/pack-deps.sh makes it): using the machine's own packages"
fi
run() {  # run NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  log "$name: $*"
  local start=$SECONDS
  timeout "$t" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  log "$name: rc=$rc in $((SECONDS - start))s"
  tail -n "${TAIL:-25}" "$LOGS/$name.log"
  return $rc
}
for stage in "$@"; do
  case $stage in
    env) run env 30 bash -c 'nvidia-smi; nproc; free -g; uname -r; cmake --version | head -1; nvcc --version | tail -1; df -h .' ;;
    build)
      run configure 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release || exit 1
      run build 480 cmake --build "$BUILD" -j "$JOBS" ${TARGETS:+--target $TARGETS} || exit 1 ;;
    tests) run gpu-tests 300 ctest --test-dir "$BUILD" -L gpu --output-on-failure ;;
    cputests) run cpu-tests 300 ctest --test-dir "$BUILD" -LE gpu -j 8 --output-on-failure ;;
    adam) run adam 240 "$BUILD/bin/strata-bench" adam ${ADAM_ARGS:---sizes 64M,200M --threads 1,8,16} --json "$LOGS/adam.json" ;;
    nvme) run nvme 150 "$BUILD/bin/strata-bench" nvme ${NVME_ARGS:-} --json "$LOGS/nvme.json" ;;
    pcie) run pcie 150 "$BUILD/bin/strata-bench" pcie --json "$LOGS/pcie.json" ;;
    store) run store 150 "$BUILD/bin/strata-bench" store --json "$LOGS/store.json" ;;
    kernels) run kernels-gpu 300 "$BUILD/bin/kernels_gpu_test" ;;
    train) run train-resident 400 "$BUILD/bin/strata-bench" train --resident --steps 5 --warmup 2 --json "$LOGS/train.json" ;;
    enginetests) run engine-gpu 60 "$BUILD/bin/engine_gpu_test" ;;
    generate) run generate 400 env BUILD="$BUILD" scripts/generate-check.sh ;;
    # The peers (bench/peers/train_peers.py; docs/benchmarks.md): every one at a tiny GPT on the GPU, then
    # strata-bench train --peers at GPT 1.3B, resident and with the 8 GiB offload workload (no clipping).
    peers-smoke) run peers-smoke 300 "${STRATA_TORCH_PYTHON:-python3}" bench/peers/train_peers.py --layers 2 \
              --d-model 256 --heads 4 --seq 256 --micro-batch 2 --steps 2 --warmup 1 --step train --clip 1 \
              --json "$LOGS/peers-smoke.json" ;;
    peers) run train-peers 580 "$BUILD/bin/strata-bench" train --resident --peers ${PEER_ARGS:---steps 5 --warmup 2} \
              --json "$LOGS/train-peers.json" ;;
    peers-offload) run train-peers-offload 580 "$BUILD/bin/strata-bench" train --workload gpt-1.3b-offload --clip 0 \
              --peers ${PEER_ARGS:---steps 4 --warmup 2} --json "$LOGS/train-peers-offload.json" ;;
    w13off) run gpt-1.3b-offload 90 "$BUILD/bin/strata" train --config configs/gpt-1.3b-offload.json \
              --gpu-memory-limit 8GiB --steps ${STEPS:-6} --log-json "$LOGS/gpt-1.3b-offload.jsonl" ;;
    w67) run gpt-6.7b 200 "$BUILD/bin/strata" train --config configs/gpt-6.7b.json --gpu-memory-limit 24GiB \
              --host-memory-limit 110GiB --steps ${STEPS67:-3} --log-json "$LOGS/gpt-6.7b.jsonl" ;;
    w13nvme) mkdir -p /var/tmp/strata-nvme
             run gpt-1.3b-nvme 120 "$BUILD/bin/strata" train --config configs/gpt-1.3b-nvme.json \
              --host-memory-limit 8GiB --steps ${STEPSNVME:-2} --log-json "$LOGS/gpt-1.3b-nvme.jsonl" ;;
    workloads)  # strata-bench's three offload workloads, with clipping 1.0 and without (CLIPS="1 0")
      mkdir -p /var/tmp/strata-nvme
      for w in ${WORKLOADS:-gpt-1.3b-offload gpt-1.3b-nvme gpt-6.7b}; do
        for c in ${CLIPS:-1 0}; do
          run "bench-$w-clip$c" 420 "$BUILD/bin/strata-bench" train --workload "$w" --clip "$c" \
            ${WORKLOAD_ARGS:-} --json "$LOGS/$w-clip$c.json"
        done
      done ;;
    nvmepair)  # old against new on gpt-1.3b-nvme, alternating (the virtio disk drifts with what it wrote):
               # OLD_BUILD (default .old/build-gpu) holds the old strata-bench; each run's ratio divides by
               # raw io_uring measured in that run (docs/gpu-machine.md)
      mkdir -p /var/tmp/strata-nvme
      i=0
      for v in new old new old; do
        i=$((i + 1))
        b="$BUILD"; [ $v = old ] && b="${OLD_BUILD:-.old/build-gpu}"
        run "nvmepair-$i-$v" 150 "$b/bin/strata-bench" train --workload gpt-1.3b-nvme --clip 0 \
          ${NVMEPAIR_ARGS:---steps 2 --warmup 1}
      done ;;
    *) log "unknown stage $stage" ;;
  esac
done
