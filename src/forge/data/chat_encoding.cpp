// Conversations to tokens and loss masks (Note [chat masks] in chat_encoding.h).
#include "forge/data/chat_encoding.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <utility>

#include "forge/core/error.h"
#include "forge/data/documents.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

bool is_prefix(const std::vector<int32_t>& p, const std::vector<int32_t>& full) {
  return p.size() <= full.size() && std::equal(p.begin(), p.end(), full.begin());
}

}  // namespace

ChatTrainOn parse_chat_train_on(const std::string& s) {
  if (s == "assistant") return ChatTrainOn::assistant;
  if (s == "all") return ChatTrainOn::all;
  FORGE_THROW("data.train_on = \"", s, "\" is unknown; use \"assistant\" (the loss on assistant turns only) or \"all\"");
}

int64_t ChatTokens::trained_count() const { return std::count(trained.begin(), trained.end(), uint8_t{1}); }

Conversation conversation_of(const std::string& line, const std::string& where) {
  const nlohmann::json j = io::parse_json(line, where + " is not JSON (a chat .jsonl file holds one conversation per line)");
  FORGE_CHECK(j.is_object(), where, " is a JSON ", j.type_name(),
              ", not an object; a chat .jsonl line is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}");
  const auto it = j.find("messages");
  FORGE_CHECK(it != j.end() && it->is_array(), where,
              " has no list \"messages\"; a chat .jsonl line is {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}");
  Conversation c;
  for (const auto& m : *it) {
    const std::string at = where + " message " + std::to_string(c.size());
    FORGE_CHECK(m.is_object(), at, " is a JSON ", m.type_name(), ", not an object {\"role\", \"content\"}");
    const auto role = m.find("role"), content = m.find("content");
    FORGE_CHECK(role != m.end() && role->is_string(), at, " has no string \"role\" (\"system\", \"user\", \"assistant\")");
    FORGE_CHECK(content != m.end() && content->is_string(), at, " has no string \"content\"");
    c.push_back({role->get<std::string>(), content->get<std::string>()});
  }
  FORGE_CHECK(!c.empty(), where, ": \"messages\" is empty");
  return c;
}

int64_t for_each_conversation(const std::string& path,
                              const std::function<void(const Conversation&, int64_t line)>& fn) {
  FORGE_CHECK(is_jsonl(path), "data.format = \"chat\": '", path,
              "' is not a JSON Lines file (*.jsonl or *.jsonl.gz) of {\"messages\": [...]} lines");
  return for_each_jsonl_line(path, [&](const std::string& line, int64_t line_no) {
    fn(conversation_of(line, "data: '" + path + "' line " + std::to_string(line_no)), line_no);
  });
}

ChatTokens encode_conversation(const ChatTemplate& tmpl, const Tokenizer& tok, const Conversation& messages,
                               ChatTrainOn train_on, const std::string& where) {
  ChatTokens out;
  out.ids = tok.encode(tmpl.render(messages, /*add_generation_prompt=*/false));
  out.trained.assign(out.ids.size(), 0);
  if (train_on == ChatTrainOn::all) {
    std::fill(out.trained.begin() + (out.ids.empty() ? 0 : 1), out.trained.end(), uint8_t{1});
    return out;
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const Conversation before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
    const Conversation through(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    const std::vector<int32_t> prompt = tok.encode(tmpl.render(before, /*add_generation_prompt=*/true));
    const std::vector<int32_t> turn = tok.encode(tmpl.render(through, /*add_generation_prompt=*/false));
    const auto unstable = [&](const char* what) {
      FORGE_THROW(where, ": the chat template (", tmpl.origin(), ") is not prefix-stable at message ", i,
                  " (assistant): ", what,
                  " the whole conversation's tokens, so the assistant's tokens cannot be found by rendering prefixes "
                  "(Note [chat masks]); use a template that renders earlier turns the same whatever follows, or "
                  "data.train_on = \"all\"");
    };
    if (!is_prefix(prompt, out.ids)) unstable("the tokens of the turns before it with the generation prompt are not a prefix of");
    if (!is_prefix(turn, out.ids)) unstable("the tokens of the turns up to it are not a prefix of");
    FORGE_CHECK(turn.size() > prompt.size(), where, ": the chat template (", tmpl.origin(),
                ") renders no tokens for assistant message ", i,
                " after its generation prompt, so there is nothing to train on; check the template (does it write "
                "assistant messages?) or use data.train_on = \"all\"");
    std::fill(out.trained.begin() + static_cast<std::ptrdiff_t>(std::max<size_t>(prompt.size(), 1)),
              out.trained.begin() + static_cast<std::ptrdiff_t>(turn.size()), uint8_t{1});
  }
  return out;
}

std::shared_ptr<const Tokenizer> with_special_tokens(std::shared_ptr<const Tokenizer> tok,
                                                     const std::vector<std::string>& tokens,
                                                     std::vector<std::string>* added) {
  std::vector<std::string> missing;
  for (const auto& t : tokens)
    if (!t.empty() && !tok->token_id(t) && std::find(missing.begin(), missing.end(), t) == missing.end())
      missing.push_back(t);
  if (added) *added = missing;
  if (missing.empty()) return tok;
  const std::string kind = tok->kind();
  std::string names;
  for (const auto& t : missing) names += (names.empty() ? "\"" : ", \"") + t + "\"";
  FORGE_CHECK(kind == "hf" || kind == "forge-bpe", "the chat template needs the special tokens ", names,
              ", which the tokenizer (", tok->describe(), ") lacks, and forge adds tokens only to Hugging Face "
              "tokenizer.json and forge BPE files; give a tokenizer that has them, or another data.chat_template");
  nlohmann::json j = io::parse_json(tok->serialized(), "the tokenizer's serialisation");
  int64_t id = tok->vocab_size();
  for (const auto& t : missing) {
    if (kind == "hf") {
      if (!j.contains("added_tokens") || !j["added_tokens"].is_array()) j["added_tokens"] = nlohmann::json::array();
      j["added_tokens"].push_back({{"id", id}, {"content", t}, {"single_word", false}, {"lstrip", false},
                                   {"rstrip", false}, {"normalized", false}, {"special", true}});
    } else {  // forge BPE: special tokens follow the merges, ids in order
      j["special_tokens"].push_back({{"id", id}, {"content", t}});
      j["vocab_size"] = id + 1;
    }
    ++id;
  }
  auto grown = tokenizer_from_bytes(j.dump(), "tokenizer.json", "the tokenizer with the chat template's tokens");
  for (const auto& t : missing)
    FORGE_CHECK(grown->token_id(t).has_value(), "with_special_tokens: \"", t, "\" did not become a token");
  return grown;
}

}  // namespace forge::data
