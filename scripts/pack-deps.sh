#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs strata's Debian build dependencies into .devdeps/ at the repository
# root, for building on a GPU machine that reaches no package registry
# (docs/gpu-machine.md). Run it on a Debian 12 machine with apt; copy
# .devdeps/ along with the tree; on the GPU machine begin each command with
#   source .devdeps/env.sh
# (scripts/gpu-check.sh does that itself). Extra package names may be given
# as arguments. .devdeps/ is git-ignored.
#
# The list is the library packages of scripts/install-deps.sh with the
# runtime packages they depend on; the compiler, CMake, Ninja, Python and
# CUDA come with the GPU machine. Keep it in step with install-deps.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
pkgs=(liburing-dev liburing2
      libhwloc-dev libhwloc15 libnuma-dev libnuma1
      libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5
      libeigen3-dev
      libboost1.74-dev libboost-program-options1.74-dev libboost-program-options1.74.0
      nlohmann-json3-dev
      libgtest-dev libgmock-dev googletest
      libbenchmark-dev libbenchmark1debian
      # Open MPI (comm/mpi_communicator.h) with the runtime packages it needs.
      libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libpmix2 libpmix-dev
      libevent-2.1-7 libevent-core-2.1-7 libevent-pthreads-2.1-7 libevent-extra-2.1-7 libevent-openssl-2.1-7
      libevent-dev libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libibverbs1 ibverbs-providers
      librdmacm1 libnl-3-200 libnl-route-3-200 libmunge2 libhwloc-plugins libxnvctrl0
      libibverbs-dev libnl-3-dev libnl-route-3-dev
      "$@")

command -v apt-get >/dev/null || { echo "pack-deps: apt-get not found (this needs a Debian machine)" >&2; exit 1; }
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "pack-deps: no package lists yet; running apt-get update"
  $sudo apt-get update -qq
fi

# Download into a fresh directory, so that a failure leaves the previous
# .devdeps/ as it was and no stale version of a package is kept beside a new one.
out="$root/.devdeps"
tmp=$(mktemp -d "$root/.devdeps.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && apt-get download "${pkgs[@]}" 2>&1 | grep -v -e unsandboxed -e '^Get:' || true)
missing=()
for p in "${pkgs[@]}"; do
  compgen -G "$tmp/${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -ne 0 ]; then
  echo "pack-deps: not downloaded: ${missing[*]} (is the name right for this Debian release?)" >&2
  exit 1
fi
cp "$here/devdeps-env.sh" "$tmp/env.sh"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "pack-deps: $(ls "$out"/*.deb | wc -l) packages, $(du -sh "$out" | cut -f1), in $out"
