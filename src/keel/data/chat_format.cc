#include "keel/data/chat_format.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "keel/core/error.h"

namespace keel::data {
namespace {

using nlohmann::json;

// Appends `text` encoded on its own, each token flagged `trained`.
void Piece(const Tokenizer& tok, std::string_view text, bool trained, bool special,
           std::vector<int32_t>* tokens, std::vector<uint8_t>* mask) {
  tok.EncodeAppend(text, tokens, special);
  mask->resize(tokens->size(), uint8_t(trained));
}

void Eos(const Tokenizer& tok, bool trained, std::vector<int32_t>* tokens,
         std::vector<uint8_t>* mask) {
  tokens->push_back(tok.eos_id());
  mask->push_back(uint8_t(trained));
}

std::string_view Trim(std::string_view s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
}

// The conversation of a chat line into *out: {"messages": [{"role", "content"}]} (OpenAI's and
// Hugging Face's), or {"conversations": [{"from", "value"}]} (ShareGPT's, as axolotl reads it:
// human → user, gpt → assistant). The problem, or "".
std::string ParseMessages(const json& j, std::vector<ChatMessage>* out) {
  if (!j.is_object()) return std::string("a JSON ") + j.type_name();
  const bool sharegpt = !j.contains("messages") && j.contains("conversations");
  const char* list = sharegpt ? "conversations" : "messages";
  const char* role_key = sharegpt ? "from" : "role";
  const char* text_key = sharegpt ? "value" : "content";
  auto it = j.find(list);
  if (it == j.end()) return "an object without \"messages\" (or ShareGPT's \"conversations\")";
  if (!it->is_array() || it->empty())
    return "\"" + std::string(list) + "\" that is not a non-empty array";
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string at = std::string(list) + "[" + std::to_string(i) + "]";
    if (!m.is_object()) return at + " as a " + std::string(m.type_name());
    auto role = m.find(role_key), content = m.find(text_key);
    if (role == m.end() || !role->is_string()) return at + " without a string \"" + role_key + "\"";
    if (content == m.end() || !content->is_string())
      return at + " without a string \"" + text_key + "\"";
    std::string r = role->get<std::string>();
    if (sharegpt && r == "human") r = "user";
    if (sharegpt && r == "gpt") r = "assistant";
    if (r != "system" && r != "user" && r != "assistant")
      return at + " with " + role_key + " \"" + role->get<std::string>() + "\" (expected " +
             (sharegpt ? "system, human or gpt" : "system, user or assistant") + ")";
    out->push_back({std::move(r), content->get<std::string>()});
  }
  return "";
}

// A message's header: what precedes its content, never trained on.
void Header(const std::string& role, ChatTemplate tmpl, const Tokenizer& tok,
            std::vector<int32_t>* tokens, std::vector<uint8_t>* mask) {
  if (tmpl == ChatTemplate::kLlama3) {
    Piece(tok, "<|start_header_id|>" + role + "<|end_header_id|>\n\n", false, true, tokens, mask);
  } else {
    Piece(tok,
          role == "system" ? "System:"
          : role == "user" ? "User:"
                           : "Assistant:",
          false, false, tokens, mask);
  }
}

// Messages as (role, content) pairs; `open_assistant`: end with an assistant's header and no
// closing eos (a generation prompt).
void RenderMessages(const std::vector<ChatMessage>& messages, ChatTemplate tmpl,
                    const Tokenizer& tok, bool open_assistant, std::vector<int32_t>* tokens,
                    std::vector<uint8_t>* mask) {
  if (tmpl == ChatTemplate::kLlama3) Piece(tok, "<|begin_of_text|>", false, true, tokens, mask);
  bool last_assistant = false;
  for (const ChatMessage& m : messages) {
    last_assistant = m.role == "assistant";
    Header(m.role, tmpl, tok, tokens, mask);
    if (tmpl == ChatTemplate::kLlama3) {
      Piece(tok, Trim(m.content), last_assistant, false, tokens, mask);
      Piece(tok, "<|eot_id|>", last_assistant, true, tokens, mask);
    } else {
      Piece(tok, " " + m.content + "\n", last_assistant, false, tokens, mask);
    }
  }
  if (open_assistant) return Header("assistant", tmpl, tok, tokens, mask);
  // Llama 3 ends a turn with <|eot_id|>; the plain template's only end is the eos.
  Eos(tok, last_assistant && tmpl == ChatTemplate::kPlain, tokens, mask);
}

}  // namespace

