#include "fuzz/fuzz_targets.h"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <numeric>
#include <string>
#include <string_view>
#include <system_error>

#include "forge/core/error.h"
#include "forge/data/bpe.h"
#include "forge/data/chat_encoding.h"
#include "forge/data/chat_template.h"
#include "forge/data/documents.h"
#include "forge/data/idx.h"
#include "forge/data/shards.h"
#include "forge/data/tokenizer.h"
#include "forge/io/checkpoint.h"
#include "forge/io/json_input.h"
#include "forge/io/safetensors.h"
#include "forge/nn/model_registry.h"
#include "forge/ops/creation.h"
#include "forge/run/config.h"
#include "forge/run/hf_model.h"

namespace forge::fuzz {
namespace {

namespace fs = std::filesystem;

// One scratch directory per process (in /dev/shm when there is one: no disk traffic), removed
// at exit. Targets overwrite their files in it for every input.
const fs::path& scratch() {
  static const fs::path dir = [] {
    std::error_code ec;
    const fs::path base = fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0
                              ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string tmpl = (base / "forge_fuzz_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("forge fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code e;
      fs::remove_all(scratch(), e);
    });
    return fs::path(tmpl);
  }();
  return dir;
}

fs::path write_file(const std::string& name, const uint8_t* data, size_t size) {
  const fs::path p = scratch() / name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) {
    std::fprintf(stderr, "forge fuzz: cannot write %s\n", p.c_str());
    std::abort();
  }
  return p;
}

std::string_view text_of(const uint8_t* data, size_t size) { return {reinterpret_cast<const char*>(data), size}; }

// Reads every byte of every tensor, so a tensor that points outside its file is caught by ASan.
uint64_t touch(const io::NamedTensors& tensors) {
  uint64_t sum = 0;
  for (const auto& [name, t] : tensors.items()) {
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) sum += p[i];
    sum += name.size();
  }
  return sum;
}

volatile uint64_t g_sink = 0;

// ---- targets ------------------------------------------------------------------------------------

void fuzz_json(const uint8_t* data, size_t size) {
  const nlohmann::json j = io::parse_json(text_of(data, size), "fuzz.json");
  g_sink = g_sink + j.dump().size();
  const nlohmann::ordered_json o = io::parse_ordered_json(text_of(data, size), "fuzz.json");
  g_sink = g_sink + o.size();
}

void fuzz_safetensors(const uint8_t* data, size_t size) {
  const fs::path p = write_file("model.safetensors", data, size);
  const io::SafetensorsHeader h = io::read_safetensors_header(p);
  (void)h;
  const io::SafetensorsFile f = io::load_safetensors(p);
  g_sink = g_sink + touch(f.tensors);
}

void fuzz_hf_config(const uint8_t* data, size_t size) {
  const nlohmann::json j = io::parse_json(text_of(data, size), "config.json");
  const train::HfModel m = train::parse_hf_config(j, "config.json");
  if (m.model.vocab_size > 0) {
    nn::validate_model(m.model);
    g_sink = g_sink + static_cast<uint64_t>(nn::transformer_shape(m.model).n_layer);
  }
}

// A tokenizer read from the bytes under `name`, then used: encode a fixed text and a piece of the
// input, decode the ids and the first ids of the vocabulary, serialise it.
void use_tokenizer(const data::Tokenizer& tok, const uint8_t* data, size_t size) {
  static const std::string kSample =
      "Hello, world! The quick brown fox -- 123 4567 ... <|endoftext|> </s> <s> \n\n  tabs\tand "
      "unicode: caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 \xff\xfe invalid";
  std::vector<int32_t> ids = tok.encode(kSample);
  std::string back = tok.decode(ids);
  const std::string_view piece = text_of(data, std::min<size_t>(size, 256));
  ids = tok.encode(piece);
  back += tok.decode(ids);
  ids = tok.encode_ordinary(piece);
  back += tok.decode(ids);
  const int64_t n = std::min<int64_t>(tok.vocab_size(), 512);
  for (int32_t id = 0; id < n; ++id) {
    try {
      const int32_t one[1] = {id};
      back += tok.decode(one);
    } catch (const Error&) {  // a hole in the vocabulary
    }
  }
  for (const auto& s : tok.special_tokens()) back += s;
  if (const auto e = tok.eos_token()) back += *e;
  back += tok.describe();
  back += tok.serialized();
  g_sink = g_sink + back.size();
}

void fuzz_tokenizer_as(const char* name, const uint8_t* data, size_t size) {
  const auto tok = data::tokenizer_from_bytes(std::string(text_of(data, size)), name);
  use_tokenizer(*tok, data, size);
}

