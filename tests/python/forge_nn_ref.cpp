// forge's side of the PyTorch check of the neural-network ops (tests/python/nn_reference.py).
//
//   forge_nn_ref <inputs file> <outputs file>
//
// Reads the cases and their inputs, runs each case named in the inputs file (forward, then
// one backward from all its outputs that have an upstream gradient), and writes the outputs
// and the gradients of the inputs that require grad. A case that throws writes
// `<case>/error` and the run goes on. The comparison with torch happens in the script.
//
// Exchange format (text, ASCII; shared with nn_reference.py, keep the two in step)
// ---------------------------------------------------------------------------------
// A file is a sequence of records; tokens are separated by whitespace.
//
//   case <case>
//       (inputs file only) a case to run, in file order.
//   tensor <name> <dtype> <requires_grad> <ndim> <d0> ... <d{ndim-1}>
//   <numel values>
//       dtype is f64, i64 or i32; requires_grad is 0 or 1 (1: the tensor becomes a leaf that
//       requires grad). Values in row-major order: f64 as a decimal that converts back
//       exactly (Python repr, C "%.17g"), or nan, inf, -inf; integers in decimal.
//   error <name> <nbytes>
//   <exactly nbytes bytes, then one newline>
//       (outputs file only) the message of the exception a case threw.
//
// Names: inputs are `<case>/<input>`; upstream gradients `<case>/gout/<output>`; in the
// outputs file `<case>/out/<output>`, `<case>/grad/<input>` (for each input that requires
// grad and received a gradient) and `<case>/error`.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forge/forge.h"

