#pragma once
// forge's environment switches (the FORGE_* variables): one table, one parser, read once.
//
//   if (env::flag("FORGE_GELU_FUSION")) ...               // bool
//   const int64_t m = env::integer("FORGE_MPI_MAX_COUNT"); // int64_t
//   const double s = env::real("FORGE_DIST_TIMEOUT");      // double
//   const std::string b = env::string("FORGE_BIND");      // a choice's (or a string's) text
//
// Contract:
//   - Every switch is declared once, in the table of env.cpp: name, kind, category, default,
//     a one-line meaning (and a choice's values, a number's range). `forge info --env` lists
//     that table and docs/environment.md documents it; nothing reads a FORGE_* switch without
//     a row there. Asking for a name that is not in the table, or reading a switch as another
//     kind (flag() of an integer switch), is a programming error: forge::Error.
//   - A switch's value is read from the environment and parsed at its first read in the
//     process (thread-safe) and kept: later reads return the same value, or throw the same
//     error, whatever setenv does afterwards. Callers read the switch where they need it and
//     keep no copy of their own (a read is a table look-up).
//   - Unset or empty means the default. Parsing is strict: a flag is 0 or 1, an integer is
//     decimal digits (an optional '-') inside its range, a real a decimal number inside its
//     range, a choice one of its values. Anything else is a forge::Error naming the variable,
//     the value, the accepted forms and the default, thrown at the read that needed it.
//   - parse(name, text) runs the same parser on a given text without reading the environment
//     or touching the kept value (tests, and `forge info --env`).
//   - A switch that changes a run's results belongs in the run's config, recorded with the
//     run, not in the environment (DESIGN.md). Category::numerics marks the ones that still do.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace forge::env {

enum class Kind {
  flag,     // 0 or 1
  integer,  // a decimal integer in [min, max]
  real,     // a decimal number in [min, max] ((min, max] with min_exclusive)
  string,   // any text
  choice,   // one of `choices`
};

enum class Category {
  diagnostic,   // changes nothing but what is measured or printed: a report, or one
                // optimisation undone so its gain can be measured; results bit for bit the same
  performance,  // chooses an implementation or a placement; the same math up to rounding
  debugging,    // how a fault shows up (a time limit, an allocator without a cache) or a rare
                // path is forced to run; a healthy run's results do not change
  numerics,     // changes results beyond rounding: a run's config key is preferred
};

// One declared switch (a row of the table in env.cpp).
struct Spec {
  std::string_view name;
  Kind kind = Kind::flag;
  Category category = Category::diagnostic;
  std::string_view default_value;           // as it would be written in the environment
  std::string_view meaning;                 // one line
  std::vector<std::string_view> choices{};  // Kind::choice
  double min = 0, max = 0;                  // Kind::integer, Kind::real (inclusive)
  bool min_exclusive = false;               // Kind::real: value > min
};

// A parsed value: bool (flag), int64_t (integer), double (real), std::string (string, choice).
using Value = std::variant<bool, int64_t, double, std::string>;

// The typed reads (the contract above). string() reads a string or a choice switch.
bool flag(std::string_view name);
int64_t integer(std::string_view name);
double real(std::string_view name);
std::string string(std::string_view name);

// The switch's parser on `text` ("" = unset: the default); throws as a read would.
Value parse(std::string_view name, std::string_view text);

// Every declared switch, in the table's order.
const std::vector<Spec>& table();
// The row of `name`; a forge::Error for a name the table does not declare.
const Spec& spec(std::string_view name);

// A switch as `forge info --env` lists it. Listing reads each switch (its first read, if no
// code has read it yet) but never throws: a malformed value is reported in `error`.
struct Listing {
  const Spec* spec = nullptr;
  std::optional<std::string> raw;  // the value read from the environment; nullopt when unset
  std::string error;               // the parse error of a malformed value, else empty
};
std::vector<Listing> switches();

// "flag", "integer", ...; "diagnostic", "performance", ...
const char* kind_name(Kind k);
const char* category_name(Category c);
// What a value of the switch may be: "0 or 1", "an integer in [1, 2147483647]", ...
std::string accepted_forms(const Spec& s);

// For tests: while alive, reads of the switch see `raw` (nullopt: unset) instead of the
// environment, parsed at every read; on destruction the previous state comes back (nested
// overrides of one switch end in reverse order). Library code never uses it: a switch is read
// once per process.
class Override {
 public:
  Override(std::string_view name, std::optional<std::string> raw);
  ~Override();
  Override(const Override&) = delete;
  Override& operator=(const Override&) = delete;

 private:
  size_t index_;
  std::optional<std::optional<std::string>> previous_;  // the override this one hides, if any
};

}  // namespace forge::env
