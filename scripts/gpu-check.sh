#!/usr/bin/env bash
# Build and check strata on a GPU machine in one go; logs land in $OUT (or
# ./gpu-check-out). Stages are chosen by name:
#   scripts/gpu-check.sh build tests adam nvme pcie store kernels train
# `build` builds everything (or only TARGETS="a b" when set). Each stage has
# its own timeout so one hang does not cost the rest.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc)}
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
run() {  # run NAME TIMEOUT CMD...
  local name=$1 t=$2; shift 2
  log "$name: $*"
  local start=$SECONDS
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name: rc=$rc in $((SECONDS - start))s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
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
    adam) run adam 240 "$BUILD/bin/strata-bench" adam --sizes 64M,200M,1G --threads 1,4,8,16 --json "$OUT/adam.json" ;;
    nvme) run nvme 150 "$BUILD/bin/strata-bench" nvme --json "$OUT/nvme.json" ;;
    pcie) run pcie 150 "$BUILD/bin/strata-bench" pcie --json "$OUT/pcie.json" ;;
    store) run store 150 "$BUILD/bin/strata-bench" store --json "$OUT/store.json" ;;
    kernels) run kernels-gpu 300 "$BUILD/bin/kernels_gpu_test" ;;
    train) run train-resident 400 "$BUILD/bin/strata-bench" train --resident --steps 5 --warmup 2 --json "$OUT/train.json" ;;
    *) log "unknown stage $stage" ;;
  esac
done
