// What a checkpoint holds, as the trainer hands it over: the tensors (name, global shape, offset
// into the flat buffers), the flat fp32 buffers by kind, and the non-tensor state as JSON.
//
// The bf16 working weights are not written: they are round-to-nearest of the fp32 master, a pure
// function of it, so a resume rebuilds them bit for bit and a save is 2 bytes/param smaller.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace keel::ckpt {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // elements into each flat buffer

  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= uint64_t(d);
    return n;
  }
};

struct FlatBuffer {
  std::string kind;       // "master" | "adam_m" | "adam_v"
  float* data = nullptr;  // laid out as the TensorSpecs say
};

struct StateView {
  int64_t step = 0;
  uint64_t tokens = 0;
  nlohmann::json state = nlohmann::json::object();  // Manifest::state
  std::vector<TensorSpec> tensors;
  std::vector<FlatBuffer> buffers;
};

// The rows [r0, r1) of axis 0 of a tensor that `rank` of `world` writes: every tensor is split
// in near-equal row blocks, so each rank writes about 1/world of the state and save bandwidth
// grows with ranks. A tensor with fewer rows than ranks leaves some ranks without a piece of it.
struct RowSlice {
  int64_t r0 = 0, r1 = 0;
  uint64_t inner = 0;  // elements per row
  size_t numel() const { return size_t(r1 - r0) * inner; }
};
inline RowSlice RowsOf(const TensorSpec& t, int rank, int world) {
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  return {rows * rank / world, rows * (rank + 1) / world, rows ? t.numel() / uint64_t(rows) : 0};
}

}  // namespace keel::ckpt
