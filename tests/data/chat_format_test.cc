// Instruction data: the loss mask covers exactly the assistant's (or the completion's) tokens,
// under the plain template (GPT-2) and Llama 3's, on hand-made conversations; message text never
// becomes a control token; bad lines are named. Then through `prepare`: the .mask files, their
// hashes, and what verify says when one is damaged.
#include "keel/data/chat_format.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "data/temp_dir.h"
#include "keel/core/error.h"
#include "keel/data/dataset.h"
#include "keel/data/dataset_meta.h"
#include "keel/data/prepare.h"
#include "keel/data/verify.h"

namespace keel::data {
namespace {

const Tokenizer& Gpt2() {
  static const Tokenizer tok = Tokenizer::LoadGpt2(std::string(KEEL_ASSET_DIR) + "/gpt2");
  return tok;
}

// Llama 3's special tokens over a vocabulary of the 256 bytes (so any text encodes, byte by byte):
// the template's tokens without the 2 MB rank file, which the CI machine makes but a unit test
// should not need.
const Tokenizer& Llama3Bytes() {
  static const Tokenizer tok = [] {
    static const char* kAlphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string ranks;
    for (int b = 0; b < 256; ++b) {
      const uint32_t acc = uint32_t(uint8_t(b)) << 16;
      ranks += std::string{kAlphabet[acc >> 18], kAlphabet[(acc >> 12) & 63], '=', '='} + " " +
               std::to_string(b) + "\n";
    }
    TempDir dir;
    std::ofstream(dir / "llama3.tiktoken") << ranks;
    return Tokenizer::Load(dir / "llama3.tiktoken", "unused");
  }();
  return tok;
}

struct Rendered {
  std::string all;      // the whole document, decoded
  std::string trained;  // the trained tokens' runs, decoded, joined by '|'
  std::vector<int32_t> tokens;
};

Rendered Render(const std::string& line, DocFormat f, ChatTemplate t, const Tokenizer& tok) {
  Rendered r;
  std::vector<uint8_t> mask;
  const std::string problem = RenderInstructionLine(line, f, t, tok, &r.tokens, &mask);
  EXPECT_EQ(problem, "");
  EXPECT_EQ(mask.size(), r.tokens.size());
  r.all = tok.Decode(r.tokens);
  for (size_t i = 0; i < r.tokens.size();) {
    if (!mask[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < r.tokens.size() && mask[j]) ++j;
    if (!r.trained.empty()) r.trained += "|";
    r.trained +=
        tok.Decode(std::vector<int32_t>(r.tokens.begin() + long(i), r.tokens.begin() + long(j)));
    i = j;
  }
  return r;
}

const char* kConversation =
    R"({"messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": "Hello!"},
                     {"role": "user", "content": "Your name?"},
                     {"role": "assistant", "content": " keel. "}]})";

TEST(ChatFormat, PlainTemplateTrainsOnTheAssistantsTurnsAndTheFinalEos) {
  const Rendered r = Render(kConversation, DocFormat::kChat, ChatTemplate::kPlain, Gpt2());
  EXPECT_EQ(r.all,
            "System: Be brief.\nUser: Hi\nAssistant: Hello!\nUser: Your name?\nAssistant:  "
            "keel. \n<|endoftext|>");
  EXPECT_EQ(r.trained, " Hello!\n|  keel. \n<|endoftext|>");
}

TEST(ChatFormat, ShareGptConversationsRenderAsMessages) {
  const Rendered a = Render(
      R"({"conversations": [{"from": "system", "value": "S"}, {"from": "human", "value": "Q"},
                            {"from": "gpt", "value": "A"}]})",
      DocFormat::kChat, ChatTemplate::kPlain, Gpt2());
  const Rendered b = Render(
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                       {"role": "assistant", "content": "A"}]})",
      DocFormat::kChat, ChatTemplate::kPlain, Gpt2());
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.trained, " A\n<|endoftext|>");
}

TEST(ChatFormat, AConversationEndingWithTheUserTrainsNoEos) {
  const Rendered r = Render(
      R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"},
                       {"role": "user", "content": "thanks"}]})",
      DocFormat::kChat, ChatTemplate::kPlain, Gpt2());
  EXPECT_EQ(r.all, "User: Q\nAssistant: A\nUser: thanks\n<|endoftext|>");
  EXPECT_EQ(r.trained, " A\n");
}

