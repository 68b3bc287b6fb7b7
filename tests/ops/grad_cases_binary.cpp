#include "testing/gradcheck.h"

namespace forge::testing {

std::vector<GradCase> binary_grad_cases() {
  using namespace forge::ops;
  std::vector<GradCase> cases;
  struct B {
    const char* name;
    Tensor (*fn)(const Tensor&, const Tensor&);
    bool positive_lhs;
  };
  const B binary[] = {
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, false},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, false},
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, false},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, false},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, false},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, false},
  };
  struct Shapes {
    Shape a, b;
    const char* label;
    int layout;  // 0 contiguous, 1 lhs transposed, 2 rhs strided
  };
  const Shapes shapes[] = {
      {{3, 4}, {3, 4}, "[3,4]x[3,4]", 0},
      {{2, 3, 4}, {4}, "broadcast [2,3,4]x[4]", 0},
      {{3, 1}, {1, 4}, "broadcast [3,1]x[1,4]", 0},
      {{4, 3}, {4, 3}, "[4,3] transposed x [4,3]", 1},
      {{2, 3}, {2, 3}, "[2,3] x [2,3] strided", 2},
      {{}, {2, 2}, "scalar x [2,2]", 0},
  };
  for (const B& op : binary) {
    for (const Shapes& s : shapes) {
      const bool pos = op.positive_lhs;
      const bool is_div = std::string(op.name) == "div";
      auto mk = [s, pos, is_div]() -> TensorList {
        Tensor a = s.layout == 1 ? arg_transposed(s.a, 11) : (pos ? arg_positive(s.a, 11) : arg(s.a, 11));
        if (s.layout == 1 && pos) a = arg_positive(s.a, 11);
        Tensor b = s.layout == 2 ? arg_strided(s.b, 12) : (is_div ? arg_away_from_zero(s.b, 12) : arg(s.b, 12));
        if (s.layout == 2 && is_div) b = arg_away_from_zero(s.b, 12);
        return {a, b};
      };
      auto f = op.fn;
      cases.push_back({op.name, s.label, mk, [f](const TensorList& in) { return f(in[0], in[1]); }});
    }
  }
  // Scalar operands and alpha.
  cases.push_back({"add", "alpha=-2.5", [] { return TensorList{arg({3, 2}, 1), arg({2}, 2)}; },
                   [](const TensorList& in) { return add(in[0], in[1], -2.5); }});
  cases.push_back({"sub", "tensor - scalar, scalar - tensor", [] { return TensorList{arg({3, 2}, 1)}; },
                   [](const TensorList& in) { return mul(sub(in[0], 1.5), rsub(in[0], 0.25)); }});
  cases.push_back({"div", "scalar / tensor", [] { return TensorList{arg_away_from_zero({5}, 1)}; },
                   [](const TensorList& in) { return add(rdiv(in[0], 2.0), div(in[0], 3.0)); }});
  cases.push_back({"pow", "tensor ^ 3.0 and 2.0 ^ tensor", [] { return TensorList{arg({4}, 1)}; },
                   [](const TensorList& in) { return add(pow(in[0], 3.0), pow(2.0, in[0])); }});
  cases.push_back({"mul", "same tensor twice", [] { return TensorList{arg({3, 3}, 1)}; },
                   [](const TensorList& in) { return mul(in[0], in[0]); }});
  // Selection.
  cases.push_back({"where", "broadcast cond [3,1], a [3,4], b [4]",
                   [] { return TensorList{arg({3, 4}, 1), arg({4}, 2)}; },
                   [](const TensorList& in) {
                     Tensor cond = from_vector<uint8_t>({1, 0, 1}, {3, 1}).to(DType::boolean);
                     return where(cond, in[0], in[1]);
                   }});
  cases.push_back({"where", "tensor vs scalar", [] { return TensorList{arg({2, 5}, 1)}; },
                   [](const TensorList& in) {
                     Tensor cond = gt(in[0].detach(), 0.0);
                     return where(cond, in[0], -0.5);
                   }});
  cases.push_back({"masked_fill", "mask [1,4] over [3,4]", [] { return TensorList{arg({3, 4}, 1)}; },
                   [](const TensorList& in) {
                     Tensor mask = from_vector<uint8_t>({0, 1, 1, 0}, {1, 4}).to(DType::boolean);
                     return masked_fill(in[0], mask, -1e4);
                   }});
  cases.push_back({"masked_fill", "transposed input", [] { return TensorList{arg_transposed({4, 3}, 1)}; },
                   [](const TensorList& in) {
                     Tensor mask = lt(in[0].detach(), 0.0);
                     return masked_fill(in[0], mask, 0.0);
                   }});
  return cases;
}

}  // namespace forge::testing
