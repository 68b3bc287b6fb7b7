// forge's side of the PyTorch reference check (tests/python/torch_reference.py).
//
//   forge_torch_ref <inputs file> <outputs file>
//
// Reads the cases and their inputs, runs each case named in the inputs file (forward,
// then one backward from all its outputs that have an upstream gradient), and writes the
// outputs and the gradients of the inputs that require grad. A case that throws writes
// `<case>/error` and the run goes on. The comparison with torch happens in the script.
//
// Exchange format (text, ASCII; shared with torch_reference.py, keep the two in step)
// -----------------------------------------------------------------------------------
// A file is a sequence of records; tokens are separated by whitespace.
//
//   case <case>
//       (inputs file only) a case to run, in file order.
//   tensor <name> <dtype> <requires_grad> <ndim> <d0> ... <d{ndim-1}>
//   <numel values>
//       dtype is a forge name: f32 f64 bf16 f16 i32 i64 u8 bool; requires_grad is 0 or 1
//       (1: the tensor becomes a leaf that requires grad). Values in row-major order:
//         f64, f32   a decimal that converts back exactly (Python repr, C "%.17g"), or
//                    nan, inf, -inf; -0 keeps its sign;
//         bf16, f16  the raw 16-bit pattern as an unsigned decimal (0..65535);
//         i32, i64, u8  decimal integers;  bool  0 or 1.
//   string <name> <nbytes>
//   <exactly nbytes bytes, then one newline>
//
// Names: inputs are `<case>/<input>`; upstream gradients `<case>/gout/<output>`; in the
// outputs file `<case>/out/<output>`, `<case>/grad/<input>` (for each input that requires
// grad and received a gradient) and, when the case threw, the string `<case>/error`.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "forge/forge.h"

namespace {

using namespace forge;
using ops::Dims;

constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();  // Python's open slice end

// ---- reading and writing the exchange format ----------------------------------------

struct InputFile {
  std::vector<std::string> cases;
  std::map<std::string, Tensor> tensors;
};

class Tokenizer {
 public:
  explicit Tokenizer(std::string text) : s_(std::move(text)) {}
  bool at_end() {
    skip_space();
    return pos_ >= s_.size();
  }
  std::string next() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < s_.size() && !is_space(s_[pos_])) ++pos_;
    FORGE_CHECK(pos_ > start, "forge_torch_ref: unexpected end of the inputs file");
    return s_.substr(start, pos_ - start);
  }
  int64_t next_int() {
    const std::string t = next();
    char* end = nullptr;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    FORGE_CHECK(end && *end == '\0', "forge_torch_ref: expected an integer, got '", t, "'");
    return v;
  }
  double next_double() {
    const std::string t = next();
    char* end = nullptr;
    const double v = std::strtod(t.c_str(), &end);
    FORGE_CHECK(end && *end == '\0', "forge_torch_ref: expected a number, got '", t, "'");
    return v;
  }
  std::string raw(size_t n) {
    ++pos_;  // the newline after the header
    FORGE_CHECK(pos_ + n <= s_.size(), "forge_torch_ref: string record runs past the end of the file");
    std::string r = s_.substr(pos_, n);
    pos_ += n;
    return r;
  }

 private:
  static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  std::string s_;
  size_t pos_ = 0;
};

Tensor read_tensor_values(Tokenizer& tok, DType dt, const Shape& shape) {
  const auto n = static_cast<size_t>(shape_numel(shape));
  switch (dt) {
    case DType::f64: {
      std::vector<double> v(n);
      for (auto& x : v) x = tok.next_double();
      return from_vector(v, shape, {.dtype = dt});
    }
    case DType::f32: {
      std::vector<float> v(n);
      for (auto& x : v) x = static_cast<float>(tok.next_double());  // exact: the decimal is an f32 value
      return from_vector(v, shape, {.dtype = dt});
    }
    case DType::bf16: {
      std::vector<bf16> v(n);
      for (auto& x : v) x = bf16::from_bits(static_cast<uint16_t>(tok.next_int()));
      return from_vector(v, shape, {.dtype = dt});
    }
    case DType::f16: {
      std::vector<f16> v(n);
      for (auto& x : v) x = f16::from_bits(static_cast<uint16_t>(tok.next_int()));
      return from_vector(v, shape, {.dtype = dt});
    }
    default: {
      std::vector<int64_t> v(n);
      for (auto& x : v) x = tok.next_int();
      return from_vector(v, shape, {.dtype = dt});
    }
  }
}

