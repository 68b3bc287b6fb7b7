// forge's side of the attention/rope/conv reference check (tests/python/attention_reference.py).
//
//   forge_attention_ref <inputs file> <outputs file>
//
// Runs every case of the inputs file: the op its kind names (the part of the case name
// before '.'), with the parameters of `<case>/params`, then one backward from all outputs
// with the upstream gradients `<case>/gout/<output>`. Writes `<case>/out/<output>` and
// `<case>/grad/<input>` (f64), or `<case>/error` when the case throws (the run goes on).
// The exchange format and the meaning of each kind's params are documented in
// attention_reference.py (PARAMS); keep the two files in step.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forge/forge.h"

namespace {

using namespace forge;

struct InputFile {
  std::vector<std::string> cases;
  std::map<std::string, Tensor> tensors;
};

InputFile read_inputs(const std::string& path) {
  std::ifstream in(path);
  FORGE_CHECK(in.good(), "forge_attention_ref: cannot open ", path);
  InputFile f;
  std::string kind;
  while (in >> kind) {
    if (kind == "case") {
      std::string name;
      in >> name;
      f.cases.push_back(name);
      continue;
    }
    FORGE_CHECK(kind == "tensor", "forge_attention_ref: unexpected record '", kind, "' in ", path);
    std::string name, dt;
    int rg = 0;
    size_t ndim = 0;
    in >> name >> dt >> rg >> ndim;
    Shape shape(ndim);
    for (auto& d : shape) in >> d;
    std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
    for (auto& x : v) {
      std::string tok;
      in >> tok;
      x = std::strtod(tok.c_str(), nullptr);  // exact: Python's repr of an f64
    }
    FORGE_CHECK(in.good() || in.eof(), "forge_attention_ref: truncated tensor ", name, " in ", path);
    Tensor t = from_vector<double>(v, shape);
    if (dt == "bool") t = ops::ne(t, 0.0);
    else if (dt == "i64") t = t.to(DType::i64);
    else FORGE_CHECK(dt == "f64", "forge_attention_ref: unsupported dtype ", dt, " for ", name);
    if (rg) t.requires_grad_(true);
    f.tensors[name] = t;
  }
  return f;
}

class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : f_(std::fopen(path.c_str(), "wb")) {
    FORGE_CHECK(f_ != nullptr, "forge_attention_ref: cannot write ", path);
  }
  ~OutputFile() { std::fclose(f_); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void tensor(const std::string& name, const Tensor& t) {
    std::fprintf(f_, "tensor %s f64 0 %d", name.c_str(), static_cast<int>(t.dim()));
    for (int64_t d : t.shape()) std::fprintf(f_, " %" PRId64, d);
    std::fputc('\n', f_);
    size_t count = 0;
    for (double v : t.to_vector<double>()) std::fprintf(f_, "%.17g%c", v, ++count % 16 == 0 ? '\n' : ' ');
    std::fputc('\n', f_);
  }
  void string(const std::string& name, const std::string& s) {
    std::fprintf(f_, "string %s %zu\n", name.c_str(), s.size());
    std::fwrite(s.data(), 1, s.size(), f_);
    std::fputc('\n', f_);
    std::fflush(f_);
  }

 private:
  std::FILE* f_;
};

// One case's inputs by short name, its params, and its outputs (in order).
class Ctx {
 public:
  Ctx(const std::string& name, const InputFile& file) : name_(name), file_(file) {
    params = in("params").to_vector<double>();
  }
  bool has(const std::string& input) const { return file_.tensors.count(name_ + "/" + input) != 0; }
  const Tensor& in(const std::string& input) const {
    auto it = file_.tensors.find(name_ + "/" + input);
    FORGE_CHECK(it != file_.tensors.end(), "case ", name_, ": input '", input, "' is missing");
    return it->second;
  }
  Tensor opt(const std::string& input) const { return has(input) ? in(input) : Tensor(); }
  int64_t ip(size_t i) const { return static_cast<int64_t>(params.at(i)); }
  void out(const std::string& output, const Tensor& t) { outputs.emplace_back(output, t); }

