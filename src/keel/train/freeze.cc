#include "keel/train/freeze.h"

#include <fnmatch.h>

#include <sstream>

#include "keel/core/error.h"

namespace keel::train {

std::vector<bool> FrozenParams(const std::string& patterns, const model::ParamLayout& layout) {
  const auto& params = layout.params();
  std::vector<bool> frozen(params.size(), false);
  std::stringstream in(patterns);
  for (std::string pat; std::getline(in, pat, ',');) {
    pat.erase(0, pat.find_first_not_of(' '));
    pat.erase(pat.find_last_not_of(' ') + 1);
    if (pat.empty()) continue;
    bool any = false;
    for (size_t i = 0; i < params.size(); ++i)
      if (fnmatch(pat.c_str(), params[i].name.c_str(), 0) == 0) frozen[i] = any = true;
    if (!any)
      ThrowBadInput("[optim] freeze: \"" + pat + "\" matches no parameter (names look like " +
                    "wte.weight, h.0.attn.c_attn.weight, ln_f.bias)");
  }
  // LoRA trains its adapters only.
  bool adapters = false;
  for (const auto& p : params) adapters = adapters || model::IsLoraParam(p.name);
  if (adapters)
    for (size_t i = 0; i < params.size(); ++i)
      if (!model::IsLoraParam(params[i].name)) frozen[i] = true;
  return frozen;
}

}  // namespace keel::train
