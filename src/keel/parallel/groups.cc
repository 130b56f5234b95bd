#include "keel/parallel/groups.h"

namespace keel::parallel {

Groups MakeGroups(Comm& world, const ParallelDims& d) {
  Groups g;
  g.at = Coords(d, world.rank());
  const RankCoords& c = g.at;
  g.tp = world.Split(c.pp * d.dp + c.dp, c.tp);
  g.dp = world.Split(c.pp * d.tp + c.tp, c.dp);
  g.pp = world.Split(c.dp * d.tp + c.tp, c.pp);
  // Colors past every pipeline's put each middle stage in a group of its own.
  const bool end = c.pp == 0 || c.pp == d.pp - 1;
  g.tied = world.Split(end ? c.dp * d.tp + c.tp : d.world() + world.rank(), c.pp);
  return g;
}

}  // namespace keel::parallel
