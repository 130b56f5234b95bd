#include "keel/monitor/prometheus_exporter.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "keel/core/error.h"
#include "keel/core/validate.h"

namespace keel::monitor {

// The registry as the exposer collects it: under the exporter's lock.
class MetricsExporter::Snapshot : public prometheus::Collectable {
 public:
  Snapshot(std::shared_ptr<std::mutex> mu, std::shared_ptr<prometheus::Registry> registry)
      : mu_(std::move(mu)), registry_(std::move(registry)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(*mu_);
    return registry_->Collect();
  }

 private:
  std::shared_ptr<std::mutex> mu_;
  std::shared_ptr<prometheus::Registry> registry_;
};

MetricsExporter::MetricsExporter(const std::string& addr, int port, const std::string& token,
                                 const std::string& what)
    : mu_(std::make_shared<std::mutex>()),
      registry_(std::make_shared<prometheus::Registry>()),
      snapshot_(std::make_shared<Snapshot>(mu_, registry_)) {
  const std::string host = CheckListenAddress("[monitor] metrics_addr", addr);
  const bool v6 = host.find(':') != std::string::npos;
  const std::string bind = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  url_ = "http://" + bind + "/metrics";
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    ThrowBadInput(what + " " + std::to_string(port) + ": cannot listen on " + bind + " (" +
                  e.what() + "): is the port in use? Pick another, or 0 for no endpoint");
  }
  if (!token.empty())
    exposer_->RegisterAuth(
        [token](const std::string& user, const std::string& password) {
          return user == "keel" && password == token;
        },
        "keel");
  exposer_->RegisterCollectable(snapshot_);
}

MetricsExporter::~MetricsExporter() = default;

void MetricsExporter::Gauge(const std::string& name, const std::string& help, double value,
                            const Labels& labels) {
  auto& fam = gauges_[name];
  if (!fam) fam = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_);
  fam->Add(labels).Set(value);
}

void MetricsExporter::Counter(const std::string& name, const std::string& help, double increment,
                              const Labels& labels) {
  auto& fam = counters_[name];
  if (!fam) fam = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_);
  if (increment > 0)
    fam->Add(labels).Increment(increment);
  else
    fam->Add(labels);
}

}  // namespace keel::monitor
