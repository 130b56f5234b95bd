#include "keel/resilience/hosts.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "keel/core/error.h"

namespace keel::resilience {

std::vector<Host> ReadHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) ThrowBadInput("hostfile " + path + ": cannot read it");
  std::vector<Host> hosts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    const std::string where = "hostfile " + path + ":" + std::to_string(n);
    for (std::string w; words >> w;) {
      const size_t eq = w.find('=');
      const std::string key = w.substr(0, eq);
      if (key == "max_slots") continue;
      if (key != "slots" || eq == std::string::npos)
        ThrowBadInput(where + ": \"" + w + "\": expected slots=N");
      try {
        size_t used = 0;
        h.slots = std::stoi(w.substr(eq + 1), &used);
        if (used != w.size() - eq - 1 || h.slots <= 0) throw std::invalid_argument("");
      } catch (const std::exception&) {
        ThrowBadInput(where + ": \"" + w + "\": expected slots=N with N > 0");
      }
    }
    for (const Host& o : hosts)
      if (o.name == h.name) ThrowBadInput(where + ": host " + h.name + " is listed twice");
    hosts.push_back(h);
  }
  if (hosts.empty()) ThrowBadInput("hostfile " + path + ": lists no host");
  return hosts;
}

void MarkSpares(std::vector<Host>& hosts, const std::string& spares) {
  std::istringstream in(spares);
  for (std::string name; std::getline(in, name, ',');) {
    if (name.empty()) continue;
    bool found = false;
    for (Host& h : hosts)
      if (h.name == name) found = h.spare = true;
    if (!found) ThrowBadInput("[launch] spares: host \"" + name + "\" is not among the hosts");
  }
}

int FitRanks(int available, const LayoutRule& rule) {
  const int model = rule.model();
  for (int r = available - available % model; r > 0; r -= model) {
    const int dp = r / model;
    const int per = dp * (rule.micro > 0 ? rule.micro : 1);
    if (rule.batch % per == 0) return r;
  }
  return 0;
}

Placement Place(const std::vector<Host>& hosts, int want_hosts, int ranks_per_host,
                const LayoutRule& rule) {
  Placement p;
  p.ranks_per_host = ranks_per_host;
  for (bool spares : {false, true})
    for (const Host& h : hosts)
      if (h.spare == spares && !h.excluded && !h.unhealthy && int(p.hosts.size()) < want_hosts)
        p.hosts.push_back(h.name);
  p.ranks = FitRanks(int(p.hosts.size()) * ranks_per_host, rule);
  p.dp = p.ranks / rule.model();
  // Fewer ranks than the hosts hold: drop the hosts the ranks do not reach.
  const size_t need = size_t((p.ranks + ranks_per_host - 1) / ranks_per_host);
  if (p.hosts.size() > need) p.hosts.resize(need);
  // Keep hostfile order: the rank layout (tp innermost) is then the same on every restart.
  std::vector<std::string> ordered;
  for (const Host& h : hosts)
    for (const std::string& n : p.hosts)
      if (n == h.name) ordered.push_back(n);
  p.hosts = ordered;
  for (const Host& h : hosts)
    if (h.spare && std::find(p.hosts.begin(), p.hosts.end(), h.name) != p.hosts.end())
      p.spares_used.push_back(h.name);
  return p;
}

}  // namespace keel::resilience
