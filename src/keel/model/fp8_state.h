// What a Transformer keeps for its fp8 block products (ModelConfig::fp8, fp8_products.h): a
// tracker per tensor of each of its blocks' four products, which blocks have fallen back to bf16,
// and the optional record of what the emulation computed (KEEL_FP8_RECORD) that
// tests/reference/fp8_reference.py checks. Internal to model/.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "keel/core/fp8.h"

namespace keel::model::internal {

// A block product's three fp8 tensors: its input and weight (E4M3), its output's gradient (E5M2).
struct Fp8Product {
  explicit Fp8Product(const Fp8Recipe& r)
      : x(Fp8Format::kE4M3, r), w(Fp8Format::kE4M3, r), dy(Fp8Format::kE5M2, r) {}
  Fp8Tracker x, w, dy;
  Fp8Tracker& tensor(int t) { return t == 0 ? x : t == 1 ? w : dy; }
};

// The products of a block, in kLoraTargets' order, by their Hugging Face-style names.
inline const char* Fp8ProductName(bool llama, int k) {
  static const char* gpt2[] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  static const char* llama_names[] = {"attn.qkv", "attn.o_proj", "mlp.gate_up", "mlp.down_proj"};
  return llama ? llama_names[k] : gpt2[k];
}
inline const char* Fp8TensorName(int t) { return t == 0 ? "x" : t == 1 ? "w" : "dy"; }

struct Fp8State {
  bool on = false;
  std::vector<Fp8Product> products;  // local block i's product k at 4·i + k
  std::vector<char> bf16_block;      // local block i has fallen back
  int step = 0;                      // steps ended (EndStep), for the record
  bool observe = true;               // training passes: uses join the step's amax (SetFp8Observe)
  // KEEL_FP8_RECORD=DIR: the first KEEL_FP8_RECORD_VIEWS (default 48) fp8 views of each rank,
  // with what went in and came out, to DIR/views.<rank>.bin, and every step's judgement of each
  // tensor to DIR/steps.<rank>.jsonl.
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> views, steps;
  int views_left = 0;
};

}  // namespace keel::model::internal
