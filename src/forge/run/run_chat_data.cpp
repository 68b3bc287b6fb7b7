// The data of a chat run (contract in run_chat_data.h).
#include "forge/run/run_chat_data.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <csignal>
#include <cerrno>
#include <filesystem>
#include <ostream>
#include <sstream>
#include <utility>

#include "forge/core/error.h"
#include "forge/data/chat_rows.h"
#include "forge/data/shards.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"
#include "forge/io/output_guard.h"
#include "forge/run/run_data.h"

namespace forge::train {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

data::ChatTemplate resolve_chat_template(const RunConfig& cfg, std::ostream& log) {
  const std::string& name = cfg.data.chat_template;
  std::error_code ec;
  if (name == "auto") {
    std::vector<fs::path> places;
    if (!cfg.data.tokenizer.empty()) places.push_back(fs::path(cfg.data.tokenizer).parent_path() / "tokenizer_config.json");
    if (!cfg.model.init_from.empty()) places.push_back(fs::path(cfg.model.init_from) / "tokenizer_config.json");
    std::string looked;
    for (const auto& p : places) {
      looked += (looked.empty() ? "'" : ", '") + p.string() + "'";
      if (!fs::is_regular_file(p, ec)) continue;
      data::ChatTemplate t = data::load_chat_template_config(p.string());
      log << "chat: the template of " << p.string() << " (data.chat_template = \"auto\")\n";
      return t;
    }
    FORGE_THROW("data.chat_template = \"auto\" found no tokenizer_config.json with a chat template (looked at ",
                looked.empty() ? std::string("nothing: no data.tokenizer, no model.init_from") : looked,
                "); set data.chat_template to a built-in template (\"chatml\", \"llama3\") or to a "
                "tokenizer_config.json or .jinja file");
  }
  if (ends_with(name, ".json") || ends_with(name, ".jinja")) {
    FORGE_CHECK(fs::is_regular_file(name, ec), "data.chat_template: '", name,
                "' does not exist; give a tokenizer_config.json, a .jinja file, \"auto\" or a built-in name");
    log << "chat: the template of " << name << "\n";
    if (ends_with(name, ".json")) return data::load_chat_template_config(name);
    return data::ChatTemplate(io::read_file(name), "'" + name + "'", "", "", {});
  }
  data::ChatTemplate t = data::builtin_chat_template(name);
  log << "chat: the built-in template \"" << name << "\"\n";
  return t;
}

std::shared_ptr<const data::Tokenizer> chat_tokenizer(const RunConfig& cfg, std::shared_ptr<const data::Tokenizer> tok,
                                                      const data::ChatTemplate& tmpl, std::ostream& log, bool save) {
  std::vector<std::string> added;
  const int64_t before = tok->vocab_size();
  auto grown = data::with_special_tokens(std::move(tok), tmpl.special_tokens(), &added);
  if (added.empty()) return grown;
  std::string names;
  for (const auto& t : added) names += (names.empty() ? "\"" : ", \"") + t + "\"";
  log << "chat: added the template's special tokens " << names << " to the tokenizer (vocabulary " << before << " -> "
      << grown->vocab_size() << "; model.vocab_size follows)\n";
  if (save) grown->save((fs::path(cfg.run_dir()) / kTokenizerFile).string());
  return grown;
}

ChatEncodeStats encode_chat_file(const data::ChatTemplate& tmpl, const data::Tokenizer& tok, data::ChatTrainOn train_on,
                                 int64_t max_tokens, int64_t vocab_size, const std::string& path,
                                 const std::string& out) {
  ChatEncodeStats s;
  data::ShardWriter tokens(out, vocab_size), flags(data::chat_flags_path(out), data::kChatFlagsVocab);
  std::vector<int32_t> f;
  data::for_each_conversation(path, [&](const data::Conversation& c, int64_t line) {
    ++s.conversations;
    data::ChatTokens ct =
        data::encode_conversation(tmpl, tok, c, train_on, "data: '" + path + "' line " + std::to_string(line));
    if (static_cast<int64_t>(ct.ids.size()) > max_tokens) {
      ++s.cut;
      for (size_t j = static_cast<size_t>(max_tokens); j < ct.ids.size(); ++j) s.trained_cut += ct.trained[j];
      ct.ids.resize(static_cast<size_t>(max_tokens));
      ct.trained.resize(static_cast<size_t>(max_tokens));
    }
    const int64_t trained = ct.trained_count();
    if (trained == 0 || ct.ids.size() < 2) {
      s.skipped_lines.push_back(line);
      return;
    }
    f.assign(ct.trained.begin(), ct.trained.end());
    f[0] |= data::kChatStart;
    tokens.append(ct.ids);
    flags.append(f);
    ++s.written;
    s.tokens += static_cast<int64_t>(ct.ids.size());
    s.trained += trained;
  });
  tokens.commit();
  flags.commit();
  return s;
}

std::vector<std::string> prepare_chat_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                             const data::ChatTemplate& tmpl, const std::vector<std::string>& files,
                                             const std::string& dir, std::ostream& log) {
  const data::ChatTrainOn train_on = data::parse_chat_train_on(cfg.data.train_on);
  const int64_t max_tokens = cfg.train.seq_len + 1;
  // Note [shard manifests]: what the shards are made from; the same again (the job's other ranks,
  // after rank 0 wrote them; a resumed run) reuses them, and what encoding them logged is said again.
  const nlohmann::json want = {{"format", "forge-chat-shards"},
                               {"tokenizer", fnv1a_hex(tok.serialized())},
                               {"template", fnv1a_hex(tmpl.source())},
                               {"train_on", cfg.data.train_on},
                               {"max_tokens", max_tokens},
                               {"files", files_fingerprint(files)}};
  if (auto paths = manifest_shards(dir, want)) {
    log << "chat: reusing " << paths->size() << " chat shard(s) in " << dir << "\n";
    const nlohmann::json m = io::read_json_file((fs::path(dir) / "manifest.json").string());
    if (m.contains("log") && m["log"].is_array())
      for (const auto& line : m["log"])
        if (line.is_string()) log << line.get<std::string>() << "\n";
    return *paths;
  }
  claim_shards_dir(dir, log);
  fs::create_directories(dir);
  std::ostringstream said;  // what encoding logs: the manifest keeps it for the runs that reuse the shards
  std::vector<std::string> out;
  for (size_t i = 0; i < files.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05zu.bin", i);
    const std::string shard = (fs::path(dir) / name).string();
    const ChatEncodeStats s =
        encode_chat_file(tmpl, tok, train_on, max_tokens, std::max<int64_t>(cfg.model.vocab_size, tok.vocab_size()),
                         files[i], shard);
    said << "chat: " << files[i] << ": " << s.written << " of " << s.conversations << " conversations, " << s.tokens
         << " tokens, " << s.trained << " trained (data.train_on = \"" << cfg.data.train_on << "\")\n";
    if (s.cut > 0)
      said << "chat: " << files[i] << ": " << s.cut << " conversation(s) longer than train.seq_len + 1 = " << max_tokens
           << " tokens were cut, losing " << s.trained_cut << " trained token(s)\n";
    if (!s.skipped_lines.empty()) {
      std::string lines;
      for (size_t k = 0; k < s.skipped_lines.size() && k < 20; ++k)
        lines += (k ? ", " : "") + std::to_string(s.skipped_lines[k]);
      if (s.skipped_lines.size() > 20) lines += ", ...";
      said << "chat: " << files[i] << ": skipped " << s.skipped_lines.size()
           << " conversation(s) with no trained token left (cut off by train.seq_len, or no assistant message), "
              "lines "
           << lines << "\n";
    }
    if (s.written > 0) out.push_back(shard);
  }
  log << said.str();
  FORGE_CHECK(!out.empty(), "data.format = \"chat\": no conversation of data.files has a trained token (",
              files.size(), " file(s)); check the files' assistant messages, or raise train.seq_len");
  nlohmann::json lines = nlohmann::json::array();
  std::istringstream in(said.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  write_manifest(dir, want, out, {{"log", lines}});
  return out;
}

void remove_stale_plan_dirs(const fs::path& tmp, std::ostream& log) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(kPlanDirPrefix, 0) != 0 || !e.is_directory(ec)) continue;
    // "<prefix><pid>-<attempt>": its plan is gone when no process has the pid.
    char* end = nullptr;
    const long pid = std::strtol(n.c_str() + std::strlen(kPlanDirPrefix), &end, 10);
    if (pid <= 0 || end == nullptr || *end != '-' || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)
      continue;
    bool ours = true;  // only forge's shards and their temporaries
    for (const auto& f : fs::directory_iterator(e.path(), ec)) ours = ours && is_shards_dir_entry(f.path());
    if (!ours || ec) continue;
    fs::remove_all(e.path(), ec);
    if (!ec) log << "forge plan: removed " << e.path().string() << ", left by a plan that was stopped\n";
  }
}

