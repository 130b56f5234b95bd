#include "keel/resilience/supervisor.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "keel/ckpt/peer_client.h"
#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/resilience/build_id.h"
#include "keel/resilience/supervisor_internal.h"

namespace keel::resilience {
namespace internal {

void Say(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  std::printf("keel launch: %s\n", buf);
  std::fflush(stdout);
}

namespace {

// One host's health check, run through the launcher on that host.
HealthResult CheckHost(const JobLine& line, const std::string& host,
                       const std::vector<std::string>& command, double timeout_s,
                       const std::string& build) {
  HealthResult r;
  r.host = host;
  const double t0 = UnixNow();
  std::string out;
  int status = 0;
  const bool ended = RunCaptured(OnHostArgv(line, host, command), timeout_s, &out, &status);
  r.seconds = UnixNow() - t0;
  if (!ended) {
    r.problem = "did not answer within " + std::to_string(int(timeout_s)) + " s";
    return r;
  }
  // The report is the last line that parses as a JSON object (launchers may add their own).
  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  for (auto it = lines.rbegin(); it != lines.rend() && r.report.is_null(); ++it) {
    const auto j = nlohmann::json::parse(*it, nullptr, false);
    if (j.is_object() && j.contains("ok")) r.report = j;
  }
  if (r.report.is_null()) {
    const std::string last = lines.empty() ? "" : lines.back();
    r.problem =
        "health check failed (" + DescribeStatus(status) + ")" + (last.empty() ? "" : ": " + last);
    return r;
  }
  if (r.report.value("build", "") != build) {
    r.problem =
        "runs another keel build (" + r.report.value("build", "?") + ", here " + build + ")";
    return r;
  }
  for (const auto& p : r.report["problems"])
    r.problem += (r.problem.empty() ? "" : "; ") + p.get<std::string>();
  r.ok = r.report.value("ok", false) && r.problem.empty();
  return r;
}

}  // namespace

Supervisor::Supervisor(const SupervisorSpec& spec) : spec_(spec), hosts_(spec.hosts) {
  for (const Host& h : hosts_)
    if (!h.spare) ++want_hosts_;
  full_ranks_ = FitRanks(want_hosts_ * spec_.ranks_per_host, spec_.layout);
  // The first start uses every slot, as mpirun would: a layout that does not take them all is
  // the user's to fix (before anything is written), not a reason to start smaller.
  const int slots = want_hosts_ * spec_.ranks_per_host;
  if (full_ranks_ != slots)
    ThrowBadInput("launch: the layout does not take the " + std::to_string(slots) +
                  " ranks of the hosts (" + std::to_string(want_hosts_) + " x " +
                  std::to_string(spec_.ranks_per_host) + "): tp " +
                  std::to_string(spec_.layout.tp) + " x pp " + std::to_string(spec_.layout.pp) +
                  " x cp " + std::to_string(spec_.layout.cp) +
                  " must divide it and [train] batch_size " + std::to_string(spec_.layout.batch) +
                  " must split into micro-batches of " + std::to_string(spec_.layout.micro) +
                  " over the data-parallel ranks; change --np ([launch] ranks_per_host) or the "
                  "batch");
  lock_ = FolderLock::Acquire(spec_.run_dir, "keel launch");
  std::filesystem::create_directories(spec_.run_dir + "/logs");
  events_ = monitor::JsonlWriter(spec_.run_dir + "/events.jsonl");
  beat_dir_ = spec_.run_dir + "/heartbeat";
  std::filesystem::create_directories(beat_dir_);
  build_ = BuildIdentity();
}

std::vector<HealthResult> Supervisor::CheckHosts(const std::vector<std::string>& names) {
  JobLine line = Line(Placement{});
  std::vector<std::future<HealthResult>> futures;
  for (const std::string& n : names)
    futures.push_back(std::async(std::launch::async, CheckHost, line, n, spec_.health_command,
                                 spec_.policy.health_timeout_s, build_));
  std::vector<HealthResult> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

void Supervisor::HealthCheck(bool only_unhealthy) {
  std::vector<std::string> names;
  for (const Host& h : hosts_)
    if (!h.excluded && (!only_unhealthy || h.unhealthy)) names.push_back(h.name);
  for (const HealthResult& r : CheckHosts(names)) {
    Host& h = *std::find_if(hosts_.begin(), hosts_.end(),
                            [&](const Host& x) { return x.name == r.host; });
    nlohmann::json ev = {{"event", "health"},
                         {"host", r.host},
                         {"ok", r.ok},
                         {"seconds", r.seconds},
                         {"problem", r.problem}};
    if (r.report.contains("matmul_gflops")) ev["matmul_gflops"] = r.report["matmul_gflops"];
    Event(ev);
    if (r.ok) {
      if (h.unhealthy) Say("host %s is healthy again (%.1f s)", r.host.c_str(), r.seconds);
      h.unhealthy = false;
      continue;
    }
    if (!h.unhealthy) {
      Say("host %s failed its health check (%.1f s): %s; excluded", r.host.c_str(), r.seconds,
          r.problem.c_str());
      Event({{"event", "exclusion"}, {"host", r.host}, {"reason", r.problem}});
    }
    h.unhealthy = true;
    h.reason = r.problem;
  }
}

std::string Supervisor::History() const {
  std::string s;
  for (size_t i = 0; i < history_.size(); ++i)
    s += "  " + std::to_string(i + 1) + ". " + history_[i] + "\n";
  return s;
}

int Supervisor::Finish(int code, const std::string& outcome) {
  StopHolders();
  const Goodput g = Account(attempts_, wall_start_, UnixNow());
  nlohmann::json summary = g.ToJson();
  summary["outcome"] = outcome;
  summary["exit_code"] = code;
  summary["failures"] = history_;
  for (const Attempt& a : attempts_)
    summary["attempts"].push_back({{"spawn", a.spawn},
                                   {"loop_start", a.loop_start},
                                   {"last_step_end", a.last_step_end},
                                   {"end", a.end},
                                   {"start_step", a.start_step},
                                   {"end_step", a.end_step},
                                   {"outcome", a.outcome}});
  Event({{"event", "launch_end"}, {"outcome", outcome}, {"exit_code", code}, {"goodput", summary}});
  WriteFileAtomic(spec_.run_dir + "/goodput.json", summary.dump(2) + "\n");
  Say("%s", g.Text().c_str());
  return code;
}

int Supervisor::Run() {
  BecomeSubreaper();
  ::setenv("KEEL_HEARTBEAT_DIR", beat_dir_.c_str(), 1);
  ::setenv("KEEL_RUN_LOCK_HOLDER", lock_.holder().c_str(), 1);
  StopScope stop;
  Announce();
  for (int attempt = 1;; ++attempt) {
    std::optional<Start> s = StartJob(attempt);
    if (!s) return Finish(1, "no hosts");
    Watch w = WatchJob(*s, stop);
    const Ending e = Collect(*s, w);
    switch (Classify(w, e)) {
      case Verdict::kClean:
        if (const std::optional<int> code = EndClean(*s, w)) return *code;
        continue;  // stopped to regrow
      case Verdict::kStopped:
        return EndStopped(*s, w, e);
      case Verdict::kBadInput:
        return EndBadInput(*s, e);
      case Verdict::kFailure:
        RecordFailure(*s, w, Blame(*s, w, e));
        if (const std::optional<int> code = Restart(*s, stop)) return *code;
    }
  }
}

void Supervisor::Announce() {
  std::string names;
  for (const Host& h : hosts_)
    names += (names.empty() ? "" : ", ") + h.name + (h.spare ? " (spare)" : "");
  Say("%s launcher, hosts %s, %d rank(s) per host; run %s", LauncherName(spec_.launcher),
      names.c_str(), spec_.ranks_per_host, spec_.run_dir.c_str());
  Event({{"event", "launch_start"},
         {"launcher", LauncherName(spec_.launcher)},
         {"hosts", names},
         {"ranks_per_host", spec_.ranks_per_host}});
}

std::vector<std::string> Supervisor::TrainCommand(const Placement& place) const {
  std::vector<std::string> cmd = spec_.train_command;
  cmd.insert(cmd.end(), {"--resume", "auto"});
  const int full_dp = full_ranks_ / spec_.layout.model();
  if (place.dp != full_dp && spec_.set_dp)
    cmd.insert(cmd.end(), {"--set", "parallel.dp=" + std::to_string(place.dp)});
  if (spec_.set_micro)
    cmd.insert(cmd.end(),
               {"--set", "train.micro_batch_size=" + std::to_string(spec_.layout.micro)});
  return cmd;
}

ckpt::peer::Address Supervisor::HolderAddress(const std::string& host) const {
  // The local launcher's holder listens on loopback only.
  return {spec_.launcher == Launcher::kLocal ? "127.0.0.1" : host, spec_.holders.port};
}

void Supervisor::EnsureHolders(const Placement& place) {
  const HolderSpec& hs = spec_.holders;
  std::string list;
  std::vector<std::pair<std::string, ckpt::peer::Address>> started;
  for (const std::string& host : place.hosts) {
    const ckpt::peer::Address a = HolderAddress(host);
    list += (list.empty() ? "" : ",") + a.Name();
    auto& child = holders_[host];
    int status = 0;
    bool answers = false;
    std::string why = "ended";
    if (child && !child->Poll(&status)) {
      try {
        ckpt::peer::Client(a, 2).List("");
        answers = true;
      } catch (const Error&) {
        // Its launcher lives on while the holder is gone (a host that died under it): replaced.
        child->Signal(SIGKILL);
        why = "does not answer";
      }
    }
    if (answers) continue;
    if (child) {
      Say("the tier-0 holder on %s %s: starting a new one (what it held is gone)", host.c_str(),
          why.c_str());
      Event({{"event", "holder_lost"}, {"host", host}, {"why", why}});
    }
    char gb[32];
    std::snprintf(gb, sizeof gb, "%g", hs.memory_gb);
    std::vector<std::string> argv = {
        hs.keel, "holder", "--bind", a.host, "--port", std::to_string(hs.port), "--max-gb", gb};
    if (!hs.spill_dir.empty()) {
      std::string dir = hs.spill_dir;
      for (size_t at; (at = dir.find("{host}")) != std::string::npos;)
        dir.replace(at, 6, ShortHost(host));
      argv.insert(argv.end(), {"--spill", dir});
    }
    JobLine line = Line(place);
    std::erase(line.env, std::string("KEEL_PEER_HOLDERS"));  // not set yet, and not its business
    std::vector<std::string> run = OnHostArgv(line, host, argv);
    // A Slurm step holds its CPUs until it ends: the holder's must let the job's steps share them.
    if (spec_.launcher == Launcher::kSlurm) run.insert(run.begin() + 1, "--overlap");
    child = std::make_unique<Child>(run, spec_.run_dir + "/logs/holder_" + ShortHost(host) + ".log",
                                    /*echo=*/false);
    started.emplace_back(host, a);
  }
  // A holder that does not answer costs tier-0 copies (a copy fails on every rank while one of its
  // holders is missing), not the job: the ranks report them and the shared checkpoints go on.
  for (const auto& [host, a] : started) {
    std::string problem;
    for (double t0 = UnixNow();;) {
      try {
        ckpt::peer::Client(a, 1).List("");
        problem.clear();
        break;
      } catch (const Error& e) {
        problem = e.what();
      }
      int status = 0;
      if (holders_[host]->Poll(&status) || UnixNow() - t0 > spec_.policy.health_timeout_s) break;
      ::usleep(100000);
    }
    if (!problem.empty())
      Say("the tier-0 holder on %s does not answer: %s", host.c_str(), problem.c_str());
    Event({{"event", "holder_start"},
           {"host", host},
           {"address", a.Name()},
           {"ok", problem.empty()}});
  }
  ::setenv("KEEL_PEER_HOLDERS", list.c_str(), 1);
}

void Supervisor::StopHolders() {
  // Asked rather than killed: a holder on another host answers to a launcher daemon that may take
  // a while to notice that its launcher is gone, and the next run may want the port.
  for (auto& [host, child] : holders_) {
    int status = 0;
    if (!child || child->Poll(&status)) continue;
    try {
      ckpt::peer::Client(HolderAddress(host), 2).Quit();
    } catch (const Error&) {
    }
    child->Wait(2, &status);
  }
  holders_.clear();
}

std::optional<Supervisor::Start> Supervisor::StartJob(int attempt) {
  HealthCheck(false);
  Start s;
  s.attempt = attempt;
  s.place = Place(hosts_, want_hosts_, spec_.ranks_per_host, spec_.layout);
  const Placement& place = s.place;
  if (place.ranks == 0) {
    Say("no usable host is left for the layout (tp %d x pp %d x cp %d); giving up after %zu "
        "failure(s):\n%s",
        spec_.layout.tp, spec_.layout.pp, spec_.layout.cp, history_.size(), History().c_str());
    return std::nullopt;
  }
  const std::vector<std::string> cmd = TrainCommand(place);
  if (spec_.holders.on) EnsureHolders(place);
  std::string where;
  for (const auto& h : place.hosts) where += (where.empty() ? "" : ", ") + h;
  Say("start %d: %d rank(s) on %s, dp %d%s%s", attempt, place.ranks, where.c_str(), place.dp,
      place.ranks < full_ranks_ ? " (shrunk: the global batch is kept by accumulation)" : "",
      place.spares_used.empty() ? "" : " (with spare hosts)");
  nlohmann::json start_ev = {{"event", "job_start"}, {"attempt", attempt},
                             {"ranks", place.ranks}, {"dp", place.dp},
                             {"hosts", place.hosts}, {"spares_used", place.spares_used}};
  Event(start_ev);
  ClearHeartbeats(beat_dir_);
  s.a.spawn = UnixNow();
  if (!attempts_.empty()) attempts_.back().next_spawn = s.a.spawn;
  char log[64];
  std::snprintf(log, sizeof log, "/logs/launch_%03d.log", attempt);
  s.job = std::make_unique<Child>(JobArgv(Line(place), cmd), spec_.run_dir + log, /*echo=*/true);
  return s;
}

Supervisor::Watch Supervisor::WatchJob(Start& s, const StopScope& stop) {
  Watch w;
  w.regrow_checked = UnixNow();
  while (!s.job->Poll(&w.status)) {
    ::usleep(200000);
    const double now = UnixNow();
    OnStopRequest(s, w, stop, now);
    CheckHeartbeats(s, w, now);
    CheckLauncherLingers(s, w, now);
    CheckRegrow(s, w, now);
  }
  return w;
}

void Supervisor::OnStopRequest(Start& s, Watch& w, const StopScope& stop, double now) {
  if (stop.requested() && !w.user_stop) {
    w.user_stop = true;
    Say("stop requested: the job saves a checkpoint and exits (up to %.0f s)",
        spec_.policy.stop_grace_s);
    // Already stopping to regrow, the job is saving: a second SIGUSR2 would make its ranks stop
    // at once, mid-save. It is not signalled again, and not restarted after.
    w.regrow = false;
    if (w.stop_sent == 0) {
      w.stop_sent = now;
      ::kill(s.job->pid(), SIGUSR2);  // mpirun forwards it to every rank
    }
  }
  if (w.stop_sent > 0 && now - w.stop_sent > spec_.policy.stop_grace_s && !w.killed) {
    Say("the job did not stop within stop_grace_s; killing it");
    s.job->Signal(SIGKILL);
    w.killed = true;
  }
}

// A rank whose heartbeat is older than heartbeat_timeout_s (or that never sent one) stops the
// job; rank 0's first beat in the training loop is the "resumed" event.
void Supervisor::CheckHeartbeats(Start& s, Watch& w, double now) {
  if (w.silent_rank >= 0 || w.stop_sent != 0 || spec_.policy.heartbeat_timeout_s <= 0) return;
  const double limit = spec_.policy.heartbeat_timeout_s;
  const std::vector<Heartbeat> beats = ReadHeartbeats(beat_dir_);
  std::map<int, const Heartbeat*> by_rank;
  for (const auto& b : beats) by_rank[b.rank] = &b;
  if (!w.resumed && by_rank.count(0) && by_rank[0]->start_step >= 0) {
    w.resumed = true;
    Event({{"event", "resumed"},
           {"attempt", s.attempt},
           {"step", by_rank[0]->start_step},
           {"seconds", by_rank[0]->loop_start - s.a.spawn}});
  }
  for (int r = 0; r < s.place.ranks && w.silent_rank < 0; ++r) {
    auto it = by_rank.find(r);
    if (it == by_rank.end()) {
      if (now - s.a.spawn > limit) {
        w.silent_rank = r;
        w.silent = "rank " + std::to_string(r) + " never sent a heartbeat in " +
                   std::to_string(int(limit)) + " s";
      }
    } else if (!it->second->exited && now - it->second->time > limit) {
      const Heartbeat& b = *it->second;
      w.silent_rank = r;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "rank %d on %s (pid %lld) is silent: last heartbeat %.0f s ago, at "
                    "step %d, phase %s",
                    r, b.host.c_str(), (long long)b.pid, now - b.time, b.step, b.phase.c_str());
      w.silent = buf;
    }
  }
  if (w.silent_rank >= 0) {
    Say("%s; stopping the job", w.silent.c_str());
    s.job->Signal(SIGTERM);
    if (!s.job->Wait(10, &w.status)) s.job->Signal(SIGKILL);
    w.killed = true;
  }
}

// Every rank has said how it ended, but the launcher still waits (mpirun for a daemon on a host
// it can no longer reach): end it.
void Supervisor::CheckLauncherLingers(Start& s, Watch& w, double now) {
  if (w.killed || s.place.ranks <= 0) return;
  const std::vector<Heartbeat> beats = ReadHeartbeats(beat_dir_);
  const bool all_out =
      int(beats.size()) == s.place.ranks &&
      std::all_of(beats.begin(), beats.end(), [](const Heartbeat& b) { return b.exited; });
  double last_exit = 0;
  for (const auto& b : beats) last_exit = std::max(last_exit, b.time);
  if (all_out && now - last_exit > kLauncherGraceS) {
    Say("every rank has exited but the launcher has not after %.0f s; ending it", kLauncherGraceS);
    s.job->Signal(SIGTERM);
    if (!s.job->Wait(5, &w.status)) s.job->Signal(SIGKILL);
    w.killed = true;
    w.ended_by_ranks = true;
  }
}

// While shrunk, see now and then whether an excluded host is back; if so, stop the job (it
// saves) and start again on more ranks.
void Supervisor::CheckRegrow(Start& s, Watch& w, double now) {
  if (spec_.policy.regrow_minutes > 0 && w.stop_sent == 0 && s.place.ranks < full_ranks_ &&
      !w.regrow_check && now - w.regrow_checked > 60 * spec_.policy.regrow_minutes) {
    std::vector<std::string> out;
    for (const Host& h : hosts_)
      if (h.unhealthy && !h.excluded) out.push_back(h.name);
    w.regrow_check = std::async(std::launch::async, [this, out] { return CheckHosts(out); });
  }
  if (w.regrow_check &&
      w.regrow_check->wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    w.regrow_checked = now;
    for (const HealthResult& r : w.regrow_check->get())
      if (r.ok && w.stop_sent == 0) {
        Say("host %s is back: stopping the job to restart it on more ranks", r.host.c_str());
        Event({{"event", "regrow"}, {"host", r.host}});
        w.regrow = true;
        w.stop_sent = now;
        ::kill(s.job->pid(), SIGUSR2);
      }
    w.regrow_check.reset();
  }
}

}  // namespace internal

int Supervise(const SupervisorSpec& spec) { return internal::Supervisor(spec).Run(); }

}  // namespace keel::resilience
