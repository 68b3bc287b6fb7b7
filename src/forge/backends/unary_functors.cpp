#include "forge/backends/unary_functors.h"

namespace forge {

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::abs: return "abs";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::sin: return "sin";
    case UnaryOp::cos: return "cos";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu: return "gelu";
    case UnaryOp::gelu_tanh: return "gelu_tanh";
    case UnaryOp::silu: return "silu";
  }
  return "?";
}

bool unary_keeps_integers(UnaryOp op) { return op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu; }

bool unary_needs_x(UnaryOp op) {
  switch (op) {
    case UnaryOp::abs: case UnaryOp::log: case UnaryOp::sin: case UnaryOp::cos: case UnaryOp::relu:
    case UnaryOp::gelu: case UnaryOp::gelu_tanh: case UnaryOp::silu:
      return true;
    default:
      return false;
  }
}

bool unary_needs_y(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp: case UnaryOp::sqrt: case UnaryOp::rsqrt: case UnaryOp::tanh: case UnaryOp::sigmoid:
      return true;
    default:
      return false;
  }
}

}  // namespace forge
