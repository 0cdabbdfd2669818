#!/bin/sh
# Runs "$@" (python arguments) under the first Python that can import torch,
# for the CTest tests of strata.torch (tests/CMakeLists.txt): $STRATA_TORCH_PYTHON,
# then the build's virtual environment (the Makefile's python-env: Debian's
# python3 and its python3-torch), then python3 and /usr/bin/python3 on this
# machine. Without one it exits 77 (CTest: skipped), saying what it tried.
# BUILD_DIR: the build folder (for its venv).
tried=""
for py in "$STRATA_TORCH_PYTHON" "${BUILD_DIR:-build}/venv/bin/python" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || { tried="$tried $py (absent)"; continue; }
  if "$py" -c 'import torch' >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
  tried="$tried $py (no torch)"
done
echo "skipped: no Python here imports torch (tried:$tried); scripts/install-deps.sh installs python3-torch on Debian"
exit 77
