// SPDX-License-Identifier: Apache-2.0
#include "engine/rank_binding.h"

#include <hwloc.h>

#include <cerrno>
#include <cstring>
#include <map>

namespace strata {

struct RankBindings::Impl {
  hwloc_topology_t topo = nullptr;
  std::string why_none;                 // set when hwloc gave nothing to bind to
  std::vector<hwloc_bitmap_t> cpus;     // owned; one per rank
  std::vector<hwloc_bitmap_t> nodes;    // owned; empty set: no memory binding
  std::vector<std::string> text;
  ~Impl() {
    for (hwloc_bitmap_t b : cpus) hwloc_bitmap_free(b);
    for (hwloc_bitmap_t b : nodes) hwloc_bitmap_free(b);
    if (topo) hwloc_topology_destroy(topo);
  }
};

namespace {

std::string BitmapList(hwloc_const_bitmap_t b) {
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, b) < 0 || s == nullptr) return "?";
  std::string out = s;
  free(s);
  return out;
}

}  // namespace

RankBindings::RankBindings(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RankBindings::~RankBindings() = default;
RankBindings::RankBindings(RankBindings&&) noexcept = default;
RankBindings& RankBindings::operator=(RankBindings&&) noexcept = default;

RankBindings RankBindings::ForGpus(const std::vector<std::string>& gpu_bus_ids) {
  auto im = std::make_unique<Impl>();
  const size_t n = gpu_bus_ids.size();
  im->text.assign(n, "");
  if (hwloc_topology_init(&im->topo) != 0) {
    im->topo = nullptr;
    im->why_none = "hwloc cannot start";
    return RankBindings(std::move(im));
  }
  hwloc_topology_set_io_types_filter(im->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (hwloc_topology_load(im->topo) != 0) {
    im->why_none = "hwloc cannot load the machine's topology";
    return RankBindings(std::move(im));
  }
  hwloc_topology_t t = im->topo;
  // Each rank's node (-1: unknown), and the ranks of each node in order.
  std::vector<int> node_of(n, -1);
  std::map<int, std::vector<size_t>> ranks_of;
  for (size_t i = 0; i < n; ++i) {
    hwloc_obj_t dev = gpu_bus_ids[i].empty() ? nullptr
                                             : hwloc_get_pcidev_by_busidstring(t, gpu_bus_ids[i].c_str());
    hwloc_obj_t anc = dev ? hwloc_get_non_io_ancestor_obj(t, dev) : nullptr;
    if (anc && anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset) &&
        hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE) > 1)
      node_of[i] = hwloc_bitmap_first(anc->nodeset);
    ranks_of[node_of[i]].push_back(i);
  }
  im->cpus.resize(n, nullptr);
  im->nodes.resize(n, nullptr);
  for (const auto& [node, ranks] : ranks_of) {
    hwloc_obj_t numa = node >= 0 ? hwloc_get_numanode_obj_by_os_index(t, static_cast<unsigned>(node)) : nullptr;
    hwloc_const_cpuset_t within = numa ? numa->cpuset : hwloc_topology_get_topology_cpuset(t);
    std::vector<hwloc_obj_t> cores;
    for (int c = 0, nc = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE); c < nc; ++c) {
      hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, static_cast<unsigned>(c));
      if (core && hwloc_bitmap_intersects(core->cpuset, within)) cores.push_back(core);
    }
    const size_t m = ranks.size();
    for (size_t j = 0; j < m; ++j) {
      const size_t i = ranks[j];
      hwloc_bitmap_t set = hwloc_bitmap_alloc();
      const size_t lo = j * cores.size() / m, hi = (j + 1) * cores.size() / m;
      std::string core_text;
      if (lo < hi) {
        for (size_t c = lo; c < hi; ++c) hwloc_bitmap_or(set, set, cores[c]->cpuset);
        core_text = "cores " + std::to_string(lo) + (hi - lo > 1 ? "-" + std::to_string(hi - 1) : "");
      } else {  // more ranks than cores: they share them all
        hwloc_bitmap_copy(set, within);
        core_text = "all " + std::to_string(cores.size()) + " cores (shared: more ranks than cores)";
      }
      im->cpus[i] = set;
      im->nodes[i] = hwloc_bitmap_alloc();
      if (numa) hwloc_bitmap_copy(im->nodes[i], numa->nodeset);
      im->text[i] = (numa ? "NUMA node " + std::to_string(node) + ", " : std::string("any NUMA node, ")) +
                    core_text + (numa ? " of its " : " of the machine's ") + std::to_string(cores.size()) +
                    " (PUs " + BitmapList(set) + ")";
    }
  }
  return RankBindings(std::move(im));
}

size_t RankBindings::size() const { return impl_->text.size(); }

std::string RankBindings::Describe(size_t rank) const {
  if (!impl_->why_none.empty() || rank >= impl_->cpus.size() || impl_->cpus[rank] == nullptr)
    return "unbound (" + (impl_->why_none.empty() ? std::string("no binding") : impl_->why_none) + ")";
  return impl_->text[rank];
}

std::string RankBindings::Bind(size_t rank) const {
  if (!impl_->why_none.empty() || rank >= impl_->cpus.size() || impl_->cpus[rank] == nullptr) return "";
  std::string warn;
  if (hwloc_set_cpubind(impl_->topo, impl_->cpus[rank], HWLOC_CPUBIND_PROCESS) != 0)
    warn += std::string("binding to PUs ") + BitmapList(impl_->cpus[rank]) + " was refused (" +
            std::strerror(errno) + "); ";
  if (!hwloc_bitmap_iszero(impl_->nodes[rank]) &&
      hwloc_set_membind(impl_->topo, impl_->nodes[rank], HWLOC_MEMBIND_BIND,
                        HWLOC_MEMBIND_PROCESS | HWLOC_MEMBIND_BYNODESET) != 0)
    warn += std::string("binding memory to NUMA node ") + BitmapList(impl_->nodes[rank]) + " was refused (" +
            std::strerror(errno) + "); ";
  if (!warn.empty()) warn = "warning: " + warn + "the rank runs where the OS puts it";
  return warn;
}

}  // namespace strata
