#include "keel/resilience/fault_inject.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "keel/core/error.h"

namespace keel::resilience {
namespace {

constexpr struct {
  const char* name;
  FaultKind kind;
} kKinds[] = {{"kill", FaultKind::kKill},        {"hang", FaultKind::kHang},
              {"slow", FaultKind::kSlow},        {"bitflip", FaultKind::kBitflip},
              {"nan_grad", FaultKind::kNanGrad}, {"spike", FaultKind::kSpike},
              {"sigterm", FaultKind::kSigterm}};

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t next; (next = s.find(sep, at)) != std::string::npos; at = next + 1)
    out.push_back(Trim(s.substr(at, next - at)));
  out.push_back(Trim(s.substr(at)));
  return out;
}

// A whole number in [0, 2^31), or the bad-input error naming `what`.
long Whole(const std::string& text, const std::string& fault, const std::string& what) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < 0 || v > INT_MAX || errno == ERANGE ||
      !std::isdigit(static_cast<unsigned char>(text[0])))
    ThrowBadInput("KEEL_FAULT: \"" + fault + "\": " + what +
                  ": expected a whole number >= 0, got \"" + text + "\"");
  return v;
}

}  // namespace

const char* FaultKindName(FaultKind k) {
  for (const auto& e : kKinds)
    if (e.kind == k) return e.name;
  return "?";
}

std::vector<Fault> ParseFaults(const std::string& spec) {
  std::vector<Fault> faults;
  for (const std::string& one : Split(spec, ';')) {
    if (one.empty()) continue;
    const std::vector<std::string> parts = Split(one, ',');
    const size_t at = parts[0].find('@');
    if (at == std::string::npos)
      ThrowBadInput("KEEL_FAULT: \"" + one + "\": expected KIND@STEP[:RANK][,key=value ...]");
    Fault f;
    const std::string kind = parts[0].substr(0, at);
    bool known = false;
    for (const auto& e : kKinds)
      if (kind == e.name) f.kind = e.kind, known = true;
    if (!known)
      ThrowBadInput("KEEL_FAULT: \"" + one + "\": unknown kind \"" + kind +
                    "\" (expected kill, hang, slow, bitflip, nan_grad, spike or sigterm)");
    const std::string where = parts[0].substr(at + 1);
    const size_t colon = where.find(':');
    f.step = int(Whole(where.substr(0, colon), one, "step"));
    if (colon != std::string::npos) f.rank = int(Whole(where.substr(colon + 1), one, "rank"));
    for (size_t i = 1; i < parts.size(); ++i) {
      const size_t eq = parts[i].find('=');
      const std::string key = parts[i].substr(0, eq);
      const std::string value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
      // An option another kind reads would be ignored by this one: the drill would not be the
      // one written.
      const char* owner =
          key == "phase"                                                              ? "hang"
          : key == "factor"                                                           ? "slow"
          : (key == "param" || key == "index" || key == "bit" || key == "persistent") ? "bitflip"
                                                                                      : nullptr;
      if (owner && kind != owner)
        ThrowBadInput("KEEL_FAULT: \"" + one + "\": " + key + " applies to " + owner +
                      " faults only, not " + kind);
      if (key == "persistent" && eq == std::string::npos) {
        f.persistent = true;
      } else if (key == "phase") {
        if (value != "data" && value != "forward" && value != "backward" && value != "optimizer" &&
            value != "checkpoint")
          ThrowBadInput("KEEL_FAULT: \"" + one + "\": phase: expected data, forward, backward, " +
                        "optimizer or checkpoint, got \"" + value + "\"");
        f.phase = value;
      } else if (key == "factor") {
        char* end = nullptr;
        f.factor = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0' || !(f.factor >= 1.0 && f.factor <= 100.0))
          ThrowBadInput("KEEL_FAULT: \"" + one + "\": factor: expected a number in [1, 100], " +
                        "got \"" + value + "\"");
      } else if (key == "param" && !value.empty()) {
        f.param = value;
      } else if (key == "index") {
        f.index = size_t(Whole(value, one, "index"));
      } else if (key == "bit") {
        f.bit = int(Whole(value, one, "bit"));
        if (f.bit > 31) ThrowBadInput("KEEL_FAULT: \"" + one + "\": bit: expected 0..31");
      } else {
        ThrowBadInput("KEEL_FAULT: \"" + one + "\": unknown option \"" + parts[i] +
                      "\" (expected phase=, factor=, param=, index=, bit= or persistent)");
      }
    }
    if (f.kind == FaultKind::kBitflip && f.param.empty())
      ThrowBadInput("KEEL_FAULT: \"" + one + "\": bitflip needs param=NAME (a tensor's name)");
    f.id = int(faults.size());
    faults.push_back(f);
  }
  return faults;
}

