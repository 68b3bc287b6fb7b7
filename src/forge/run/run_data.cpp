// Tokenizer, shards, random tokens and the bigram baseline (contracts in run_data.h).
#include "forge/run/run_data.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <unordered_map>

#include "forge/core/error.h"
#include "forge/core/generator.h"
#include "forge/data/documents.h"
#include "forge/data/shards.h"
#include "forge/io/atomic_file.h"
#include "forge/io/json_input.h"
#include "forge/io/output_guard.h"
#include "forge/ops/creation.h"
#include "forge/telemetry/metrics.h"

namespace forge::train {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kTokenizerSourceFile = "tokenizer.source.json";
constexpr const char* kManifestFile = "manifest.json";

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fixed1(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

}  // namespace

json files_fingerprint(const std::vector<std::string>& files) {
  json out = json::array();
  for (const auto& f : files) {
    std::error_code ec;
    const auto size = fs::file_size(f, ec);
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    out.push_back({{"path", fs::absolute(f).lexically_normal().string()}, {"size", size}, {"mtime", mtime}});
  }
  return out;
}

namespace {

std::optional<json> read_json_file(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  try {
    return io::read_json_file(p.string());
  } catch (const std::exception&) {
    return std::nullopt;  // a damaged cache file is rebuilt
  }
}

}  // namespace

std::string fnv1a_hex(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::shared_ptr<const data::Tokenizer> load_or_train_tokenizer(const RunConfig& cfg,
                                                               const std::vector<std::string>& files,
                                                               const std::optional<fs::path>& resume_tokenizer,
                                                               std::ostream& log) {
  const fs::path run_dir = cfg.run_dir();
  const fs::path tok_path = run_dir / kTokenizerFile;
  const fs::path source_path = run_dir / kTokenizerSourceFile;
  std::error_code ec;
  if (resume_tokenizer) {
    FORGE_CHECK(fs::is_regular_file(*resume_tokenizer, ec), "--resume: '", resume_tokenizer->string(),
                "' is missing; a checkpoint is continued with the tokenizer of its run directory");
    auto tok = data::load_tokenizer(resume_tokenizer->string());
    if (fs::absolute(*resume_tokenizer).lexically_normal() != fs::absolute(tok_path).lexically_normal()) {
      tok->save(tok_path.string());
      io::write_file_atomic(source_path, json{{"from", resume_tokenizer->string()}}.dump() + "\n");
    }
    log << "tokenizer: " << resume_tokenizer->string() << " (the checkpoint's run), " << tok->describe() << "\n";
    return tok;
  }
  if (!cfg.data.tokenizer.empty()) {
    auto tok = data::load_tokenizer(cfg.data.tokenizer);  // Note [tokenizer files] (tokenizer.cpp)
    tok->save(tok_path.string());
    io::write_file_atomic(source_path, json{{"from", cfg.data.tokenizer}}.dump() + "\n");
    log << "tokenizer: " << cfg.data.tokenizer << ", " << tok->describe() << "\n";
    return tok;
  }
  json want = {{"trained_on", files_fingerprint(files)}, {"vocab_size", cfg.data.vocab_size}};
  if (cfg.data.text_key != "text") want["text_key"] = cfg.data.text_key;
  if (!cfg.data.eos_token.empty()) want["special_tokens"] = json::array({cfg.data.eos_token});
  if (fs::is_regular_file(tok_path, ec) && read_json_file(source_path) == want) {
    auto tok = data::load_tokenizer(tok_path.string());
    log << "tokenizer: reusing " << tok_path.string() << ", " << tok->describe() << "\n";
    return tok;
  }
  const auto t0 = Clock::now();
  data::BpeTrainOptions topt;
  topt.vocab_size = cfg.data.vocab_size;
  topt.text_key = cfg.data.text_key;
  if (!cfg.data.eos_token.empty()) topt.special_tokens = {cfg.data.eos_token};
  auto tok = std::make_shared<data::BpeTokenizer>(data::BpeTokenizer::train_files(files, topt));
  tok->save(tok_path.string());
  io::write_file_atomic(source_path, want.dump() + "\n");
  log << "tokenizer: trained a byte-level BPE of " << tok->vocab_size() << " tokens on " << files.size()
      << " file(s) in " << fixed1(seconds_since(t0)) << " s -> " << tok_path.string() << "\n";
  return tok;
}

fs::path data_shards_dir(const RunConfig& cfg) {
  return cfg.data.shards_dir.empty() ? fs::path(cfg.run_dir()) / "data" : fs::path(cfg.data.shards_dir);
}

std::vector<std::string> prepare_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                        const std::vector<std::string>& files, std::ostream& log) {
  return prepare_shards(cfg, tok, files, log, data_shards_dir(cfg));
}

std::vector<std::string> prepare_shards(const RunConfig& cfg, const data::Tokenizer& tok,
                                        const std::vector<std::string>& files, std::ostream& log, const fs::path& dir) {
  json want = {{"format", "forge-shards"}, {"tokenizer", fnv1a_hex(tok.serialized())}, {"files", files_fingerprint(files)}};
  // (Note [documents]: how the files become documents changes the shards.)
  if (cfg.data.text_key != "text") want["text_key"] = cfg.data.text_key;
  if (!cfg.data.eos_token.empty()) want["eos_token"] = cfg.data.eos_token;
  if (auto paths = manifest_shards(dir, want)) {
    log << "data: reusing " << paths->size() << " token shard(s) in " << dir.string() << "\n";
    return *paths;
  }
  claim_shards_dir(dir, log);
  const auto t0 = Clock::now();
  auto paths = encode_files_to_shards(tok, files, dir.string(), nullptr, cfg.data.text_key, cfg.data.eos_token);
  write_manifest(dir, want, paths);
  log << "data: tokenized " << files.size() << " file(s) into " << dir.string() << " in "
      << fixed1(seconds_since(t0)) << " s\n";
  return paths;
}

bool is_shards_dir_entry(const fs::path& entry) {
  std::string n = entry.filename().string();
  if (io::is_temporary_name(n)) n = n.substr(0, n.rfind('.', n.rfind('.', n.rfind('.') - 1) - 1));
  const std::string flags = ".flags.bin";
  const bool flag_file = n.size() > flags.size() && n.compare(n.size() - flags.size(), flags.size(), flags) == 0 &&
                         is_shard_file_name(n.substr(0, n.size() - flags.size()) + ".bin");
  return is_shard_file_name(n) || flag_file || n == kManifestFile || n == "random_tokens.bin";
}

void claim_shards_dir(const fs::path& dir, std::ostream& log) {
  // Note [nothing deletes what it did not write]: only shards, their flags and manifest, and the
  // temporaries of those, may be there.
  io::check_output_dir(dir, "data.shards_dir", [](const fs::path& e) { return is_shards_dir_entry(e); },
                       /*force=*/false);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!io::is_temporary_name(n)) continue;
    // "<name>.tmp.<pid>.<hex>": a writer's temporary; its writer is gone when no process has the pid.
    const size_t hex_dot = n.rfind('.'), pid_dot = n.rfind('.', hex_dot - 1);
    const long pid = std::strtol(n.substr(pid_dot + 1, hex_dot - pid_dot - 1).c_str(), nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      fs::remove(e.path(), ec);
      log << "data: removed " << e.path().string() << ", the temporary of a shard writer that did not finish\n";
    }
  }
}

