// The hosts a supervised job may run on, what happened to each, and where the next start goes:
// excluded hosts stay out, spares replace them, and with too few hosts the job shrinks its
// data-parallel degree (tp x pp fixed; the trainer keeps the global batch by accumulating more
// micro-batches, and resharding keeps the data position exact).
#pragma once

#include <string>
#include <vector>

namespace keel::resilience {

struct Host {
  std::string name;
  int slots = 1;
  bool spare = false;      // held back until an active host is lost
  int failures = 0;        // failures of this host's ranks
  bool excluded = false;   // for good: failed host_failures times
  bool unhealthy = false;  // failed its last health check (checked again later)
  std::string reason;      // why it is out, for messages
};

// An OpenMPI hostfile: "name [slots=N] [max_slots=N]" per line, '#' starts a comment. Throws
// keel::Error (bad input) naming the file and line.
std::vector<Host> ReadHostfile(const std::string& path);
// Marks the hosts named in `spares` ("h7,h8") as spares; throws (bad input) for a name that is
// not among `hosts`.
void MarkSpares(std::vector<Host>& hosts, const std::string& spares);

// What the layout needs of a rank count: tp x pp must divide it, and the global batch must split
// over dp x micro-batch.
struct LayoutRule {
  int tp = 1, pp = 1;
  int batch = 1;
  int micro = 0;  // per-rank micro-batch; 0: none fixed (then the batch must split over dp)
  int cp = 1;
  int model() const { return tp * pp * cp; }  // the ranks of one data-parallel replica
};
// The largest rank count <= `available` that the layout takes; 0 if none.
int FitRanks(int available, const LayoutRule& rule);

struct Placement {
  std::vector<std::string> hosts;  // in hostfile order
  int ranks_per_host = 1;
  int ranks = 0;  // 0: no start possible
  int dp = 0;
  std::vector<std::string> spares_used;
};
// Where the next start goes: usable active hosts first, then usable spares, up to `want_hosts`
// hosts of `ranks_per_host` ranks; then as many ranks as the layout takes.
Placement Place(const std::vector<Host>& hosts, int want_hosts, int ranks_per_host,
                const LayoutRule& rule);

}  // namespace keel::resilience