void CheckFaultsStrike(const std::vector<Fault>& faults, int world, int steps,
                       const std::function<std::string(const Fault&)>& bad_param) {
  for (const Fault& f : faults) {
    const std::string name = std::string("KEEL_FAULT: fault ") + std::to_string(f.id + 1) + " (" +
                             FaultKindName(f.kind) + "@" + std::to_string(f.step) + ")";
    if (f.rank >= world)
      ThrowBadInput(name + ": rank " + std::to_string(f.rank) + ": the job has " +
                    std::to_string(world) + " rank(s), 0.." + std::to_string(world - 1) +
                    "; the fault would never strike");
    if (f.step >= steps)
      ThrowBadInput(name + ": step " + std::to_string(f.step) + ": the run has " +
                    std::to_string(steps) + " steps, 0.." + std::to_string(steps - 1) +
                    " (0-based); the fault would never strike");
    if (f.kind == FaultKind::kBitflip)
      if (const std::string why = bad_param(f); !why.empty())
        ThrowBadInput(name + ": param=" + f.param + ": " + why);
  }
}

FaultInjector FaultInjector::FromEnv(int rank) {
  FaultInjector inj;
  inj.rank_ = rank;
  const char* spec = std::getenv("KEEL_FAULT");
  if (!spec || !*spec) return inj;
  for (const Fault& f : ParseFaults(spec))
    if (f.rank < 0 || f.rank == rank) inj.faults_.push_back(f);
  inj.fired_.assign(inj.faults_.size(), false);
  return inj;
}

void FaultInjector::SetMarkerDir(const std::string& dir) {
  marker_dir_ = dir;
  if (!faults_.empty()) std::filesystem::create_directories(dir);
}

bool FaultInjector::Fired(const Fault& f) const {
  return !marker_dir_.empty() &&
         std::filesystem::exists(marker_dir_ + "/fault_" + std::to_string(f.id) + "_rank_" +
                                 std::to_string(rank_));
}

const Fault* FaultInjector::Take(FaultKind kind, int step, const std::string& phase) {
  const Fault* lasting = nullptr;
  for (size_t i = 0; i < faults_.size(); ++i) {
    const Fault& f = faults_[i];
    if (f.kind != kind || (!phase.empty() && f.phase != phase)) continue;
    if (kind == FaultKind::kSlow) {
      if (f.step <= step) lasting = &f;
      continue;
    }
    if (f.step != step || fired_[i] || Fired(f)) continue;
    fired_[i] = true;
    if (!marker_dir_.empty())  // before it strikes: a kill must not strike again after a restart
      std::ofstream(marker_dir_ + "/fault_" + std::to_string(f.id) + "_rank_" +
                    std::to_string(rank_))
          << FaultKindName(kind) << " at step " << step << "\n";
    return &f;
  }
  return lasting;
}

const Fault* FaultInjector::Repeat(FaultKind kind, int step) const {
  for (size_t i = 0; i < faults_.size(); ++i)
    if (faults_[i].kind == kind && faults_[i].step <= step && fired_[i] && faults_[i].persistent)
      return &faults_[i];
  return nullptr;
}

}  // namespace keel::resilience
