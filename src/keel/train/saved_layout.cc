#include "keel/train/saved_layout.h"

namespace keel::train {

nlohmann::json LayoutJson(const parallel::ParallelDims& dims) {
  nlohmann::json l = {{"dp", dims.dp}, {"tp", dims.tp}, {"pp", dims.pp}, {"zero", dims.zero}};
  if (dims.cp > 1) l["cp"] = dims.cp;
  return l;
}

int RanksThatSaved(const nlohmann::json& state) {
  const nlohmann::json l = state.value("layout", nlohmann::json::object());
  return l.value("dp", 1) * l.value("tp", 1) * l.value("pp", 1) * l.value("cp", 1);
}

int ReplicasThatSaved(const nlohmann::json& state) {
  return state.value("layout", nlohmann::json::object()).value("dp", 1);
}

}  // namespace keel::train
