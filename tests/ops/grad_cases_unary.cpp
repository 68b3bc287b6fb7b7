#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> unary_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> cases;
  struct U {
    const char* name;
    Tensor (*fn)(const Tensor&);
    int domain;  // 0: any real, 1: positive, 2: away from zero (kinks at 0)
  };
  const U unary[] = {
      {"neg", neg, 0},      {"abs", abs, 2},   {"exp", exp, 0},         {"log", log, 1},
      {"sqrt", sqrt, 1},    {"rsqrt", rsqrt, 1}, {"sin", sin, 0},       {"cos", cos, 0},
      {"tanh", tanh, 0},    {"sigmoid", sigmoid, 0}, {"relu", relu, 2}, {"silu", silu, 0},
  };
  auto make = [](int domain, const Shape& s, int layout) {
    return [domain, s, layout]() -> TensorList {
      if (layout == 1) {  // non-contiguous
        Tensor t = arg_strided(s, 7);
        if (domain == 0) return {t};
        NoGradGuard ng;
        Tensor base = domain == 1 ? arg_positive(s, 7) : arg_away_from_zero(s, 7);
        Tensor wide = zeros({s[0], s[1] * 2}, {.dtype = DType::f64});
        wide.slice(-1, 0, s[1] * 2, 2).copy_(base.detach());
        return {wide.slice(-1, 0, s[1] * 2, 2).detach().requires_grad_()};
      }
      if (domain == 1) return {arg_positive(s, 3)};
      if (domain == 2) return {arg_away_from_zero(s, 3)};
      return {arg(s, 3)};
    };
  };
  for (const U& u : unary) {
    auto f = u.fn;
    cases.push_back({u.name, "[5]", make(u.domain, {5}, 0), [f](const TensorList& in) { return f(in[0]); }});
    cases.push_back({u.name, "[3,4] strided", make(u.domain, {3, 4}, 1), [f](const TensorList& in) { return f(in[0]); }});
    cases.push_back({u.name, "[] scalar", make(u.domain, {}, 0), [f](const TensorList& in) { return f(in[0]); }});
  }
  for (bool approx : {false, true}) {
    const char* name = approx ? "gelu_tanh" : "gelu";
    cases.push_back({name, "[2,3,4]", [] { return TensorList{arg({2, 3, 4}, 5)}; },
                     [approx](const TensorList& in) { return gelu(in[0], approx); }});
    cases.push_back({name, "[4,3] transposed", [] { return TensorList{arg_transposed({4, 3}, 5)}; },
                     [approx](const TensorList& in) { return gelu(in[0], approx); }});
  }
  cases.push_back({"swiglu", "[3,5] both need grad", [] { return TensorList{arg({3, 5}, 11), arg({3, 5}, 12)}; },
                   [](const TensorList& in) { return swiglu(in[0], in[1]); }});
  cases.push_back({"swiglu", "[4,3] transposed gate, strided up",
                   [] { return TensorList{arg_transposed({4, 3}, 13), arg_strided({4, 3}, 14)}; },
                   [](const TensorList& in) { return swiglu(in[0], in[1]); }});
  cases.push_back({"swiglu", "only up needs grad",
                   [] { return TensorList{arg({2, 6}, 15).detach(), arg({2, 6}, 16)}; },
                   [](const TensorList& in) { return swiglu(in[0], in[1]); }});
  return cases;
}

}  // namespace forge::testing
