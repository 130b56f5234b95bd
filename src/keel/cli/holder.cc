// keel holder: the tier-0 checkpoint holder of one host (ckpt/peer_holder.h). keel launch starts
// one per host when [checkpoint] peer_every is set; it is a verb so that the launcher can start
// it wherever it starts ranks (mpirun, srun, the local machine).
#include <sys/prctl.h>

#include <atomic>
#include <csignal>
#include <cstdio>

#include "keel/ckpt/peer_holder.h"
#include "keel/cli/verbs.h"
#include "keel/core/error.h"

namespace keel::cli {

void RegisterHolder(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "holder", "Keep tier-0 checkpoint copies of this host's and a buddy host's ranks in memory");
  static ckpt::peer::HolderOptions o;
  static double max_gb = 0;
  cmd->add_option("--bind", o.bind, "address or host name to listen on")->capture_default_str();
  cmd->add_option("--port", o.port, "TCP port")->capture_default_str();
  cmd->add_option("--max-gb", max_gb, "refuse copies past this many GB held (0: no limit)");
  cmd->add_option("--spill", o.spill_dir,
                  "also keep every copy in this folder on the host's disk, and start with what it "
                  "holds (a holder restarted on a host that survived)");
  cmd->footer(
      "\nkeel launch starts one per host when [checkpoint] peer_every is set ([launch] "
      "holder_port,\nholder_memory_gb). It outlives the training job's processes, not the host: "
      "a restart loads\neach rank's part from its own host's holder or from the buddy's (the next "
      "host's), else from\nthe shared checkpoint. It keeps the newest two copies of each rank's "
      "files, and stops on\nSIGTERM or when the process that started it ends.\n\nExample:\n"
      "  keel holder --bind node2 --port 29790 --max-gb 64 --spill /local/nvme/keel-holder\n");
  cmd->callback([] {
    if (o.port < 0 || o.port > 65535)
      ThrowBadInput("keel holder --port: expected 1 to 65535 (0: any free port), got " +
                    std::to_string(o.port));
    if (!(max_gb >= 0 && max_gb < 1e9))
      ThrowBadInput("keel holder --max-gb: expected a number >= 0");
    o.max_bytes = uint64_t(max_gb * 1e9);
    // Started by mpirun's daemon or by keel launch itself: it must not outlive them.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    std::atomic<bool> stop{false};
    ckpt::peer::RunHolder(o, stop, [](int port) {
      std::printf("keel holder: listening on %s:%d\n", o.bind.c_str(), port);
      std::fflush(stdout);
    });
  });
}

}  // namespace keel::cli
