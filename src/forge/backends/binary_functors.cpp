#include "forge/backends/binary_functors.h"

namespace forge {

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::eq: return "eq";
    case BinaryOp::ne: return "ne";
    case BinaryOp::lt: return "lt";
    case BinaryOp::le: return "le";
    case BinaryOp::gt: return "gt";
    case BinaryOp::ge: return "ge";
  }
  return "?";
}

bool binary_is_comparison(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le || op == BinaryOp::gt ||
         op == BinaryOp::ge;
}

}  // namespace forge
