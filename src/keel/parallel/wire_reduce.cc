#include "keel/parallel/wire_reduce.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>

#include "keel/parallel/dims.h"

namespace keel::parallel {
namespace {

// The buffers of one reduction, kept alive by its handle.
struct Scratch {
  std::unique_ptr<char[]> send, recv;  // uninitialized: every byte read is written first
  size_t send_cap = 0, recv_cap = 0;
};

// Scratch kept from one reduction for the next: fresh buffers are fresh pages, and a 26 MB
// bucket's pair cost 18.6 ms of page faults on the communication thread, against 2.3 ms to write
// them again (one core of the AMX Xeon), a step's whole gradients' worth every step. A request
// takes the smallest free pair that fits, else grows the largest free one, else makes one: the
// pool holds as many pairs as were ever in flight at once, as large as the largest request.
class ScratchPool {
 public:
  std::shared_ptr<Scratch> Take(size_t send, size_t recv) {
    std::unique_ptr<Scratch> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto size = [](const auto& f) { return f->send_cap + f->recv_cap; };
      auto best = free_.end();  // the smallest that fits
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if ((*it)->send_cap >= send && (*it)->recv_cap >= recv &&
            (best == free_.end() || size(*it) < size(*best)))
          best = it;
      if (best == free_.end())  // else the largest, to grow
        best = std::max_element(free_.begin(), free_.end(),
                                [&](const auto& a, const auto& b) { return size(a) < size(b); });
      if (best != free_.end()) {
        s = std::move(*best);
        free_.erase(best);
      }
    }
    if (!s) s = std::make_unique<Scratch>();
    if (s->send_cap < send) s->send.reset(new char[s->send_cap = send]);
    if (s->recv_cap < recv) s->recv.reset(new char[s->recv_cap = recv]);
    return std::shared_ptr<Scratch>(s.release(), [this](Scratch* back) { Give(back); });
  }
  size_t bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& f : free_) n += f->send_cap + f->recv_cap;
    return n;
  }

 private:
  void Give(Scratch* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace_back(s);
  }
  std::mutex mu_;
  std::vector<std::unique_ptr<Scratch>> free_;
};

// Never destroyed: a reduction's handle may return its scratch during static destruction.
ScratchPool& Pool() {
  static auto* pool = new ScratchPool;
  return *pool;
}

// The operations of one reduction, waited in order under one deadline.
class ChainWork final : public Work {
 public:
  ChainWork(std::vector<std::unique_ptr<Work>> ops, std::shared_ptr<Scratch> keep)
      : ops_(std::move(ops)), keep_(std::move(keep)) {}
  // Not finished (a lost peer; the process is on its way to exit 75): MPI may still write into
  // the scratch, which is leaked on purpose rather than freed under it.
  ~ChainWork() override {
    if (next_ < ops_.size()) new std::shared_ptr<Scratch>(std::move(keep_));
  }
  bool Wait(double timeout_s) override {
    const auto start = std::chrono::steady_clock::now();
    for (; next_ < ops_.size(); ++next_) {
      double left = -1;
      if (timeout_s >= 0) {
        const double spent =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        left = std::max(0.0, timeout_s - spent);
      }
      if (!ops_[next_]->Wait(left)) return false;
    }
    return true;
  }
  std::string describe() const override {
    return next_ < ops_.size() ? ops_[next_]->describe() : "";
  }

 private:
  std::vector<std::unique_ptr<Work>> ops_;
  std::shared_ptr<Scratch> keep_;
  size_t next_ = 0;
};

std::unique_ptr<Work> OnWire(Comm& c, GradWire w, float* x, const std::vector<size_t>& counts,
                             float* err, bool all_reduce) {
  const int p = c.size();
  const size_t r = size_t(c.rank());
  std::vector<size_t> at(counts.size()), bytes(counts.size()), wat(counts.size());
  size_t elems = 0, total = 0;
  for (size_t k = 0; k < counts.size(); ++k) {
    at[k] = elems;
    wat[k] = total;
    bytes[k] = WireBytes(w, counts[k]);
    elems += counts[k];
    total += bytes[k];
  }
  const size_t mine = counts[r], mb = bytes[r];
  std::shared_ptr<Scratch> s =
      Pool().Take(std::max<size_t>(total, 1), std::max<size_t>(size_t(p) * mb, 1));
  char *send = s->send.get(), *recv = s->recv.get();

  std::vector<std::unique_ptr<Work>> ops;
  ops.push_back(c.ThenAsync([=] {
    for (size_t k = 0; k < counts.size(); ++k)
      Encode(w, x + at[k], counts[k], send + wat[k], err ? err + at[k] : nullptr, Feedback::kCarry);
    return std::string();
  }));
  ops.push_back(c.AllToAllAsync(send, recv, bytes));
  ops.push_back(c.ThenAsync([=] {
    // In fp32, in rank order: the same bits whatever order the pieces arrived in.
    float* sum = all_reduce ? x + at[r] : x;
    Decode(w, recv, mine, sum);
    for (int k = 1; k < p; ++k) DecodeAdd(w, recv + size_t(k) * mb, mine, sum);
    if (all_reduce)
      Encode(w, sum, mine, send + wat[r], err ? err + at[r] : nullptr, Feedback::kAccumulate);
    return std::string();
  }));
  if (all_reduce) {
    std::vector<size_t> floats(bytes.size());
    for (size_t k = 0; k < bytes.size(); ++k) floats[k] = bytes[k] / 4;
    // Moved, never summed: the encoded bytes travel as fp32 elements (WireBytes rounds to 4).
    ops.push_back(c.AllGatherAsync(send + wat[r], send, floats, DType::kF32));
    ops.push_back(c.ThenAsync([=] {
      for (size_t k = 0; k < counts.size(); ++k) Decode(w, send + wat[k], counts[k], x + at[k]);
      return std::string();
    }));
  }
  return std::make_unique<ChainWork>(std::move(ops), std::move(s));
}

}  // namespace

std::unique_ptr<Work> AllReduceOnWire(Comm& c, GradWire w, float* x, size_t n, float* err) {
  if (w == GradWire::kF32 || c.size() == 1) return c.AllReduceSumAsync(x, n);
  std::vector<size_t> counts(size_t(c.size()));
  for (int k = 0; k < c.size(); ++k) counts[size_t(k)] = Shard(n, c.size(), k).numel();
  return OnWire(c, w, x, counts, err, /*all_reduce=*/true);
}

std::unique_ptr<Work> ReduceScatterOnWire(Comm& c, GradWire w, float* x,
                                          const std::vector<size_t>& counts, float* err) {
  if (w == GradWire::kF32 || c.size() == 1)
    return c.ReduceScatterSumAsync(x, x, counts, DType::kF32);
  return OnWire(c, w, x, counts, err, /*all_reduce=*/false);
}

size_t WireScratchBytesFree() { return Pool().bytes(); }

}  // namespace keel::parallel
