#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The mutation check: applies small wrong changes (mutants), one at a time,
# to a copy of the tree, builds only the test targets that matter into the
# copy's own build folder (ccache makes reruns cheap), runs the tests meant to
# catch each one, and prints a table: mutant | caught by | survived?
#
#   scripts/mutate.sh [--gpu] [--dir DIR] [--only NAME[,NAME...]] [--list] [--prepare]
#
#   --gpu    also the CUDA mutants (their tests need a GPU: label gpu);
#            without it they are listed as not run
#   --dir    where the copy and its build live (default build/mutate: under
#            the worktree's build folder, so that ccache's base_dir matches
#            the worktree's own build and most objects are cache hits)
#   --only   just these mutants
#   --list   print the mutants and exit
#   --prepare  copy and build the unmutated copy's test targets, then exit
#            (a GPU machine's first call builds it beside other work; a later
#            call on the same machine then runs the mutants at once)
#
# Each mutant is a textual patch: the exact text to replace in one file and
# its replacement; a patch whose text is missing fails loudly (the code moved:
# rewrite the mutant). The unmutated copy is built and its tests run first: a
# test that fails there would "catch" every mutant, so the check stops.
# Exit status: 0 when every mutant that ran was caught, 1 when one survived,
# 2 on a usage, patch, build or baseline failure.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 - "$@" <<'PY'
import argparse, os, shutil, subprocess, sys, time

# name, why, file, old text, new text, gpu?, tests: [(test binary, gtest filter)]
MUTANTS = [
    ("proj-bias-forward",
     "the attention output projection's bias ignored in BlockProgram::Run",
     "models/block_program.cc",
     "      if (s.bias >= 0) g.bias = W(s.bias);",
     "      if (s.bias >= 0 && !(s.residual.kind != Loc::kNone && s.k == C)) g.bias = W(s.bias);",
     False, [("models_test", "GptReferenceTest.Fp32*"), ("engine_test", "Gpt2Parity.AdamWSteps*")]),
    ("proj-bias-op-list",
     "attn.c_proj.bias removed from the GPT-2 op list",
     "models/gpt2.cc",
     'op(OpKind::kLinear, "att", "x1", "attn.c_proj.weight", "attn.c_proj.bias", "x");',
     'op(OpKind::kLinear, "att", "x1", "attn.c_proj.weight", "", "x");',
     False, [("models_test", "GptReferenceTest.Fp32*"), ("engine_test", "Gpt2Parity.AdamWSteps*")]),
    ("adam-bc2-step-1",
     "Adam's second bias correction computed with step - 1 (from step 2 on)",
     "optim/cpu_adam.cc",
     "bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));",
     "bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step > 1 ? h.step - 1 : 1));",
     False, [("engine_test", "Gpt2Parity.AdamWSteps*"),
             ("optim_test", "CpuAdamReference.ManyRandomHyperparametersOnAShortShard")]),
    ("adam-bc1-sign",
     "a sign flip in Adam's first bias correction (1 + beta1^t)",
     "optim/cpu_adam.cc",
     "bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));",
     "bc1 = 1.0 + std::pow(h.beta1, static_cast<double>(h.step));",
     False, [("optim_test", "CpuAdamReference.ManyRandomHyperparametersOnAShortShard")]),
    ("adam-bc2-sign",
     "a sign flip in Adam's second bias correction (1 + beta2^t)",
     "optim/cpu_adam.cc",
     "bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));",
     "bc2 = 1.0 + std::pow(h.beta2, static_cast<double>(h.step));",
     False, [("optim_test", "CpuAdamReference.ManyRandomHyperparametersOnAShortShard")]),
    ("ln-no-eps",
     "CPU LayerNorm without epsilon",
     "kernels/cpu/layernorm.cc",
     "const A rs = A(1) / std::sqrt(var + eps);",
     "const A rs = A(1) / std::sqrt(var + A(0) * eps);",
     False, [("models_test", "GptReferenceTest.*"), ("kernels_test", "CpuOpsTest.LayerNorm*")]),
    ("attn-scale-1/D",
     "attention scale 1/D instead of 1/sqrt(D) (CPU)",
     "kernels/cpu/attention.cc",
     "A(1) / std::sqrt(static_cast<A>(s.head_dim));",
     "A(1) / static_cast<A>(s.head_dim);",
     False, [("models_test", "GptReferenceTest.*")]),
    ("gelu-erf",
     "erf GELU (and its derivative) instead of the tanh GELU (CPU)",
     "kernels/cpu/vecmath.inc",
     "  return x / (A(1) + Exp(A(-2) * u));\n",
     "  return A(0.5) * x * (A(1) + std::erf(x * A(0.7071067811865476))) + A(0) * u;\n",
     False, [("models_test", "GptReferenceTest.*"), ("kernels_test", "CpuOpsTest.Gelu*")]),
    ("cuda-ln-no-eps",
     "CUDA LayerNorm without epsilon",
     "kernels/cuda/layernorm.cu",
     "const float rs = rsqrtf(WarpSum(v) / C + eps);",
     "const float rs = rsqrtf(WarpSum(v) / C + 0.f * eps);",
     True, [("kernels_gpu_test", "*CudaLayerNormTest.*")]),
    ("cuda-gelu-erf-grad",
     "the erf GELU's derivative in the CUDA elementwise/epilogue kernels",
     "kernels/cuda/common.cuh",
     "  return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du;",
     "  return 0.5f * (1.f + erff(x * 0.70710678f)) + x * expf(-0.5f * x2) * 0.39894228f + 0.f * t * du;",
     True, [("kernels_gpu_test", "CudaGemmRunnerTest.FusedDgelu*"), ("kernels_gpu_test", "*CudaElementwiseTest.Gelu*")]),
    ("cuda-ln-no-bias",
     "CUDA LayerNorm forward without its bias (a whole-model GPU test must see it)",
     "kernels/cuda/layernorm.cu",
     "for (int i = 0; i < kVec; ++i) f[i] = (f[i] - m) * rs * fw[i] + fb[i];",
     "for (int i = 0; i < kVec; ++i) f[i] = (f[i] - m) * rs * fw[i] + 0.f * fb[i];",
     True, [("models_gpu_test", "*CudaGptTest.*:CudaGptReferenceTest.*"), ("engine_gpu_test", "Gpt2ParityGpu.*")]),
]
# The gelu-erf mutant changes the derivative too (a second patch in the same file).
EXTRA = {
    "gelu-erf": [("kernels/cpu/vecmath.inc",
                  "  return s + A(2) * x * s * (A(1) - s) * k0 * (A(1) + A(3) * k1 * x2);\n",
                  "  return A(0.5) * (A(1) + std::erf(x * A(0.7071067811865476))) +\n"
                  "         x * std::exp(A(-0.5) * x2) * A(0.3989422804014327) + A(0) * s;\n")],
}

