// [monitor] and its sub-table [monitor.alerts]: nested tables in files, three-part --set paths,
// the round trip, and the bad inputs (unknown keys named with the sub-table, out-of-range values,
// an endpoint reachable from other machines without a token).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../bad_input.h"
#include "keel/train/config.h"

namespace keel::train {
namespace {

namespace fs = std::filesystem;

std::string Write(const std::string& name, const std::string& text) {
  const fs::path dir = fs::path(::testing::TempDir()) / "keel_config_monitor_test";
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return (dir / name).string();
}

TEST(ConfigMonitor, AlertsTableAndDottedOverrides) {
  const std::string path = Write("a.toml",
                                 "[monitor]\nmetrics_port = 9400\n"
                                 "[monitor.alerts]\nloss_ceiling = 7.5\nstraggler = false\n");
  RunConfig c = LoadConfig(
      path, {"monitor.alerts.webhook=http://127.0.0.1:1/x", "monitor.alerts.no_step_s=30"});
  EXPECT_EQ(c.monitor.metrics_port, 9400);
  EXPECT_EQ(c.monitor.alerts.loss_ceiling, 7.5);
  EXPECT_FALSE(c.monitor.alerts.straggler);
  EXPECT_EQ(c.monitor.alerts.webhook, "http://127.0.0.1:1/x");
  EXPECT_EQ(c.monitor.alerts.no_step_s, 30);
  EXPECT_TRUE(c.monitor.alerts.nonfinite);  // a default kept

  // What the run folder records reads back to the same values.
  const std::string again = Write("b.toml", ToToml(c));
  RunConfig d = LoadConfig(again, {});
  d.source = c.source;
  EXPECT_EQ(c, d);
  EXPECT_NE(ToToml(c).find("[monitor.alerts]"), std::string::npos);
}

TEST(ConfigMonitor, BadAlertKeysNameTheSubTable) {
  std::string msg = BadInputMessage(
      [&] { LoadConfig(Write("c.toml", "[monitor.alerts]\nloss_cieling = 3\n"), {}); });
  EXPECT_NE(msg.find("[monitor.alerts] loss_cieling: unknown key (known: nonfinite, "),
            std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"monitor.alerts.nope=1"}); });
  EXPECT_NE(msg.find("--set monitor.alerts.nope: unknown key"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"monitor.alerts.throughput_drop=1.5"}); });
  EXPECT_NE(msg.find("throughput_drop: expected a fraction in [0, 1)"), std::string::npos) << msg;
  msg = BadInputMessage([] { LoadConfig("", {"monitor.alerts.webhook=ftp://x"}); });
  EXPECT_NE(msg.find("webhook: \"ftp://x\": the scheme is not http or https"), std::string::npos)
      << msg;
  msg = BadInputMessage([] { LoadConfig("", {"monitor.alerts.no_step_s=-1"}); });
  EXPECT_NE(msg.find("no_step_s"), std::string::npos) << msg;
}

TEST(ConfigMonitor, EndpointOffLoopbackNeedsAToken) {
  std::string msg = BadInputMessage([] {
    LoadConfig("", {"monitor.metrics_port=9400", "monitor.metrics_addr=10.0.0.5"});
  });
  EXPECT_NE(msg.find("metrics_addr: \"10.0.0.5\" is reachable from other machines"),
            std::string::npos)
      << msg;
  RunConfig ok = LoadConfig("", {"monitor.metrics_port=9400", "monitor.metrics_addr=10.0.0.5",
                                 "monitor.metrics_token=t"});
  EXPECT_EQ(ok.monitor.metrics_addr, "10.0.0.5");
  EXPECT_NO_THROW(LoadConfig("", {"monitor.metrics_port=9400", "monitor.metrics_addr=::1"}));
  msg = BadInputMessage([] { LoadConfig("", {"monitor.metrics_port=70000"}); });
  EXPECT_NE(msg.find("metrics_port: expected a TCP port"), std::string::npos) << msg;
}

}  // namespace
}  // namespace keel::train
