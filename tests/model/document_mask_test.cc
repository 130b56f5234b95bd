// Document masking: in a row that packs two documents, the second one's losses and the gradients
// they produce do not depend on the first document's tokens at all (bitwise), for GPT-2 and
// Llama, fp32 and bf16, with and without recomputation; without the mask they do.
#include <gtest/gtest.h>

#include <vector>

#include "keel/core/rng.h"
#include "keel/model/config.h"
#include "keel/model/transformer.h"

namespace keel::model {
namespace {

constexpr int kEos = 1000;  // a small vocabulary keeps the classifier cheap

struct Out {
  double loss = 0;
  std::vector<float> grads;
};

// Two rows of T = 80: document A (first_len tokens, the last one eos), then document B. Only B's
// targets count. `a_seed` draws A's tokens; B's are the same for every call.
Out Packed(const ModelConfig& cfg, DType dtype, Recompute rc, bool mask, uint64_t a_seed) {
  const int B = 2, T = 80, first_len = 67;  // B's start crosses the 64-row attention tile
  std::vector<int32_t> tokens(size_t(B) * T), targets(tokens.size(), -1);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const bool in_a = t < first_len;
      const Philox rng(in_a ? a_seed : 99, uint64_t(b));
      const size_t i = size_t(b) * T + size_t(t);
      tokens[i] = t == first_len - 1 ? kEos : int32_t(rng.Bits(uint64_t(t))[0] % 1000);
      if (!in_a && t > first_len) targets[i - 1] = tokens[i];  // B predicts its own next tokens
    }
  Transformer m(cfg, dtype, B, T, rc);
  InitParams(m.layout(), cfg, 5, m.master());
  m.SyncWorking();
  if (mask) m.SetDocumentMask(kEos);
  m.ZeroGrads();
  Out o;
  o.loss = m.ForwardBackward(tokens.data(), targets.data(), 0.01f);
  o.grads.assign(m.grads(), m.grads() + m.layout().total());
  return o;
}

TEST(DocumentMask, ADocumentNeverSeesTheOnePackedBeforeIt) {
  const ModelConfig gpt{2, 2, 32, 1024, 128};
  ModelConfig llama = NamedConfig("llama-tiny");
  llama.block_size = 128;
  llama.vocab_size = 1024;
  for (const ModelConfig& cfg : {gpt, llama})
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << (cfg.llama() ? "llama" : "gpt2") << " " << DTypeName(dtype));
      const Out a = Packed(cfg, dtype, Recompute::kNone, true, 1);
      const Out b = Packed(cfg, dtype, Recompute::kNone, true, 2);
      EXPECT_EQ(a.loss, b.loss);
      // Only the weights B's rows touch have gradients; the embedding rows of A's tokens get none
      // either way, so the whole vectors compare.
      EXPECT_TRUE(a.grads == b.grads) << "document A's tokens changed B's gradients";
      const Out full = Packed(cfg, dtype, Recompute::kFull, true, 2);
      EXPECT_EQ(full.loss, b.loss);
      EXPECT_TRUE(full.grads == b.grads) << "recomputation changed the masked gradients";
      // Control: without the mask B reads A.
      const Out c = Packed(cfg, dtype, Recompute::kNone, false, 1);
      const Out d = Packed(cfg, dtype, Recompute::kNone, false, 2);
      EXPECT_NE(c.loss, d.loss);
    }
}

}  // namespace
}  // namespace keel::model
