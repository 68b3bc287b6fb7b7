#pragma once
// Conversations to tokens and their loss mask (data.format = "chat").
//
// Note [chat masks]: which tokens of a rendered conversation are trained is found by rendering
// prefixes, never by looking for the template's markers in the text. For a conversation m_1..m_n
// rendered in full to tokens F (chat_template.h), each assistant message m_i contributes the tokens
//   [ |tok(render(m_1..m_{i-1}, add_generation_prompt))|,  |tok(render(m_1..m_i))| )
// of F: what the template adds for that message after the assistant header, its content and its
// end-of-turn token (<|im_end|>, <|eot_id|>: the model must learn to stop), whatever else the
// template writes there. Each prefix's tokens must be a prefix of F: a template that renders an
// earlier turn differently once later ones follow (not prefix-stable), or whose tokens merge across
// the cut, is refused naming the template and the message; an assistant message that renders to no
// tokens is refused too (no loss could be trained on it). train_on = "all" trains every token.
// trained[j] says whether token j is a target (predicted from tokens < j); trained[0] is false.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "forge/data/chat_template.h"
#include "forge/data/tokenizer.h"

namespace forge::data {

enum class ChatTrainOn { assistant, all };
// "assistant" | "all"; throws naming data.train_on.
ChatTrainOn parse_chat_train_on(const std::string& s);

struct ChatTokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // 1 where ids[j] is a trained target
  int64_t trained_count() const;
};

// A JSON Lines record {"messages": [{"role": string, "content": string}, ...]} (other keys are
// ignored); throws naming `where` (file and line) and the fix.
Conversation conversation_of(const std::string& line, const std::string& where);
// Each conversation of a chat corpus file (*.jsonl, *.jsonl.gz), with its line number.
int64_t for_each_conversation(const std::string& path,
                              const std::function<void(const Conversation&, int64_t line)>& fn);

// The conversation's tokens and mask (Note [chat masks]); `where` names it in errors.
ChatTokens encode_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& messages,
                               ChatTrainOn train_on, const std::string& where);

// `tok` with each of `tokens` it lacks added as a special token (ids from its vocab_size() on), read
// back through load_tokenizer's own parsers (the Hugging Face file's added_tokens, forge BPE's
// special_tokens); `added` receives the ones added. Throws naming the tokenizer's kind for kinds
// whose files hold no added tokens (tiktoken, sentencepiece).
std::shared_ptr<const Tokenizer> with_special_tokens(std::shared_ptr<const Tokenizer> tok,
                                                     const std::vector<std::string>& tokens,
                                                     std::vector<std::string>* added = nullptr);

}  // namespace forge::data
