// Instruction data for `keel data prepare --format chat|prompt-completion`: one JSONL line into
// one document's tokens and its loss mask (1: a target the loss trains on).
//
//   chat:              {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
//                      or ShareGPT's {"conversations": [{"from": "system"|"human"|"gpt",
//                      "value": "..."}, ...]}
//   prompt-completion: {"prompt": "...", "completion": "..."}
//
// Only the assistant's turns (or the completion) are trained on; headers, system prompts and the
// user's turns are context. Each piece is tokenized on its own, so a mask boundary is always a
// token boundary, and message text never becomes a special token ("<|eot_id|>" typed by a user
// stays text). Templates:
//
//   llama3: <|begin_of_text|> then per message
//           <|start_header_id|>ROLE<|end_header_id|>\n\n CONTENT <|eot_id|>
//           (CONTENT trimmed, as Llama 3's own template does); trained: an assistant's CONTENT
//           and its <|eot_id|>. The document ends with the tokenizer's eos, not trained.
//   plain:  per message "Role:" then " CONTENT\n" (Role: System, User, Assistant); trained: an
//           assistant's " CONTENT\n". The document ends with eos, trained when the conversation
//           ends with the assistant (so that a tuned model learns to stop). For GPT-2, whose only
//           special token is <|endoftext|>.
//   prompt-completion: PROMPT then COMPLETION then eos (llama3: <|begin_of_text|> first);
//           trained: COMPLETION and eos. No template: the text is what the pair says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "keel/data/tokenizer.h"

namespace keel::data {

enum class DocFormat { kText, kChat, kPromptCompletion };
enum class ChatTemplate { kPlain, kLlama3 };

// "text", "chat" or "prompt-completion". Throws keel::Error (bad input) naming the flag.
DocFormat ParseDocFormat(const std::string& name);
// "plain", "llama3", or "auto": llama3 when the tokenizer has Llama 3's header tokens, else plain.
// Throws keel::Error (bad input) for another name, or llama3 with a tokenizer that lacks them.
ChatTemplate ChooseChatTemplate(const std::string& name, const Tokenizer& tok);
const char* ChatTemplateName(ChatTemplate t);

// Renders one JSONL line of `format` (not kText) into *tokens and *mask (cleared first), the
// document's closing eos included. Returns "" or what the line is instead of what was expected
// ("a message without a string \"content\"", ...).
std::string RenderInstructionLine(const std::string& line, DocFormat format, ChatTemplate tmpl,
                                  const Tokenizer& tok, std::vector<int32_t>* tokens,
                                  std::vector<uint8_t>* mask);

// The prompt that asks a model tuned on `tmpl` for the assistant's next turn: the conversation so
// far (`messages`: {role, content} pairs, roles as above) and the assistant's header, exactly the
// tokens the training documents hold before an assistant's content. Generation stops at the
// template's end of turn (eos; Llama 3: <|eot_id|>, which *stop receives).
struct ChatMessage {
  std::string role, content;
};
std::vector<int32_t> ChatPrompt(const std::vector<ChatMessage>& messages, ChatTemplate tmpl,
                                const Tokenizer& tok, int32_t* stop);

}  // namespace keel::data
