// Tests of the size-1 communicator and of CreateComm's choice; the MPI communicator is tested
// under mpirun by mpi_comm_main.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/core/error.h"
#include "keel/parallel/comm.h"
#include "keel/parallel/comm_wait.h"

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

TEST(CommLocal, TypedAllReduceIsIdentity) {
  auto comm = MakeLocalComm();
  std::vector<float> f = {1.5f, -2.0f};
  std::vector<bf16> h = {ToBf16(1.5f), ToBf16(-3.0f)};
  EXPECT_TRUE(comm->AllReduceSumAsync(f.data(), f.size(), DType::kF32)->Wait(0));
  EXPECT_TRUE(comm->AllReduceSumAsync(h.data(), h.size(), DType::kBF16)->Wait(0));
  EXPECT_EQ(f, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(ToFloat(h[0]), 1.5f);
  EXPECT_EQ(ToFloat(h[1]), -3.0f);
}

TEST(CommLocal, VariableCountReduceScatterAndAllGatherCopy) {
  auto comm = MakeLocalComm();
  const std::vector<float> send = {1, 2, 3, 4};
  std::vector<float> recv(5, -1.0f);
  EXPECT_TRUE(comm->ReduceScatterSumAsync(send.data(), recv.data(), {3}, DType::kF32)->Wait(0));
  EXPECT_EQ(recv, (std::vector<float>{1, 2, 3, -1, -1}));  // only counts[0] elements
  std::fill(recv.begin(), recv.end(), -1.0f);
  EXPECT_TRUE(comm->AllGatherAsync(send.data(), recv.data(), {4}, DType::kF32)->Wait(0));
  EXPECT_EQ(recv, (std::vector<float>{1, 2, 3, 4, -1}));

  // bf16 moves 2 bytes per element: a copy of 3 must not touch the 4th.
  const std::vector<bf16> send_h = {ToBf16(1), ToBf16(2), ToBf16(3)};
  std::vector<bf16> recv_h(4, ToBf16(-1));
  EXPECT_TRUE(comm->AllGatherAsync(send_h.data(), recv_h.data(), {3}, DType::kBF16)->Wait(0));
  EXPECT_EQ(ToFloat(recv_h[2]), 3.0f);
  EXPECT_EQ(ToFloat(recv_h[3]), -1.0f);
  std::fill(recv_h.begin(), recv_h.end(), ToBf16(-1));
  EXPECT_TRUE(
      comm->ReduceScatterSumAsync(send_h.data(), recv_h.data(), {2}, DType::kBF16)->Wait(0));
  EXPECT_EQ(ToFloat(recv_h[1]), 2.0f);
  EXPECT_EQ(ToFloat(recv_h[2]), -1.0f);

  // In place, and a count of 0 (with null buffers) are fine.
  std::vector<float> buf = {5, 6};
  EXPECT_TRUE(comm->AllGatherAsync(buf.data(), buf.data(), {2}, DType::kF32)->Wait(0));
  EXPECT_EQ(buf, (std::vector<float>{5, 6}));
  EXPECT_TRUE(comm->ReduceScatterSumAsync(nullptr, nullptr, {0}, DType::kBF16)->Wait(0));
  EXPECT_TRUE(comm->AllGatherAsync(nullptr, nullptr, {0}, DType::kF32)->Wait(0));

  // One count per rank, as over MPI.
  EXPECT_THROW((void)comm->AllGatherAsync(send.data(), recv.data(), {2, 2}, DType::kF32), Error);
  EXPECT_THROW((void)comm->ReduceScatterSumAsync(send.data(), recv.data(), {}, DType::kF32), Error);
}

TEST(CommLocal, SplitGivesASizeOneComm) {
  auto comm = MakeLocalComm();
  auto sub = comm->Split(/*color=*/3, /*key=*/-5);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_STREQ(sub->name(), "local");
  float x = 2.0f;
  sub->AllReduceSum(&x, 1);
  EXPECT_EQ(x, 2.0f);
  // Each group has its own messages to self, as separate MPI communicators do.
  int a = 7, out = 0;
  comm->Send(&a, sizeof(a), 0);
  EXPECT_THROW(sub->Recv(&out, sizeof(out), 0), Error);
  comm->Recv(&out, sizeof(out), 0);
  EXPECT_EQ(out, 7);
  // The parent still works once the group is gone.
  sub.reset();
  EXPECT_EQ(comm->AllReduceSum(1.5), 1.5);
  EXPECT_THROW((void)comm->Split(/*color=*/-1, /*key=*/0), Error);
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

TEST(CommLocal, AsyncSendToSelfIsAMailboxByTag) {
  auto comm = MakeLocalComm();
  int a = 1, b = 2, c = 3, out = 0;
  EXPECT_TRUE(comm->SendAsync(&a, sizeof(a), 0, /*tag=*/4)->Wait(0));
  EXPECT_TRUE(comm->SendAsync(&b, sizeof(b), 0, /*tag=*/9)->Wait(0));
  EXPECT_TRUE(comm->SendAsync(&c, sizeof(c), 0, /*tag=*/4)->Wait(0));
  a = b = c = -1;  // copied when sent, as the buffer may be reused once Wait returns true
  // By tag, in issue order within a tag.
  EXPECT_TRUE(comm->RecvAsync(&out, sizeof(out), 0, /*tag=*/9)->Wait(0));
  EXPECT_EQ(out, 2);
  EXPECT_TRUE(comm->RecvAsync(&out, sizeof(out), 0, /*tag=*/4)->Wait(0));
  EXPECT_EQ(out, 1);
  EXPECT_TRUE(comm->RecvAsync(&out, sizeof(out), 0, /*tag=*/4)->Wait(0));
  EXPECT_EQ(out, 3);
  // Empty messages match too.
  EXPECT_TRUE(comm->SendAsync(nullptr, 0, 0, /*tag=*/0)->Wait(0));
  EXPECT_TRUE(comm->RecvAsync(nullptr, 0, 0, /*tag=*/0)->Wait(0));
}

TEST(CommLocal, AsyncP2pIsApartFromBlockingAndChecked) {
  auto comm = MakeLocalComm();
  int x = 5, out = 0;
  // A blocking Send is not an asynchronous one's message, nor the other way round (over MPI they
  // travel with different tags).
  comm->Send(&x, sizeof(x), 0);
  EXPECT_THROW((void)comm->RecvAsync(&out, sizeof(out), 0, /*tag=*/0), Error);
  (void)comm->SendAsync(&x, sizeof(x), 0, /*tag=*/0);
  comm->Recv(&out, sizeof(out), 0);
  EXPECT_EQ(out, 5);
  // The asynchronous message is still there, and a receive of the wrong size fails.
  EXPECT_THROW((void)comm->RecvAsync(&out, sizeof(out) + 1, 0, /*tag=*/0), Error);
  EXPECT_THROW((void)comm->RecvAsync(&out, sizeof(out), 0, /*tag=*/0), Error);  // consumed above
  // A group's messages stay in the group.
  auto sub = comm->Split(/*color=*/0, /*key=*/0);
  (void)comm->SendAsync(&x, sizeof(x), 0, /*tag=*/1);
  EXPECT_THROW((void)sub->RecvAsync(&out, sizeof(out), 0, /*tag=*/1), Error);
  // Only rank 0 exists, and tags are not negative.
  EXPECT_THROW((void)comm->SendAsync(&x, sizeof(x), 1, /*tag=*/0), Error);
  EXPECT_THROW((void)comm->RecvAsync(&x, sizeof(x), -1, /*tag=*/0), Error);
  EXPECT_THROW((void)comm->SendAsync(&x, sizeof(x), 0, /*tag=*/-3), Error);
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

// A wait past its deadline is exit 75 naming what the caller waited for and the operation itself.
TEST(CommWait, TimeoutNamesTheOperation) {
  struct Stuck final : Work {
    bool Wait(double) override { return false; }
    std::string describe() const override { return "pp#0 1->0 tag 11 RecvAsync #9"; }
  } stuck;
  try {
    (void)WaitOrLost(stuck, 0.01, "pipeline stage 0: receiving gradients");
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kTempFail);
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0: receiving gradients (pp#0 1->0 tag 11 "
                                         "RecvAsync #9) did not complete within [parallel] "
                                         "comm_timeout_s = 0.01 s"),
              std::string::npos)
        << e.what();
  }
  SetDefaultWaitDeadline(0.01);
  struct Reset {
    ~Reset() { SetDefaultWaitDeadline(-1); }  // also when an assertion returns early
  } reset;
  try {
    WaitOrLostDefault(stuck);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pp#0 1->0 tag 11 RecvAsync #9 did not complete"),
              std::string::npos)
        << e.what();
  }
}

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

// The NCCL communicator is the plugin libkeel_nccl.so (core/plugin.h). Where it is built it loads
// in this binary (every keel symbol it needs is here) and runs: on one GPU it is a communicator of
// one; without a GPU its first NCCL or CUDA call fails as a keel::Error that says which, not as a
// load failure or a crash. Without the plugin: one line naming the missing file.
TEST(NcclPlugin, LoadsWhereBuilt) {
  auto local = MakeLocalComm();
  try {
    auto nccl = MakeNcclComm(*local);
    EXPECT_TRUE(NcclBuilt());
    EXPECT_EQ(nccl->size(), 1);
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (NcclBuilt()) {
      EXPECT_TRUE(msg.rfind("NCCL: ", 0) == 0 || msg.rfind("CUDA: ", 0) == 0) << msg;
    } else {
      EXPECT_EQ(e.code(), ExitCode::kBadInput) << msg;
      EXPECT_NE(msg.find("no libkeel_nccl.so"), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace keel::parallel