// Note [shard manifests] (run_data.h).
std::optional<std::vector<std::string>> manifest_shards(const fs::path& dir, const json& want) {
  const auto m = read_json_file(dir / kManifestFile);
  if (!m || !m->is_object() || !m->contains("shards") || !(*m)["shards"].is_array()) return std::nullopt;
  for (const auto& [key, value] : want.items())
    if (m->value(key, json()) != value) return std::nullopt;
  std::vector<std::string> paths;
  std::error_code ec;
  for (const auto& s : (*m)["shards"]) {
    if (!s.is_string()) return std::nullopt;
    const fs::path p = dir / s.get<std::string>();
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    paths.push_back(p.string());
  }
  return paths;
}

void write_manifest(const fs::path& dir, const json& want, const std::vector<std::string>& shards, const json& extra) {
  json manifest = want;
  for (const auto& [key, value] : extra.items()) manifest[key] = value;
  manifest["shards"] = json::array();
  for (const auto& p : shards) manifest["shards"].push_back(fs::path(p).filename().string());
  io::write_file_atomic(dir / kManifestFile, manifest.dump(2) + "\n");
}

// data.source = "random": uniform random tokens of model.vocab_size in one shard of the run
// directory, from the run's seed (a resumed run rewrites the same tokens). 8 Mi tokens: enough
// windows that a benchmark never sees the same batch twice in practice; 16-32 MB on disk.
std::string write_random_shard(const RunConfig& cfg, std::ostream& log, bool write) {
  constexpr int64_t kTokens = int64_t{1} << 23;
  const fs::path dir = cfg.data.shards_dir.empty() ? fs::path(cfg.run_dir()) / "data" : fs::path(cfg.data.shards_dir);
  if (!write) return (dir / "random_tokens.bin").string();  // another rank wrote it
  std::error_code ec;
  fs::create_directories(dir, ec);
  FORGE_CHECK(!ec, "cannot create the shard directory '", dir.string(), "': ", ec.message());
  Generator gen(static_cast<uint64_t>(cfg.run.seed) ^ kDataSeedSalt);
  const Tensor ids = randint(0, cfg.model.vocab_size, {kTokens}, {.dtype = DType::i32}, &gen);
  const std::string path = (dir / "random_tokens.bin").string();
  data::write_shard(path, std::span<const int32_t>(ids.data<int32_t>(), static_cast<size_t>(kTokens)), cfg.model.vocab_size);
  log << "data: " << telemetry::format_count(static_cast<double>(kTokens)) << " uniform random tokens in [0, "
      << cfg.model.vocab_size << ") -> " << path << "\n";
  return path;
}