std::vector<int32_t> ChatPrompt(const std::vector<ChatMessage>& messages, ChatTemplate tmpl,
                                const Tokenizer& tok, int32_t* stop) {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> mask;
  RenderMessages(messages, tmpl, tok, /*open_assistant=*/true, &tokens, &mask);
  *stop = tmpl == ChatTemplate::kLlama3 ? tok.Encode("<|eot_id|>", true).at(0) : tok.eos_id();
  return tokens;
}

DocFormat ParseDocFormat(const std::string& name) {
  if (name == "text") return DocFormat::kText;
  if (name == "chat") return DocFormat::kChat;
  if (name == "prompt-completion") return DocFormat::kPromptCompletion;
  ThrowBadInput("prepare: --format \"" + name + "\": expected text, chat or prompt-completion");
}

ChatTemplate ChooseChatTemplate(const std::string& name, const Tokenizer& tok) {
  const bool has_llama3 = tok.Encode("<|start_header_id|>", /*allow_special=*/true).size() == 1 &&
                          tok.Encode("<|eot_id|>", true).size() == 1 &&
                          tok.Encode("<|begin_of_text|>", true).size() == 1;
  if (name == "plain") return ChatTemplate::kPlain;
  if (name == "auto") return has_llama3 ? ChatTemplate::kLlama3 : ChatTemplate::kPlain;
  if (name == "llama3") {
    if (!has_llama3)
      ThrowBadInput("prepare: --chat-template llama3: tokenizer " + tok.name() +
                    " has no <|start_header_id|>, <|eot_id|> and <|begin_of_text|> tokens");
    return ChatTemplate::kLlama3;
  }
  ThrowBadInput("prepare: --chat-template \"" + name + "\": expected auto, plain or llama3");
}

const char* ChatTemplateName(ChatTemplate t) {
  return t == ChatTemplate::kLlama3 ? "llama3" : "plain";
}

std::string RenderInstructionLine(const std::string& line, DocFormat format, ChatTemplate tmpl,
                                  const Tokenizer& tok, std::vector<int32_t>* tokens,
                                  std::vector<uint8_t>* mask) {
  tokens->clear();
  mask->clear();
  json j;
  try {
    j = json::parse(line);
  } catch (const json::parse_error& e) {
    return "invalid JSON (syntax error at byte " + std::to_string(e.byte) + ")";
  } catch (const json::exception& e) {
    return "invalid JSON (" + std::string(e.what()) + ")";
  }
  if (format == DocFormat::kChat) {
    std::vector<ChatMessage> messages;
    if (std::string problem = ParseMessages(j, &messages); !problem.empty()) return problem;
    RenderMessages(messages, tmpl, tok, /*open_assistant=*/false, tokens, mask);
    return "";
  }
  KEEL_CHECK(format == DocFormat::kPromptCompletion, "RenderInstructionLine: not a text format");
  if (!j.is_object()) return std::string("a JSON ") + j.type_name();
  for (const char* key : {"prompt", "completion"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string())
      return "an object without a string \"" + std::string(key) + "\"";
  }
  if (tmpl == ChatTemplate::kLlama3) Piece(tok, "<|begin_of_text|>", false, true, tokens, mask);
  Piece(tok, j["prompt"].get_ref<const std::string&>(), false, false, tokens, mask);
  Piece(tok, j["completion"].get_ref<const std::string&>(), true, false, tokens, mask);
  Eos(tok, true, tokens, mask);
  return "";
}

}  // namespace keel::data
