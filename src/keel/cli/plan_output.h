// The output of `keel plan` (plan_output.cc): tables and explanations for people, JSON for
// machines. plan.cc reads the request; this prints the answer.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "keel/plan/search.h"

namespace keel::cli::plan_output {

nlohmann::json EstimateJson(const plan::Estimate& e);
nlohmann::json CheckpointJson(const plan::CheckpointPlan& c);

void PrintHeader(const plan::Job& j);
// The best `top` layouts that fit, the closest rejected one, and the checkpoint and cost summary
// of the best; throws bad input when none fits.
void PrintTable(const plan::Job& j, const std::vector<plan::Estimate>& all, int top);
// One layout's memory, communication, time, checkpoint and cost arithmetic, step by step.
void PrintExplain(const plan::Job& j, const plan::Estimate& e);

}  // namespace keel::cli::plan_output