TEST(ChatFormat, Llama3TemplateTrainsOnContentAndEndOfTurn) {
  const Rendered r = Render(kConversation, DocFormat::kChat, ChatTemplate::kLlama3, Llama3Bytes());
  EXPECT_EQ(r.all,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nYour name?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nkeel.<|eot_id|><|end_of_text|>");
  EXPECT_EQ(r.trained, "Hello!<|eot_id|>|keel.<|eot_id|>");
}

TEST(ChatFormat, MessageTextNeverBecomesAControlToken) {
  const Rendered r = Render(
      R"({"messages": [{"role": "user", "content": "<|eot_id|><|start_header_id|>"},
                       {"role": "assistant", "content": "ok"}]})",
      DocFormat::kChat, ChatTemplate::kLlama3, Llama3Bytes());
  // Two turns: two <|eot_id|> (128009) and two headers (128006) from the template, none from text.
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), 128009), 2);
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), 128006), 2);
  EXPECT_NE(r.all.find("\n\n<|eot_id|><|start_header_id|><|eot_id|>"), std::string::npos);
}

TEST(ChatFormat, PromptCompletionTrainsOnTheCompletionAndEos) {
  const Rendered r = Render(R"({"prompt": "2 + 2 =", "completion": " 4"})",
                            DocFormat::kPromptCompletion, ChatTemplate::kPlain, Gpt2());
  EXPECT_EQ(r.all, "2 + 2 = 4<|endoftext|>");
  EXPECT_EQ(r.trained, " 4<|endoftext|>");
  const Rendered l = Render(R"({"prompt": "2 + 2 =", "completion": " 4"})",
                            DocFormat::kPromptCompletion, ChatTemplate::kLlama3, Llama3Bytes());
  EXPECT_EQ(l.all, "<|begin_of_text|>2 + 2 = 4<|end_of_text|>");
  EXPECT_EQ(l.trained, " 4<|end_of_text|>");
}

TEST(ChatFormat, TemplateChoiceFollowsTheTokenizer) {
  EXPECT_EQ(ChooseChatTemplate("auto", Gpt2()), ChatTemplate::kPlain);
  EXPECT_EQ(ChooseChatTemplate("auto", Llama3Bytes()), ChatTemplate::kLlama3);
  EXPECT_EQ(ChooseChatTemplate("plain", Llama3Bytes()), ChatTemplate::kPlain);
  try {
    ChooseChatTemplate("llama3", Gpt2());
    ADD_FAILURE() << "GPT-2 has no Llama 3 header tokens";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find("<|start_header_id|>"), std::string::npos) << e.what();
  }
}

TEST(ChatFormat, BadLinesSayWhatIsWrong) {
  std::vector<int32_t> t;
  std::vector<uint8_t> m;
  auto problem = [&](const std::string& line, DocFormat f = DocFormat::kChat) {
    return RenderInstructionLine(line, f, ChatTemplate::kPlain, Gpt2(), &t, &m);
  };
  EXPECT_EQ(problem("{\"text\": \"x\"}"),
            "an object without \"messages\" (or ShareGPT's \"conversations\")");
  EXPECT_EQ(problem(R"({"conversations": [{"from": "bot", "value": "b"}]})"),
            "conversations[0] with from \"bot\" (expected system, human or gpt)");
  EXPECT_EQ(problem("{\"messages\": []}"), "\"messages\" that is not a non-empty array");
  EXPECT_EQ(problem(R"({"messages": [{"role": "user", "content": "a"}, {"role": "tool",
                       "content": "b"}]})"),
            "messages[1] with role \"tool\" (expected system, user or assistant)");
  EXPECT_EQ(problem(R"({"messages": [{"role": "user", "content": 3}]})"),
            "messages[0] without a string \"content\"");
  EXPECT_EQ(problem("[1]"), "a JSON array");
  EXPECT_EQ(problem("{\"prompt\": \"a\"}", DocFormat::kPromptCompletion),
            "an object without a string \"completion\"");
  EXPECT_EQ(problem("{", DocFormat::kPromptCompletion).rfind("invalid JSON", 0), 0u);
}

// A generation prompt is exactly what a training document holds before the assistant's content,
// and the mask starts training right after it.
TEST(ChatFormat, GenerationPromptIsTheTrainingPrefix) {
  for (const auto& [tmpl, tok] : {std::pair{ChatTemplate::kPlain, &Gpt2()},
                                  std::pair{ChatTemplate::kLlama3, &Llama3Bytes()}}) {
    int32_t stop = -1;
    const std::vector<int32_t> prompt =
        ChatPrompt({{"system", "Be brief."}, {"user", "Hi"}}, tmpl, *tok, &stop);
    std::vector<int32_t> doc;
    std::vector<uint8_t> mask;
    ASSERT_EQ(RenderInstructionLine(R"({"messages": [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hi"},
                                        {"role": "assistant", "content": "Hello!"}]})",
                                    DocFormat::kChat, tmpl, *tok, &doc, &mask),
              "");
    ASSERT_LT(prompt.size(), doc.size());
    EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), doc.begin())) << ChatTemplateName(tmpl);
    EXPECT_EQ(std::find(mask.begin(), mask.end(), 1) - mask.begin(), long(prompt.size()))
        << ChatTemplateName(tmpl);
    // The turn's last trained token is where generation stops.
    const auto last = std::find(mask.rbegin(), mask.rend(), 1);
    EXPECT_EQ(doc[size_t(mask.rend() - last - 1)], stop) << ChatTemplateName(tmpl);
  }
}

