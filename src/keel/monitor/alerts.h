// Alerts: the conditions a person watching a run would want to be told of, each firing once when
// it begins (and a "resolved" line when it ends) into events.jsonl, the console, and optionally a
// webhook. Step rules are judged by the training loop; time rules (no step, an old checkpoint,
// a full disk) by a timer thread, so that they fire while the loop is stuck.
//
//   Alerts alerts(cfg, sink);                 // sink: events.jsonl and the console
//   alerts.Step({.step = 12, .loss = 3.1, ...});
//   alerts.Checkpointed();                    // a save committed: its age restarts
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace keel::monitor {

class Webhook;

struct AlertConfig {
  bool nonfinite = true;          // a non-finite loss, validation loss or gradient norm
  double loss_ceiling = 0;        // loss above this after `after_step`; 0 = off
  int after_step = 0;             // the warmup: loss_ceiling applies from the next step on
  double throughput_drop = 0;     // tokens/s below (1 - this) x the running median; 0 = off
  double no_step_s = 0;           // no step done for this long; 0 = off
  double checkpoint_age_min = 0;  // no committed checkpoint for this long; 0 = off
  double min_free_disk_gb = 0;    // free space at `disk_path` below this; 0 = off
  std::string disk_path;          // the checkpoint folder (or, until it exists, its nearest parent)
  bool straggler = true;          // the straggler check named a rank
  std::string webhook;            // POST each alert's JSON here; "" = none
};

struct StepSignals {
  int step = 0;
  double loss = 0, grad_norm = 0;
  bool overflow = false;           // a loss-scale overflow the scaler answered: not a fault
  std::optional<double> val_loss;  // validated this step
  double tokens_per_s = 0;         // of the training phases only (validation and saves excluded)
  bool straggler_checked = false;  // the straggler check ran this step
  std::string straggler;           // its line, "" when it named nobody
};

class Alerts {
 public:
  // `sink` receives each alert's event object (event "alert" or "alert_resolved") and its
  // console line; it may be called from the timer thread.
  using Sink = std::function<void(const nlohmann::json& event, const std::string& line)>;
  Alerts(const AlertConfig& cfg, Sink sink);
  ~Alerts();

  void Step(const StepSignals& s);
  void Checkpointed();
  // The last step is done: what follows (the final gather, model file, samples, the last save's
  // wait) is no stall, and no_step is judged no more (resolved if it had fired).
  void StepsEnded();

 private:
  // Fires `rule` on a false -> true change and resolves it on true -> false.
  void Set(const std::string& rule, bool active, const std::string& message, int step);
  void Timer();

  const AlertConfig cfg_;
  Sink sink_;
  std::unique_ptr<Webhook> webhook_;
  std::mutex mu_;
  std::map<std::string, bool> active_;
  std::vector<double> recent_tps_;  // the last 50 steps' training tokens/s
  int low_in_a_row_ = 0, normal_in_a_row_ = 0;
  int last_step_ = 0;
  bool disk_unreadable_ = false;  // said once
  using Clock = std::chrono::steady_clock;
  std::atomic<Clock::rep> last_step_at_, last_save_at_;
  std::atomic<bool> steps_ended_{false};
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread timer_;
};

}  // namespace keel::monitor