std::vector<std::string> pre_encoded_shards(const std::vector<std::string>& files) {
  std::set<std::string> megatron_bins;
  std::vector<std::pair<std::string, std::string>> kinds;  // (file, format or "")
  for (const auto& f : files) {
    const std::string format = data::token_shard_format(f);
    kinds.emplace_back(f, format);
    if (format == "megatron") megatron_bins.insert(f);
  }
  std::vector<std::string> shards;
  std::string text;
  auto ends_with = [](const std::string& s, const char* suffix) {
    const size_t n = std::strlen(suffix);
    return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
  };
  for (const auto& [f, format] : kinds) {
    if (!format.empty()) {
      shards.push_back(f);
      continue;
    }
    const bool index = ends_with(f, ".idx") && megatron_bins.count(f.substr(0, f.size() - 4) + ".bin");
    if (index) continue;
    // Issue 43: formats by content. A file named as a shard whose header matches none (a flipped
    // magic byte, a Megatron .bin whose index is missing or truncated) is an error, never text.
    FORGE_CHECK(!ends_with(f, ".bin"), "data.files: '", f, "' is named as a token shard (.bin) but is none forge reads: ",
                "its first bytes are neither forge's magic \"FRGTOK\\0\\0\" nor llm.c's 20240520 / 20240801, and no ",
                "Megatron index ('", f.substr(0, f.size() - 4), ".idx', magic \"MMIDIDX\\0\\0\") is beside it; restore ",
                "the shard or its index, or rename a text corpus");
    FORGE_CHECK(!ends_with(f, ".idx"), "data.files: '", f, "' is named as a Megatron index (.idx) but its .bin ('",
                f.substr(0, f.size() - 4), ".bin') is not among data.files or its magic is not \"MMIDIDX\\0\\0\"");
    if (text.empty()) text = f;
  }
  if (shards.empty()) return {};
  FORGE_CHECK(text.empty(), "data.files mixes token shards ('", shards.front(), "', ",
              data::token_shard_format(shards.front()), ") with text ('", text,
              "'); give either text files (encoded by the run's tokenizer) or shards already encoded, not both");
  return shards;
}

void check_shard_vocabulary(const std::vector<std::shared_ptr<const data::TokenShard>>& shards, int64_t vocab,
                            std::ostream& log) {
  const auto t0 = Clock::now();
  int64_t tokens = 0;
  for (const auto& s : shards) {
    const int32_t most = s->max_token();
    FORGE_CHECK(most < vocab, "data: '", s->path(), "' (", s->format(), " shard) holds token id ", most,
                ", outside the model's vocabulary of ", vocab, "; set model.vocab_size to at least ", most + 1,
                " (or data.tokenizer to the tokenizer that encoded it)");
    tokens += s->size();
  }
  log << "data: " << shards.size() << " pre-encoded shard(s) (" << shards.front()->format() << "), "
      << telemetry::format_count(static_cast<double>(tokens)) << " tokens, every id below " << vocab << " (checked in "
      << fixed1(seconds_since(t0)) << " s)\n";
}

