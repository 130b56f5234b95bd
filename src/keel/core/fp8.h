// fp8 numbers as Hopper's tensor cores take them (the OCP 8-bit formats): E4M3 for weights and
// activations (4 exponent bits, bias 7, 3 mantissa bits; finite only, largest 448, NaN 0x7F) and
// E5M2 for gradients (bias 15, 2 mantissa bits, largest 57344, with infinities). A tensor is
// multiplied by a scale before it is rounded, and its product divided by the scales after:
//
//   s = Fp8Scale(amax(x), kE4M3);          // a power of two with amax·s ≤ 448
//   x' = RoundFp8(x · s, kE4M3) / s;       // what an fp8 product sees of x
//
// keel's scales are powers of two (Transformer Engine's power_2_scale, MXFP8's choice): dividing
// by one is exact, so x' is exactly representable in bf16, and a bf16 product of x' and w' with
// fp32 accumulation is the fp8 product (CPU emulation: kernels Fp8Round). The cost is at most one
// bit of the range: amax·s lands in (max/2, max].
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace keel {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };
const char* Fp8FormatName(Fp8Format f);  // "e4m3" | "e5m2"

// The largest finite value: 448 (E4M3), 57344 (E5M2).
float Fp8Max(Fp8Format f);

// x rounded to the nearest value of the format, ties to even, saturating at ±max (cuBLASLt's and
// Transformer Engine's __NV_SATFINITE: an infinity too); NaN stays NaN. Values below the smallest
// subnormal (2^-9, 2^-16) round to ±0.
float RoundFp8(float x, Fp8Format f);

// The format's 8-bit code of x (rounded as RoundFp8), and back.
uint8_t ToFp8(float x, Fp8Format f);
float FromFp8(uint8_t code, Fp8Format f);

// The scale for a tensor whose largest magnitude is amax: 2^floor(log2(max / amax)), within
// [2^-126, 2^126]. amax 0, negative or not finite: 1 (nothing to scale; the caller decides what a
// non-finite amax means).
float Fp8Scale(float amax, Fp8Format f);

// How one tensor of one product is scaled over a run, and when it gives up on fp8.
//   current: each use scales by its own amax (Transformer Engine's current scaling).
//   delayed: each step scales by the largest amax of the last `history` steps, known before the
//            step (TE's delayed scaling, "max" algorithm); the step's own amax joins the history
//            when the step ends. A history that is empty or all zero scales as current.
// EndStep judges the step: a non-finite amax, or (after `history` steps) one above `spike` times
// the history's largest, is a reason to run the product's layer in bf16 from then on.
struct Fp8Recipe {
  bool delayed = false;
  int history = 16;
  double spike = 64;  // 0: no spike test
};

class Fp8Tracker {
 public:
  Fp8Tracker(Fp8Format f, const Fp8Recipe& r) : format_(f), recipe_(r) {}

  // The scale for a use of the tensor whose amax is `amax`, which also joins the step's unless
  // `observe` is false (a validation pass: it neither judges nor moves the training's scales).
  float Scale(float amax, bool observe = true);
  // Closes the step with its amax (reduced over the ranks that share the tensor, or the step's
  // own: step_amax()); "" when fp8 may go on, else why not ("amax is not finite", "amax 3.1e+05
  // is 120x the last 16 steps' largest (2581)").
  std::string EndStep(float amax);
  // The largest amax of the step's uses so far; +inf once one was NaN or infinite.
  float step_amax() const { return step_amax_; }
  // The largest amax in the history (0 when empty).
  float history_max() const;
  Fp8Format format() const { return format_; }
  // The amax history, oldest first (a checkpoint's), and a history put back: the delayed
  // scales and the spike test go on where they were.
  std::vector<float> history() const { return {history_.begin(), history_.end()}; }
  void Restore(const std::vector<float>& history);

 private:
  Fp8Format format_;
  Fp8Recipe recipe_;
  std::deque<float> history_;
  float step_amax_ = 0;
};

}  // namespace keel