namespace {

using namespace forge;
using ops::Reduction;

// ---- the exchange format --------------------------------------------------------------

struct InputFile {
  std::vector<std::string> cases;
  std::map<std::string, Tensor> tensors;
};

InputFile read_inputs(const std::string& path) {
  std::ifstream in(path);
  FORGE_CHECK(in.good(), "forge_nn_ref: cannot open ", path);
  InputFile f;
  std::string kind;
  while (in >> kind) {
    if (kind == "case") {
      std::string name;
      in >> name;
      f.cases.push_back(name);
      continue;
    }
    FORGE_CHECK(kind == "tensor", "forge_nn_ref: unknown record kind '", kind, "' in ", path);
    std::string name, dt;
    int rg = 0, ndim = 0;
    in >> name >> dt >> rg >> ndim;
    Shape shape(static_cast<size_t>(ndim));
    for (auto& d : shape) in >> d;
    const auto n = static_cast<size_t>(shape_numel(shape));
    Tensor t;
    if (dt == "f64") {
      std::vector<double> v(n);
      for (auto& x : v) {
        std::string tok;
        in >> tok;
        x = std::strtod(tok.c_str(), nullptr);  // also parses nan, inf, -inf
      }
      t = from_vector(v, shape);
    } else {
      FORGE_CHECK(dt == "i64" || dt == "i32", "forge_nn_ref: unsupported dtype '", dt, "' for ", name);
      std::vector<int64_t> v(n);
      for (auto& x : v) in >> x;
      t = from_vector(v, shape, {.dtype = dt == "i64" ? DType::i64 : DType::i32});
    }
    FORGE_CHECK(!in.fail(), "forge_nn_ref: malformed tensor record '", name, "' in ", path);
    if (rg) t.requires_grad_(true);
    f.tensors[name] = t;
  }
  return f;
}

class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : f_(std::fopen(path.c_str(), "wb")) {
    FORGE_CHECK(f_ != nullptr, "forge_nn_ref: cannot write ", path);
  }
  ~OutputFile() { std::fclose(f_); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void tensor(const std::string& name, const Tensor& t) {
    const bool floating = is_floating(t.dtype());
    std::fprintf(f_, "tensor %s %s 0 %d", name.c_str(), floating ? "f64" : "i64", static_cast<int>(t.dim()));
    for (int64_t d : t.shape()) std::fprintf(f_, " %" PRId64, d);
    std::fputc('\n', f_);
    if (floating) {
      for (double v : t.to_vector<double>()) std::fprintf(f_, "%.17g\n", v);
    } else {
      for (int64_t v : t.to_vector<int64_t>()) std::fprintf(f_, "%" PRId64 "\n", v);
    }
  }

  void error(const std::string& name, const std::string& s) {
    std::fprintf(f_, "error %s %zu\n", name.c_str(), s.size());
    std::fwrite(s.data(), 1, s.size(), f_);
    std::fputc('\n', f_);
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

// ---- cases ----------------------------------------------------------------------------

class Ctx {
 public:
  Ctx(const std::string& name, const InputFile& file) : name_(name), file_(file) {}
  const Tensor& in(const std::string& input) const {
    auto it = file_.tensors.find(name_ + "/" + input);
    FORGE_CHECK(it != file_.tensors.end(), "case ", name_, ": input '", input, "' is missing from the inputs file");
    return it->second;
  }
  void out(const std::string& output, const Tensor& t) { outputs.emplace_back(output, t); }
  std::vector<std::pair<std::string, Tensor>> outputs;

 private:
  std::string name_;
  const InputFile& file_;
};

using CaseFn = std::function<void(Ctx&)>;

void layer_norm_affine(Ctx& c) { c.out("y", ops::layer_norm(c.in("x"), c.in("w"), c.in("b"), 1e-5)); }
void layer_norm_3d_plain(Ctx& c) { c.out("y", ops::layer_norm(c.in("x"))); }
void layer_norm_weight_only_transposed(Ctx& c) {
  c.out("y", ops::layer_norm(c.in("x").t(), c.in("w"), Tensor(), 1e-3));
}
void layer_norm_bias_only_offset(Ctx& c) {
  c.out("y", ops::layer_norm(ops::add(c.in("x"), 100.0), Tensor(), c.in("b"), 1e-5));
}
void rms_norm_weight(Ctx& c) { c.out("y", ops::rms_norm(c.in("x"), c.in("w"), 1e-6)); }
void rms_norm_plain_strided(Ctx& c) {
  const Tensor& x = c.in("x");
  c.out("y", ops::rms_norm(x.slice(1, 0, x.size(1), 2), Tensor(), 1e-5));
}
void embedding_repeats(Ctx& c) { c.out("out", ops::embedding(c.in("weight"), c.in("ids"))); }
void embedding_i32_transposed(Ctx& c) { c.out("out", ops::embedding(c.in("weight").t(), c.in("ids"))); }

void cross_entropy_reductions(Ctx& c) {
  const Tensor &logits = c.in("logits"), &targets = c.in("targets");
  c.out("mean", ops::cross_entropy(logits, targets));
  c.out("sum", ops::cross_entropy(logits, targets, -100, Reduction::sum));
  c.out("none", ops::cross_entropy(logits, targets, -100, Reduction::none));
}
void cross_entropy_3d(Ctx& c) {
  const Tensor &logits = c.in("logits"), &targets = c.in("targets");
  c.out("mean", ops::cross_entropy(logits, targets));
  c.out("none", ops::cross_entropy(logits, targets, -100, Reduction::none));
}
void cross_entropy_custom_ignore(Ctx& c) { c.out("mean", ops::cross_entropy(c.in("logits"), c.in("targets"), 3)); }
void cross_entropy_large_logits(Ctx& c) {
  c.out("mean", ops::cross_entropy(ops::mul(c.in("logits"), 200.0), c.in("targets")));
}
void cross_entropy_all_ignored(Ctx& c) {
  c.out("mean", ops::cross_entropy(c.in("logits"), c.in("targets")));
  c.out("sum", ops::cross_entropy(c.in("logits"), c.in("targets"), -100, Reduction::sum));
}

// A tiny language model: token embedding + positions, pre-norm, an MLP with RMS norm,
// final layer norm, tied LM head, cross-entropy with ignored (padding) positions.
void tiny_lm(Ctx& c) {
  using namespace ops;
  const Tensor &wte = c.in("wte"), &wpe = c.in("wpe"), &idx = c.in("idx"), &targets = c.in("targets");
  const int64_t T = idx.size(1);
  Tensor pos = arange(T, {.dtype = DType::i64});
  Tensor h = add(embedding(wte, idx), embedding(wpe, pos));                       // (B, T, C)
  Tensor a = rms_norm(h, c.in("rms_w"));
  h = add(h, matmul(gelu(matmul(a, c.in("w1")), true), c.in("w2")));             // residual MLP
  Tensor f = layer_norm(h, c.in("ln_w"), c.in("ln_b"));
  Tensor logits = matmul(f, wte.t());                                             // (B, T, V)
  c.out("logits", logits);
  c.out("loss", cross_entropy(logits, targets));
}

const std::map<std::string, CaseFn>& case_table() {
  static const std::map<std::string, CaseFn> table = {
      {"layer_norm_affine", layer_norm_affine},
      {"layer_norm_3d_plain", layer_norm_3d_plain},
      {"layer_norm_weight_only_transposed", layer_norm_weight_only_transposed},
      {"layer_norm_bias_only_offset", layer_norm_bias_only_offset},
      {"rms_norm_weight", rms_norm_weight},
      {"rms_norm_plain_strided", rms_norm_plain_strided},
      {"embedding_repeats", embedding_repeats},
      {"embedding_i32_transposed", embedding_i32_transposed},
      {"cross_entropy_reductions", cross_entropy_reductions},
      {"cross_entropy_3d", cross_entropy_3d},
      {"cross_entropy_custom_ignore", cross_entropy_custom_ignore},
      {"cross_entropy_large_logits", cross_entropy_large_logits},
      {"cross_entropy_all_ignored", cross_entropy_all_ignored},
      {"tiny_lm", tiny_lm},
  };
  return table;
}

void run_case(const std::string& name, const InputFile& file, OutputFile& out) {
  auto it = case_table().find(name);
  FORGE_CHECK(it != case_table().end(), "forge_nn_ref has no case '", name, "'");
  Ctx c(name, file);
  it->second(c);
  TensorList roots, grads;
  for (const auto& [oname, t] : c.outputs) {
    auto g = file.tensors.find(name + "/gout/" + oname);
    if (g == file.tensors.end()) continue;
    FORGE_CHECK(t.requires_grad(), "case ", name, ": output '", oname, "' has an upstream gradient but no history");
    roots.push_back(t);
    grads.push_back(g->second);
  }
  if (!roots.empty()) autograd::backward(roots, grads);
  for (const auto& [oname, t] : c.outputs) out.tensor(name + "/out/" + oname, t);
  const std::string prefix = name + "/";
  for (const auto& [iname, t] : file.tensors) {
    if (iname.compare(0, prefix.size(), prefix) != 0 || iname.find("/gout/") != std::string::npos) continue;
    if (t.requires_grad() && t.grad().defined()) out.tensor(name + "/grad/" + iname.substr(prefix.size()), t.grad());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <inputs file> <outputs file>\n(run by tests/python/nn_reference.py)\n", argv[0]);
    return 2;
  }
  try {
    const InputFile inputs = read_inputs(argv[1]);
    OutputFile out(argv[2]);
    for (const std::string& name : inputs.cases) {
      try {
        run_case(name, inputs, out);
      } catch (const std::exception& e) {
        out.error(name + "/error", e.what());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forge_nn_ref: %s\n", e.what());
    return 1;
  }
  return 0;
}