// Note [streaming encoder]: documents are read in batches of about kBatchBytes of text, each
// batch encoded over the cores (OpenMP over its documents; each document's ids in its own
// vector, appended in order), and the ids streamed into the current shard, which is committed
// and replaced by the next one at tokens_per_shard tokens. Memory is bounded by one batch and
// its ids whatever the corpus's size (a plain text file is one document, read whole). The ids
// are those of encoding the documents one after another.
bool is_shard_file_name(const fs::path& path) {
  const std::string n = path.filename().string();
  // "shard_" + 5 or more digits (the %05zu of encode_files_to_shards) + ".bin"
  if (n.size() < 15 || n.rfind("shard_", 0) != 0 || n.compare(n.size() - 4, 4, ".bin") != 0) return false;
  return std::all_of(n.begin() + 6, n.end() - 4, [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> encode_files_to_shards(const data::Tokenizer& tok, const std::vector<std::string>& files,
                                                const std::string& out_dir, std::ostream* log,
                                                const std::string& text_key, const std::string& eos,
                                                int64_t tokens_per_shard) {
  constexpr int64_t kBatchBytes = int64_t{32} << 20;
  FORGE_CHECK(tokens_per_shard > 0, "encode_files_to_shards: tokens_per_shard must be positive");
  const int32_t eos_id = eos.empty() ? -1 : tok.special_id(eos);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  FORGE_CHECK(!ec, "cannot create the shard directory '", out_dir, "': ", ec.message());
  std::vector<std::string> paths;
  std::unique_ptr<data::ShardWriter> shard;
  auto open_shard = [&] {
    char name[32];
    std::snprintf(name, sizeof(name), "shard_%05zu.bin", paths.size());
    paths.push_back((fs::path(out_dir) / name).string());
    shard = std::make_unique<data::ShardWriter>(paths.back(), tok.vocab_size());
  };
  for (const auto& file : files) {
    const size_t first_shard = paths.size();
    open_shard();
    int64_t bytes = 0, tokens = 0;
    std::vector<std::string> batch;
    int64_t batch_bytes = 0;
    auto flush = [&] {
      std::vector<std::vector<int32_t>> ids(batch.size());
#pragma omp parallel for schedule(dynamic, 1) if (batch.size() > 1)
      for (size_t k = 0; k < batch.size(); ++k) {
        tok.encode_ordinary_into(batch[k], ids[k]);
        if (eos_id >= 0) ids[k].push_back(eos_id);
      }
      for (const auto& v : ids) {
        std::span<const int32_t> rest(v);
        while (!rest.empty()) {  // (a document may cross into the next shard)
          if (shard->size() >= tokens_per_shard) {
            shard->commit();
            open_shard();
          }
          const auto n = std::min<size_t>(rest.size(), static_cast<size_t>(tokens_per_shard - shard->size()));
          shard->append(rest.first(n));
          rest = rest.subspan(n);
        }
        tokens += static_cast<int64_t>(v.size());
      }
      batch.clear();
      batch_bytes = 0;
    };
    const int64_t docs = data::for_each_document(file, text_key, [&](std::string_view doc) {
      batch.emplace_back(doc);
      batch_bytes += static_cast<int64_t>(doc.size());
      bytes += static_cast<int64_t>(doc.size());
      if (batch_bytes >= kBatchBytes) flush();
    });
    flush();
    shard->commit();
    shard.reset();
    if (log)
      *log << "  " << file << ": " << docs << " document(s), " << bytes << " bytes -> " << tokens << " tokens -> "
           << paths.size() - first_shard << " shard(s) from " << paths[first_shard] << "\n";
  }
  return paths;
}

double bigram_baseline(const std::vector<data::TokenRange>& train, data::SequentialWindows& windows,
                       int64_t max_batches, int64_t vocab) {
  FORGE_CHECK(vocab > 0, "bigram_baseline: vocab must be positive");
  // Sparse pair counts (a dense V x V table would not fit for large vocabularies).
  std::unordered_map<uint64_t, int64_t> pairs;
  std::vector<int64_t> firsts(static_cast<size_t>(vocab), 0);
  std::vector<int32_t> buf;
  for (const auto& r : train) {
    if (r.size() < 2) continue;
    buf.resize(static_cast<size_t>(r.size()));
    r.shard->copy(r.begin, r.size(), buf.data());
    for (size_t i = 0; i + 1 < buf.size(); ++i) {
      FORGE_CHECK(buf[i] >= 0 && buf[i] < vocab && buf[i + 1] >= 0 && buf[i + 1] < vocab, "bigram_baseline: token ",
                  std::max(buf[i], buf[i + 1]), " is outside the vocabulary of ", vocab);
      ++pairs[static_cast<uint64_t>(buf[i]) * static_cast<uint64_t>(vocab) + static_cast<uint64_t>(buf[i + 1])];
      ++firsts[static_cast<size_t>(buf[i])];
    }
  }
  double nll = 0.0;
  int64_t count = 0;
  for (int64_t b = 0; max_batches == 0 || b < max_batches; ++b) {
    auto batch = windows.next();
    if (!batch) break;
    const int64_t* in = batch->inputs.data<int64_t>();
    const int64_t* tg = batch->targets.data<int64_t>();
    for (int64_t i = 0; i < batch->targets.numel(); ++i) {
      const auto it = pairs.find(static_cast<uint64_t>(in[i]) * static_cast<uint64_t>(vocab) + static_cast<uint64_t>(tg[i]));
      const double c = it == pairs.end() ? 0.0 : static_cast<double>(it->second);
      nll -= std::log((c + 1.0) / (static_cast<double>(firsts[static_cast<size_t>(in[i])]) + static_cast<double>(vocab)));
      ++count;
    }
  }
  FORGE_CHECK(count > 0, "bigram_baseline: no validation window");
  return nll / static_cast<double>(count);
}

}  // namespace forge::train
