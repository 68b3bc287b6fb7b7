#include "testing/op_table.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>

#include "forge/autograd/node.h"

namespace forge::testing {

// ---- inputs ------------------------------------------------------------------------------------

Input Input::transposed() const {
  FORGE_CHECK(shape.size() == 2, "Input::transposed: needs a 2-D shape, got ", shape);
  Input r = *this;
  r.layout = Layout::transposed;
  return r;
}

Input Input::strided() const {
  FORGE_CHECK(!shape.empty(), "Input::strided: needs at least one dim");
  Input r = *this;
  r.layout = Layout::strided;
  return r;
}

Input Input::constant() const {
  Input r = *this;
  r.grad = false;
  return r;
}

Input real(const Shape& shape, uint64_t seed) { return {.shape = shape, .seed = seed}; }
Input positive(const Shape& shape, uint64_t seed) { return {.shape = shape, .seed = seed, .domain = Domain::positive}; }
Input away_from_zero(const Shape& shape, uint64_t seed) {
  return {.shape = shape, .seed = seed, .domain = Domain::away_from_zero};
}
Input ids(std::vector<int64_t> values, const Shape& shape, DType dtype) {
  return {.kind = Input::Kind::integer, .shape = shape, .grad = false, .values = std::move(values), .dtype = dtype};
}
Input mask(std::vector<int64_t> values, const Shape& shape) {
  return {.kind = Input::Kind::boolean, .shape = shape, .grad = false, .values = std::move(values)};
}
Input random_mask(const Shape& shape, uint64_t seed) {
  return {.kind = Input::Kind::boolean, .shape = shape, .seed = seed, .grad = false};
}

namespace {

// f64 values of `domain` on the CPU, from their own generator.
Tensor draw(const Shape& shape, Domain domain, uint64_t seed) {
  Generator g(seed);
  const TensorOptions f64{.dtype = DType::f64};
  switch (domain) {
    case Domain::real:
      return randn(shape, f64, &g);
    case Domain::positive:
      return uniform(shape, 0.5, 2.0, f64, &g);
    case Domain::away_from_zero: {
      const Tensor mag = uniform(shape, 0.2, 1.2, f64, &g);
      const Tensor sign = ops::sub(ops::mul(ops::to(ops::gt(rand(shape, f64, &g), 0.5), DType::f64), 2.0), 1.0);
      return ops::mul(mag, sign);
    }
  }
  return {};
}

}  // namespace

Tensor make_input(const Input& in, Device device, DType dtype, DType round_to) {
  NoGradGuard no_grad;
  switch (in.kind) {
    case Input::Kind::integer:
      return from_vector<int64_t>(in.values, in.shape, {.dtype = in.dtype}).to(device);
    case Input::Kind::boolean: {
      if (in.values.empty()) {
        Generator g(in.seed);
        return ops::gt(rand(in.shape, {}, &g), 0.5).to(device);
      }
      return ops::ne(from_vector<int64_t>(in.values, in.shape), 0.0).to(device);
    }
    case Input::Kind::floating:
      break;
  }
  Shape base = in.shape;
  if (in.layout == Layout::transposed) base = {in.shape[1], in.shape[0]};
  if (in.layout == Layout::strided) base.back() *= 2;
  Tensor t = draw(base, in.domain, in.seed);
  if (round_to != DType::f64) t = t.to(round_to);
  t = t.to(device, dtype);
  if (in.layout == Layout::transposed) t = t.t();
  if (in.layout == Layout::strided) t = t.slice(-1, 0, base.back(), 2);
  t = t.detach();
  if (in.grad) t.requires_grad_();
  return t;
}

TensorList make_inputs(const std::vector<Input>& specs, Device device, DType dtype, DType round_to) {
  TensorList r;
  r.reserve(specs.size());
  for (const Input& s : specs) r.push_back(make_input(s, device, dtype, round_to));
  return r;
}

// ---- cases -------------------------------------------------------------------------------------

OpCase& OpCase::gradcheck_tolerance(double step, double abs_tol, double rel_tol) {
  eps = step;
  atol = abs_tol;
  rtol = rel_tol;
  return *this;
}

namespace {
void add_note(std::string& note, std::string why) { note += (note.empty() ? "" : "; ") + std::move(why); }
}  // namespace

OpCase& OpCase::dtypes(std::vector<DType> only, std::string why) {
  device.dtypes = std::move(only);
  add_note(device.note, std::move(why));
  return *this;
}

OpCase& OpCase::tolerance16(double tol, std::string why) {
  device.tol16 = tol;
  add_note(device.note, std::move(why));
  return *this;
}

OpCase& OpCase::tolerance32(double tol, std::string why) {
  device.tol32 = tol;
  add_note(device.note, std::move(why));
  return *this;
}

OpCase& OpCase::exempt(std::string why, std::vector<std::string> dedicated_tests) {
  add_note(device.note, std::move(why));
  device.dedicated = std::move(dedicated_tests);
  return *this;
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << c.op << " [" << c.label << "]"; }

const std::vector<OpCase>& op_table() {
  static const std::vector<OpCase> table = [] {
    std::vector<OpCase> all;
    for (auto family : {unary_cases, binary_cases, view_cases, reduce_cases, matmul_cases, index_cases, join_cases,
                        nn_cases, attention_cases}) {
      std::vector<OpCase> part = family();
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }();
  return table;
}

std::string case_name(size_t index) {
  const std::vector<OpCase>& t = op_table();
  size_t k = 0;
  for (size_t i = 0; i < index; ++i) k += t[i].op == t[index].op;
  return t[index].op + "_" + std::to_string(k);
}

// ---- the device comparison ---------------------------------------------------------------------

namespace {

// ||got - ref|| / ||ref||, both read back as f64 on the host (||got - ref|| when ref is zero).
double rel_err(const Tensor& got, const Tensor& ref) {
  const std::vector<double> g = got.to_vector<double>(), r = ref.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num += (g[i] - r[i]) * (g[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct Run {
  Tensor out;
  TensorList grads;  // per input that needs one (undefined where none arrived)
  std::vector<size_t> of;  // the input each gradient belongs to
};

Run run_case(const OpCase& c, Device device, DType dtype, DType round_to) {
  const TensorList in = make_inputs(c.inputs, device, dtype, round_to);
  Run r;
  r.out = c.fn(in);
  // The upstream gradient: positive values rounded to the compared dtype once, the same on both runs.
  const Tensor up = make_input(positive(r.out.shape(), 7919).constant(), device, r.out.dtype(), round_to);
  r.out.backward(up);
  for (size_t i = 0; i < in.size(); ++i)
    if (c.inputs[i].grad) {
      r.grads.push_back(in[i].grad());
      r.of.push_back(i);
    }
  return r;
}

std::string describe(double err, double tol) {
  std::ostringstream os;
  os << "||out - ref|| / ||ref|| = " << err << " > " << tol;
  return os.str();
}

}  // namespace

std::vector<std::string> compare_with_cpu(const OpCase& c, Device device, DType dtype) {
  const DType ref_dtype = dtype == DType::f64 ? DType::f64 : DType::f32;
  const double tol = dtype == DType::f64 ? 1e-12 : dtype == DType::f32 ? c.device.tol32 : c.device.tol16;
  const Run got = run_case(c, device, dtype, dtype);
  const Run ref = run_case(c, Device::cpu(), ref_dtype, dtype);
  std::vector<std::string> bad;
  if (got.out.device() != device) bad.push_back("the output is on " + got.out.device().str());
  if (got.out.shape() != ref.out.shape()) {
    bad.push_back("output shape " + shape_str(got.out.shape()) + " vs the reference's " + shape_str(ref.out.shape()));
    return bad;
  }
  const double out_err = rel_err(got.out, ref.out);
  if (!(out_err <= tol)) bad.push_back("output: " + describe(out_err, tol));
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const std::string what = "gradient of input " + std::to_string(ref.of[i]);
    const Tensor& g = got.grads[i];
    const Tensor& r = ref.grads[i];
    if (g.defined() != r.defined()) {
      bad.push_back(what + (g.defined() ? ": none in the reference" : ": missing"));
      continue;
    }
    if (!g.defined()) continue;
    if (g.device() != device) bad.push_back(what + ": on " + g.device().str());
    const double err = rel_err(g, r);
    if (!(err <= tol)) bad.push_back(what + ": " + describe(err, tol));
  }
  return bad;
}

// ---- coverage ----------------------------------------------------------------------------------

std::set<std::string> recorded_ops(const Tensor& root) {
  std::set<std::string> names;
  std::set<const autograd::Node*> seen;
  std::vector<std::shared_ptr<autograd::Node>> stack;
  if (root.grad_fn()) stack.push_back(root.grad_fn());
  while (!stack.empty()) {
    const std::shared_ptr<autograd::Node> n = stack.back();
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    if (dynamic_cast<const autograd::AccumulateGrad*>(n.get())) continue;
    std::string name = n->name();
    const std::string suffix = "Backward";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      name.resize(name.size() - suffix.size());
    names.insert(name);
    for (const autograd::Edge& e : n->next_edges)
      if (e.node) stack.push_back(e.node);
  }
  return names;
}

std::vector<std::string> coverage_problems(const std::vector<std::string>& ops, const std::vector<OpCase>& cases) {
  std::vector<std::string> bad;
  std::set<std::string> covered;
  for (const OpCase& c : cases) covered.insert(c.op);
  for (const std::string& op : ops)
    if (!covered.count(op))
      bad.push_back("op '" + op + "' is registered but has no case: add one to tests/ops/op_cases_*.cpp");
  for (const OpCase& c : cases) {
    const std::string what = "case '" + c.op + " [" + c.label + "]'";
    if (std::find(ops.begin(), ops.end(), c.op) == ops.end())
      bad.push_back(what +
                    " names an op that is not registered: register it next to its definition "
                    "(Note [op registry] in forge/ops/registry.h)");
    const DeviceCheck& d = c.device;
    if (d.exempt()) {
      if (d.note.empty()) bad.push_back(what + " is exempt from the device comparison without a reason");
    } else if (d.dtypes.empty()) {
      bad.push_back(what +
                    " runs the device comparison in no dtype: compare it, or exempt it naming the "
                    "dedicated CUDA tests that cover it");
    }
    const bool narrowed =
        d.dtypes != DeviceCheck{}.dtypes || d.tol32 != DeviceCheck{}.tol32 || d.tol16 != DeviceCheck{}.tol16;
    if (narrowed && d.note.empty())
      bad.push_back(what + " changes the device comparison's dtypes or tolerances without a reason");
  }
  return bad;
}

std::vector<std::string> ops_without_cases(const std::set<std::string>& recorded, const std::vector<std::string>& ops,
                                           const std::vector<OpCase>& cases) {
  std::set<std::string> covered;
  for (const OpCase& c : cases) covered.insert(c.op);
  std::vector<std::string> bad;
  for (const std::string& name : recorded) {
    if (std::find(ops.begin(), ops.end(), name) == ops.end())
      bad.push_back("node '" + name + "Backward' is not a registered op");
    else if (!covered.count(name))
      bad.push_back("op '" + name + "' has no case in the op table");
  }
  return bad;
}

std::vector<std::string> missing_dedicated_tests(const std::vector<OpCase>& cases, const std::string& sources) {
  std::vector<std::string> bad;
  std::set<std::string> checked;
  for (const OpCase& c : cases)
    for (const std::string& t : c.device.dedicated) {
      if (!checked.insert(t).second) continue;
      const size_t dot = t.find('.');
      if (dot == std::string::npos) {
        bad.push_back("'" + t + "' (case " + c.op + " [" + c.label + "]) is not of the form Suite.Name");
        continue;
      }
      const std::regex def("TEST(_P)?\\(\\s*" + t.substr(0, dot) + "\\s*,\\s*" + t.substr(dot + 1) + "\\s*\\)");
      if (!std::regex_search(sources, def))
        bad.push_back("'" + t + "' (case " + c.op + " [" + c.label + "]) is not defined in the CUDA tests");
    }
  return bad;
}

}  // namespace forge::testing
