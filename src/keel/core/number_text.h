// Numbers as the shortest decimal text that reads back as the same value (0.3, not 0.300000012 or
// 0.30000001192092896): for messages, configs written back, and JSON settings.
#pragma once

#include <string>

namespace keel {

// A float's shortest text that reads back (as a double, then rounded to float) to `v`.
std::string ShortestDecimal(float v);
std::string ShortestDecimal(double v);

}  // namespace keel
