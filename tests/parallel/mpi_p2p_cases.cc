// Multi-process cases of asynchronous point-to-point (SendAsync/RecvAsync, for pipeline stages),
// linked into parallel_mpi_test beside mpi_comm_main.cc and run under the same rules: every rank
// runs every case in the same order; checks are EXPECT so that a failing rank keeps taking part.
//
// Not named *_test.cc: that would glob it into the single-process parallel_test binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "keel/core/error.h"
#include "keel/parallel/comm.h"
#include "parallel/mpi_test_comm.h"

namespace keel::parallel {
namespace {

// The byte at index i of the point-to-point message `msg` from rank `from`.
unsigned char P2pByte(int from, int msg, size_t i) {
  return static_cast<unsigned char>(size_t(from) * 131 + size_t(msg) * 17 + i * 7 + (i >> 12));
}

std::vector<unsigned char> P2pMessage(int from, int msg, size_t bytes) {
  std::vector<unsigned char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = P2pByte(from, msg, i);
  return v;
}

// Counts the bytes of `got` that differ from message `msg` of rank `from`, reporting the first.
size_t P2pMismatches(const std::vector<unsigned char>& got, int from, int msg) {
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != P2pByte(from, msg, i) && bad++ == 0)
      ADD_FAILURE() << "message " << msg << " from rank " << from << " differs at byte " << i;
  return bad;
}

TEST(CommMpi, SendAsyncBothWaysBeforeReceivingDoesNotDeadlock) {
  // Every rank sends 64 MiB to the next and to the previous rank, and only then posts its
  // receives: with blocking (rendezvous) sends every rank would wait in its first send forever.
  // With two ranks next == prev, and the two messages are told apart by tag.
  const int r = g_comm->rank(), p = g_comm->size();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const size_t n = size_t{64} << 20;
  const std::vector<unsigned char> to_next = P2pMessage(r, 1, n), to_prev = P2pMessage(r, 2, n);
  std::vector<unsigned char> from_prev(n, 0), from_next(n, 0);
  auto t0 = std::chrono::steady_clock::now();
  auto s1 = g_comm->SendAsync(to_next.data(), n, next, /*tag=*/1);
  auto s2 = g_comm->SendAsync(to_prev.data(), n, prev, /*tag=*/2);
  EXPECT_LT(Seconds(t0), 0.5) << "issuing sends must not wait for the receiver";
  auto r1 = g_comm->RecvAsync(from_prev.data(), n, prev, /*tag=*/1);
  auto r2 = g_comm->RecvAsync(from_next.data(), n, next, /*tag=*/2);
  // Progress without this thread calling into the communicator (compute stands in).
  bool done = false;
  while (!done && Seconds(t0) < 60) {
    volatile double acc = 0;
    for (int i = 0; i < 100000; ++i) acc = acc + i;
    done = r1->Wait(0);
  }
  EXPECT_TRUE(done) << "receive not complete after 60 s";
  for (auto* w : {&s1, &s2, &r1, &r2}) ASSERT_TRUE((*w)->Wait(60)) << "p2p hung";
  EXPECT_EQ(P2pMismatches(from_prev, prev, 1), 0u);
  EXPECT_EQ(P2pMismatches(from_next, next, 2), 0u);
}

TEST(CommMpi, AsyncMessagesMatchByTagInIssueOrder) {
  const int r = g_comm->rank(), p = g_comm->size();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // Message k goes with tag kTags[k] and kSizes[k] bytes: empty, eager and rendezvous sizes.
  const int kTags[] = {5, 7, 5, 7, 5, 0};
  const size_t kSizes[] = {100, 3000, 0, size_t{1} << 20, 17, 4096};
  constexpr int kMsgs = 6;
  std::vector<std::vector<unsigned char>> out(kMsgs), in(kMsgs);
  std::vector<std::unique_ptr<Work>> works;
  for (int k = 0; k < kMsgs; ++k) {
    out[size_t(k)] = P2pMessage(r, k, kSizes[k]);
    in[size_t(k)].assign(kSizes[k], 0);
    works.push_back(g_comm->SendAsync(out[size_t(k)].data(), kSizes[k], next, kTags[k]));
  }
  // A blocking message with the same (caller's) tag 0 as message 5: neither may take the other's.
  int blocking_out = r * 10 + 3, blocking_in = -1;
  if (r == 0) {
    g_comm->Send(&blocking_out, sizeof(int), next);
    g_comm->Recv(&blocking_in, sizeof(int), prev);
  } else {
    g_comm->Recv(&blocking_in, sizeof(int), prev);
    g_comm->Send(&blocking_out, sizeof(int), next);
  }
  EXPECT_EQ(blocking_in, prev * 10 + 3);
  // Received tag by tag, not in the order sent across tags; within a tag, in issue order.
  for (int k : {5, 1, 3, 0, 2, 4})
    works.push_back(g_comm->RecvAsync(in[size_t(k)].data(), kSizes[k], prev, kTags[k]));
  for (size_t i = 0; i < works.size(); ++i) ASSERT_TRUE(works[i]->Wait(60)) << "op " << i;
  for (int k = 0; k < kMsgs; ++k) EXPECT_EQ(P2pMismatches(in[size_t(k)], prev, k), 0u);
}

TEST(CommMpi, AsyncP2pInterleavesWithAGroupAllReduce) {
  const int r = g_comm->rank(), p = g_comm->size();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  // Every rank, in reverse order: a different MPI communicator over the same ranks.
  auto sub = g_comm->Split(/*color=*/0, /*key=*/-r);
  const int sr = sub->rank(), snext = (sr + 1) % p, sprev = (sr + p - 1) % p;
  const size_t n = size_t{8} << 20;
  const std::vector<unsigned char> out = P2pMessage(r, 20, n), sub_out = P2pMessage(sr, 21, n);
  std::vector<unsigned char> in(n, 0), sub_in(n, 0);
  std::vector<float> x(size_t{1} << 20, float(r + 1));
  float y = float(r);
  // The receive is posted before the all-reduce and completes while (or after) it runs; the
  // sends of the same user tag on the two communicators must not cross.
  auto recv = g_comm->RecvAsync(in.data(), n, prev, /*tag=*/11);
  auto ar = sub->AllReduceSumAsync(x.data(), x.size());
  auto send = g_comm->SendAsync(out.data(), n, next, /*tag=*/11);
  auto sub_recv = sub->RecvAsync(sub_in.data(), n, sprev, /*tag=*/11);
  auto ar2 = sub->AllReduceSumAsync(&y, 1);
  auto sub_send = sub->SendAsync(sub_out.data(), n, snext, /*tag=*/11);
  ASSERT_TRUE(ar->Wait(60));
  ASSERT_TRUE(ar2->Wait(60));
  for (auto* w : {&recv, &send, &sub_recv, &sub_send}) ASSERT_TRUE((*w)->Wait(60)) << "p2p hung";
  EXPECT_EQ(x.front(), float(p * (p + 1) / 2));
  EXPECT_EQ(x.back(), float(p * (p + 1) / 2));
  EXPECT_EQ(y, float(p * (p - 1) / 2));
  EXPECT_EQ(P2pMismatches(in, prev, 20), 0u);
  EXPECT_EQ(P2pMismatches(sub_in, sprev, 21), 0u);
}

TEST(CommMpi, AsyncSendGoesAheadOfQueuedCollectives) {
  // Ranks 0 and 1: rank 0 queues two all-reduces and then a send; rank 1 joins the first late,
  // then waits for the message before it joins the second. The send must be posted between the
  // two (ahead of the queued one), or rank 0 sits in the second all-reduce and this times out:
  // the pipeline's case, a stage's gradient queued behind its data-parallel buckets.
  const int r = g_comm->rank();
  auto pair = g_comm->Split(/*color=*/r < 2 ? 0 : 1 + r, /*key=*/r);
  if (r >= 2 || g_comm->size() < 2) return;
  float a = 1, b = 2;
  const size_t n = size_t{4} << 20;  // rendezvous size: it moves only once rank 0 posts it
  std::vector<unsigned char> out = P2pMessage(0, 30, n), in(n, 0);
  if (r == 0) {
    auto first = pair->AllReduceSumAsync(&a, 1);
    auto second = pair->AllReduceSumAsync(&b, 1);
    auto send = pair->SendAsync(out.data(), n, 1, /*tag=*/3);
    EXPECT_TRUE(first->Wait(60));
    EXPECT_TRUE(send->Wait(60));
    EXPECT_TRUE(second->Wait(60));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto first = pair->AllReduceSumAsync(&a, 1);
    auto recv = pair->RecvAsync(in.data(), n, 0, /*tag=*/3);
    EXPECT_TRUE(first->Wait(60));
    const bool arrived = recv->Wait(10);
    EXPECT_TRUE(arrived) << "the send waited behind a queued all-reduce";
    auto second = pair->AllReduceSumAsync(&b, 1);  // lets rank 0 finish either way
    EXPECT_TRUE(second->Wait(60));
    if (!arrived) {
      EXPECT_TRUE(recv->Wait(60));
    }
    EXPECT_EQ(P2pMismatches(in, 0, 30), 0u);
  }
  EXPECT_EQ(a, 2.0f);
  EXPECT_EQ(b, 4.0f);
}

TEST(CommMpi, AsyncReceiveOfTheWrongSizeFails) {
  // Pairs 0-1, 2-3, ...; an odd last rank sits this one out.
  const int r = g_comm->rank(), p = g_comm->size(), peer = r ^ 1;
  if (peer >= p) return;
  const bool sender = r % 2 == 0;
  // Fewer bytes than expected, then more (MPI's truncation), then a short one of rendezvous size,
  // then a good one: the pair must still be in step after the failures.
  const size_t kSent[] = {100, 300, size_t{2} << 20, 64};
  const size_t kExpected[] = {200, 200, size_t{3} << 20, 64};
  for (int k = 0; k < 4; ++k) {
    const size_t cap = std::max(kSent[k], kExpected[k]);
    std::vector<unsigned char> buf =
        sender ? P2pMessage(r, k, cap) : std::vector<unsigned char>(cap);
    if (sender) {
      EXPECT_TRUE(g_comm->SendAsync(buf.data(), kSent[k], peer, /*tag=*/3)->Wait(60)) << k;
      continue;
    }
    auto work = g_comm->RecvAsync(buf.data(), kExpected[k], peer, /*tag=*/3);
    if (kSent[k] == kExpected[k]) {
      EXPECT_TRUE(work->Wait(60));
      buf.resize(kExpected[k]);
      EXPECT_EQ(P2pMismatches(buf, peer, k), 0u);
      continue;
    }
    try {
      (void)work->Wait(60);
      ADD_FAILURE() << "expected keel::Error for message " << k;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("RecvAsync on rank " + std::to_string(r) + " from rank " +
                          std::to_string(peer)),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("expected " + std::to_string(kExpected[k]) + " bytes"), std::string::npos)
          << what;
      if (kSent[k] < kExpected[k]) {
        EXPECT_NE(what.find("sent " + std::to_string(kSent[k])), std::string::npos) << what;
      }
    }
  }
}

TEST(CommMpi, AsyncP2pBadPeerAndTag) {
  int x = 0;
  auto work = g_comm->SendAsync(&x, sizeof(x), g_comm->size(), /*tag=*/0);  // no such rank
  try {
    (void)work->Wait(30);
    ADD_FAILURE() << "expected keel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SendAsync"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)g_comm->SendAsync(&x, sizeof(x), 0, /*tag=*/-1), Error);
  EXPECT_THROW((void)g_comm->RecvAsync(&x, sizeof(x), 0, /*tag=*/INT_MAX), Error);
}

}  // namespace
}  // namespace keel::parallel