  std::vector<double> params;
  std::vector<std::pair<std::string, Tensor>> outputs;

 private:
  std::string name_;
  const InputFile& file_;
};

Tensor from_btHd(const Tensor& t, bool permuted) { return permuted ? t.permute({0, 2, 1, 3}) : t; }

// params: causal, scale, q_is_btHd
void sdpa(Ctx& c) {
  const Tensor q = from_btHd(c.in("q"), c.ip(2) != 0);
  c.out("out", ops::scaled_dot_product_attention(q, c.in("k"), c.in("v"), c.ip(0) != 0, c.params.at(1), c.opt("mask")));
}

// params: offset, theta, x_is_btHd
void rope(Ctx& c) { c.out("out", ops::rope(from_btHd(c.in("x"), c.ip(2) != 0), c.ip(0), c.params.at(1))); }

// params: sh, sw, ph, pw, x_is_nhwc
void conv2d(Ctx& c) {
  const Tensor x = c.ip(4) != 0 ? c.in("x").permute({0, 3, 1, 2}) : c.in("x");
  c.out("out", ops::conv2d(x, c.in("w"), c.opt("b"), {c.ip(0), c.ip(1)}, {c.ip(2), c.ip(3)}));
}

// params: kh, kw, sh, sw, ph, pw
void max_pool2d(Ctx& c) {
  c.out("out", ops::max_pool2d(c.in("x"), {c.ip(0), c.ip(1)}, {c.ip(2), c.ip(3)}, {c.ip(4), c.ip(5)}));
}

// params: offset, theta, causal
void rope_sdpa(Ctx& c) {
  const Tensor q = ops::rope(c.in("q"), c.ip(0), c.params.at(1));
  const Tensor k = ops::rope(c.in("k"), c.ip(0), c.params.at(1));
  c.out("q_rot", q);
  c.out("out", ops::scaled_dot_product_attention(q, k, c.in("v"), c.ip(2) != 0));
}

void cnn(Ctx& c) {
  const Tensor h = ops::max_pool2d(ops::relu(ops::conv2d(c.in("x"), c.in("w1"), c.in("b1"), {1, 1}, {1, 1})), {2, 2});
  c.out("pooled", h);
  c.out("out", ops::conv2d(h, c.in("w2"), c.in("b2"), {2, 2}, {1, 1}));
}

void run_case(const std::string& name, const InputFile& file, OutputFile& out) {
  static const std::map<std::string, void (*)(Ctx&)> kinds = {
      {"sdpa", sdpa}, {"rope", rope}, {"conv2d", conv2d}, {"max_pool2d", max_pool2d}, {"rope_sdpa", rope_sdpa},
      {"cnn", cnn}};
  const std::string kind = name.substr(0, name.find('.'));
  auto it = kinds.find(kind);
  FORGE_CHECK(it != kinds.end(), "forge_attention_ref has no case kind '", kind, "' (case ", name, ")");
  Ctx c(name, file);
  it->second(c);
  TensorList roots, grads;
  for (const auto& [oname, t] : c.outputs) {
    roots.push_back(t);
    grads.push_back(c.in("gout/" + oname));
  }
  autograd::backward(roots, grads);
  for (const auto& [oname, t] : c.outputs) out.tensor(name + "/out/" + oname, t);
  const std::string prefix = name + "/";
  for (const auto& [iname, t] : file.tensors) {
    if (iname.compare(0, prefix.size(), prefix) != 0) continue;
    if (t.requires_grad() && t.grad().defined()) out.tensor(name + "/grad/" + iname.substr(prefix.size()), t.grad());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <inputs file> <outputs file>\n(run by tests/python/attention_reference.py)\n",
                 argv[0]);
    return 2;
  }
  try {
    const InputFile inputs = read_inputs(argv[1]);
    OutputFile out(argv[2]);
    for (const std::string& name : inputs.cases) {
      try {
        run_case(name, inputs, out);
      } catch (const std::exception& e) {
        out.string(name + "/error", e.what());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "forge_attention_ref: %s\n", e.what());
    return 1;
  }
  return 0;
}
