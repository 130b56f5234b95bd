#include "keel/parallel/grad_wire.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "keel/core/dtype.h"
#include "keel/core/error.h"

namespace keel::parallel {
namespace {

size_t Blocks(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

// One block of int8: v (m elements) into codes and its scale, what rounding lost into `lost`.
// A block holding Inf or NaN (an fp16 overflow) gets a NaN scale, so that every element of it
// decodes to NaN and the overflow reaches the gradient norm as it would in fp32; it loses nothing,
// so that no residual carries a NaN into later steps.
// `err` (null: none) receives what rounding lost, or (`add`) has it added.
float QuantizeBlock(const float* v, size_t m, int8_t* codes, float* err, bool add) {
  // Written so that the compiler vectorizes both loops (the encoding runs on the communication
  // thread, in the step's path): the largest magnitude as the largest of the magnitudes' bits
  // (their order is the floats' for finite ones, and Inf's and NaN's bits are above every
  // finite one's), and rounding to nearest even by adding and taking away 1.5·2^23 instead of
  // std::nearbyint.
  uint32_t top = 0;
  for (size_t i = 0; i < m; ++i) top = std::max(top, std::bit_cast<uint32_t>(v[i]) & 0x7fffffffu);
  const float amax = std::bit_cast<float>(top);
  if (top >= 0x7f800000u) {    // Inf or NaN
    std::memset(codes, 0, m);  // host: wire bytes
    if (err) std::fill(err, err + m, 0.0f);
    return std::nanf("");
  }
  if (amax == 0) {             // nothing to send, nothing lost
    std::memset(codes, 0, m);  // host: wire bytes
    if (err && !add) std::fill(err, err + m, 0.0f);
    return 0;
  }
  const float scale = amax / 127.0f, inv = 127.0f / amax;
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: |v·inv| <= 127 rounds to an integer
  if (err && add) {
    for (size_t i = 0; i < m; ++i) {
      const float q = std::min(127.0f, std::max(-127.0f, (v[i] * inv + kRound) - kRound));
      codes[i] = int8_t(int(q));
      err[i] += v[i] - q * scale;
    }
  } else if (err) {  // may be v itself (the sender's x + err, in place)
    for (size_t i = 0; i < m; ++i) {
      const float q = std::min(127.0f, std::max(-127.0f, (v[i] * inv + kRound) - kRound));
      codes[i] = int8_t(int(q));
      err[i] = v[i] - q * scale;
    }
  } else {
    for (size_t i = 0; i < m; ++i) {
      const float q = std::min(127.0f, std::max(-127.0f, (v[i] * inv + kRound) - kRound));
      codes[i] = int8_t(int(q));
    }
  }
  return scale;
}

}  // namespace

const char* GradWireName(GradWire w) {
  return w == GradWire::kF32 ? "fp32" : w == GradWire::kBF16 ? "bf16" : "int8";
}

std::optional<GradWire> ParseGradWire(std::string_view s) {
  if (s == "fp32") return GradWire::kF32;
  if (s == "bf16") return GradWire::kBF16;
  if (s == "int8") return GradWire::kInt8;
  return std::nullopt;
}

size_t WireBytes(GradWire w, size_t n) {
  const size_t raw = w == GradWire::kF32 ? 4 * n : w == GradWire::kBF16 ? 2 * n : 4 * Blocks(n) + n;
  return (raw + 3) / 4 * 4;
}

double WireSentBytes(GradWire w, size_t n, int ranks, bool all_reduce) {
  if (ranks <= 1) return 0;
  return (all_reduce ? 2.0 : 1.0) * double(WireBytes(w, n)) * (ranks - 1) / ranks;
}

void Encode(GradWire w, const float* x, size_t n, void* out, float* err, Feedback fb) {
  if (w == GradWire::kF32) {
    std::memcpy(out, x, 4 * n);  // host: wire bytes
    return;
  }
  if (w == GradWire::kBF16) {
    ConvertF32ToBf16(static_cast<bf16*>(out), x, n);
    return;
  }
  auto* scales = static_cast<float*>(out);
  auto* codes = reinterpret_cast<int8_t*>(scales + Blocks(n));
  const bool carry = err && fb == Feedback::kCarry;
  for (size_t b = 0, at = 0; at < n; ++b, at += kInt8Block) {
    const size_t m = std::min(kInt8Block, n - at);
    float* e = err ? err + at : nullptr;
    if (carry) {  // the residual becomes x + residual, then what rounding it loses
      for (size_t i = 0; i < m; ++i) e[i] += x[at + i];
      scales[b] = QuantizeBlock(e, m, codes + at, e, false);
    } else {
      scales[b] = QuantizeBlock(x + at, m, codes + at, e, true);
    }
  }
}

void DecodeAdd(GradWire w, const void* in, size_t n, float* acc) {
  if (w == GradWire::kF32) {
    const auto* x = static_cast<const float*>(in);
    for (size_t i = 0; i < n; ++i) acc[i] += x[i];
    return;
  }
  if (w == GradWire::kBF16) {
    const auto* x = static_cast<const bf16*>(in);
    for (size_t i = 0; i < n; ++i) acc[i] += ToFloat(x[i]);
    return;
  }
  const auto* scales = static_cast<const float*>(in);
  const auto* codes = reinterpret_cast<const int8_t*>(scales + Blocks(n));
  for (size_t b = 0, at = 0; at < n; ++b, at += kInt8Block) {
    const size_t m = std::min(kInt8Block, n - at);
    for (size_t i = 0; i < m; ++i) acc[at + i] += float(codes[at + i]) * scales[b];
  }
}

void Decode(GradWire w, const void* in, size_t n, float* out) {
  std::fill(out, out + n, 0.0f);
  DecodeAdd(w, in, n, out);
}

}  // namespace keel::parallel
