// Chat templates rendered by minja (Note [chat templates] in chat_template.h).
#include "forge/data/chat_template.h"

#include <minja/minja.hpp>

#include <algorithm>
#include <cctype>
#include <exception>
#include <nlohmann/json.hpp>
#include <utility>

#include "forge/core/error.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"

namespace forge::data {

namespace {

// The ChatML form: each message between <|im_start|>role\n and <|im_end|>\n; the generation
// prompt opens the assistant's turn.
constexpr const char* kChatmlTemplate =
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Meta-Llama-3-8B-Instruct's template: bos first, each message's content trimmed between its
// header and <|eot_id|>.
constexpr const char* kLlama3Template =
    "{% set loop_messages = messages %}"
    "{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

// The deepest nesting of brackets inside a tag, and of blocks between tags; refused past
// kMaxChatTemplateDepth before the parser (which recurses on both) sees the text.
void check_nesting(const std::string& s, const std::string& origin) {
  static const char* const kOpeners[] = {"if", "for", "macro", "call", "filter", "generation", "raw"};
  int blocks = 0;
  size_t i = 0;
  while ((i = s.find('{', i)) != std::string::npos) {
    if (i + 1 >= s.size() || (s[i + 1] != '{' && s[i + 1] != '%' && s[i + 1] != '#')) {
      ++i;
      continue;
    }
    const char kind = s[i + 1];
    if (kind == '#') {  // a comment
      const size_t end = s.find("#}", i + 2);
      i = end == std::string::npos ? s.size() : end + 2;
      continue;
    }
    const char close = kind == '{' ? '}' : '%';
    size_t j = i + 2;
    int depth = 0;
    char quote = 0;
    for (; j < s.size(); ++j) {
      const char c = s[j];
      if (quote) {
        if (c == '\\') ++j;
        else if (c == quote) quote = 0;
      } else if (c == '\'' || c == '"') {
        quote = c;
      } else if (c == '(' || c == '[' || c == '{') {
        FORGE_CHECK(++depth <= kMaxChatTemplateDepth, "chat template (", origin, "): brackets nest deeper than ",
                    kMaxChatTemplateDepth, " levels at byte ", j, "; forge refuses such a template");
      } else if (c == ')' || c == ']' || (c == '}' && !(close == '}' && depth == 0))) {
        depth = std::max(0, depth - 1);
      } else if (c == close && j + 1 < s.size() && s[j + 1] == '}' && depth == 0) {
        break;
      }
    }
    if (kind == '%') {  // the statement's first word opens or ends a block
      size_t w = i + 2;
      while (w < j && (s[w] == '-' || s[w] == '+' || s[w] == ' ' || s[w] == '\t' || s[w] == '\n')) ++w;
      size_t e = w;
      while (e < j && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
      const std::string word = s.substr(w, e - w);
      if (word.rfind("end", 0) == 0) blocks = std::max(0, blocks - 1);
      for (const char* o : kOpeners)
        if (word == o)
          FORGE_CHECK(++blocks <= kMaxChatTemplateDepth, "chat template (", origin, "): blocks nest deeper than ",
                      kMaxChatTemplateDepth, " levels at byte ", i, "; forge refuses such a template");
    }
    i = j + 2;
  }
}

// A tokenizer_config.json's token field: a string, {"content": ...}, or absent/null ("").
std::string token_field(const nlohmann::json& j, const char* key, const std::string& origin) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  FORGE_CHECK(it->is_object() && it->contains("content") && it->at("content").is_string(), origin, ": \"", key,
              "\" is a ", it->type_name(), "; expected a string or an object with a string \"content\"");
  return it->at("content").get<std::string>();
}

}  // namespace

struct ChatTemplate::Parsed {
  std::shared_ptr<minja::TemplateNode> root;
};

ChatTemplate::ChatTemplate(std::string source, std::string origin, std::string bos_token, std::string eos_token,
                           std::vector<std::string> special_tokens)
    : source_(std::move(source)),
      origin_(std::move(origin)),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      special_tokens_(std::move(special_tokens)) {
  FORGE_CHECK(source_.size() <= kMaxChatTemplateBytes, "chat template (", origin_, ") is ", source_.size(),
              " bytes; forge reads templates of up to ", kMaxChatTemplateBytes >> 10, " KiB");
  FORGE_CHECK(source_.find('\0') == std::string::npos, "chat template (", origin_, ") holds a NUL byte");
  check_nesting(source_, origin_);
  auto parsed = std::make_shared<Parsed>();
  try {
    // transformers renders with trim_blocks and lstrip_blocks (and drops a final newline).
    parsed->root = minja::Parser::parse(source_, {/*trim_blocks=*/true, /*lstrip_blocks=*/true,
                                                  /*keep_trailing_newline=*/false});
  } catch (const std::exception& e) {
    FORGE_THROW("chat template (", origin_, ") is not a Jinja template forge can read: ", e.what());
  }
  FORGE_CHECK(parsed->root != nullptr, "chat template (", origin_, ") parsed to nothing");
  parsed_ = std::move(parsed);
}

std::string ChatTemplate::render(const Conversation& messages, bool add_generation_prompt) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  std::string out;
  try {
    auto context = minja::Context::make(
        minja::Value(nlohmann::ordered_json{{"messages", std::move(list)}, {"add_generation_prompt", add_generation_prompt}}));
    context->set("bos_token", minja::Value(bos_));
    context->set("eos_token", minja::Value(eos_));
    out = parsed_->root->render(context);
  } catch (const forge::Error&) {
    throw;
  } catch (const std::exception& e) {  // raise_exception(...), a type error, a missing variable
    FORGE_THROW("chat template (", origin_, ") failed on a conversation of ", messages.size(),
                " message(s): ", e.what());
  }
  FORGE_CHECK(out.size() <= kMaxRenderedChatBytes, "chat template (", origin_, ") rendered ", out.size(),
              " bytes for a conversation of ", messages.size(), " message(s); forge refuses more than ",
              kMaxRenderedChatBytes >> 20, " MiB");
  return out;
}

