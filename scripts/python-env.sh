#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up what the Python tests need (tests/CMakeLists.txt), under a build
# folder, from the project's own files; the Makefile's `make test` runs it.
#   BUILD/venv            a virtual environment over the Python that has torch
#                         (Debian's python3 with python3-torch, installed by
#                         scripts/install-deps.sh; else python3), seeing that
#                         Python's packages: strata.torch's tests run in it
#   BUILD/python-wheels   the build requirements of pyproject.toml, from PyPI,
#                         so that the pip-install test builds offline
#   in BUILD/venv         Hugging Face transformers and tokenizers from PyPI
#                         (engine.hf_step_dir, python.tokenize): over torch
#                         1.x, transformers 4.44.2, known to load models there
# Neither the system's Python nor pyenv's is changed (Debian's refuses pip
# installs: PEP 668). Usage: scripts/python-env.sh [BUILD]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
python=""
for p in /usr/bin/python3 python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then python=$p; break; fi
done
if [ -z "$python" ]; then
  python=python3
  echo "strata: no Python here imports torch: strata.torch's tests will be skipped (Debian: apt-get install python3-torch)"
fi
if [ ! -x "$build/venv/bin/python" ]; then
  echo "strata: creating $build/venv over $python ($("$python" --version 2>&1))"
  "$python" -m venv --system-site-packages "$build/venv"
fi
# The [build-system] requires of pyproject.toml, read from it (tomllib: Python 3.11+).
requires=$("$build/venv/bin/python" - <<'PY'
import re
text = open("pyproject.toml", encoding="utf-8").read()
try:
    import tomllib
    print("\n".join(tomllib.loads(text)["build-system"]["requires"]))
except ImportError:  # Python < 3.11: the one line this project writes
    print("\n".join(re.findall(r'"([^"]+)"', re.search(r"^requires\s*=\s*\[(.*?)\]", text, re.M | re.S).group(1))))
PY
)
stamp="$build/python-wheels/.requires"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$requires" ]; then
  echo "strata: fetching the Python build requirements into $build/python-wheels: $(echo $requires)"
  mkdir -p "$build/python-wheels"
  # shellcheck disable=SC2086
  if "$build/venv/bin/python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
      -d "$build/python-wheels" $requires; then
    printf '%s' "$requires" > "$stamp"
  else
    echo "strata: could not fetch them (no index?); the pip-install test will ask the index itself" >&2
  fi
fi
# transformers (with tokenizers, safetensors) for the Hugging Face round trip
# and the tokenizer script's tests; skipped with a note when the index is
# out of reach (those tests then say they were skipped).
if ! "$build/venv/bin/python" -c 'import transformers, tokenizers' 2>/dev/null; then
  hf="transformers tokenizers"
  if "$build/venv/bin/python" -c 'import sys, torch; sys.exit(int(torch.__version__.split(".")[0]) >= 2)' 2>/dev/null; then
    hf="transformers==4.44.2"  # one that loads models over torch 1.13 (checked with Debian's)
  fi
  echo "strata: installing $hf into $build/venv (for engine.hf_step_dir and python.tokenize)"
  # shellcheck disable=SC2086
  "$build/venv/bin/python" -m pip install --quiet --disable-pip-version-check $hf ||
    echo "strata: could not install $hf (no index?); the Hugging Face tests will be skipped" >&2
fi
