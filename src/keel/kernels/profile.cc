#include "keel/kernels/profile.h"

namespace keel::kernels {
namespace {
bool g_enabled = false;
std::map<std::string, double>& Totals() {
  static std::map<std::string, double> t;
  return t;
}
}  // namespace

void ProfileReset(bool enable) {
  g_enabled = enable;
  Totals().clear();
}
bool ProfileEnabled() { return g_enabled; }
void ProfileAdd(const char* name, double ms) { Totals()[name] += ms; }

std::map<std::string, double> ProfileReport(int steps) {
  std::map<std::string, double> r;
  for (auto& [k, v] : Totals()) r[k] = v / steps;
  return r;
}

}  // namespace keel::kernels
