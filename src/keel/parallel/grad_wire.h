// How data-parallel gradients travel ([parallel] grad_comm): their format on the wire, its bytes,
// and the encoding each rank applies before sending and after receiving. Pure functions over host
// buffers, shared by the reduction (wire_reduce.h), the planner and the tests.
//
//   fp32  the gradients as they are (MPI's own sum)
//   bf16  rounded to nearest even; 2 bytes an element
//   int8  blocks of kInt8Block elements, each as a float scale (its largest magnitude / 127) and
//         one signed byte per element (round to nearest of x / scale); about 1.016 bytes an
//         element. With error feedback, what rounding lost is carried into the next send.
//
// Every receiver sums in fp32 (wire_reduce.h): no rank adds two rounded values in bf16 or int8.
//
//   std::vector<char> wire(WireBytes(GradWire::kInt8, n));
//   Encode(GradWire::kInt8, grads, n, wire.data(), residual, Feedback::kCarry);
//   DecodeAdd(GradWire::kInt8, wire.data(), n, sum);
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace keel::parallel {

enum class GradWire { kF32, kBF16, kInt8 };

inline constexpr size_t kInt8Block = 256;

const char* GradWireName(GradWire w);  // "fp32" | "bf16" | "int8"
std::optional<GradWire> ParseGradWire(std::string_view s);

// The bytes n elements take on the wire, rounded up to whole floats (4 bytes), so that every
// format's pieces can travel by any collective that moves fp32 elements.
size_t WireBytes(GradWire w, size_t n);

// The bytes one rank sends for a sum of n elements over `ranks` in format `w`: a reduce-scatter
// sends (ranks-1)/ranks of the encoded buffer, an all-reduce (a reduce-scatter, then an all-gather
// of the encoded sums) twice that. The ring algorithms' count, which Open MPI's large messages
// and NCCL follow.
double WireSentBytes(GradWire w, size_t n, int ranks, bool all_reduce);

// What Encode does with `err`, int8's error feedback (n floats; null: none):
//   kCarry       sends x + err and keeps in err what rounding lost (a sender's residual)
//   kAccumulate  sends x and adds what rounding lost to err (an owner's rounding of a sum,
//                carried into that rank's next send of the same elements)
enum class Feedback { kCarry, kAccumulate };

// n elements of x into `out` (WireBytes(w, n) bytes). fp32 and bf16 ignore `err`.
void Encode(GradWire w, const float* x, size_t n, void* out, float* err = nullptr,
            Feedback fb = Feedback::kCarry);
// acc[i] += the i-th encoded element of `in`.
void DecodeAdd(GradWire w, const void* in, size_t n, float* acc);
// out[i] = the i-th encoded element of `in`.
void Decode(GradWire w, const void* in, size_t n, float* out);

}  // namespace keel::parallel
