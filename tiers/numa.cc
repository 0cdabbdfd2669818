// SPDX-License-Identifier: Apache-2.0
#include "tiers/numa.h"

#include <hwloc.h>

#include <cerrno>

namespace strata {

namespace {

// The process-wide topology, loaded once with PCI devices. Null when hwloc
// failed to load (then every query answers "unknown").
hwloc_topology_t Topology() {
  static hwloc_topology_t topo = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) return static_cast<hwloc_topology_t>(nullptr);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      return static_cast<hwloc_topology_t>(nullptr);
    }
    return t;
  }();
  return topo;
}

// The lowest node in `nodeset`, or -1.
int FirstNode(hwloc_const_nodeset_t nodeset) {
  if (nodeset == nullptr || hwloc_bitmap_iszero(nodeset)) return -1;
  return hwloc_bitmap_first(nodeset);
}

}  // namespace

int NumaNodeCount() {
  hwloc_topology_t t = Topology();
  if (t == nullptr) return 1;
  int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  return n > 0 ? n : 1;
}

int NumaNodeOfPciBusId(const std::string& bus_id) {
  hwloc_topology_t t = Topology();
  if (t == nullptr || bus_id.empty()) return -1;
  hwloc_obj_t dev = hwloc_get_pcidev_by_busidstring(t, bus_id.c_str());
  if (dev == nullptr) return -1;
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(t, dev);
  if (anc == nullptr) return -1;
  return FirstNode(anc->nodeset);
}

int NumaNodeOfCurrentThread() {
  hwloc_topology_t t = Topology();
  if (t == nullptr) return -1;
  hwloc_cpuset_t cpus = hwloc_bitmap_alloc();
  hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
  int node = -1;
  if (hwloc_get_last_cpu_location(t, cpus, HWLOC_CPUBIND_THREAD) == 0) {
    hwloc_cpuset_to_nodeset(t, cpus, nodes);
    node = FirstNode(nodes);
  }
  hwloc_bitmap_free(cpus);
  hwloc_bitmap_free(nodes);
  return node;
}

Status BindToNumaNode(void* addr, uint64_t bytes, int node) {
  if (node < 0 || bytes == 0) return Status::OK();
  hwloc_topology_t t = Topology();
  if (t == nullptr) return Status::OK();
  int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  if (node >= n)
    return InvalidArgument("NUMA node " + std::to_string(node) + " does not exist (this machine has " +
                           std::to_string(n) + ")");
  if (n <= 1) return Status::OK();
  hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(node));
  if (obj == nullptr) return InvalidArgument("NUMA node " + std::to_string(node) + " not found");
  if (hwloc_set_area_membind(t, addr, bytes, obj->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET) != 0) {
    int err = errno;
    Status::Rep rep;
    rep.code = StatusCode::kUnavailable;
    rep.message = "binding memory to NUMA node " + std::to_string(node) + " was refused";
    rep.sys_errno = err;
    return Status(std::move(rep));
  }
  return Status::OK();
}

int NumaNodeOfAddress(const void* addr) {
  hwloc_topology_t t = Topology();
  if (t == nullptr) return -1;
  hwloc_nodeset_t nodes = hwloc_bitmap_alloc();
  int node = -1;
  if (hwloc_get_area_memlocation(t, addr, 1, nodes, HWLOC_MEMBIND_BYNODESET) == 0)
    node = FirstNode(nodes);
  hwloc_bitmap_free(nodes);
  return node;
}

}  // namespace strata
