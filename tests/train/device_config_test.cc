// [train] device: "cpu" and (where built) "cuda"; anything else, "cuda" without the CUDA backend,
// and "cuda" with tensor parallelism are one line naming the key.
#include <gtest/gtest.h>

#include <string>

#include "../bad_input.h"
#include "keel/kernels/backend.h"
#include "keel/train/config.h"

namespace keel::train {
namespace {

std::string Refusal(const std::vector<std::string>& overrides) {
  return BadInputMessage([&] { LoadConfig("", overrides); });
}

TEST(DeviceConfig, CpuIsTheDefault) { EXPECT_EQ(LoadConfig("", {}).train.device, "cpu"); }

TEST(DeviceConfig, UnknownDeviceListsTheChoices) {
  const std::string msg = Refusal({"train.device=gpu"});
  EXPECT_NE(msg.find("device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda"), std::string::npos) << msg;
}

TEST(DeviceConfig, CudaNeedsTheCudaBuild) {
  if (kernels::CudaBuilt()) {
    EXPECT_EQ(LoadConfig("", {"train.device=cuda"}).train.device, "cuda");
  } else {
    const std::string msg = Refusal({"train.device=cuda"});
    EXPECT_NE(msg.find("-DKEEL_CUDA=ON"), std::string::npos) << msg;
  }
}

TEST(DeviceConfig, CudaRefusesTensorParallelism) {
  const std::string msg = Refusal({"train.device=cuda", "parallel.tp=2"});
  EXPECT_NE(msg.find("device"), std::string::npos) << msg;
}

}  // namespace
}  // namespace keel::train
