// What a checkpoint holds, as the trainer hands it over: the tensors (name, global shape, offset
// into the flat buffers), the flat buffers by kind, and the non-tensor state as JSON.
//
// The bf16 working weights are not written: they are round-to-nearest of the fp32 master, a pure
// function of it, so a resume rebuilds them bit for bit and a save is 2 bytes/param smaller.
// Without a master (optim.master_weights = false) they are the state, written widened as "master".
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keel/core/dtype.h"

namespace keel::ckpt {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // the whole tensor's, as the manifest lists it
  size_t offset = 0;           // elements into each flat buffer
  // Another rank writes this tensor (a pipeline stage's copy of the tied wte, a tensor every
  // tensor-parallel rank holds whole): loaded, not saved.
  bool replica = false;
  // A tensor-parallel shard (model::ParamInfo's cut): `local_shape` is what the flat buffers
  // hold, cut along `tp_axis` in blocks (`tp_blocks`: their extents in the whole tensor; empty:
  // one block), each in equal parts, of which this rank holds part tp_rank.
  // Empty local_shape: the whole tensor.
  std::vector<int64_t> local_shape = {};
  int tp_axis = -1, tp_rank = 0;
  std::vector<int64_t> tp_blocks = {};

  const std::vector<int64_t>& held_shape() const {
    return local_shape.empty() ? shape : local_shape;
  }
  uint64_t numel() const {  // elements held
    uint64_t n = 1;
    for (int64_t d : held_shape()) n *= uint64_t(d);
    return n;
  }
};

// A buffer of fp32 or bf16 elements. Checkpoints hold fp32 whatever the run keeps: bf16 buffers
// (moments with optim.state_dtype = "bf16", weights without a master) are saved widened, exactly,
// and loaded rounded to nearest, which gives their bits back; a run may resume with another
// state dtype, and every reader and tool sees one format.
struct FlatBuffer {
  FlatBuffer() = default;
  FlatBuffer(std::string k, void* d, DType t = DType::kF32)
      : kind(std::move(k)), data(d), dtype(t) {}
  std::string kind;      // "master" | "adam_m" | "adam_v"
  void* data = nullptr;  // laid out as the TensorSpecs say
  DType dtype = DType::kF32;
  // A buffer that is not in memory (an offload tier), where data is null: its elements
  // [at, at + n) into host memory and back. `read` may run on several threads at once.
  std::function<void(size_t at, size_t n, void* host)> read;
  std::function<void(size_t at, size_t n, const void* host)> write;
};

// The buffers hold the flat range [lo, hi) of the layout (hi 0: all of it), element 0 at lo: a
// ZeRO shard or a whole replica. A save writes this rank's ZeRO slice of it; a load fills it.
//
// `tensors` are this rank's layout (a pipeline stage's part of the model); `all_tensors` the
// whole model's, which the manifest lists (empty: the same). The ranks that hold the same
// tensors split the writing: part `part` of `parts` (-1: the writer's rank of its world).
// State only one rank holds, of no other rank's layout (the int8 gradient sums' error-feedback
// residual): written whole by that rank as a one-axis tensor of kind kOwnKind under `name`,
// which must differ between ranks, and loaded by the rank that asks for the same name and size.
// A save copies it when it begins (it may change before the next update). A load that does not
// find it zeroes it, unless `keep_if_missing` (the owner fills it another way). `stand_in`, where
// set, is an fnmatch pattern for a tensor of the same size to load instead when `name` is not
// there: the first own tensor of the manifest it matches (a DiLoCo replica's state, saved when the
// run had another number of replicas, under that width's name).
struct OwnBuffer {
  std::string name;
  float* data = nullptr;
  size_t n = 0;
  bool keep_if_missing = false;
  std::string stand_in;
};

struct StateView {
  int64_t step = 0;
  size_t lo = 0, hi = 0;
  int part = -1, parts = 0;
  std::vector<TensorSpec> all_tensors;
  uint64_t tokens = 0;
  nlohmann::json state = nlohmann::json::object();  // Manifest::state
  std::vector<TensorSpec> tensors;
  std::vector<FlatBuffer> buffers;
  std::vector<OwnBuffer> own;
};

// A box of a tensor (start and count along each axis) that is also one contiguous run
// [flat, flat + numel) of its row-major elements: how a flat slice of the layout, which may start
// and end mid-row, is described in a manifest of boxes.
struct Box {
  std::vector<int64_t> start, count;
  uint64_t flat = 0, numel = 0;
};
// The elements [a, b) of a row-major tensor of `shape`, as at most 2·rank - 1 boxes in order.
std::vector<Box> BoxesOf(const std::vector<int64_t>& shape, uint64_t a, uint64_t b);

// The part of tensor `t` in the flat range [lo, hi) of the layout, as boxes of the whole tensor
// (flat: within what this rank holds of t, each box a contiguous run of it). A tensor-parallel
// shard's run is cut where its blocks end (c_attn's q, k, v).
std::vector<Box> TensorBoxesIn(const TensorSpec& t, size_t lo, size_t hi);

}  // namespace keel::ckpt