ap = argparse.ArgumentParser(prog="scripts/mutate.sh")
ap.add_argument("--gpu", action="store_true")
ap.add_argument("--dir", default="build/mutate")
ap.add_argument("--only", default="")
ap.add_argument("--list", action="store_true")
ap.add_argument("--prepare", action="store_true")
a = ap.parse_args()
if a.list:
    for m in MUTANTS:
        print(f"{m[0]:20} {'gpu' if m[5] else 'cpu'}  {m[1]}  ({m[2]}; tests: {', '.join(f'{b} {f}' for b, f in m[6])})")
    sys.exit(0)
only = set(x for x in a.only.split(",") if x)
unknown = only - {m[0] for m in MUTANTS}
if unknown:
    sys.exit(f"mutate: no mutant named {', '.join(sorted(unknown))} (--list shows them)")
chosen = [m for m in MUTANTS if not only or m[0] in only]
run = [m for m in chosen if a.gpu or not m[5]]

root = os.getcwd()
src = os.path.join(os.path.abspath(a.dir), "src")
build = os.path.join(src, "build")  # inside the copy, as build/ is inside the worktree (ccache base_dir)

def sh(cmd, **kw):
    return subprocess.run(cmd, shell=isinstance(cmd, str), **kw)

# The copy: the tracked and untracked-but-not-ignored files as they are now.
files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       check=True, capture_output=True).stdout.split(b"\0")
os.makedirs(src, exist_ok=True)
wanted = set()
for f in files:
    if not f:
        continue
    rel = f.decode()
    if not os.path.isfile(rel) or rel.startswith(a.dir.rstrip("/") + "/"):
        continue
    wanted.add(rel)
    dst = os.path.join(src, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    # Copy only what changed (keeps mtimes, so ninja rebuilds only that).
    if not os.path.exists(dst) or open(rel, "rb").read() != open(dst, "rb").read():
        shutil.copy2(rel, dst)

# Files of an earlier copy that the tree no longer has.
for dirpath, dirnames, filenames in os.walk(src):
    if os.path.abspath(dirpath) == src and "build" in dirnames:
        dirnames.remove("build")
    for fn in filenames:
        rel = os.path.relpath(os.path.join(dirpath, fn), src)
        if rel not in wanted:
            os.remove(os.path.join(dirpath, fn))

# ccache where there is one (a GPU machine may lack it: the copy is then built
# without, at the cost of a full first build).
env = dict(os.environ)
if shutil.which("ccache"):
    env.update(CMAKE_CXX_COMPILER_LAUNCHER="ccache", CMAKE_C_COMPILER_LAUNCHER="ccache",
               CMAKE_CUDA_COMPILER_LAUNCHER="ccache")
if not os.path.exists(os.path.join(build, "build.ninja")):
    r = sh(["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"], env=env,
           capture_output=True, text=True)
    if r.returncode:
        print(r.stdout[-3000:], r.stderr[-3000:])
        sys.exit("mutate: cmake failed")

def build_targets(targets):
    r = sh(["cmake", "--build", build, "-j", os.environ.get("JOBS", "2"), "--target", *sorted(targets)],
           env=env, capture_output=True, text=True)
    return r.returncode == 0, (r.stdout + r.stderr)[-4000:]

def run_test(binary, flt):
    exe = os.path.join(build, "bin", binary)
    t = time.time()
    r = sh([exe, f"--gtest_filter={flt}", "--gtest_brief=1"], capture_output=True, text=True, cwd=build)
    failed = [l.split("]", 1)[1].split()[0].rstrip(",") for l in r.stdout.splitlines() if l.startswith("[  FAILED  ]")]
    failed = [f for f in failed if not f[:1].isdigit()]  # not the "N tests, listed below" line
    return r.returncode, sorted(set(failed)), r.stdout[-3000:], time.time() - t

def patches(m):
    return [(m[2], m[3], m[4])] + EXTRA.get(m[0], [])

# Every patch must apply to today's text before anything runs.
for m in chosen:
    for path, old, new in patches(m):
        text = open(os.path.join(src, path)).read()
        n = text.count(old)
        if n != 1:
            sys.exit(f"mutate: mutant {m[0]}: the text to replace occurs {n} times in {path} (want 1): {old.strip()!r}")

# Baseline: the unmutated copy passes every test a mutant relies on.
targets = {b for m in run for b, _ in m[6]}
ok, log = build_targets(targets)
if not ok:
    print(log)
    sys.exit("mutate: the unmutated copy does not build")
if a.prepare:
    print(f"mutate: the unmutated copy is built ({len(targets)} test binaries, in {build})")
    sys.exit(0)
for b, flt in sorted({t for m in run for t in m[6]}):
    rc, failed, out, _ = run_test(b, flt)
    if rc != 0:
        print(out)
        sys.exit(f"mutate: baseline: {b} --gtest_filter={flt} fails without a mutant ({', '.join(failed)})")
print(f"mutate: baseline passes ({len(targets)} test binaries)", flush=True)

rows, survived, broken = [], 0, 0
for m in chosen:
    name, why, gpu, tests = m[0], m[1], m[5], m[6]
    if m not in run:
        rows.append((name, why, "not run (GPU mutant: --gpu on a machine with a GPU)", "-"))
        continue
    originals = {}
    try:
        for path, old, new in patches(m):
            full = os.path.join(src, path)
            originals.setdefault(full, open(full).read())
            text = open(full).read()
            open(full, "w").write(text.replace(old, new, 1))
        ok, log = build_targets({b for b, _ in tests})
        if not ok:
            broken += 1
            rows.append((name, why, "BUILD FAILED (fix the mutant):\n" + log[-800:], "?"))
            continue
        caught = []
        for b, flt in tests:
            rc, failed, out, secs = run_test(b, flt)
            if rc != 0:
                caught.append(f"{b}: " + (", ".join(failed) if failed else f"exit {rc}"))
        if not caught:
            survived += 1
        rows.append((name, why, "; ".join(caught) if caught else "nothing (" + ", ".join(f"{b} {f}" for b, f in tests) + ")",
                     "no" if caught else "SURVIVED"))
        print(f"mutate: {name}: {'caught' if caught else 'SURVIVED'}", flush=True)
    finally:
        for full, text in originals.items():
            open(full, "w").write(text)

print()
print("| mutant | wrong change | caught by | survived? |")
print("|---|---|---|---|")
for r in rows:
    print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} |")
# Leave the copy built unmutated.
build_targets(targets)
sys.exit(2 if broken else (1 if survived else 0))
PY
