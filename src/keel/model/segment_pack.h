// A LoRA run's working copy as ZeRO 3 shards it (train::ZeroStrategy; FSDP-QLoRA): every
// segment's frozen base and adapters in the form the products read, as one run of bytes per
// segment that the data-parallel group cuts into equal shards and all-gathers a segment at a
// time. Segment s's pack is its working elements (ParamLayout::segment_work_start on, the working
// dtype), then its quantized matrices' codes, then their fp32 scales; each piece starts on 64
// bytes, so that the scales are aligned wherever the pack lands and the packs, laid end to end,
// are whole 4-byte words that the shards cut without splitting an element.
//
//   std::vector<SegmentPack> packs = SegmentPacks(layout, DType::kBF16);
//   char* w = pack_bytes + 0;                 // segment_work_start(s) is element 0
//   uint8_t* c = pack_bytes + packs[s].codes;  // segment_quant_start(s) is code 0
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "keel/core/dtype.h"
#include "keel/model/params.h"

namespace keel::model {

struct SegmentPack {
  size_t start = 0;              // its first byte in the packed copy (a multiple of 64)
  size_t codes = 0, scales = 0;  // where its codes and its scales begin, from its start
  size_t bytes = 0;              // its size (a multiple of 64)
};

// One per segment of `layout`, in order; the packed copy is back().start + back().bytes.
std::vector<SegmentPack> SegmentPacks(const ParamLayout& layout, DType dtype);
inline size_t PackedBytes(const std::vector<SegmentPack>& packs) {
  return packs.empty() ? 0 : packs.back().start + packs.back().bytes;
}

// Where tensor p (of segment s) lives in its segment's pack, in bytes from the pack's start: its
// working elements', or (quantized) its codes' and its scales'.
size_t PackWorkAt(const ParamLayout& layout, DType dtype, int s, const ParamInfo& p);
size_t PackCodesAt(const ParamLayout& layout, const SegmentPack& pack, int s, const ParamInfo& p);
size_t PackScalesAt(const ParamLayout& layout, const SegmentPack& pack, int s, const ParamInfo& p);

// The packed copy (PackedBytes(packs) bytes at `packed`, host memory) laid out as one rank's
// working copy (ParamLayout::work_total() elements of `dtype`), codes and scales.
void UnpackSegments(const ParamLayout& layout, DType dtype, const std::vector<SegmentPack>& packs,
                    const char* packed, char* working, uint8_t* codes, float* scales);

// The segment that holds tensor p.
int SegmentOf(const ParamLayout& layout, const ParamInfo& p);

}  // namespace keel::model
