#include "keel/model/fp8_products.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "keel/core/error.h"

namespace keel::model::internal {

void Fp8Setup(Transformer::Impl& m) {
  Fp8State& f = m.fp8;
  f.on = m.cfg.fp8;
  if (!f.on) return;
  const int blocks = m.stage.l1 - m.stage.l0;
  f.products.assign(size_t(4 * blocks), Fp8Product(m.cfg.fp8_recipe));
  f.bf16_block.assign(size_t(blocks), 0);
  const char* dir = std::getenv("KEEL_FP8_RECORD");
  if (dir == nullptr || *dir == '\0') return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) ThrowBadInput("KEEL_FP8_RECORD: cannot create " + std::string(dir) + ": " + ec.message());
  const std::string base = std::string(dir) + "/";
  // One recorder per process and stage piece: a chunk's file names its first block.
  const std::string tag = std::to_string(::getpid()) + "." + std::to_string(m.stage.l0);
  f.views.reset(std::fopen((base + "views." + tag + ".bin").c_str(), "wb"));
  f.steps.reset(std::fopen((base + "steps." + tag + ".jsonl").c_str(), "w"));
  if (!f.views || !f.steps) ThrowBadInput("KEEL_FP8_RECORD: cannot write in " + std::string(dir));
  const char* views = std::getenv("KEEL_FP8_RECORD_VIEWS");
  f.views_left = views ? std::atoi(views) : 48;
}

Fp8Product* Fp8Of(Transformer::Impl& m, int layer, int k, bool adapted) {
  Fp8State& f = m.fp8;
  if (!f.on || adapted || layer == 0 || layer == m.cfg.n_layer - 1) return nullptr;
  const int i = layer - m.stage.l0;
  if (f.bf16_block[size_t(i)]) return nullptr;
  return &f.products[size_t(4 * i + k)];
}

std::vector<float> Fp8StepAmax(const Transformer::Impl& m) {
  std::vector<float> amax;
  for (const Fp8Product& p : m.fp8.products)
    for (const Fp8Tracker* t : {&p.x, &p.w, &p.dy})
      amax.push_back(std::isfinite(t->step_amax()) ? t->step_amax() : INFINITY);
  return amax;
}

std::vector<std::string> Fp8EndStep(Transformer::Impl& m, const std::vector<float>& amax) {
  Fp8State& f = m.fp8;
  KEEL_CHECK(amax.size() == 3 * f.products.size(), "Fp8EndStep: one amax per tracker");
  ++f.step;
  std::vector<std::string> lines;
  for (size_t j = 0; j < f.products.size(); ++j) {
    const int i = int(j / 4), k = int(j % 4), layer = m.stage.l0 + i;
    // A block in bf16 (always, or since it fell back) has nothing to judge.
    if (layer == 0 || layer == m.cfg.n_layer - 1 || f.bf16_block[size_t(i)]) continue;
    for (int t = 0; t < 3; ++t) {
      Fp8Tracker& tr = f.products[j].tensor(t);
      const float a = amax[3 * j + size_t(t)];
      const std::string why = tr.EndStep(a);
      if (f.steps) {
        char amax_text[32] = "Infinity";  // Python's json reads it; the amaxes are never NaN
        if (std::isfinite(a)) std::snprintf(amax_text, sizeof amax_text, "%.9g", double(a));
        std::fprintf(f.steps.get(),
                     "{\"step\": %d, \"layer\": %d, \"product\": %d, \"tensor\": \"%s\", "
                     "\"amax\": %s, \"history_max\": %.9g, \"fallback\": %s}\n",
                     f.step, layer, k, Fp8TensorName(t), amax_text, double(tr.history_max()),
                     why.empty() ? "false" : "true");
      }
      if (why.empty() || f.bf16_block[size_t(i)]) continue;
      f.bf16_block[size_t(i)] = 1;
      lines.push_back("block " + std::to_string(layer) + " " + Fp8ProductName(m.cfg.llama(), k) +
                      " " + Fp8TensorName(t) + ": " + why);
    }
  }
  if (f.steps) std::fflush(f.steps.get());
  return lines;
}

namespace {
size_t HistorySlots(const Transformer::Impl& m) {
  return size_t(std::max(1, m.cfg.fp8_recipe.history));
}
}  // namespace

size_t Fp8StateFloats(const Transformer::Impl& m) {
  if (!m.fp8.on) return 0;
  return m.fp8.bf16_block.size() + m.fp8.products.size() * 3 * (1 + HistorySlots(m));
}

void Fp8SaveState(const Transformer::Impl& m, float* out) {
  const Fp8State& f = m.fp8;
  for (char b : f.bf16_block) *out++ = b ? 1.0f : 0.0f;
  const size_t slots = HistorySlots(m);
  for (const Fp8Product& p : f.products)
    for (const Fp8Tracker* t : {&p.x, &p.w, &p.dy}) {
      const std::vector<float> h = t->history();
      *out++ = float(h.size());
      for (size_t i = 0; i < slots; ++i) *out++ = i < h.size() ? h[i] : 0.0f;
    }
}

void Fp8LoadState(Transformer::Impl& m, const float* in) {
  Fp8State& f = m.fp8;
  for (char& b : f.bf16_block) b = *in++ != 0.0f;
  const size_t slots = HistorySlots(m);
  for (Fp8Product& p : f.products)
    for (int t = 0; t < 3; ++t) {
      const size_t n = std::min(slots, size_t(*in++));
      p.tensor(t).Restore(std::vector<float>(in, in + n));
      in += slots;
    }
}

void Fp8Record(Transformer::Impl& m, const Fp8Tracker& t, const void* in, const void* out, size_t n,
               float scale, float amax) {
  Fp8State& f = m.fp8;
  --f.views_left;
  const size_t bytes = n * DTypeSize(m.dtype);
  std::vector<char> a(bytes), b(bytes);
  m.be->ToHost(a.data(), in, bytes);
  m.be->ToHost(b.data(), out, bytes);
  // Header: format (0 E4M3, 1 E5M2), element bytes (2: bf16, 4: fp32), scale, amax, n.
  const int32_t head[2] = {t.format() == Fp8Format::kE4M3 ? 0 : 1, int32_t(DTypeSize(m.dtype))};
  const float sa[2] = {scale, amax};
  const uint64_t count = n;
  std::FILE* v = f.views.get();
  bool ok = std::fwrite(head, sizeof head, 1, v) == 1 && std::fwrite(sa, sizeof sa, 1, v) == 1 &&
            std::fwrite(&count, sizeof count, 1, v) == 1 &&
            std::fwrite(a.data(), 1, bytes, v) == bytes &&
            std::fwrite(b.data(), 1, bytes, v) == bytes;
  if (!ok || std::fflush(v) != 0) ThrowRuntime("KEEL_FP8_RECORD: a write failed");
}

}  // namespace keel::model::internal