void fuzz_tokenizer_json(const uint8_t* d, size_t n) { fuzz_tokenizer_as("tokenizer.json", d, n); }
void fuzz_tiktoken(const uint8_t* d, size_t n) { fuzz_tokenizer_as("cl100k_base.tiktoken", d, n); }
void fuzz_sentencepiece(const uint8_t* d, size_t n) { fuzz_tokenizer_as("tokenizer.model", d, n); }
void fuzz_forge_bpe(const uint8_t* d, size_t n) { fuzz_tokenizer_as("forge_tokenizer.json", d, n); }

io::CheckpointData base_checkpoint() {
  io::CheckpointData d;
  d.step = 40;
  std::vector<float> w(24), m(24);
  std::iota(w.begin(), w.end(), 0.5f);
  std::iota(m.begin(), m.end(), -3.0f);
  d.model = io::NamedTensors({{"wte.weight", from_vector(w, {4, 6})}, {"ln_f.bias", from_vector(m, {24})}});
  d.optimizer = io::NamedTensors({{"exp_avg.wte.weight", from_vector(m, {4, 6})}});
  d.data_loader = {{"epoch", 1}, {"position", 96}};
  d.config = {{"model", {{"type", "gpt"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 6}, {"vocab_size", 4},
                         {"block_size", 8}}}};
  d.extra = {{"loss_scale", 1.0}};
  return d;
}

// The base checkpoint (fixed values: its manifest's checksums are the same in every process, so
// the seeds match it) copied to a run directory's step 40 with one file replaced by the input.
fs::path checkpoint_with(const char* file, const uint8_t* data, size_t size) {
  static const fs::path base = [] {
    const fs::path dir = scratch() / "base_checkpoint";
    io::save_checkpoint(dir, base_checkpoint());
    return dir;
  }();
  const fs::path dir = io::checkpoint_path(scratch() / "run", 40);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir.parent_path());
  // libFuzzer's -timeout alarm (a handler without SA_RESTART) can interrupt the copy's sendfile:
  // the harness's own setup, not the code under test (forge's handlers restart: preemption.cpp).
  for (int attempt = 0;; ++attempt) {
    fs::copy(base, dir, fs::copy_options::recursive | fs::copy_options::overwrite_existing, ec);
    if (!ec) break;
    if (ec != std::errc::interrupted || attempt == 100) throw fs::filesystem_error("fuzz harness: copy", base, dir, ec);
  }
  write_file((fs::path("run") / "checkpoints" / dir.filename() / file).string(), data, size);
  return dir;
}

void use_checkpoint(const io::CheckpointData& ck, const fs::path& dir) {
  g_sink = g_sink + touch(ck.model) + touch(ck.optimizer) + ck.data_loader.dump().size() + ck.extra.dump().size();
  if (ck.config.is_object() || ck.config.is_string()) {
    const train::RunConfig cfg = train::config_from_json(ck.config, (dir / "state.json").string() + " (config)");
    g_sink = g_sink + cfg.model.type.size();
  }
}

void fuzz_checkpoint_state(const uint8_t* data, size_t size) {
  const fs::path dir = checkpoint_with("state.json", data, size);
  use_checkpoint(io::load_checkpoint(dir, Device::cpu(), /*verify=*/false), dir);
}

void fuzz_checkpoint_manifest(const uint8_t* data, size_t size) {
  const fs::path dir = checkpoint_with("manifest.json", data, size);
  g_sink = g_sink + static_cast<uint64_t>(io::verify_checkpoint(dir));
  use_checkpoint(io::load_checkpoint(dir, Device::cpu(), /*verify=*/true), dir);
  const io::ValidCheckpoint v = io::find_latest_valid_checkpoint(scratch() / "run");
  g_sink = g_sink + v.skipped.size();
}

void use_shard(const std::string& path) {
  const data::TokenShard s(path);
  int64_t sum = s.max_token();
  const int64_t n = std::min<int64_t>(s.size(), 4096);
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (n > 0) s.copy(0, n, out.data());
  for (int32_t t : out) sum += t;
  if (s.size() > 0) sum += s.at(s.size() - 1);
  g_sink = g_sink + static_cast<uint64_t>(sum);
}

void fuzz_shard_forge(const uint8_t* data, size_t size) { use_shard(write_file("train_000.tok", data, size).string()); }
void fuzz_shard_llmc(const uint8_t* data, size_t size) { use_shard(write_file("fineweb_train_000.bin", data, size).string()); }

// Megatron's two files from one input: a little-endian u32 n (taken modulo the rest's size + 1),
// then the .idx (n bytes) and the .bin (the rest).
void fuzz_shard_megatron(const uint8_t* data, size_t size) {
  uint32_t n = 0;
  if (size >= 4) std::memcpy(&n, data, 4);
  const uint8_t* rest = size >= 4 ? data + 4 : data;
  const size_t rest_size = size >= 4 ? size - 4 : size;
  n = static_cast<uint32_t>(n % (rest_size + 1));
  write_file("corpus_text_document.idx", rest, n);
  use_shard(write_file("corpus_text_document.bin", rest + n, rest_size - n).string());
}

