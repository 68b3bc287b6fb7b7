#pragma once
// The registry of differentiable ops: every op of forge::ops whose output carries a gradient,
// by the name it records in the autograd graph (a node named "<op>Backward"; ops composed of
// other ops, such as stack or flatten, record their parts' nodes and are registered by their
// own name).
//
// Note [op registry]: each family file (ops/unary.cpp, ops/view.cpp, ...) registers the ops it
// defines, next to their definitions, at static initialisation:
//
//   [[maybe_unused]] const bool kRegistered = register_ops({"exp", "log"});
//
// The tests read it (tests/testing/op_table.h): every registered op must have a case in the op
// table, which drives its f64 gradient check and its CUDA-vs-CPU comparison, and every node a
// model or a case records must be a registered op. A family file is linked whenever one of its
// ops is called, so a program that can record an op also sees it registered.
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace forge::ops {

// Adds `names` to the registry (a name registered twice is kept once). Returns true, so that it
// can initialise a namespace-scope constant.
bool register_ops(std::initializer_list<const char*> names);

// Every registered op, sorted by name.
std::vector<std::string> registered_ops();

bool is_registered_op(std::string_view name);

}  // namespace forge::ops
