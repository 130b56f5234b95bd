// The size-1 communicator: a process that trains alone. Collectives over one rank are identities
// (or copies when the output is a separate buffer), so every handle is complete when returned.
// Keeping this a real Comm, rather than `if (size > 1)` branches in the trainer, means the
// single-process path runs the same code as the distributed one.
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"

namespace keel::parallel {
namespace {

class CompletedWork final : public Work {
 public:
  bool Wait(double /*timeout_s*/) override { return true; }
};

class LocalComm final : public Comm {
 public:
  LocalComm() = default;
  LocalComm(const LocalComm&) = delete;
  LocalComm& operator=(const LocalComm&) = delete;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "local"; }

  std::unique_ptr<Work> AllReduceSumAsync(float* /*data*/, size_t /*n*/) override {
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> ReduceScatterSumAsync(const float* send, float* recv, size_t n) override {
    // memmove: callers may pass the same buffer for send and recv.
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> AllGatherAsync(const float* send, float* recv, size_t n) override {
    if (n > 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> AllReduceSumAsync(void* /*data*/, size_t /*n*/, DType /*dtype*/) override {
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> ReduceScatterSumAsync(const void* send, void* recv,
                                              const std::vector<size_t>& counts,
                                              DType dtype) override {
    CheckCounts(counts, "ReduceScatter");
    Copy(send, recv, counts[0] * DTypeSize(dtype));
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> AllGatherAsync(const void* send, void* recv,
                                       const std::vector<size_t>& counts, DType dtype) override {
    CheckCounts(counts, "AllGather");
    Copy(send, recv, counts[0] * DTypeSize(dtype));
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> AllToAllAsync(const void* send, void* recv,
                                      const std::vector<size_t>& counts) override {
    CheckCounts(counts, "AllToAll");
    Copy(send, recv, counts[0]);
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> ThenAsync(std::function<std::string()> fn) override {
    if (std::string error = fn(); !error.empty()) ThrowRuntime(error);
    return std::make_unique<CompletedWork>();
  }

  // Every group of one rank is this rank alone. A fresh Comm, so that the groups' Sends to self
  // stay apart as they would over MPI.
  std::unique_ptr<Comm> Split(int color, int /*key*/) override {
    KEEL_CHECK(color >= 0, "Split with negative color " + std::to_string(color));
    return std::make_unique<LocalComm>();
  }

  void Broadcast(void* /*data*/, size_t /*bytes*/, int root) override {
    KEEL_CHECK(root == 0, "Broadcast root " + std::to_string(root) + " on a size-1 communicator");
  }

  // Messages to oneself are queued, so that code written for N ranks (send to the next stage,
  // receive from the previous one) also runs with one rank as long as each Send precedes its Recv.
  void Send(const void* data, size_t bytes, int peer) override {
    KEEL_CHECK(peer == 0, "Send to rank " + std::to_string(peer) + " on a size-1 communicator");
    const auto* p = static_cast<const unsigned char*>(data);
    pending_.emplace_back(p, p + bytes);
  }

  void Recv(void* data, size_t bytes, int peer) override {
    KEEL_CHECK(peer == 0, "Recv from rank " + std::to_string(peer) + " on a size-1 communicator");
    if (pending_.empty())
      ThrowRuntime("local communicator: Recv of " + std::to_string(bytes) +
                   " bytes with no matching Send (with one rank this would wait forever)");
    std::vector<unsigned char> msg = std::move(pending_.front());
    pending_.pop_front();
    if (msg.size() != bytes)
      ThrowRuntime("local communicator: Recv expected " + std::to_string(bytes) +
                   " bytes, the matching Send had " + std::to_string(msg.size()));
    if (bytes > 0) std::memcpy(data, msg.data(), bytes);
  }

  // The same mailbox idea, one queue per tag, kept apart from Send/Recv's as over MPI (where the
  // two use different tags). Complete when returned: a send is copied, a receive takes the oldest
  // message of its tag, and one with no such message throws (it would wait forever).
  std::unique_ptr<Work> SendAsync(const void* data, size_t bytes, int peer, int tag) override {
    CheckPeerAndTag("SendAsync to", peer, tag);
    const auto* p = static_cast<const unsigned char*>(data);
    tagged_[tag].emplace_back(p, p + bytes);
    return std::make_unique<CompletedWork>();
  }

  std::unique_ptr<Work> RecvAsync(void* data, size_t bytes, int peer, int tag) override {
    CheckPeerAndTag("RecvAsync from", peer, tag);
    auto it = tagged_.find(tag);
    if (it == tagged_.end() || it->second.empty())
      ThrowRuntime("local communicator: RecvAsync of " + std::to_string(bytes) +
                   " bytes with tag " + std::to_string(tag) +
                   " with no matching SendAsync (with one rank this would wait forever)");
    std::vector<unsigned char> msg = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) tagged_.erase(it);
    if (msg.size() != bytes)
      ThrowRuntime("local communicator: RecvAsync with tag " + std::to_string(tag) + " expected " +
                   std::to_string(bytes) + " bytes, the matching SendAsync had " +
                   std::to_string(msg.size()));
    if (bytes > 0) std::memcpy(data, msg.data(), bytes);
    return std::make_unique<CompletedWork>();
  }

  void Barrier() override {}

 protected:
  void AllReduceDoubles(double* /*data*/, size_t /*n*/, bool /*max*/) override {}

 private:
  // Checked as the MPI communicator does, so that code wrong for N ranks fails with one too.
  static void CheckCounts(const std::vector<size_t>& counts, const char* op) {
    KEEL_CHECK(counts.size() == 1, std::string(op) + " with " + std::to_string(counts.size()) +
                                       " counts on a size-1 communicator");
  }

  static void CheckPeerAndTag(const char* what, int peer, int tag) {
    KEEL_CHECK(peer == 0,
               std::string(what) + " rank " + std::to_string(peer) + " on a size-1 communicator");
    KEEL_CHECK(tag >= 0, std::string(what) + " rank 0 with negative tag " + std::to_string(tag));
  }

  // memmove: callers may pass overlapping (or the same) buffers.
  static void Copy(const void* send, void* recv, size_t bytes) {
    if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  }

  std::deque<std::vector<unsigned char>> pending_;  // Sends to self not yet received, in order
  std::map<int, std::deque<std::vector<unsigned char>>> tagged_;  // SendAsyncs, by tag, in order
};

}  // namespace

std::unique_ptr<Comm> MakeLocalComm() { return std::make_unique<LocalComm>(); }

}  // namespace keel::parallel
