#include "keel/resilience/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "keel/core/error.h"
#include "keel/core/host.h"

namespace keel::resilience {
namespace fs = std::filesystem;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string HeartbeatPath(const std::string& dir, int rank) {
  char name[32];
  std::snprintf(name, sizeof name, "/rank_%05d.json", rank);
  return dir + name;
}

namespace {

nlohmann::json ToJson(const Heartbeat& b) {
  nlohmann::json j = {{"rank", b.rank},
                      {"host", b.host},
                      {"pid", b.pid},
                      {"step", b.step},
                      {"phase", b.phase},
                      {"time", b.time},
                      {"start_step", b.start_step},
                      {"loop_start", b.loop_start},
                      {"last_step_end", b.last_step_end}};
  for (const GroupProgress& g : b.collectives)
    j["collectives"].push_back(
        {{"group", g.group}, {"issued", g.issued}, {"done", g.done}, {"op", g.op}});
  if (b.culprit) j["culprit"] = true;
  if (b.exited) {
    j["exit_code"] = b.exit_code;
    j["error"] = b.error;
  }
  return j;
}

}  // namespace

HeartbeatWriter::HeartbeatWriter(const std::string& dir, int rank, double period_s)
    : path_(HeartbeatPath(dir, rank)), period_s_(period_s) {
  if (period_s_ <= 0) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) ThrowRuntime(dir + ": cannot create the heartbeat folder: " + ec.message());
  beat_.rank = rank;
  beat_.host = HostName();
  beat_.pid = ::getpid();
  beat_.phase = "setup";
  WriteNow();
  thread_ = std::thread([this] { Loop(); });
}

HeartbeatWriter::~HeartbeatWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeartbeatWriter::Set(int step, const char* phase) {
  std::lock_guard<std::mutex> lock(mu_);
  if (beat_.exited) return;
  beat_.step = step;
  beat_.phase = phase;
}

void HeartbeatWriter::StartedAt(int start_step) {
  std::lock_guard<std::mutex> lock(mu_);
  beat_.start_step = start_step;
  beat_.step = start_step;
  beat_.loop_start = UnixNow();
  beat_.phase = "train";
  // At once, not at the next beat: the supervisor's accounting needs to know the loop began even
  // if the rank dies within the first period.
  if (period_s_ > 0) WriteNow();
}

void HeartbeatWriter::StepDone(int step) {
  std::lock_guard<std::mutex> lock(mu_);
  beat_.step = step;
  beat_.last_step_end = UnixNow();
}

void HeartbeatWriter::BlameSelf() {
  std::lock_guard<std::mutex> lock(mu_);
  beat_.culprit = true;
}

void HeartbeatWriter::Finish(int exit_code, const std::string& error) {
  if (period_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  beat_.exited = true;
  beat_.exit_code = exit_code;
  beat_.error = error;
  beat_.phase = "exit";
  WriteNow();
}

void HeartbeatWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::duration<double>(period_s_));
    if (stop_ || beat_.exited) break;
    WriteNow();
  }
}

// Called with mu_ held (or before the thread exists). A failed write is not an error: the
// supervisor then sees a silent rank, which is what it is.
void HeartbeatWriter::WriteNow() {
  beat_.time = UnixNow();
  beat_.collectives = CollectiveProgress();
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    // Replace, not throw, on bytes that are not UTF-8 (a host name): this runs on a thread, where
    // a throw ends the process.
    out << ToJson(beat_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) return;
  }
  std::error_code ec;
  fs::rename(tmp, path_, ec);
}

std::vector<Heartbeat> ReadHeartbeats(const std::string& dir) {
  std::vector<Heartbeat> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("rank_") || !name.ends_with(".json")) continue;
    std::ifstream in(e.path());
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    try {
      Heartbeat b;
      b.rank = j.at("rank").get<int>();
      b.host = j.at("host").get<std::string>();
      b.pid = j.at("pid").get<int64_t>();
      b.step = j.at("step").get<int>();
      b.phase = j.at("phase").get<std::string>();
      b.time = j.at("time").get<double>();
      b.start_step = j.value("start_step", -1);
      b.loop_start = j.value("loop_start", 0.0);
      b.last_step_end = j.value("last_step_end", 0.0);
      b.exited = j.contains("exit_code");
      b.exit_code = j.value("exit_code", 0);
      b.error = j.value("error", "");
      b.culprit = j.value("culprit", false);
      for (const auto& g : j.value("collectives", nlohmann::json::array()))
        b.collectives.push_back({g.at("group").get<std::string>(), g.at("issued").get<uint64_t>(),
                                 g.at("done").get<uint64_t>(), g.value("op", "")});
      out.push_back(b);
    } catch (const nlohmann::json::exception&) {
      continue;  // a file of another format: not a rank of this run
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Heartbeat& a, const Heartbeat& b) { return a.rank < b.rank; });
  return out;
}

void ClearHeartbeats(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("rank_")) fs::remove(e.path(), ec);
  }
}

}  // namespace keel::resilience
