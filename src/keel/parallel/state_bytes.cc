#include "keel/parallel/state_bytes.h"

#include <algorithm>

#include "keel/core/error.h"

namespace keel::parallel {

StateBytes StateBytesPerRank(const StateShape& s, const ParallelDims& d) {
  const bool bf16 = s.working_bytes == 2;
  const size_t shard = Shard(s.total, d.replicas(), 0).size;
  const size_t state = s.compact() ? s.trainable : s.total;
  const size_t held = d.zero >= 1 ? Shard(state, d.replicas(), 0).size : state;  // master, moments
  const size_t segs = s.embed + s.final_norm + 2 * s.max_block;
  StateBytes b;
  b.master = s.master ? 4 * held : 0;
  b.moments = 2 * size_t(s.moment_bytes) * held;
  b.grads = size_t(s.grad_bytes) * (s.compact() ? s.grads : d.zero >= 2 ? shard : s.total);
  b.biases = bf16 ? 4 * s.n_bias : 0;
  if (s.compact() && d.zero >= 3) {
    // This rank's shard of the packed copy (the first rank's, the largest), in 4-byte words.
    b.working = 4 * Shard(s.packed / 4, d.replicas(), 0).size;
  } else if (s.compact()) {
    // The frozen weights' only copy: in the working dtype, or a quantized base's codes.
    b.working = size_t(s.working_bytes) * (s.working ? s.working : s.total);
    b.quantized = s.quantized;
  } else if (d.zero == 0)
    b.working = bf16 ? 2 * s.total : 0;  // fp32: the master is the working copy
  else if (d.zero <= 2)
    b.working = size_t(s.working_bytes) * s.total;
  else
    b.working = bf16 ? 2 * shard : 0;  // gathered from the bf16 shard, or the fp32 master shard
  // Gradient scratch: reduce-scattered in place (ZeRO >= 2), or the fp32 buckets of bf16 ones.
  // A compact state's gradients (a few MB of adapters') are all-reduced whole at every stage.
  if ((d.zero >= 2 && !s.compact()) || s.grad_bytes == 2) b.zero_buffers += 4 * segs;
  if (d.zero >= 3) b.zero_buffers += s.compact() ? s.packed_slots : size_t(s.working_bytes) * segs;
  b.zero_buffers += 4 * GradSumScratchElems(s, d);
  b.zero_buffers += 4 * GradResidualElems(s, d);
  if (s.diloco) b.zero_buffers += (s.diloco_streaming ? 4 : 2) * 4 * held;
  if (s.offload_chunk > 0) {
    const size_t master = s.master_offloaded() ? b.master : 0;
    auto blocks = [](size_t x) { return (x + 4095) / 4096 * 4096; };  // O_DIRECT's unit
    b.tier = blocks(master) + 2 * blocks(b.moments / 2);
    if (s.working_offloaded()) {
      KEEL_CHECK(d.zero >= 3 && !s.compact(), "StateBytesPerRank: [offload] params is ZeRO 3's");
      b.tier += blocks(b.working);
      b.working = 0;
    }
    const size_t chunk = OffloadChunkElems(s, held);
    b.offload_buffers = !s.offload_host ? OffloadBufferBytes(held, chunk, s.tier_bytes_per_elem())
                        : held          ? (2 * size_t(s.grad_bytes) + 2) * chunk
                                        : 0;
    b.master -= master;
    b.moments = 0;
  }
  return b;
}

size_t GradSumScratchElems(const StateShape& s, const ParallelDims& d) {
  // 4 MiB: the sums are a few norms (tp with sequence parallelism) or one embedding (pp), which
  // pieces of a million elements all-reduce at full speed.
  return s.grad_bytes == 2 && (d.tp > 1 || d.pp > 1) ? size_t(1) << 20 : 0;
}

size_t GradResidualElems(const StateShape& s, const ParallelDims& d) {
  if (s.grad_comm != GradWire::kInt8 || d.replicas() <= 1) return 0;
  return s.compact() ? s.grads : s.total;
}

size_t OffloadBufferBytes(size_t held, size_t chunk_elems, size_t bytes_per_elem) {
  const size_t chunks = (held + chunk_elems - 1) / chunk_elems;
  return chunks ? std::min<size_t>(3, chunks) * chunk_elems * bytes_per_elem + 4096 : 0;
}

size_t OffloadChunkElems(const StateShape& s, size_t held) {
  return OffloadChunkElems(s.offload_chunk, s.tier_bytes_per_elem(), held);
}

size_t OffloadChunkElems(size_t chunk_bytes, size_t bytes_per_elem, size_t held) {
  const size_t want = std::max<size_t>(1, chunk_bytes / bytes_per_elem / 2048) * 2048;
  return std::min(want, std::max<size_t>(2048, (held + 2047) / 2048 * 2048));
}

}  // namespace keel::parallel
