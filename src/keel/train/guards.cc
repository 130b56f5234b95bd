#include "keel/train/guards.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "keel/core/error.h"
#include "keel/core/file_util.h"
#include "keel/core/host.h"
#include "keel/core/log.h"
#include "keel/parallel/comm_wait.h"
#include "keel/resilience/heartbeat.h"

namespace keel::train {

std::vector<std::string> GatherHosts(parallel::Comm& comm) {
  constexpr size_t kFloats = 16;  // 64 bytes of name, carried as raw float bits
  float mine[kFloats] = {};
  const std::string name = HostName();
  // host: a name, not model state; at most 63 bytes, so that it ends in a zero
  std::memcpy(mine, name.data(), std::min(name.size(), sizeof mine - 1));
  std::vector<float> all(kFloats * size_t(comm.size()));
  parallel::WaitOrLostDefault(*comm.AllGatherAsync(mine, all.data(), kFloats),
                              "all-gather of host names");
  std::vector<std::string> hosts;
  for (int r = 0; r < comm.size(); ++r) {
    char h[65] = {};
    std::memcpy(h, all.data() + kFloats * size_t(r), 64);  // host: a name
    hosts.emplace_back(h);
  }
  return hosts;
}

std::vector<double> GatherPerRank(parallel::Comm& comm, double mine) {
  std::vector<double> v(size_t(comm.size()), -1.0);
  v[size_t(comm.rank())] = mine;
  comm.AllReduceMax(v.data(), v.size());
  return v;
}

bool CanCompareReplicas(TrainStep& step, int zero) {
  return zero == 0 || (zero <= 2 && step.store().bytes().working > 0);
}

// The xxh3 of `bytes` of the backend's memory at `p` (on a GPU, through a host copy).
uint64_t HashState(const kernels::Backend& be, const void* p, size_t bytes) {
  if (be.host_visible()) return resilience::HashBytes(p, bytes);
  std::vector<uint8_t> host(bytes);
  be.ToHost(host.data(), p, bytes);
  return resilience::HashBytes(host.data(), bytes);
}

uint64_t ReplicaHash(TrainStep& step, int zero) {
  optim::ParamStore& st = step.store();
  if (zero == 0) {
    // An offload tier's master in pieces: the hash of their hashes (one piece in memory).
    std::vector<uint64_t> parts;
    st.VisitState(optim::ParamStore::Kind::kMaster, false, [&](void* p, size_t, size_t n) {
      parts.push_back(HashState(st.backend(), p, DTypeSize(st.master_dtype()) * n));
    });
    if (parts.size() == 1) return parts[0];
    return resilience::HashBytes(parts.data(), 8 * parts.size());
  }
  return HashState(st.backend(), st.working(), st.bytes().working);
}

uint64_t GradHash(TrainStep& step) {
  // The reduced ones: a LoRA layout's frozen-norm scratch after them is each rank's own.
  const size_t n = std::min(step.store().grads_size(), step.layout().grad_trained());
  return HashState(step.store().backend(), step.store().grads(),
                   DTypeSize(step.store().grad_dtype()) * n);
}

resilience::Disagreement CompareReplicas(parallel::Comm& dp, uint64_t mine) {
  // Four 16-bit pieces per rank: each exact in a double, gathered by a max over the group.
  std::vector<double> v(4 * size_t(dp.size()), 0.0);
  for (int i = 0; i < 4; ++i) v[4 * size_t(dp.rank()) + i] = double((mine >> (16 * i)) & 0xffff);
  dp.AllReduceMax(v.data(), v.size());
  std::vector<uint64_t> hashes(size_t(dp.size()), 0);
  for (size_t r = 0; r < hashes.size(); ++r)
    for (int i = 0; i < 4; ++i) hashes[r] |= uint64_t(v[4 * r + i]) << (16 * i);
  return resilience::FindDisagreement(hashes);
}

void RepairReplicas(TrainStep& step, parallel::Comm& dp, int zero, int from) {
  optim::ParamStore& st = step.store();
  if (zero == 0) {
    using Kind = optim::ParamStore::Kind;
    for (Kind k : {Kind::kMaster, Kind::kM, Kind::kV})
      st.VisitState(k, /*write=*/true, [&](void* p, size_t, size_t n) {
        dp.Broadcast(p, DTypeSize(st.state_dtype(k)) * n, from);
      });
  } else if (!st.has_master() && zero <= 2) {
    // The bf16 copy is each slice's only copy: the majority's whole copy, not a re-gather of the
    // slices (which would spread a corrupted one).
    dp.Broadcast(st.working(), st.bytes().working, from);
  }
  // The working weights again, from the (repaired) master; without one, the biases from them.
  step.strategy().PublishWeights();
}

StepJudge::StepJudge(const ResilienceSection& rs)
    : rs_(rs),
      loss_("loss", {rs.spike_window, rs.spike_min_steps, rs.spike_z, rs.spike_ratio}),
      norm_("gradient norm",
            {rs.spike_window, rs.spike_min_steps, rs.spike_z, rs.norm_spike_ratio}) {}

StepJudge::Verdict StepJudge::Judge(double loss, double norm) {
  Verdict v;
  v.nonfinite = !std::isfinite(loss) || !std::isfinite(norm);
  if (v.nonfinite) {
    ++skipped_steps_;
    v.in_a_row = ++skips_in_row_;
    if (skips_in_row_ >= rs_.max_skips)
      v.rollback =
          std::to_string(skips_in_row_) + " non-finite steps in a row ([resilience] max_skips)";
    return v;
  }
  skips_in_row_ = 0;
  v.spike = loss_.Check(loss);
  if (!v.spike && rs_.norm_spike_ratio > 0) v.spike = norm_.Check(norm);
  if (v.spike && rs_.rollback) v.rollback = v.spike;
  return v;
}

void StepJudge::Applied(double loss, double norm) {
  loss_.Add(loss);
  norm_.Add(norm);
}

nlohmann::json StepJudge::ToJson() const {
  return {{"loss_window", loss_.ToJson()},
          {"norm_window", norm_.ToJson()},
          {"skips_in_row", skips_in_row_},
          {"skipped_steps", skipped_steps_}};
}

void StepJudge::FromJson(const nlohmann::json& j) {
  loss_.FromJson(j.value("loss_window", nlohmann::json::array()));
  norm_.FromJson(j.value("norm_window", nlohmann::json::array()));
  skips_in_row_ = j.value("skips_in_row", 0);
  skipped_steps_ = j.value("skipped_steps", 0);
}

std::vector<double> CheckStragglers(resilience::StragglerTracker& tracker, parallel::Comm& world,
                                    double compute_ms, int group, int step_done,
                                    const ResilienceSection& rs,
                                    const std::vector<std::string>& hosts,
                                    monitor::JsonlWriter* events,
                                    const std::function<void()>& blame_self,
                                    std::string* named_line) {
  if (rs.straggler_every <= 0 || world.size() < 2 || step_done % rs.straggler_every != 0) return {};
  std::vector<int> groups;
  for (double g : GatherPerRank(world, double(group))) groups.push_back(int(g));
  const std::vector<int> named = tracker.Update(GatherPerRank(world, compute_ms), groups);
  for (int r : named) {
    const double score = tracker.scores()[size_t(r)];
    const std::string line =
        "straggler: rank " + std::to_string(r) + " on " + hosts[size_t(r)] + " computes " +
        std::to_string(score).substr(0, 4) + "x as long as the median of its peers (" +
        std::to_string(rs.straggler_checks) + " checks in a row, [resilience] " +
        "straggler_ratio = " + std::to_string(rs.straggler_ratio).substr(0, 4) + ")";
    if (named_line && named_line->empty())
      *named_line = "step " + std::to_string(step_done) + ": " + line;
    if (events) {
      Log("keel: step %d: %s", step_done, line.c_str());
      events->Write({{"event", "straggler"},
                     {"step", step_done},
                     {"rank", r},
                     {"host", hosts[size_t(r)]},
                     {"score", score}});
    }
    if (!rs.straggler_fails) continue;
    if (world.rank() == r) blame_self();
    throw Error(ExitCode::kTempFail,
                line +
                    "; exiting 75 ([resilience] straggler_fails) so that keel launch restarts "
                    "without the host",
                /*quiet=*/world.rank() != r);
  }
  return tracker.scores();
}

void CheckReplicas(const ReplicaCheck& c, int step_done, const std::function<void()>& rerun,
                   const std::function<void()>& blame_self) {
  std::vector<int> first_suspects;
  for (int attempt = 0;; ++attempt) {
    const char* part = "weights";
    resilience::Disagreement dis = CompareReplicas(c.dp, ReplicaHash(c.step, c.zero));
    if (dis.suspects.empty() && c.zero == 0) {
      part = "reduced gradients";
      dis = CompareReplicas(c.dp, GradHash(c.step));
    }
    std::vector<int> suspects;
    std::string named;
    for (int d : dis.suspects) {
      const int w = int(c.dp_world_ranks[size_t(d)]);
      suspects.push_back(w);
      named +=
          (named.empty() ? "rank " : ", rank ") + std::to_string(w) + " on " + c.hosts[size_t(w)];
    }
    if (suspects.empty()) {
      if (attempt > 0 && c.events) {
        Log("keel: step %d: the replicas agree after the repair and re-run: transient", step_done);
        c.events->Write({{"event", "sdc"},
                         {"step", step_done},
                         {"ranks", first_suspects},
                         {"class", "transient"}});
      }
      return;
    }
    if (attempt == 0) first_suspects = suspects;
    const std::string what =
        "silent data corruption at step " + std::to_string(step_done) + ": " + named +
        (dis.majority ? std::string(" holds ") + part +
                            " that differ from the majority of its data-parallel replicas"
                      : ": the replicas disagree and no majority tells which is wrong");
    if (c.events)
      c.events->Write({{"event", "sdc"},
                       {"step", step_done},
                       {"ranks", suspects},
                       {"majority", dis.majority},
                       {"part", part},
                       {"class", attempt == 0 ? "detected" : "persistent"}});
    if (attempt > 0 || !dis.majority) {
      const bool mine = std::find(suspects.begin(), suspects.end(), c.world_rank) != suspects.end();
      if (mine && dis.majority) blame_self();
      throw Error(
          ExitCode::kTempFail,
          what + (attempt > 0 ? ", again after a repair and a re-run: persistent" : "") +
              (dis.majority ? "; exiting 75 so that keel launch restarts and charges the host"
                            : "; exiting 75 so that keel launch restarts from the last checkpoint"),
          /*quiet=*/!c.events && !mine);
    }
    if (c.events)
      Log("keel: %s; repairing from the majority and re-running the step", what.c_str());
    int from = 0;
    while (std::find(dis.suspects.begin(), dis.suspects.end(), from) != dis.suspects.end()) ++from;
    RepairReplicas(c.step, c.dp, c.zero, from);
    rerun();
  }
}

void FlipBit(TrainStep& step, const resilience::Fault& f, int rank) {
  const model::ParamInfo& p = step.layout().Find(f.param);
  optim::ParamStore& st = step.store();
  // A compact (LoRA) state's master holds the adapters alone, packed as their gradients are.
  if (st.compact() && !model::IsLoraParam(p.name)) {
    Log("keel: injected fault: %s is frozen (no master copy); nothing flipped", f.param.c_str());
    return;
  }
  const size_t at = (st.compact() ? p.grad_offset : p.offset) + std::min(f.index, p.numel - 1);
  if (at < st.state_lo() || at >= st.state_hi()) return;  // another rank's shard
  // A bf16 weight without a master: fp32's bit b >= 16 is its bit b - 16; a lower one, which
  // bf16 does not have, flips its bit b instead.
  const size_t eb = DTypeSize(st.master_dtype());
  const int bit = eb == 4 || f.bit < 16 ? f.bit : f.bit - 16;
  uint32_t bits = 0;
  st.ReadState(optim::ParamStore::Kind::kMaster, at - st.state_lo(), 1, &bits);
  bits ^= 1u << bit;
  st.WriteState(optim::ParamStore::Kind::kMaster, at - st.state_lo(), 1, &bits);
  Log("keel: injected fault: rank %d flipped bit %d of %s[%zu]%s", rank, bit, f.param.c_str(),
      std::min(f.index, p.numel - 1), eb == 4 ? "" : " (bf16, no master)");
}

std::optional<std::string> SharedRollbackFile(parallel::Comm& comm, const std::string& path) {
  // One status byte ahead of the text: '-' no file, 'F' the file, 'E' why rank 0 could not read it.
  std::string msg = "-";
  if (comm.rank() == 0) {
    try {
      std::error_code ec;
      if (std::filesystem::exists(path, ec) || ec) msg = "F" + ReadWholeFile(path);
    } catch (const std::exception& e) {
      msg = std::string("E") + e.what();
    }
  }
  comm.BroadcastString(msg, 0);
  if (msg[0] == 'E') ThrowBadInput(msg.substr(1));
  if (msg[0] == '-') return std::nullopt;
  return msg.substr(1);
}

RollbackLog::RollbackLog(std::string path, const std::optional<std::string>& text,
                         std::map<int, int> configured)
    : path_(std::move(path)), configured_(std::move(configured)) {
  if (!text) return;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("skips") || !j["skips"].is_object())
    ThrowBadInput(path_ + ": expected {\"skips\": {STEP: BATCHES}, \"rollbacks\": [...]} " +
                  "(written by keel); move it away to train without its skips");
  for (const auto& [step, n] : j["skips"].items()) recorded_[std::stoi(step)] = n.get<int>();
  if (j.contains("rollbacks")) rollbacks_ = j["rollbacks"];
}

