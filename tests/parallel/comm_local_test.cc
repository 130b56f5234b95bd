// Tests of the size-1 communicator and of CreateComm's choice; the MPI communicator is tested
// under mpirun by mpi_comm_main.cc.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {
namespace {

TEST(CommLocal, RankSizeName) {
  auto comm = MakeLocalComm();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_STREQ(comm->name(), "local");
}

TEST(CommLocal, AllReduceIsIdentityAndCompletesAtOnce) {
  auto comm = MakeLocalComm();
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  auto work = comm->AllReduceSumAsync(x.data(), x.size());
  EXPECT_TRUE(work->Wait(0));
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  comm->AllReduceSum(x.data(), x.size());
  EXPECT_EQ(x[2], 3.25f);
  EXPECT_EQ(comm->AllReduceSum(2.5), 2.5);
  EXPECT_EQ(comm->AllReduceMax(-7.0), -7.0);
}

TEST(CommLocal, ReduceScatterAndAllGatherCopy) {
  auto comm = MakeLocalComm();
  std::vector<float> send = {1, 2, 3, 4}, recv(4, 0);
  EXPECT_TRUE(comm->ReduceScatterSumAsync(send.data(), recv.data(), 4)->Wait(0));
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), 0.0f);
  EXPECT_TRUE(comm->AllGatherAsync(send.data(), recv.data(), 4)->Wait(0));
  EXPECT_EQ(recv, send);
  // Same buffer for input and output is allowed.
  EXPECT_TRUE(comm->AllGatherAsync(send.data(), send.data(), 4)->Wait(0));
  EXPECT_EQ(send, (std::vector<float>{1, 2, 3, 4}));
}

TEST(CommLocal, BroadcastAndBarrierAreNoOps) {
  auto comm = MakeLocalComm();
  int x = 42;
  comm->Broadcast(&x, sizeof(x), 0);
  comm->Barrier();
  EXPECT_EQ(x, 42);
  EXPECT_THROW(comm->Broadcast(&x, sizeof(x), 1), Error);
}

TEST(CommLocal, SendToSelfThenRecvInOrder) {
  auto comm = MakeLocalComm();
  int a = 1, b = 2, out = 0;
  comm->Send(&a, sizeof(a), 0);
  comm->Send(&b, sizeof(b), 0);
  comm->Recv(&out, sizeof(out), 0);
  EXPECT_EQ(out, 1);
  comm->Recv(&out, sizeof(out), 0);
  EXPECT_EQ(out, 2);
}

TEST(CommLocal, RecvWithoutSendOrWrongSizeThrows) {
  auto comm = MakeLocalComm();
  int x = 0;
  EXPECT_THROW(comm->Recv(&x, sizeof(x), 0), Error);
  double d = 1;
  comm->Send(&d, sizeof(d), 0);
  EXPECT_THROW(comm->Recv(&x, sizeof(x), 0), Error);
  EXPECT_THROW(comm->Send(&x, sizeof(x), 1), Error);
}

// Sets an environment variable for one scope and restores the previous state after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(CreateComm, LocalWithoutLauncher) {
  ScopedEnv a("KEEL_COMM", nullptr), b("OMPI_COMM_WORLD_SIZE", nullptr), c("PMI_SIZE", nullptr),
      d("PMIX_RANK", nullptr);
  EXPECT_STREQ(CreateComm()->name(), "local");
}

TEST(CreateComm, LocalWhenLauncherSaysOneRank) {
  ScopedEnv a("KEEL_COMM", nullptr), b("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_STREQ(CreateComm()->name(), "local");
  ScopedEnv c("OMPI_COMM_WORLD_SIZE", nullptr), d("PMI_SIZE", "1");
  EXPECT_STREQ(CreateComm()->name(), "local");
}

TEST(CreateComm, KeelCommOverridesAndIsValidated) {
  ScopedEnv a("KEEL_COMM", "local"), b("OMPI_COMM_WORLD_SIZE", "4");
  EXPECT_STREQ(CreateComm()->name(), "local");
  ScopedEnv c("KEEL_COMM", "nccl");
  try {
    (void)CreateComm();
    FAIL() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("KEEL_COMM"), std::string::npos);
  }
}

}  // namespace
}  // namespace keel::parallel
