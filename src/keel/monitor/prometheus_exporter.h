// The run's metrics for Prometheus: an HTTP endpoint (prometheus-cpp's exposer, civetweb) serving
// the text exposition format at /metrics. The trainer's rank 0 serves every rank's figures,
// labelled rank="N" (it gathers them for metrics.jsonl anyway): one scrape target per job, and no
// port to open on the other hosts.
//
//   MetricsExporter m("127.0.0.1", 9400, /*token=*/"");
//   m.Gauge("keel_loss", "training loss", 3.21);
//   m.Gauge("keel_step_phase_ms", "...", 12.5, {{"rank", "0"}, {"phase", "forward"}});
//   m.Counter("keel_tokens_total", "...", 4096);     // adds
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace prometheus {
class Exposer;
class Registry;
template <typename T>
class Family;
class Gauge;
class Counter;
}  // namespace prometheus

namespace keel::monitor {

using Labels = std::map<std::string, std::string>;

class MetricsExporter {
 public:
  // Listens on addr:port (`addr` as core/validate.h's CheckListenAddress takes it, brackets or
  // not for IPv6). A non-empty `token` requires
  // HTTP basic auth with user "keel" and the token as password (Prometheus: basic_auth). Throws
  // keel::Error (bad input) naming `what` (the config key) if it cannot listen.
  MetricsExporter(const std::string& addr, int port, const std::string& token,
                  const std::string& what = "[monitor] metrics_port");
  ~MetricsExporter();

  // "http://ADDR:PORT/metrics": where scrapers find it.
  const std::string& url() const { return url_; }

  // Holds scrapes off while a step's figures are set, so that one scrape sees one step.
  class Batch {
   public:
    explicit Batch(MetricsExporter& e) : lock_(*e.mu_) {}

   private:
    std::lock_guard<std::mutex> lock_;
  };

  void Gauge(const std::string& name, const std::string& help, double value,
             const Labels& labels = {});
  void Counter(const std::string& name, const std::string& help, double increment,
               const Labels& labels = {});

 private:
  class Snapshot;
  std::shared_ptr<std::mutex> mu_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<Snapshot> snapshot_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string url_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> gauges_;
  std::map<std::string, prometheus::Family<prometheus::Counter>*> counters_;
};

}  // namespace keel::monitor
