#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/adam-sweep.sh: which host-memory setup gives the CPU Adam the most
# G params/s on this machine? One command, bounded to about 3 minutes of
# measuring (each stage has its own `timeout`; rows are written as they are
# measured, so a stage cut short keeps what it got). Writes to $OUT:
#   adam-sweep.log        machine facts (lscpu, THP settings, memory) and every stage's output
#   adam-<stage>.json   strata-bench adam rows (see bench/adam.cc)
#   summary.txt           the best combinations per config and size
# Stages:
#   main  f16:f32:f16 (28 B/param), 64M and 200M params, all threads:
#         huge pages on/off x pinning off/on x prefetch 0 and 256..4096 bytes (l1, l2)
#   tile  f16:f32:f16, 200M: tile 4K..256K elements, without and with prefetch
#   stagger0, stagger2052K  the array layout (see below)
#   ds    f32:f32:none (DeepSpeed's cpu_adam configuration, 4.90 G params/s), 200M,
#         8 and all threads: huge pages on/off x pinning off/on x prefetch 0/512/2048
# The binary: $BENCH, else $BUILD/bin/strata-bench (BUILD=build-gpu, what
# scripts/gpu-check.sh builds), else it builds strata-bench alone in
# build-adam (CUDA off; outside the 3 minutes).
set -uo pipefail
OUT=${OUT:-$PWD/adam-sweep-out}
mkdir -p "$OUT"
LOG=$OUT/adam-sweep.log
: > "$LOG"
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
log() { echo "== $*" | tee -a "$LOG"; }

BUILD=${BUILD:-build-gpu}
BENCH=${BENCH:-$BUILD/bin/strata-bench}
if [ ! -x "$BENCH" ]; then
  BUILD=build-adam
  BENCH=$BUILD/bin/strata-bench
  log "building strata-bench in $BUILD (CUDA off)"
  timeout 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_CUDA=OFF >> "$LOG" 2>&1 &&
    timeout 480 cmake --build "$BUILD" -j "$(nproc)" --target strata-bench >> "$LOG" 2>&1 ||
    { log "build failed; see $LOG"; exit 1; }
fi

log "machine"
{
  lscpu
  echo "--- transparent huge pages"
  for f in enabled defrag khugepaged/defrag; do
    echo "$f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>/dev/null)"
  done
  grep -i -E 'MemTotal|MemFree|AnonHugePages|HugePages_Total' /proc/meminfo
  command -v numactl > /dev/null && numactl -H
  echo "--- cpufreq governor: $(cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null || echo none)"
} >> "$LOG" 2>&1

stage() {  # stage NAME TIMEOUT ARGS...
  local name=$1 t=$2; shift 2
  log "$name: strata-bench adam $*"
  local start=$SECONDS
  timeout "$t" "$BENCH" adam --reps 5 --json "$OUT/adam-$name.json" "$@" >> "$LOG" 2>&1
  log "$name: rc=$? in $((SECONDS - start))s"
}

# Sizes can be shrunk for a dry run elsewhere: SIZES=4M SIZE=4M scripts/adam-sweep.sh
SIZES=${SIZES:-64M,200M}
SIZE=${SIZE:-200M}
stage main 90 --config f16:f32:f16 --sizes "$SIZES" --threads all --isa avx512 \
  --hugepages both --pin off,on --tile 16K --prefetch 0,256,512,1024,2048,4096 --prefetch-hint l1,l2
stage tile 30 --config f16:f32:f16 --sizes "$SIZE" --threads all --isa avx512 \
  --hugepages on --tile 4K,16K,64K,256K --prefetch 0,1024 --prefetch-hint l2
stage ds 35 --config f32:f32:none --sizes "$SIZE" --threads 8,all --isa avx512 \
  --hugepages both --pin off,on --tile 16K --prefetch 0,512,2048 --prefetch-hint l2

# Array layout: every buffer 2 MiB-aligned back to back (stagger 0: arrays
# spaced by exact powers of two) against a 2 MiB + 4 KiB stagger (the other
# stages use 2M, like glibc's aligned_alloc). On the 2-core dev VM stagger 0
# was 2-3x slower, for both the Adam pass and the roof.
stage stagger0 25 --config f16:f32:f16 --sizes "$SIZE" --threads all --isa avx512 --hugepages both --stagger 0
stage stagger2052K 25 --config f16:f32:f16 --sizes "$SIZE" --threads all --isa avx512 --hugepages both --stagger 2052K

# The best rows per config and size, from the JSON (or, for a stage cut short
# before its first JSON write, nothing).
python3 - "$OUT" > "$OUT/summary.txt" 2>&1 <<'PY'
import json, sys, glob, os
rows = []
for f in sorted(glob.glob(os.path.join(sys.argv[1], "adam-*.json"))):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f"{f}: {e}"); continue
    print(f"{os.path.basename(f)}: meta {json.dumps(d.get('meta', {}))}")
    for r in d.get("rows", []):
        r["stage"] = os.path.basename(f)[5:-5]; rows.append(r)
keys = sorted({(r["config"], r["params"], r["threads"]) for r in rows})
cols = ["stage", "hp", "thp", "pin", "tile", "pf", "Gparam/s", "value", "baseline", "ratio", "read", "copy", "update"]
def fmt(v):
    return f"{v:.3f}" if isinstance(v, float) else str(v)
for k in keys:
    sel = sorted((r for r in rows if (r["config"], r["params"], r["threads"]) == k),
                 key=lambda r: -r["Gparam/s"])
    base = [r for r in sel if r["pf"] == "0" and r["hp"] == "on" and not r["pin"] and r["tile"] == "16K"]
    print(f"\n{k[0]} {k[1]} params, {k[2]} threads: {len(sel)} rows"
          + (f"; plain (hp on, no pin, no prefetch, 16K): {base[0]['Gparam/s']:.3f} G params/s" if base else ""))
    print("  " + "  ".join(cols))
    for r in sel[:8]:
        print("  " + "  ".join(fmt(r.get(c, "")) for c in cols))
PY
cat "$OUT/summary.txt" | tee -a "$LOG"
