#include "keel/parallel/groups.h"

#include <string>

namespace keel::parallel {

Groups MakeGroups(Comm& world, const Layout& d, bool nccl) {
  Groups g;
  g.at = Coords(d, world.rank());
  const RankCoords& c = g.at;
  // Each group is named by its kind and color, the same on all its ranks (progress reports).
  auto split = [&](const char* kind, int color, int key) {
    std::unique_ptr<Comm> group = world.Split(color, key);
    group->set_label(std::string(kind) + "#" + std::to_string(color));
    return group;
  };
  const int replica = ReplicaOf(d, c);
  g.tp = split("tp", c.pp * d.replicas() + replica, c.tp);
  g.dp = split("dp", c.pp * d.tp + c.tp, replica);
  g.pp = split("pp", replica * d.tp + c.tp, c.pp);
  // Colors past every pipeline's put each middle stage in a group of its own.
  const bool end = c.pp == 0 || c.pp == d.pp - 1;
  g.tied = split("tied", end ? replica * d.tp + c.tp : d.world() + world.rank(), c.pp);
  g.cp = split("cp", (c.pp * d.dp + c.dp) * d.tp + c.tp, c.cp);
  if (nccl) {  // created in one order on every rank
    g.nccl_dp = MakeNcclComm(*g.dp);
    g.nccl_pp = MakeNcclComm(*g.pp);
    g.nccl_tied = MakeNcclComm(*g.tied);
  }
  return g;
}

StepGroups Groups::ForStep() const {
  auto pick = [](const std::unique_ptr<Comm>& nccl, const std::unique_ptr<Comm>& split) {
    return nccl ? nccl.get() : split.get();
  };
  return {pick(nccl_dp, dp), pick(nccl_pp, pp), pick(nccl_tied, tied), tp.get(), cp.get()};
}

}  // namespace keel::parallel
