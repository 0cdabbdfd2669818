#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs a CTest test under the first Python that can import MODULE:
#
#   python_with.sh MODULE VAR HINT [python arguments...]
#
# trying $VAR (a Python the user names, e.g. STRATA_TORCH_PYTHON), the
# build's virtual environment (BUILD_DIR/venv: the Makefile's python-env,
# over Debian's python3 and its packages), then python3 and /usr/bin/python3
# on this machine. Without one it exits 77 (CTest: skipped), saying what it
# tried and HINT (how to get MODULE), rather than pass with the tests that
# need MODULE skipped. tests/CMakeLists.txt runs the package's numpy buffer
# tests (test_store, test_adam), strata.torch's tests and engine.hf_step_dir
# (transformers) through it. BUILD_DIR: the build folder (for its venv).
module=$1
var=$2
hint=$3
shift 3
case $var in *[!A-Za-z0-9_]*|"") echo "python_with.sh: bad variable name '$var'" >&2; exit 2 ;; esac
eval "named=\${$var:-}"
tried=""
for py in "$named" "${BUILD_DIR:-build}/venv/bin/python" python3 /usr/bin/python3; do
  [ -n "$py" ] || continue
  command -v "$py" >/dev/null 2>&1 || { tried="$tried $py (absent)"; continue; }
  if "$py" -c "import $module" >/dev/null 2>&1; then
    exec "$py" "$@"
  fi
  tried="$tried $py (no $module)"
done
echo "skipped: no Python here imports $module (tried:$tried); $hint"
exit 77
