#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# strata generate and strata eval on a GPU machine, from a Hugging Face
# directory and from a checkpoint fine-tuned from it, with tokens/s
# (docs/inference.md); scripts/gpu-check.sh runs it as its `generate` stage.
#   BUILD=build-gpu scripts/generate-check.sh [WORKDIR]
# Needs the strata binary in $BUILD/bin and python3 with torch (CUDA),
# transformers and tokenizers (scripts/make_hf_gpt2.py makes the model).
set -uo pipefail
B=${BUILD:-build-gpu}/bin
W=${1:-/tmp/strata-generate-check}
rm -rf "$W" && mkdir -p "$W"
python3 scripts/make_hf_gpt2.py "$W/hf" 2>&1 | grep -v -i warn | tail -3 || exit 1
P=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1])))))" "$W/hf/prompt.json")
echo "== greedy from the Hugging Face directory against PyTorch's full recompute"
"$B/strata" generate --model "$W/hf" --tokens "$P" --max-new-tokens 64 --temperature 0 --print-ids --ignore-eos \
  > "$W/greedy.ids" || exit 1
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
t = json.load(open(w + "/hf/torch_greedy.json"))
s = [int(x) for x in open(w + "/greedy.ids").read().split()]
n = next((i for i, (a, b) in enumerate(zip(t["greedy"], s)) if a != b), len(s))
print("strata and PyTorch greedy: the first %d of %d ids agree%s" % (
    n, len(s), "" if n == len(s) else " (the two largest logits there %.2e apart)" % t["gaps"][n]))
PY
echo "== tokens/s, 512 new tokens, top-k 50, from the Hugging Face directory"
for dt in fp32 bf16; do
  "$B/strata" generate --model "$W/hf" --tokens "$P" --max-new-tokens 512 --seed 1 --top-k 50 --print-ids \
    --ignore-eos --dtype "$dt" 2>&1 >/dev/null | tail -1
done
echo "== fine-tune 20 steps from it (--init-from), then generate and eval from the checkpoint"
"$B/strata" train --init-from "$W/hf" --data "$W/hf/kjv.bin" --steps 20 --save "$W/ft" > "$W/ft.log" 2>&1 \
  || { tail -20 "$W/ft.log"; exit 1; }
grep -E "val loss|saved" "$W/ft.log" | tail -2
STRATA_BIN="$B/strata" PYTHONPATH=python python3 -m strata generate --model "$W/ft" --prompt "And God said" \
  --max-new-tokens 100 --seed 2 --top-k 40 --ignore-eos
"$B/strata" eval --model "$W/ft" --data "$W/hf/kjv.bin" --batches 4
"$B/strata" eval --model "$W/hf" --data "$W/hf/kjv.bin" --batches 4 --batch 4 --seq 1024
