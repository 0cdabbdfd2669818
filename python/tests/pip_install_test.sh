#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# `pip install` of strata from its source tree into a fresh virtual
# environment, as a user would (pyproject.toml: scikit-build-core builds
# libstrata.so and puts it inside the package), then, from a folder outside
# the tree and with no PYTHONPATH or STRATA_LIB, `import strata` and the
# package's own tests against the installed copy (test_store, test_adam, and
# test_torch where the environment's Python has torch).
#
#   pip_install_test.sh SOURCE_DIR WORK_DIR [BUILD_DIR]
#
# The environment is made over BUILD_DIR/venv's Python (scripts/python-env.sh,
# which also fetched the build requirements into BUILD_DIR/python-wheels:
# pip then builds offline), else over python3. CTest: python.pip_install.
set -eu
src=$1
work=$2
build=${3:-$src/build}
unset PYTHONPATH STRATA_LIB
base=python3
[ -x "$build/venv/bin/python" ] && base=$build/venv/bin/python
rm -rf "$work"
mkdir -p "$work"
"$base" -m venv --system-site-packages "$work/venv"
py=$work/venv/bin/python
offline=""
if [ -f "$build/python-wheels/.requires" ]; then
  offline="--no-index --find-links $build/python-wheels"
fi
echo "pip install $src ($offline)"
# shellcheck disable=SC2086
"$py" -m pip install --disable-pip-version-check --no-cache-dir $offline "$src"

cd "$work"  # neither the source tree nor python/ is on sys.path here
"$py" - "$work/venv" <<'PY'
import os, sys
import strata
venv = os.path.realpath(sys.argv[1])
where = os.path.realpath(strata.__file__)
lib = os.path.realpath(strata.library_path())
assert where.startswith(venv + os.sep), "strata imported from %s, not the environment %s" % (where, venv)
assert lib == os.path.join(os.path.dirname(where), "libstrata.so"), "libstrata.so loaded from %s" % lib
print("strata from %s, library %s, cpu adam %s" % (where, lib, strata.CpuAdam(threads=1).isa))
PY
# The package's tests, from a copy of python/tests (its folder is sys.path[0]:
# the import of strata can only find the installed package).
cp -r "$src/python/tests" "$work/tests"
cd "$work/tests"
"$py" -m unittest test_store test_adam test_torch