InputFile read_inputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in.good(), "forge_torch_ref: cannot open ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  Tokenizer tok(ss.str());
  InputFile f;
  while (!tok.at_end()) {
    const std::string kind = tok.next();
    if (kind == "case") {
      f.cases.push_back(tok.next());
    } else if (kind == "tensor") {
      const std::string name = tok.next();
      const DType dt = parse_dtype(tok.next());
      const bool rg = tok.next_int() != 0;
      Shape shape(static_cast<size_t>(tok.next_int()));
      for (auto& d : shape) d = tok.next_int();
      Tensor t = read_tensor_values(tok, dt, shape);
      if (rg) t.requires_grad_(true);
      f.tensors[name] = t;
    } else if (kind == "string") {
      tok.next();  // name: no case reads string inputs
      tok.raw(static_cast<size_t>(tok.next_int()));
    } else {
      FORGE_THROW("forge_torch_ref: unknown record kind '", kind, "' in ", path);
    }
  }
  return f;
}

class OutputFile {
 public:
  explicit OutputFile(const std::string& path) : f_(std::fopen(path.c_str(), "wb")) {
    FORGE_CHECK(f_ != nullptr, "forge_torch_ref: cannot write ", path);
  }
  ~OutputFile() { std::fclose(f_); }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void tensor(const std::string& name, const Tensor& t) {
    std::fprintf(f_, "tensor %s %s 0 %d", name.c_str(), dtype_name(t.dtype()), static_cast<int>(t.dim()));
    for (int64_t d : t.shape()) std::fprintf(f_, " %" PRId64, d);
    std::fputc('\n', f_);
    size_t count = 0;
    auto sep = [&] { std::fputc(++count % 16 == 0 ? '\n' : ' ', f_); };
    switch (t.dtype()) {
      case DType::f64:
      case DType::f32:
        for (double v : t.to_vector<double>()) {
          std::fprintf(f_, "%.17g", v);  // f32 -> double is exact, so this is exact for both
          sep();
        }
        break;
      case DType::bf16:
        for (bf16 v : t.to_vector<bf16>()) {
          std::fprintf(f_, "%u", static_cast<unsigned>(v.bits));
          sep();
        }
        break;
      case DType::f16:
        for (f16 v : t.to_vector<f16>()) {
          std::fprintf(f_, "%u", static_cast<unsigned>(v.bits));
          sep();
        }
        break;
      default:
        for (int64_t v : t.to_vector<int64_t>()) {
          std::fprintf(f_, "%" PRId64, v);
          sep();
        }
        break;
    }
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

// ---- cases ------------------------------------------------------------------------------

// What a case sees: its inputs by short name, and where its outputs go (in order).
class Ctx {
 public:
  Ctx(const std::string& name, const InputFile& file) : name_(name), file_(file) {}

  const Tensor& in(const std::string& input) const {
    auto it = file_.tensors.find(name_ + "/" + input);
    FORGE_CHECK(it != file_.tensors.end(), "case ", name_, ": input '", input, "' is missing from the inputs file");
    return it->second;
  }
  void out(const std::string& output, const Tensor& t) { outputs.emplace_back(output, t); }
  void out(const std::string& output, const std::string& s) { strings.emplace_back(output, s); }

  std::vector<std::pair<std::string, Tensor>> outputs;
  std::vector<std::pair<std::string, std::string>> strings;

 private:
  std::string name_;
  const InputFile& file_;
};

using CaseFn = std::function<void(Ctx&)>;

// (1) An MLP block with layer norm written from primitives, and a loss.
void mlp_layernorm(Ctx& c) {
  using namespace ops;
  const Tensor &x = c.in("x"), &w = c.in("w"), &b = c.in("b"), &targets = c.in("targets");
  Tensor h = add(matmul(x, w), b);
  Tensor mu = mean(h, {-1}, true);
  Tensor v = var(h, {-1}, true, 0);
  Tensor y = mul(sub(h, mu), rsqrt(add(v, 1e-5)));
  Tensor z = mul(gelu(y, /*approximate=*/true), sigmoid(y));
  Tensor loss = add(sum(gather(log_softmax(z, -1), -1, targets)), mean(amax(z, {-1})));
  c.out("h", h);
  c.out("y", y);
  c.out("z", z);
  c.out("loss", loss);
}

// (2) Broadcasting: a (2,1,3) with b (4,1).
void broadcast_add_sub_mul_div(Ctx& c) {
  const Tensor &a = c.in("a"), &b = c.in("b");
  Tensor add = a + b, mul = a * b, div = a / b;
  c.out("add", add);
  c.out("mul", mul);
  c.out("div", div);
  c.out("sub_alpha", ops::sub(a, b, -2.5));
  c.out("add_sum", add.sum({0, 2}, true));
  c.out("mul_sum", mul.sum({0, 2}, true));
  c.out("div_sum", div.sum({0, 2}, true));
  c.out("scalars", (1.5 - a) * (b / 3.0) + 2.0 / b);
}

void broadcast_maximum_where(Ctx& c) {
  const Tensor &a = c.in("a"), &b = c.in("b");
  Tensor mx = ops::maximum(a, b);
  Tensor wh = ops::where(ops::gt(a, b), a * b, b - a);
  c.out("maximum", mx);
  c.out("minimum", ops::minimum(a, b));
  c.out("where", wh);
  c.out("where_sum", wh.sum({0, 2}, true));
  c.out("maximum_sum", mx.sum({0, 2}, true));
}

void broadcast_pow(Ctx& c) {
  const Tensor &p = c.in("p"), &e = c.in("e");
  Tensor pw = ops::pow(p, e);
  c.out("pow", pw);
  c.out("pow_sum", pw.sum({0, 2}, true));
  c.out("pow_scalar", p.pow(3.0));
  c.out("scalar_pow", ops::pow(2.0, e));
}

// (3) Views, then reductions.
void views_chain(Ctx& c) {
  const Tensor &x = c.in("x"), &w = c.in("w");
  Tensor v = x.transpose(0, 2);                  // (6, 5, 4)
  v = v.permute({1, 0, 2});                      // (5, 6, 4)
  v = v.slice(1, 1, 6, 2);                       // (5, 3, 4)
  v = v.narrow(2, 1, 2);                         // (5, 3, 2)
  Tensor s = v.select(0, -2);                    // (3, 2)
  Tensor e = s.unsqueeze(0).expand({4, 3, 2});   // (4, 3, 2), stride 0
  Tensor r = e.reshape({4, 6});                  // non-contiguous: a copy
  Tensor q = r.unsqueeze(1).squeeze(1);          // (4, 6)
  c.out("v", v);
  c.out("q", q);
  c.out("weighted", (q * w).sum({1}));
  c.out("sq_sum", (v * v).sum({0, 2}, true));
  c.out("total", x.transpose(1, 2).slice(0, 1, kEnd).slice(1, -3, kEnd).slice(2, 0, kEnd, 2).sum());
}

void views_reshape_flatten(Ctx& c) {
  const Tensor &x = c.in("x"), &m = c.in("m");
  Tensor a = x.transpose(1, 2).reshape({2, 12});
  Tensor b = x.transpose(1, 2).flatten(1);
  Tensor cc = x.reshape({6, 4}).view({4, 6});
  Tensor d = m.t().unsqueeze(-1).expand({-1, -1, 2});
  Tensor e = x.slice(1, 0, 1).squeeze();
  c.out("a", a * a);
  c.out("b", b.exp());
  c.out("c", ops::sin(cc));
  c.out("d", d * d.sum({0}, true));
  c.out("e", ops::tanh(e));
  c.out("f", x.slice(2, 1, kEnd).sum({0, 1}));
}

// (4) Joining, splitting, indexing, softmax.
void cat_stack_split(Ctx& c) {
  using namespace ops;
  const Tensor &a = c.in("a"), &b = c.in("b"), &cc = c.in("c");
  Tensor k = cat({a, b}, 0);
  Tensor k1 = cat({a, cc}, 1);
  Tensor s = stack({a, cc}, 1);
  TensorList p = split(k, std::vector<int64_t>{2, 3}, 0);
  TensorList q = split(k1, int64_t{3}, 1);
  TensorList ch = chunk(s, 2, 2);
  c.out("cat0", k * k);
  c.out("cat1", k1);
  c.out("stack", s.exp());
  c.out("split0", p.at(0) * 2.0);
  c.out("split1", sin(p.at(1)));
  c.out("split_size", q.at(0) * q.at(2).sum({1}, true));
  c.out("chunk", ch.at(1) * ch.at(0));
}

void index_select_scatter_add(Ctx& c) {
  using namespace ops;
  Tensor sel = index_select(c.in("x"), 0, c.in("idx"));
  Tensor sel1 = index_select(c.in("x"), 1, c.in("cidx"));
  Tensor sa = scatter_add(c.in("base"), 0, c.in("sidx"), c.in("src"));
  c.out("sel", sel * sel);
  c.out("sel1", sel1);
  c.out("scatter_add", sa.exp());
}

void softmax_composite(Ctx& c) {
  using namespace ops;
  const Tensor &x = c.in("x"), &y = c.in("y");
  Tensor sm = softmax(x * 2.0, -1);
  c.out("softmax", sm);
  c.out("softmax0", softmax(y, 0));
  c.out("log_softmax", log_softmax(y.transpose(1, 2), 1));
  c.out("cat", cat({sm, softmax(x, 0)}, 1) * cat({x, x}, 1));
}

// (5) dtype conversions.
void convert_f32_to_16bit(Ctx& c) {
  c.out("bf16", c.in("x").to(DType::bf16));
  c.out("f16", c.in("x").to(DType::f16));
}

void convert_16bit_to_f32(Ctx& c) {
  c.out("bf16_f32", c.in("hb").to(DType::f32));
  c.out("f16_f32", c.in("hf").to(DType::f32));
  c.out("bf16_f64", c.in("hb").to(DType::f64));
  c.out("f16_f64", c.in("hf").to(DType::f64));
}

void convert_f64_to_f32(Ctx& c) {
  const Tensor& d = c.in("d");
  c.out("f32", d.to(DType::f32));
  c.out("bf16", d.to(DType::bf16));
  c.out("f16", d.to(DType::f16));
}

void convert_float_to_int(Ctx& c) {
  const Tensor &x = c.in("x"), &d = c.in("d"), &h = c.in("h"), &n = c.in("n");
  c.out("x_i32", x.to(DType::i32));
  c.out("x_i64", x.to(DType::i64));
  c.out("d_i64", d.to(DType::i64));
  c.out("d_i32", d.slice(0, 6, kEnd).to(DType::i32));
  c.out("h_i32", h.to(DType::i32));
  c.out("h_i64", h.to(DType::i64));
  c.out("n_f32", n.to(DType::f32));
  c.out("n_f64", n.to(DType::f64));
  c.out("n_i32", n.slice(0, 0, 3).to(DType::i32));
}

void convert_bool(Ctx& c) {
  const Tensor& m = c.in("m");
  c.out("x_bool", c.in("x").to(DType::boolean));
  c.out("n_bool", c.in("n").to(DType::boolean));
  c.out("u_bool", c.in("u").to(DType::boolean));
  c.out("h_bool", c.in("h").to(DType::boolean));
  c.out("m_f32", m.to(DType::f32));
  c.out("m_i64", m.to(DType::i64));
  c.out("m_bf16", m.to(DType::bf16));
  c.out("m_u8", m.to(DType::u8));
  c.out("m_f64", m.to(DType::f64));
}

// (6) Type promotion: each result and its dtype name.
void out_with_dtype(Ctx& c, const std::string& name, const Tensor& t) {
  c.out(name, t);
  c.out(name + ".dtype", std::string(dtype_name(t.dtype())));
}

void type_promotion(Ctx& c) {
  using namespace ops;
  auto in = [&](const char* n) { return c.in(n); };
  out_with_dtype(c, "i32+i64", in("i32") + in("i64"));
  out_with_dtype(c, "u8+i32", in("u8") + in("i32"));
  out_with_dtype(c, "bool+i32", in("bool") + in("i32"));
  out_with_dtype(c, "u8+bool", in("u8") + in("bool"));
  out_with_dtype(c, "i64+f16", in("i64") + in("f16"));
  out_with_dtype(c, "f16+bf16", in("f16") + in("bf16"));
  out_with_dtype(c, "bf16+f32", in("bf16") + in("f32"));
  out_with_dtype(c, "f32+f64", in("f32") + in("f64"));
  out_with_dtype(c, "u8*i64", in("u8") * in("i64"));
  out_with_dtype(c, "i32+2.5", in("i32") + 2.5);
  out_with_dtype(c, "i64+3", in("i64") + 3.0);
  out_with_dtype(c, "u8+2.5", in("u8") + 2.5);
  out_with_dtype(c, "bool+2.5", in("bool") + 2.5);
  out_with_dtype(c, "f16+2.5", in("f16") + 2.5);
  out_with_dtype(c, "i32/i32", in("i32") / in("i32"));
  out_with_dtype(c, "i64/2", in("i64") / 2.0);
  out_with_dtype(c, "i32-i64", in("i32") - in("i64"));
  out_with_dtype(c, "bool<i32", lt(in("bool"), in("i32")));
}

void type_promotion_scalar_operands(Ctx& c) {
  auto in = [&](const char* n) { return c.in(n); };
  out_with_dtype(c, "bool+3", in("bool") + 3.0);
  out_with_dtype(c, "i32+s_i64", in("i32") + in("s_i64"));
  out_with_dtype(c, "f16+s_f32", in("f16") + in("s_f32"));
  out_with_dtype(c, "bf16+s_f64", in("bf16") + in("s_f64"));
  out_with_dtype(c, "i32+s_f64", in("i32") + in("s_f64"));
  out_with_dtype(c, "s_i32+s_i64", in("s_i32") + in("s_i64"));
}

// (7) Printing: every input of the case, printed.
void print_repr(Ctx& c, const InputFile& file, const std::string& case_name) {
  const std::string prefix = case_name + "/";
  for (const auto& [name, t] : file.tensors) {
    if (name.compare(0, prefix.size(), prefix) != 0 || name.find("/gout/") != std::string::npos) continue;
    c.out(name.substr(prefix.size()), t.to_string());
  }
}

// (8) Optimizers: 10 steps of forge::optim over torch's parameters and gradients, the lr of
// each step from LRSchedule (warmup + cosine); every parameter after every step is an
// output, and so is the lr sequence. Groups: decay (w, e) and no decay (b, n); a false in
// has_grad (steps, 4) means that parameter has no gradient at that step.
void optimizer_steps(Ctx& c, const std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>& make) {
  const std::vector<std::string> names{"w", "e", "b", "n"};
  std::map<std::string, Tensor> p;
  for (const auto& n : names) {
    Tensor t = c.in(n).clone();
    t.requires_grad_(true);
    p[n] = t;
  }
  std::unique_ptr<optim::Optimizer> opt = make({{.params = {p["w"], p["e"]}, .weight_decay = c.in("weight_decay").item()},
                                                {.params = {p["b"], p["n"]}, .weight_decay = 0.0}});
  const optim::LRSchedule schedule{.kind = optim::ScheduleKind::cosine,
                                   .lr = c.in("lr").item(),
                                   .min_lr = c.in("min_lr").item(),
                                   .warmup_steps = c.in("warmup").item<int64_t>(),
                                   .total_steps = c.in("total").item<int64_t>()};
  const Tensor& has_grad = c.in("has_grad");
  const std::vector<int64_t> mask = has_grad.to_vector<int64_t>();
  const int64_t steps = has_grad.size(0);
  std::vector<double> lrs;
  for (int64_t s = 0; s < steps; ++s) {
    schedule.apply(*opt, opt->step_count());
    lrs.push_back(*opt->param_groups()[0].lr);
    for (size_t i = 0; i < names.size(); ++i) {
      if (mask[static_cast<size_t>(s) * names.size() + i]) p[names[i]].set_grad(c.in("grad_" + names[i]).select(0, s).clone());
      else p[names[i]].zero_grad();
    }
    opt->step();
    for (const auto& n : names) c.out(n + "/step" + std::to_string(s), p[n].detach().clone());
  }
  c.out("lr", from_vector<double>(lrs, {steps}));
}

void adamw_10_steps(Ctx& c) {
  optimizer_steps(c, [&](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::AdamW>(std::move(groups),
                                          optim::AdamWOptions{.lr = c.in("lr").item(),
                                                              .beta1 = c.in("beta1").item(),
                                                              .beta2 = c.in("beta2").item(),
                                                              .eps = c.in("eps").item()});
  });
}

void sgd_nesterov_10_steps(Ctx& c) {
  optimizer_steps(c, [&](std::vector<optim::ParamGroup> groups) {
    return std::make_unique<optim::SGD>(
        std::move(groups), optim::SGDOptions{.lr = c.in("lr").item(), .momentum = c.in("momentum").item(), .nesterov = true});
  });
}

const std::map<std::string, CaseFn>& case_table() {
  static const std::map<std::string, CaseFn> table = {
      {"mlp_layernorm", mlp_layernorm},
      {"broadcast_add_sub_mul_div", broadcast_add_sub_mul_div},
      {"broadcast_maximum_where", broadcast_maximum_where},
      {"broadcast_pow", broadcast_pow},
      {"views_chain", views_chain},
      {"views_reshape_flatten", views_reshape_flatten},
      {"cat_stack_split", cat_stack_split},
      {"index_select_scatter_add", index_select_scatter_add},
      {"softmax_composite", softmax_composite},
      {"convert_f32_to_16bit", convert_f32_to_16bit},
      {"convert_16bit_to_f32", convert_16bit_to_f32},
      {"convert_f64_to_f32", convert_f64_to_f32},
      {"convert_float_to_int", convert_float_to_int},
      {"convert_bool", convert_bool},
      {"type_promotion", type_promotion},
      {"type_promotion_scalar_operands", type_promotion_scalar_operands},
      {"adamw_10_steps", adamw_10_steps},
      {"sgd_nesterov_10_steps", sgd_nesterov_10_steps},
  };
  return table;
}

// Runs one case: forward, backward from the outputs that have an upstream gradient, then
// writes outputs and gradients.
void run_case(const std::string& name, const InputFile& file, OutputFile& out) {
  Ctx c(name, file);
  if (name == "print_repr") {
    print_repr(c, file, name);
  } else {
    auto it = case_table().find(name);
    FORGE_CHECK(it != case_table().end(), "forge_torch_ref has no case '", name, "'");
    it->second(c);
  }
  TensorList roots, grads;
  for (const auto& [oname, t] : c.outputs) {
    auto g = file.tensors.find(name + "/gout/" + oname);
    if (g == file.tensors.end()) continue;
    FORGE_CHECK(t.requires_grad(), "case ", name, ": torch's output '", oname,
                "' requires grad but forge's does not (no history was recorded)");
    roots.push_back(t);
    grads.push_back(g->second);
  }
  if (!roots.empty()) autograd::backward(roots, grads);
  for (const auto& [oname, t] : c.outputs) out.tensor(name + "/out/" + oname, t);
  for (const auto& [oname, s] : c.strings) out.string(name + "/out/" + oname, s);
  const std::string prefix = name + "/";
  for (const auto& [iname, t] : file.tensors) {
    if (iname.compare(0, prefix.size(), prefix) != 0 || iname.find("/gout/") != std::string::npos) continue;
    if (t.requires_grad() && t.grad().defined()) out.tensor(name + "/grad/" + iname.substr(prefix.size()), t.grad());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <inputs file> <outputs file>\n(run by tests/python/torch_reference.py)\n", argv[0]);
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
    std::fprintf(stderr, "forge_torch_ref: %s\n", e.what());
    return 1;
  }
  return 0;
}