PrepareOptions ChatOptions(const TempDir& tmp, const std::string& input) {
  PrepareOptions o;
  o.inputs = {input};
  o.out = tmp / "out";
  o.tokenizer_dir = std::string(KEEL_ASSET_DIR) + "/gpt2";
  o.format = "chat";
  o.val_fraction = 0;
  o.progress = false;
  o.shard_tokens = 40;  // several shards, each with its mask
  return o;
}

TEST(ChatFormat, PrepareWritesAMaskThatMatchesTheRenderedDocuments) {
  TempDir tmp;
  const std::string input = tmp / "chats.jsonl";
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i)
    lines.push_back(R"({"messages": [{"role": "user", "content": "question )" + std::to_string(i) +
                    R"("}, {"role": "assistant", "content": "answer )" +
                    std::string(size_t(i), 'x') + R"("}]})");
  {
    std::ofstream out(input);
    for (const auto& l : lines) out << l << "\n";
  }
  const PrepareSummary s = Prepare(ChatOptions(tmp, input));
  const TokenDataset ds = TokenDataset::Open(tmp / "out/train");
  ASSERT_TRUE(ds.masked());
  ASSERT_GT(ds.meta()->shards.size(), 1u);
  EXPECT_EQ(ds.meta()->prepare->format, "chat");
  EXPECT_EQ(ds.meta()->prepare->chat_template, "plain");
  const std::vector<uint64_t> bounds = ds.DocumentBounds();
  ASSERT_EQ(bounds.size(), lines.size() + 1);
  uint64_t trained = 0;
  for (size_t d = 0; d < lines.size(); ++d) {
    std::vector<int32_t> want_t;
    std::vector<uint8_t> want_m;
    ASSERT_EQ(RenderInstructionLine(lines[d], DocFormat::kChat, ChatTemplate::kPlain, Gpt2(),
                                    &want_t, &want_m),
              "");
    const size_t n = bounds[d + 1] - bounds[d];
    std::vector<int32_t> got_t(n);
    std::vector<uint8_t> got_m(n);
    ds.Read(bounds[d], n, got_t.data());
    ds.ReadMask(bounds[d], n, got_m.data());
    EXPECT_EQ(got_t, want_t) << "document " << d;
    EXPECT_EQ(got_m, want_m) << "document " << d;
    for (uint8_t f : got_m) trained += f;
  }
  EXPECT_EQ(s.trained_tokens, trained);
  EXPECT_NO_THROW(VerifyDataset(tmp / "out/train"));

  // A flag flipped to another valid value: the hash says so; an invalid value: verify names it.
  const std::string mask = tmp / ("out/train/" + ds.meta()->shards[0].mask);
  std::fstream f(mask, std::ios::in | std::ios::out | std::ios::binary);
  char c;
  f.seekg(3);
  f.get(c);
  f.seekp(3);
  f.put(char(c ^ 1));
  f.flush();
  try {
    VerifyDataset(tmp / "out/train");
    ADD_FAILURE() << "a changed mask passed verify";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mask + ": xxh3"), std::string::npos) << e.what();
  }
  f.seekp(3);
  f.put(char(2));
  f.flush();
  try {
    VerifyDataset(tmp / "out/train");
    ADD_FAILURE() << "a mask byte of 2 passed verify";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mask), std::string::npos) << e.what();
  }
}

TEST(ChatFormat, PrepareNamesTheBadLineAndRefusesText) {
  TempDir tmp;
  const std::string input = tmp / "chats.jsonl";
  std::ofstream(input) << R"({"messages": [{"role": "user", "content": "a"}]})"
                       << "\n"
                       << R"({"messages": [{"role": "bot", "content": "b"}]})"
                       << "\n";
  try {
    Prepare(ChatOptions(tmp, input));
    ADD_FAILURE() << "accepted a bad role";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::kBadInput);
    EXPECT_NE(std::string(e.what()).find(input + ":2: expected {\"messages\""), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("role \"bot\""), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(tmp / "out/train/meta.json"));
  const std::string text = tmp / "notes.txt";
  std::ofstream(text) << "plain text\n";
  try {
    Prepare(ChatOptions(tmp, text));
    ADD_FAILURE() << "accepted a text file as chat";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads JSONL"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::data
