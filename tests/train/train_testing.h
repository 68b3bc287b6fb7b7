#pragma once
// Helpers for the trainer tests: a scratch directory, a small synthetic corpus, and the
// TOML of a tiny GPT run over it (a few ms per step).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forge/core/error.h"
#include "forge/io/safetensors.h"

namespace forge::train_testing {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with its contents at scope exit.
class Scratch {
 public:
  Scratch() {
    std::string tmpl = (fs::temp_directory_path() / "forge_train_test_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw Error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  const fs::path& path() const { return path_; }
  std::string str(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

inline void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// About `bytes` bytes of English-like sentences from a small grammar, driven by a fixed
// LCG: structured enough that a tiny model's loss falls within a few dozen steps.
inline std::string synthetic_text(size_t bytes, uint64_t seed) {
  static const std::vector<std::string> subjects = {"the cat", "a dog", "my friend", "the old man", "our teacher",
                                                    "a small bird", "the computer", "every child"};
  static const std::vector<std::string> verbs = {"sees", "likes", "finds", "wants", "reads", "makes", "hears", "knows"};
  static const std::vector<std::string> objects = {"the red ball", "a good book", "some warm bread", "the river",
                                                   "a quiet song", "the morning sun", "a long letter", "the garden"};
  std::string out;
  uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  auto next = [&](size_t n) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>((s >> 33) % n);
  };
  while (out.size() < bytes) {
    std::string sentence = subjects[next(subjects.size())] + " " + verbs[next(verbs.size())] + " " +
                           objects[next(objects.size())];
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    out += sentence + (next(4) == 0 ? ".\n" : ". ");
  }
  return out;
}

// Two corpus files in `dir` (corpus_a.txt, corpus_b.txt), ~`bytes` each.
inline std::vector<std::string> write_corpus(const fs::path& dir, size_t bytes = 20000) {
  fs::create_directories(dir);
  const std::string a = (dir / "corpus_a.txt").string(), b = (dir / "corpus_b.txt").string();
  write_text(a, synthetic_text(bytes, 1));
  write_text(b, synthetic_text(bytes, 2));
  return {a, b};
}

// The training losses a run wrote to `run_dir`/metrics.jsonl, by step (final and evaluation
// records left out).
inline std::map<int64_t, double> metrics_losses(const fs::path& run_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("final")) out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// A tiny GPT run over the corpus in `root`/corpus, its run directory `root`/runs/<name>.
inline std::string tiny_toml(const fs::path& root, const std::string& name = "tiny", int64_t steps = 30) {
  return "[run]\nname = \"" + name + "\"\ndir = \"" + (root / "runs").string() +
         "\"\nseed = 7\ndevice = \"cpu\"\n"  // the CPU's exact numbers, also on a GPU machine
         "[model]\ntype = \"gpt\"\nblock_size = 32\nn_layer = 2\nn_head = 2\nn_embd = 32\n"
         "[data]\nfiles = [\"" + (root / "corpus").string() + "\"]\nvocab_size = 300\nval_fraction = 0.1\n"
         "[optim]\nlr = 3e-3\n"
         "[schedule]\nkind = \"cosine\"\nwarmup_steps = 5\nmin_lr = 3e-4\n"
         "[train]\nsteps = " + std::to_string(steps) + "\nbatch_size = 8\nseq_len = 32\nlog_every = 1\n"
         "[eval]\nevery = 10\nbatches = 4\nbigram_baseline = true\n"
         "[checkpoint]\nevery = 0\nkeep_last = 10\n";
}

// Every tensor of a checkpoint's model.safetensors, in name order, as f64: two runs' final weights
// compared bit for bit.
inline std::vector<double> checkpoint_weights(const fs::path& checkpoint_dir) {
  const auto tensors = io::load_safetensors((checkpoint_dir / "model.safetensors").string());
  const std::map<std::string, Tensor> sorted(tensors.tensors.begin(), tensors.tensors.end());
  std::vector<double> out;
  for (const auto& [n, t] : sorted) {
    const auto v = t.to_vector<double>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace forge::train_testing