ChatDataSummary summarize_chat_data(const RunConfig& cfg, std::ostream& log) {
  FORGE_CHECK(cfg.data.format == "chat", "summarize_chat_data: data.format is \"", cfg.data.format, "\", not \"chat\"");
  const data::ChatTemplate tmpl = resolve_chat_template(cfg, log);
  const std::vector<std::string> files = resolve_data_files(cfg.data);
  FORGE_CHECK(!cfg.data.tokenizer.empty(), "data.format = \"chat\" needs data.tokenizer (the tokenizer the template's "
              "text is encoded with): set it, or model.init_from a directory with a tokenizer.json");
  const auto tok = chat_tokenizer(cfg, data::load_tokenizer(cfg.data.tokenizer), tmpl, log, /*save=*/false);
  // A directory of this call's own: created here (create_directory fails on an existing one, so
  // nothing of anyone else's is reused or removed) and removed whole at the end. One left by a
  // plan that was killed (its process gone) is removed first, when it holds nothing but shards.
  remove_stale_plan_dirs(fs::temp_directory_path(), log);
  fs::path dir;
  for (int attempt = 0;; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof(name), "%s%ld-%d", kPlanDirPrefix, static_cast<long>(::getpid()), attempt);
    dir = fs::temp_directory_path() / name;
    if (fs::create_directory(dir)) break;
    FORGE_CHECK(attempt < 100, "forge plan: cannot create a temporary directory in ", fs::temp_directory_path().string());
  }
  struct Remove {
    fs::path d;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } remove{dir};
  const data::ChatTrainOn train_on = data::parse_chat_train_on(cfg.data.train_on);
  ChatDataSummary out;
  out.files = static_cast<int64_t>(files.size());
  out.seq_len = cfg.train.seq_len;
  std::vector<std::vector<data::ChatSpan>> per_shard;
  for (size_t i = 0; i < files.size(); ++i) {
    char shard_name[32];
    std::snprintf(shard_name, sizeof(shard_name), "shard_%05zu.bin", i);
    const std::string shard = (dir / shard_name).string();
    const ChatEncodeStats s = encode_chat_file(tmpl, *tok, train_on, cfg.train.seq_len + 1,
                                               std::max<int64_t>(cfg.model.vocab_size, tok->vocab_size()), files[i], shard);
    out.encoded.conversations += s.conversations;
    out.encoded.written += s.written;
    out.encoded.tokens += s.tokens;
    out.encoded.trained += s.trained;
    out.encoded.cut += s.cut;
    out.encoded.trained_cut += s.trained_cut;
    out.skipped += static_cast<int64_t>(s.skipped_lines.size());
    if (s.written == 0) continue;
    auto t = std::make_shared<const data::TokenShard>(shard);
    per_shard.push_back(data::chat_conversations(t, std::make_shared<const data::TokenShard>(data::chat_flags_path(shard))));
  }
  FORGE_CHECK(!per_shard.empty(), "data.format = \"chat\": no conversation of data.files has a trained token (",
              files.size(), " file(s)); check the files' assistant messages, or raise train.seq_len");
  const data::ChatSplit split = data::split_chat(per_shard, cfg.data.val_files.empty() ? cfg.data.val_fraction : 0.0);
  out.train_conversations = static_cast<int64_t>(split.train.size());
  out.val_conversations = static_cast<int64_t>(split.val.size());
  for (const auto& c : split.train) out.train_tokens += c.size();
  const data::ChatRows rows(split.train, 1, cfg.train.seq_len, data::ChatRows::Order::sequential);
  out.rows = rows.num_rows();
  out.trained_targets = rows.trained_targets();
  return out;
}

}  // namespace forge::train
