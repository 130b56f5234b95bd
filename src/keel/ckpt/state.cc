#include "keel/ckpt/state.h"

#include <algorithm>

namespace keel::ckpt {
namespace {

void Decompose(const std::vector<int64_t>& shape, size_t dim, std::vector<int64_t>& prefix,
               uint64_t base, uint64_t a, uint64_t b, std::vector<Box>& out) {
  if (a >= b) return;
  auto box = [&](std::vector<int64_t> start, std::vector<int64_t> count, uint64_t flat,
                 uint64_t n) {
    out.push_back({std::move(start), std::move(count), flat, n});
  };
  const size_t rank = shape.size();
  std::vector<int64_t> start = prefix, count(prefix.size(), 1);
  if (dim + 1 >= rank) {  // the last axis: one run
    if (rank == 0) return box({}, {}, base + a, b - a);
    start.push_back(int64_t(a));
    count.push_back(int64_t(b - a));
    return box(start, count, base + a, b - a);
  }
  uint64_t inner = 1;
  for (size_t d = dim + 1; d < rank; ++d) inner *= uint64_t(shape[d]);
  uint64_t r = a / inner;
  if (a % inner) {  // a partial first row
    const uint64_t end = std::min(b, (r + 1) * inner);
    prefix.push_back(int64_t(r));
    Decompose(shape, dim + 1, prefix, base + r * inner, a - r * inner, end - r * inner, out);
    prefix.pop_back();
    a = end;
    r += 1;
  }
  const uint64_t full_end = b / inner;
  if (a < b && full_end > r) {  // whole rows
    start.push_back(int64_t(r));
    count.push_back(int64_t(full_end - r));
    for (size_t d = dim + 1; d < rank; ++d) {
      start.push_back(0);
      count.push_back(shape[d]);
    }
    box(start, count, base + r * inner, (full_end - r) * inner);
    a = full_end * inner;
  }
  if (a < b) {  // a partial last row
    const uint64_t row = a / inner;
    prefix.push_back(int64_t(row));
    Decompose(shape, dim + 1, prefix, base + row * inner, a - row * inner, b - row * inner, out);
    prefix.pop_back();
  }
}

}  // namespace

std::vector<Box> BoxesOf(const std::vector<int64_t>& shape, uint64_t a, uint64_t b) {
  std::vector<Box> out;
  std::vector<int64_t> prefix;
  Decompose(shape, 0, prefix, 0, a, b, out);
  return out;
}

std::vector<Box> TensorBoxesIn(const TensorSpec& t, size_t lo, size_t hi) {
  const size_t a = std::max(lo, t.offset), b = std::min(hi, t.offset + size_t(t.numel()));
  if (a >= b) return {};
  std::vector<Box> held = BoxesOf(t.held_shape(), a - t.offset, b - t.offset);
  if (t.local_shape.empty() || t.tp_axis < 0) return held;
  // Shards cut along a later axis (the projections' input columns, one block) map box for box;
  // along axis 0 a box of whole rows may span blocks (q, k, v) and is cut at their ends.
  const size_t ax = size_t(t.tp_axis);
  const std::vector<int64_t> blocks = t.tp_blocks.empty() ? std::vector{t.shape[ax]} : t.tp_blocks;
  const int64_t tp = t.shape[ax] / t.local_shape[ax];
  std::vector<Box> out;
  for (const Box& h : held) {
    int64_t s = h.start[ax];
    const int64_t end = s + h.count[ax];
    while (s < end) {
      // The block that shard index s falls in: its first index in the shard (l0) and whole (g0).
      size_t g = 0;
      int64_t l0 = 0, g0 = 0;
      for (; l0 + blocks[g] / tp <= s; ++g) l0 += blocks[g] / tp, g0 += blocks[g];
      const int64_t part = blocks[g] / tp, e = std::min(end, l0 + part);
      Box o = h;
      o.start[ax] = g0 + t.tp_rank * part + (s - l0);
      o.count[ax] = e - s;
      if (ax == 0) {  // a box of several rows spans whole rows; one row may be partial
        const uint64_t per_row = h.numel / uint64_t(h.count[0]);
        o.flat = h.flat + uint64_t(s - h.start[ax]) * per_row;
        o.numel = uint64_t(e - s) * per_row;
      }
      out.push_back(o);
      s = e;
    }
  }
  return out;
}

}  // namespace keel::ckpt