std::vector<std::string> builtin_chat_template_names() { return {"chatml", "llama3"}; }

ChatTemplate builtin_chat_template(const std::string& name) {
  const std::string origin = "built-in template \"" + name + "\"";
  if (name == "chatml") return ChatTemplate(kChatmlTemplate, origin, "", "<|im_end|>", {"<|im_start|>", "<|im_end|>"});
  if (name == "llama3")
    return ChatTemplate(kLlama3Template, origin, "<|begin_of_text|>", "<|eot_id|>",
                        {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
  std::string names;
  for (const auto& n : builtin_chat_template_names()) names += (names.empty() ? "\"" : ", \"") + n + "\"";
  FORGE_THROW("data.chat_template = \"", name, "\" is not a built-in template (", names,
              "), nor \"auto\" (the tokenizer_config.json beside the tokenizer), nor a path to a tokenizer_config.json "
              "or a .jinja file");
}

ChatTemplate chat_template_from_config(const std::string& text, const std::string& origin) {
  const nlohmann::json j = io::parse_json(text, origin);  // Note [untrusted JSON]
  FORGE_CHECK(j.is_object(), origin, " is a JSON ", j.type_name(), ", not an object (a tokenizer_config.json)");
  const auto it = j.find("chat_template");
  FORGE_CHECK(it != j.end() && !it->is_null(), origin,
              " has no \"chat_template\"; set data.chat_template to a built-in template (\"chatml\", \"llama3\") or "
              "to a file that has one");
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else {
    FORGE_CHECK(it->is_array(), origin, ": \"chat_template\" is a ", it->type_name(),
                "; expected a string or a list of {\"name\", \"template\"}");
    bool found = false;
    for (const auto& t : *it) {
      FORGE_CHECK(t.is_object() && t.contains("name") && t.at("name").is_string() && t.contains("template") &&
                      t.at("template").is_string(),
                  origin, ": an entry of \"chat_template\" is not {\"name\": string, \"template\": string}");
      if (t.at("name") == "default") source = t.at("template").get<std::string>(), found = true;
    }
    FORGE_CHECK(found, origin, ": \"chat_template\" lists no template named \"default\"");
  }
  const std::string bos = token_field(j, "bos_token", origin), eos = token_field(j, "eos_token", origin);
  std::vector<std::string> specials;
  auto add = [&](const std::string& t) {
    if (!t.empty() && std::find(specials.begin(), specials.end(), t) == specials.end()) specials.push_back(t);
  };
  if (const auto d = j.find("added_tokens_decoder"); d != j.end() && d->is_object()) {
    for (const auto& [id, tok] : d->items()) {
      if (!tok.is_object() || !tok.value("special", false) || !tok.contains("content") || !tok.at("content").is_string())
        continue;
      const std::string content = tok.at("content").get<std::string>();
      const bool used = source.find(content) != std::string::npos ||
                        (content == bos && source.find("bos_token") != std::string::npos) ||
                        (content == eos && source.find("eos_token") != std::string::npos);
      if (used) add(content);
    }
  }
  if (source.find("bos_token") != std::string::npos) add(bos);
  if (source.find("eos_token") != std::string::npos) add(eos);
  return ChatTemplate(std::move(source), origin, bos, eos, std::move(specials));
}

ChatTemplate load_chat_template_config(const std::string& path) {
  return chat_template_from_config(io::read_file(path), "'" + path + "'");
}

}  // namespace forge::data
