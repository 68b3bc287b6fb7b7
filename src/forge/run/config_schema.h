#pragma once
// The schema of the run config (run/config.h), shared by config.cpp (parsing, checking,
// printing) and config_fields.cpp (the table): every key with its section, its member of
// RunConfig (an accessor, whose type is the key's type) and its documentation. Internal to train/.
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "forge/run/config.h"

namespace forge::train::detail {

using StringList = std::vector<std::string>;
using IntList = std::vector<int64_t>;
template <class T> using Accessor = T& (*)(RunConfig&);
using AnyAccessor = std::variant<Accessor<int64_t>, Accessor<double>, Accessor<bool>, Accessor<std::string>,
                                 Accessor<StringList>, Accessor<IntList>>;

struct Field {
  std::string key;      // "train.steps"
  std::string section;  // "train"
  std::string name;     // "steps"
  AnyAccessor get;
  std::string doc;
};


// Every key, in the order --print-config and the docs list them.
const std::vector<Field>& fields();

}  // namespace forge::train::detail
