#include "keel/model/segment_pack.h"

#include <algorithm>

#include "keel/model/quantize.h"

namespace keel::model {
namespace {

size_t Aligned(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

std::vector<SegmentPack> SegmentPacks(const ParamLayout& layout, DType dtype) {
  const BaseQuant q = layout.base_quant();
  std::vector<SegmentPack> packs(size_t(layout.segments()));
  size_t at = 0;
  for (int s = 0; s < layout.segments(); ++s) {
    SegmentPack& p = packs[size_t(s)];
    const size_t work =
        (layout.segment_work_end(s) - layout.segment_work_start(s)) * DTypeSize(dtype);
    const size_t codes =
        CodeByte(q, layout.segment_quant_end(s)) - CodeByte(q, layout.segment_quant_start(s));
    const size_t scales = 4 * (layout.segment_scale_end(s) - layout.segment_scale_start(s));
    p.start = at;
    p.codes = Aligned(work);
    p.scales = p.codes + Aligned(codes);
    p.bytes = p.scales + Aligned(scales);
    at += p.bytes;
  }
  return packs;
}

size_t PackWorkAt(const ParamLayout& layout, DType dtype, int s, const ParamInfo& p) {
  return (p.work_offset - layout.segment_work_start(s)) * DTypeSize(dtype);
}

size_t PackCodesAt(const ParamLayout& layout, const SegmentPack& pack, int s, const ParamInfo& p) {
  const BaseQuant q = layout.base_quant();
  // nf4's matrices hold whole groups of 64 codes: every quant_offset is even, every byte whole.
  return pack.codes + CodeByte(q, p.quant_offset) - CodeByte(q, layout.segment_quant_start(s));
}

size_t PackScalesAt(const ParamLayout& layout, const SegmentPack& pack, int s, const ParamInfo& p) {
  return pack.scales + 4 * (p.scale_offset - layout.segment_scale_start(s));
}

void UnpackSegments(const ParamLayout& layout, DType dtype, const std::vector<SegmentPack>& packs,
                    const char* packed, char* working, uint8_t* codes, float* scales) {
  const BaseQuant q = layout.base_quant();
  for (int s = 0; s < layout.segments(); ++s) {
    const SegmentPack& p = packs[size_t(s)];
    const char* at = packed + p.start;
    const size_t eb = DTypeSize(dtype);
    // host: every buffer here is host memory (segment_pack.h)
    std::copy_n(at, (layout.segment_work_end(s) - layout.segment_work_start(s)) * eb,
                working + layout.segment_work_start(s) * eb);
    // host: as above
    std::copy_n(
        at + p.codes,
        CodeByte(q, layout.segment_quant_end(s)) - CodeByte(q, layout.segment_quant_start(s)),
        codes + CodeByte(q, layout.segment_quant_start(s)));
    // host: as above
    std::copy_n(at + p.scales, 4 * (layout.segment_scale_end(s) - layout.segment_scale_start(s)),
                reinterpret_cast<char*>(scales + layout.segment_scale_start(s)));
  }
}

int SegmentOf(const ParamLayout& layout, const ParamInfo& p) {
  int s = 0;
  while (s + 1 < layout.segments() && layout.segment_start(s + 1) <= p.offset) ++s;
  return s;
}

}  // namespace keel::model
