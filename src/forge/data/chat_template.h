#pragma once
// Note [chat templates]: a chat model is trained on conversations rendered to text by its chat
// template, the Jinja program a Hugging Face tokenizer_config.json carries as "chat_template"
// (transformers' apply_chat_template). forge renders the same programs with a real Jinja engine,
// minja (third_party/minja, google/minja, written for these templates), behind this interface:
// nothing else includes minja.
//
// A template is rendered as transformers does: Jinja with trim_blocks and lstrip_blocks, the
// variables `messages` (a list of {"role", "content"}), `add_generation_prompt`, `bos_token` and
// `eos_token` (the tokenizer_config.json's, or the built-in template's), and minja's built-ins
// (raise_exception, range, tojson, ...). `strftime_now` is left undefined, so templates that ask
// for today's date (LLaMA-3.2's) take their own fixed default and a corpus renders the same
// tomorrow.
//
// Built-in templates by name (data.chat_template): "chatml" (<|im_start|>role\n...<|im_end|>\n, the
// ChatML form of Qwen and many others, with no default system prompt) and "llama3" (Meta-Llama-3
// Instruct's: <|begin_of_text|> then <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>).
//
// Templates are untrusted input (issue 43). A template longer than kMaxChatTemplateBytes, or
// nesting brackets or blocks deeper than kMaxChatTemplateDepth (the engine's parser recurses), is
// refused before it is parsed; every exception the engine throws while parsing or rendering becomes
// a forge::Error naming the template's origin and the problem; a rendering longer than
// kMaxRenderedChatBytes is refused. (A template can still loop for long: tests/fuzz's chat_template
// target runs under libFuzzer's time limit.)
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace forge::data {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", ...
  std::string content;
};
using Conversation = std::vector<ChatMessage>;

inline constexpr size_t kMaxChatTemplateBytes = size_t{256} << 10;
inline constexpr int kMaxChatTemplateDepth = 64;
inline constexpr size_t kMaxRenderedChatBytes = size_t{64} << 20;

class ChatTemplate {
 public:
  // Parses `source` (Jinja); `origin` names it in errors ("built-in template \"chatml\"", a path);
  // `special_tokens` are the template's markers that must each be one token of the tokenizer
  // (bos and eos among them when they are used).
  ChatTemplate(std::string source, std::string origin, std::string bos_token, std::string eos_token,
               std::vector<std::string> special_tokens);

  // The conversation as text, with the assistant header after it when add_generation_prompt.
  std::string render(const Conversation& messages, bool add_generation_prompt) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  const std::vector<std::string>& special_tokens() const { return special_tokens_; }

 private:
  struct Parsed;
  std::string source_, origin_, bos_, eos_;
  std::vector<std::string> special_tokens_;
  std::shared_ptr<const Parsed> parsed_;
};

// "chatml", "llama3".
std::vector<std::string> builtin_chat_template_names();
// The built-in template `name`; throws naming data.chat_template and the names.
ChatTemplate builtin_chat_template(const std::string& name);
// The chat template of a Hugging Face tokenizer_config.json: "chat_template" (a string, or a list of
// {"name", "template"} whose "default" is taken), "bos_token" / "eos_token" (strings or
// {"content": ...}), and as special tokens the contents of "added_tokens_decoder"'s special entries
// that the template or bos/eos name. Throws naming the file when it has no chat template.
ChatTemplate load_chat_template_config(const std::string& path);
// The same from the file's bytes; `origin` names it.
ChatTemplate chat_template_from_config(const std::string& text, const std::string& origin);

}  // namespace forge::data
