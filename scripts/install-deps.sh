#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian packages strata builds with, only those missing.
# The CUDA Toolkit is not installed here: it comes with the machine (nvcc is
# found on PATH or in /usr/local/cuda); without it strata builds CPU-only.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      liburing-dev libhwloc-dev libtbb-dev libeigen3-dev libboost-program-options-dev
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev
      python3 python3-venv  # the Python package's tests and example (python/, examples/python/)
      python3-numpy         # their numpy buffer tests (python/tests/test_adam.py, test_store.py)
      gnuplot-nox           # the charts of strata-bench all and strata plot (engine/plot.h)
      libopenmpi-dev openmpi-bin  # the CPU backend's ranks communicate over MPI (comm/mpi_communicator.h)
      clang)                # the analysis of the lock annotations (scripts/check_thread_safety.sh)
# strata.torch's tests (python/tests/test_torch.py) need torch: Debian's
# python3-torch, unless a Python here has it already (as where it comes
# with the machine).
if ! python3 -c 'import torch' 2>/dev/null && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  pkgs+=(python3-torch)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "strata: installing missing Debian packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "strata: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
if ! command -v apt-get >/dev/null; then
  echo "strata: apt-get not found; install these packages by hand: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
