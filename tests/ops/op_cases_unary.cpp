// Op-table cases for the unary elementwise ops: contiguous, strided and 0-d inputs, from each
// op's domain (positive for log/sqrt/rsqrt, away from zero for the kinks of abs and relu).
#include "testing/op_table.h"

namespace forge::testing {

std::vector<OpCase> unary_cases() {
  using namespace forge::ops;
  std::vector<OpCase> cases;
  struct U {
    const char* name;
    Tensor (*fn)(const Tensor&);
    Domain domain;
  };
  const U unary[] = {
      {"neg", neg, Domain::real},
      {"abs", abs, Domain::away_from_zero},
      {"exp", exp, Domain::real},
      {"log", log, Domain::positive},
      {"sqrt", sqrt, Domain::positive},
      {"rsqrt", rsqrt, Domain::positive},
      {"sin", sin, Domain::real},
      {"cos", cos, Domain::real},
      {"tanh", tanh, Domain::real},
      {"sigmoid", sigmoid, Domain::real},
      {"relu", relu, Domain::away_from_zero},
      {"silu", silu, Domain::real},
  };
  auto in = [](Domain d, const Shape& s, uint64_t seed) { return Input{.shape = s, .seed = seed, .domain = d}; };
  for (const U& u : unary) {
    auto f = u.fn;
    const OpFn fn = [f](const TensorList& x) { return f(x[0]); };
    cases.push_back({u.name, "[5]", {in(u.domain, {5}, 3)}, fn});
    cases.push_back({u.name, "[3,4] strided", {in(u.domain, {3, 4}, 7).strided()}, fn});
    cases.push_back({u.name, "[] scalar", {in(u.domain, {}, 3)}, fn});
  }
  for (bool approx : {false, true}) {
    const char* name = approx ? "gelu_tanh" : "gelu";
    const OpFn fn = [approx](const TensorList& x) { return gelu(x[0], approx); };
    cases.push_back({name, "[2,3,4]", {real({2, 3, 4}, 5)}, fn});
    cases.push_back({name, "[4,3] transposed", {real({4, 3}, 5).transposed()}, fn});
  }
  const OpFn glu = [](const TensorList& x) { return swiglu(x[0], x[1]); };
  cases.push_back({"swiglu", "[3,5] both need grad", {real({3, 5}, 11), real({3, 5}, 12)}, glu});
  // Many vectors and a tail: the CUDA backward's one-pass kernel (Note [one-pass SwiGLU backward]).
  cases.push_back({"swiglu", "[33,65] both need grad", {real({33, 65}, 17), real({33, 65}, 18)}, glu});
  cases.push_back(
      {"swiglu", "[4,3] transposed gate, strided up", {real({4, 3}, 13).transposed(), real({4, 3}, 14).strided()}, glu});
  cases.push_back({"swiglu", "only up needs grad", {real({2, 6}, 15).constant(), real({2, 6}, 16)}, glu});
  return cases;
}

}  // namespace forge::testing
