# SPDX-License-Identifier: Apache-2.0
# Sourced on the GPU machine as .devdeps/env.sh (scripts/pack-deps.sh copies
# this file there beside the .debs; docs/gpu-machine.md):
#   source .devdeps/env.sh
# Unpacks the carried .debs into $STRATA_DEVDEPS_ROOT (default /opt/devdeps;
# never into /, so the machine's own packages are untouched) and points
# CMake, pkg-config, the compiler and the loader at them. The packages are
# unpacked again whenever the set of .debs differs from the one unpacked.
_dd=${STRATA_DEVDEPS_ROOT:-/opt/devdeps}
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
_want=$(cd "$_here" && ls *.deb 2>/dev/null | md5sum | cut -d' ' -f1)
case $_dd in /|/usr|/usr/*|"") echo "devdeps: refusing to unpack into '$_dd'" >&2; return 1 ;; esac
if [ "$(cat "$_dd/.done" 2>/dev/null)" != "$_want" ]; then
  # The stamp is written only when every package unpacked: a failed unpack
  # is tried again at the next source, not taken for done.
  _ok=1
  rm -rf "$_dd" && mkdir -p "$_dd" || _ok=0
  for _f in "$_here"/*.deb; do
    [ $_ok -eq 1 ] || break
    dpkg -x "$_f" "$_dd" || { echo "devdeps: cannot unpack $_f into $_dd" >&2; _ok=0; }
  done
  if [ $_ok -eq 0 ]; then
    echo "devdeps: $_dd is incomplete; nothing was set" >&2
    unset _dd _here _want _f _ok
    return 1
  fi
  echo "$_want" > "$_dd/.done"
fi
# The packages' pkg-config files say prefix=/usr; the sysroot re-roots them.
export CMAKE_PREFIX_PATH=$_dd/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export PKG_CONFIG_SYSROOT_DIR=$_dd
export PKG_CONFIG_PATH=$_dd/usr/lib/x86_64-linux-gnu/pkgconfig:$_dd/usr/share/pkgconfig
export LD_LIBRARY_PATH=$_dd/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CPATH=$_dd/usr/include:$_dd/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}
export LIBRARY_PATH=$_dd/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
# The lent GPU hosts are shared: NVLink multicast stays off for NCCL and
# anything else that would use it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset _dd _here _want _f _ok
