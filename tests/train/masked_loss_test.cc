// The loss mask through the rows and the model: tokens the mask leaves out of the loss, and that
// nothing trained on reads (a closing user turn), do not change the gradients at all; the same
// change trains the model when the mask is off, and a change to an assistant's turn does too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "keel/data/chat_format.h"
#include "keel/data/shard_writer.h"
#include "keel/data/windows.h"
#include "keel/model/transformer.h"

namespace keel::train {
namespace {

using data::ChatTemplate;
using data::DocFormat;

const data::Tokenizer& Gpt2() {
  static const data::Tokenizer tok =
      data::Tokenizer::LoadGpt2(std::string(KEEL_ASSET_DIR) + "/gpt2");
  return tok;
}

std::string Conversation(const std::string& answer, const std::string& closing) {
  return R"({"messages": [{"role": "system", "content": "Answer in one word."},
                          {"role": "user", "content": "What colour is the sky?"},
                          {"role": "assistant", "content": ")" +
         answer + R"("}, {"role": "user", "content": ")" + closing + R"("}]})";
}

struct Result {
  std::vector<float> grads;
  double loss = 0;
  int scored = 0;
};

// One conversation as a dataset (loss-masked, or every token trained on), its one row through a
// tiny GPT-2 in fp32: the loss's gradients as the trainer seeds them (1 / targets trained on).
Result Grads(const std::string& line, bool masked) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  EXPECT_EQ(data::RenderInstructionLine(line, DocFormat::kChat, ChatTemplate::kPlain, Gpt2(),
                                        &tokens, &mask),
            "");
  const std::string dir = testing::TempDir() + "/keel_masked_loss_" + std::to_string(masked);
  data::ShardWriterOptions o;
  o.masked = true;
  if (!masked) mask.assign(mask.size(), 1);
  data::ShardWriter w(dir, o);
  w.AddDocument(tokens, mask);
  w.Finish();
  const data::TokenDataset ds = data::TokenDataset::Open(dir);
  const int T = 64;
  EXPECT_LT(int(tokens.size()), T);  // one row, padded
  data::SampleWindows rows(ds, T);
  EXPECT_EQ(rows.count(), 1u);
  std::vector<int32_t> tok(T), tgt(T);
  Result r;
  r.scored = rows.Read(0, tok.data(), tgt.data());
  const model::ModelConfig cfg{2, 2, 32, 50257, 64};
  model::Transformer m(cfg, DType::kF32, 1, T, model::Recompute::kNone);
  model::InitParams(m.layout(), cfg, 3, m.master());
  m.ZeroGrads();
  r.loss = m.ForwardBackward(tok.data(), tgt.data(), 1.0f / float(r.scored)) / r.scored;
  r.grads.assign(m.grads(), m.grads() + m.layout().total());
  return r;
}

TEST(MaskedLoss, TokensOutsideTheMaskDoNotChangeTheGradients) {
  const Result a = Grads(Conversation("Blue.", "Thanks!"), true);
  const Result b = Grads(Conversation("Blue.", "Are you sure about that?"), true);
  EXPECT_EQ(a.scored, b.scored);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_TRUE(a.grads == b.grads) << "the closing user turn changed the gradients";

  // Controls: without the mask the same change is trained on; an assistant's change always is.
  const Result c = Grads(Conversation("Blue.", "Thanks!"), false);
  const Result d = Grads(Conversation("Blue.", "Are you sure about that?"), false);
  EXPECT_GT(c.scored, a.scored);
  EXPECT_FALSE(c.grads == d.grads);
  const Result e = Grads(Conversation("Grey.", "Thanks!"), true);
  EXPECT_FALSE(a.grads == e.grads);
}

}  // namespace
}  // namespace keel::train
