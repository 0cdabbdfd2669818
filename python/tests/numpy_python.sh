#!/bin/sh
# Runs "$@" (python arguments) under the first Python that can import numpy,
# for the CTest tests of the strata package (tests/CMakeLists.txt), whose
# buffer tests use numpy arrays: $STRATA_PYTHON, then the build's virtual
# environment (the Makefile's python-env, over Debian's python3), then
# python3 and /usr/bin/python3 on this machine (scripts/install-deps.sh
# installs Debian's python3-numpy). Without one it exits 77 (CTest: skipped),
# saying what it tried, rather than pass with the numpy tests skipped.
# BUILD_DIR: the build folder (for its venv).
tried=""
for py in "$STRATA_PYTHON" "${BUILD_DIR:-build}/venv/bin/python" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || { tried="$tried $py (absent)"; continue; }
  if "$py" -c 'import numpy' >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
  tried="$tried $py (no numpy)"
done
echo "skipped: no Python here imports numpy (tried:$tried); scripts/install-deps.sh installs python3-numpy on Debian"
exit 77
