#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Checks the lock annotations (base/thread_annotations.h) with clang's
# thread-safety analysis: every source that uses strata::Mutex compiles with
# -Werror=thread-safety-analysis, and a sample that breaks the rules
# (tests/base/thread_safety_violation.cc) fails to, so the check can fail.
# GCC ignores the annotations, so the build itself checks nothing.
# Only strata::Mutex is a capability: a GUARDED_BY or REQUIRES naming a
# std::mutex (as in tiers/) is not checked, and -Wno-thread-safety-attributes
# keeps clang from saying so.
#
# Usage: scripts/check_thread_safety.sh [ROOT]   (exit 0: clean; 1: a
# violation, printed; 77: no clang++ here — scripts/install-deps.sh installs it)
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 1
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "skipped: clang++ not found (scripts/install-deps.sh installs clang)"
  exit 77
fi
flags="-fsyntax-only -std=c++20 -I. -DSTRATA_WITH_CUDA=0 -Wthread-safety-analysis -Wthread-safety-precise
       -Wno-thread-safety-attributes -Werror=thread-safety-analysis -Werror=thread-safety-precise"
files=$(grep -rlE '\bMutexLock\b|\bCondVar\b' --include='*.cc' base comm tiers swap kernels optim models engine | sort)
[ -n "$files" ] || { echo "no source uses strata::Mutex: nothing checked"; exit 1; }
bad=0
for f in $files; do
  # shellcheck disable=SC2086
  if ! out=$($cxx $flags "$f" 2>&1); then
    echo "$f:"; echo "$out"; bad=1
  fi
done
# shellcheck disable=SC2086
if $cxx $flags tests/base/thread_safety_violation.cc >/dev/null 2>&1; then
  echo "tests/base/thread_safety_violation.cc compiled: the analysis is not running"; bad=1
fi
[ $bad -eq 0 ] && echo "thread-safety analysis clean: $(echo "$files" | wc -l) files ($cxx)"
exit $bad
