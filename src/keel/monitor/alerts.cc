#include "keel/monitor/alerts.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "keel/core/log.h"
#include "keel/core/stats.h"
#include "keel/monitor/webhook.h"

namespace keel::monitor {
namespace {

constexpr size_t kThroughputWindow = 50;
constexpr int kThroughputSteps = 3;  // low (or normal again) this many steps in a row

std::string Fmt(const char* f, double a, double b = 0) {
  char buf[160];
  std::snprintf(buf, sizeof buf, f, a, b);
  return buf;
}

}  // namespace

Alerts::Alerts(const AlertConfig& cfg, Sink sink)
    : cfg_(cfg),
      sink_(std::move(sink)),
      last_step_at_(Clock::now().time_since_epoch().count()),
      last_save_at_(Clock::now().time_since_epoch().count()) {
  if (!cfg_.webhook.empty()) webhook_ = std::make_unique<Webhook>(cfg_.webhook);
  if (cfg_.no_step_s > 0 || cfg_.checkpoint_age_min > 0 || cfg_.min_free_disk_gb > 0)
    timer_ = std::thread([this] { Timer(); });
}

Alerts::~Alerts() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (timer_.joinable()) timer_.join();
}

void Alerts::Set(const std::string& rule, bool active, const std::string& message, int step) {
  bool& was = active_[rule];
  if (was == active) return;
  was = active;
  nlohmann::json e = {{"event", active ? "alert" : "alert_resolved"},
                      {"rule", rule},
                      {"step", step},
                      {"message", message},
                      {"time", double(std::time(nullptr))}};
  sink_(e, std::string(active ? "ALERT " : "resolved: ") + rule + ": " + message);
  if (webhook_) webhook_->Post(e.dump());
}

void Alerts::Step(const StepSignals& s) {
  last_step_at_ = Clock::now().time_since_epoch().count();
  std::lock_guard<std::mutex> lock(mu_);
  last_step_ = s.step;
  if (cfg_.nonfinite) {
    const bool bad_val = s.val_loss && !std::isfinite(*s.val_loss);
    const bool bad =
        !std::isfinite(s.loss) || (!std::isfinite(s.grad_norm) && !s.overflow) || bad_val;
    Set("nonfinite", bad,
        bad ? Fmt("step %.0f: the loss is %g", s.step, s.loss) +
                  Fmt(" and the gradient norm %g", s.grad_norm) +
                  (bad_val ? Fmt("; the validation loss is %g", *s.val_loss) : "")
            : Fmt("step %.0f: finite again", s.step),
        s.step);
  }
  if (cfg_.loss_ceiling > 0 && s.step > cfg_.after_step && std::isfinite(s.loss)) {
    const bool high = s.loss > cfg_.loss_ceiling;
    Set("loss_ceiling", high,
        Fmt("step %.0f: loss %.4f", s.step, s.loss) +
            Fmt(high ? " is above the ceiling %g" : " is back under the ceiling %g",
                cfg_.loss_ceiling),
        s.step);
  }
  if (cfg_.throughput_drop > 0 && s.tokens_per_s > 0) {
    if (recent_tps_.size() >= 10) {
      const double median = WindowMedian(recent_tps_);
      const double floor = (1 - cfg_.throughput_drop) * median;
      const bool low = s.tokens_per_s < floor;
      low_in_a_row_ = low ? low_in_a_row_ + 1 : 0;
      normal_in_a_row_ = low ? 0 : normal_in_a_row_ + 1;
      if (low_in_a_row_ >= kThroughputSteps)
        Set("throughput_drop", true,
            Fmt("step %.0f: %.0f tokens/s", s.step, s.tokens_per_s) +
                Fmt(" for %.0f steps, under %.0f (", kThroughputSteps, floor) +
                Fmt("%.0f%% below the running median %.0f)", 100 * cfg_.throughput_drop, median),
            s.step);
      if (normal_in_a_row_ >= kThroughputSteps)
        Set("throughput_drop", false, Fmt("step %.0f: %.0f tokens/s again", s.step, s.tokens_per_s),
            s.step);
    }
    // A slow stretch does not become the new normal while it lasts.
    if (low_in_a_row_ == 0) {
      recent_tps_.push_back(s.tokens_per_s);
      if (recent_tps_.size() > kThroughputWindow) recent_tps_.erase(recent_tps_.begin());
    }
  }
  if (cfg_.straggler && s.straggler_checked)
    Set("straggler", !s.straggler.empty(),
        s.straggler.empty() ? Fmt("step %.0f: no straggler", s.step) : s.straggler, s.step);
}

void Alerts::StepsEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  steps_ended_ = true;
  Set("no_step", false, Fmt("the steps ended (the last: step %.0f)", last_step_), last_step_);
}

void Alerts::Checkpointed() { last_save_at_ = Clock::now().time_since_epoch().count(); }

void Alerts::Timer() {
  auto age_s = [](const std::atomic<Clock::rep>& at) {
    return std::chrono::duration<double>(Clock::now() -
                                         Clock::time_point(Clock::duration(at.load())))
        .count();
  };
  Clock::time_point next_disk;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_; })) {
    if (cfg_.no_step_s > 0 && !steps_ended_) {
      const double idle = age_s(last_step_at_);
      Set("no_step", idle > cfg_.no_step_s,
          idle > cfg_.no_step_s
              ? Fmt("no step done for %.0f s (the last: step %.0f)", idle, last_step_)
              : Fmt("steps again (step %.0f)", last_step_),
          last_step_);
    }
    if (cfg_.checkpoint_age_min > 0) {
      const double min = age_s(last_save_at_) / 60;
      Set("checkpoint_age", min > cfg_.checkpoint_age_min,
          min > cfg_.checkpoint_age_min ? Fmt("no checkpoint committed for %.0f s (limit %g min)",
                                              60 * min, cfg_.checkpoint_age_min)
                                        : std::string("a checkpoint committed"),
          last_step_);
    }
    if (cfg_.min_free_disk_gb > 0 && Clock::now() >= next_disk) {
      next_disk = Clock::now() + std::chrono::seconds(5);
      // The checkpoint folder appears at the first save: until then its nearest existing folder
      // is on the disk it will use.
      std::filesystem::path where(cfg_.disk_path);
      std::error_code ec;
      while (!std::filesystem::exists(where, ec) && where.has_relative_path())
        where = where.parent_path();
      if (where.empty()) where = ".";
      struct statvfs st {};
      if (statvfs(where.c_str(), &st) != 0) {
        if (!disk_unreadable_)
          Log("keel: alerts: cannot read the free space of %s (%s): "
              "disk_space is not judged",
              where.c_str(), std::strerror(errno));
        disk_unreadable_ = true;
      } else {
        const double gb = double(st.f_bavail) * double(st.f_frsize) / 1e9;
        Set("disk_space", gb < cfg_.min_free_disk_gb,
            Fmt("%.1f GB free in the checkpoint folder (limit %g)", gb, cfg_.min_free_disk_gb) +
                " " + cfg_.disk_path,
            last_step_);
      }
    }
  }
}

}  // namespace keel::monitor