void read_documents(const fs::path& p) {
  uint64_t total = 0;
  const int64_t docs = data::for_each_document(p.string(), "text", [&](std::string_view d) { total += d.size(); });
  g_sink = g_sink + total + static_cast<uint64_t>(docs);
}

void fuzz_jsonl(const uint8_t* data, size_t size) { read_documents(write_file("corpus.jsonl", data, size)); }
void fuzz_jsonl_gz(const uint8_t* data, size_t size) { read_documents(write_file("corpus.jsonl.gz", data, size)); }
void fuzz_text(const uint8_t* data, size_t size) { read_documents(write_file("corpus.txt", data, size)); }

// A chat template (Note [chat templates]): parsed, rendered over a fixed conversation with and
// without the generation prompt, and its masks found by rendering prefixes (Note [chat masks]) under
// forge's byte-level tokenizer.
void fuzz_chat_template(const uint8_t* data, size_t size) {
  const data::ChatTemplate t(std::string(text_of(data, size)), "fuzz.jinja", "<s>", "</s>", {});
  const data::Conversation c = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "2+2?"},
                                {"assistant", "4"}};
  g_sink = g_sink + t.render(c, false).size() + t.render({c[0], c[1]}, true).size();
  const data::BpeTokenizer bytes;
  g_sink = g_sink + static_cast<uint64_t>(
                        data::encode_conversation(t, bytes, c, data::ChatTrainOn::assistant, "fuzz").trained_count());
}

void fuzz_toml(const uint8_t* data, size_t size) {
  const train::RunConfig cfg = train::parse_config(std::string(text_of(data, size)), "fuzz.toml");
  g_sink = g_sink + train::config_to_toml(cfg).size();
}

void fuzz_idx(const uint8_t* data, size_t size) {
  const data::IdxArray a = data::read_idx(write_file("train-images-idx3-ubyte", data, size).string());
  g_sink = g_sink + a.dims.size();
}

}  // namespace

const std::vector<FuzzTarget>& fuzz_targets() {
  static const std::vector<FuzzTarget> targets = {
      {"json", "any JSON document forge reads (io::parse_json, parse_ordered_json)", fuzz_json},
      {"safetensors", "a .safetensors file (io::read_safetensors_header, load_safetensors; every tensor read)",
       fuzz_safetensors},
      {"hf_config", "a Hugging Face config.json (train::parse_hf_config, the model's shape rules)", fuzz_hf_config},
      {"tokenizer_json", "a Hugging Face tokenizer.json, loaded and used (encode, decode, serialise)",
       fuzz_tokenizer_json},
      {"tiktoken", "a tiktoken ranks file, loaded and used", fuzz_tiktoken},
      {"sentencepiece", "a sentencepiece .model, loaded and used", fuzz_sentencepiece},
      {"forge_bpe", "forge's own BPE tokenizer file, loaded and used", fuzz_forge_bpe},
      {"checkpoint_state", "a checkpoint's state.json (io::load_checkpoint, its config validated)",
       fuzz_checkpoint_state},
      {"checkpoint_manifest", "a checkpoint's manifest.json (io::verify_checkpoint, load_checkpoint, "
                              "find_latest_valid_checkpoint)", fuzz_checkpoint_manifest},
      {"shard_forge", "a forge token shard (data::TokenShard)", fuzz_shard_forge},
      {"shard_llmc", "an llm.c token shard (.bin)", fuzz_shard_llmc},
      {"shard_megatron", "a Megatron .idx and .bin pair (u32 .idx length, .idx, .bin)", fuzz_shard_megatron},
      {"jsonl", "a JSON Lines corpus (data::for_each_document)", fuzz_jsonl},
      {"jsonl_gz", "a gzip JSON Lines corpus (.jsonl.gz)", fuzz_jsonl_gz},
      {"text", "a plain text corpus", fuzz_text},
      {"toml", "a run config (train::parse_config, validate)", fuzz_toml},
      {"chat_template", "a chat template (data::ChatTemplate: parsed, rendered, masks by prefixes)",
       fuzz_chat_template},
      {"idx", "an IDX file (Fashion-MNIST; data::read_idx)", fuzz_idx},
  };
  return targets;
}

void write_base_checkpoint(const std::string& dir) { io::save_checkpoint(dir, base_checkpoint()); }

const FuzzTarget* find_fuzz_target(const std::string& name) {
  for (const auto& t : fuzz_targets())
    if (name == t.name) return &t;
  return nullptr;
}

bool run_fuzz_target(const FuzzTarget& t, const uint8_t* data, size_t size) {
  try {
    t.run(data, size);
    return true;
  } catch (const Error&) {
    return false;  // the expected answer to bad bytes
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forge fuzz %s: an exception other than forge::Error escaped (%s): %s\n", t.name,
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "forge fuzz %s: a non-standard exception escaped\n", t.name);
    std::abort();
  }
}

}  // namespace forge::fuzz