int RollbackLog::SkipAt(int step) const {
  if (auto it = recorded_.find(step); it != recorded_.end()) return it->second;
  if (auto it = configured_.find(step); it != configured_.end()) return it->second;
  return 0;
}

void RollbackLog::Record(int spike_step, int to_step, int batches, const std::string& why,
                         bool write) {
  // `batches` runs from the checkpoint's position to the spike's, so it holds every skip the
  // steps after `to_step` made on the way: replayed, they would skip fresh data a second time.
  for (int s = to_step + 1; s < spike_step; ++s)
    if (SkipAt(s) > 0) recorded_[s] = 0;
  recorded_[to_step] = batches;
  rollbacks_.push_back({{"spike_step", spike_step},
                        {"to_step", to_step},
                        {"skipped_batches", batches},
                        {"why", why},
                        {"time", resilience::UnixNow()}});
  if (!write) return;
  nlohmann::json skips = nlohmann::json::object();
  for (const auto& [step, n] : recorded_) skips[std::to_string(step)] = n;
  WriteFileAtomic(path_,
                  nlohmann::json{{"skips", skips}, {"rollbacks", rollbacks_}}.dump(1) + "\n");
}

int RollbackLog::RecentRollbacks(int step, int window) const {
  int n = 0;
  for (const auto& r : rollbacks_)
    if (r.value("spike_step", -1) > step - window) ++n;
  return n;
}

}  // namespace keel::train
