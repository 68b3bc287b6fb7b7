// The environment switches (core/env.h): the strict parser of each kind, defaults, the errors
// (naming the variable, the value and the accepted forms), the table's contents, reads kept
// once per process, env::Override, and `forge info --env` (table and JSON).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "forge/core/env.h"
#include "forge/core/error.h"
#include "testing/cli_testing.h"

namespace forge {
namespace {

// The message of the forge::Error that f throws ("" and a test failure when it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no forge::Error";
  return "";
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

bool as_flag(std::string_view name, std::string_view text) { return std::get<bool>(env::parse(name, text)); }
int64_t as_integer(std::string_view name, std::string_view text) { return std::get<int64_t>(env::parse(name, text)); }
double as_real(std::string_view name, std::string_view text) { return std::get<double>(env::parse(name, text)); }
std::string as_string(std::string_view name, std::string_view text) {
  return std::get<std::string>(env::parse(name, text));
}

TEST(Env, FlagsAreZeroOrOne) {
  EXPECT_TRUE(as_flag("FORGE_GELU_FUSION", "1"));
  EXPECT_FALSE(as_flag("FORGE_GELU_FUSION", "0"));
  EXPECT_TRUE(as_flag("FORGE_GELU_FUSION", ""));  // empty = unset = the default (on)
  EXPECT_FALSE(as_flag("FORGE_ALLOW_TF32", ""));   // off by default
  EXPECT_FALSE(as_flag("FORGE_NO_GRAD_BUFFER_CLAIM", ""));
  for (const char* bad : {"yes", "true", "on", "2", " 1", "1 ", "01", "-0"}) {
    const std::string e = error_of([&] { env::parse("FORGE_GELU_FUSION", bad); });
    expect_has(e, std::string("FORGE_GELU_FUSION='") + bad + "'");
    expect_has(e, "0 or 1");
    expect_has(e, "default (1)");
  }
}

TEST(Env, IntegersAreDecimalAndInRange) {
  EXPECT_EQ(as_integer("FORGE_MPI_MAX_COUNT", "7"), 7);
  EXPECT_EQ(as_integer("FORGE_MPI_MAX_COUNT", "1"), 1);
  EXPECT_EQ(as_integer("FORGE_MPI_MAX_COUNT", "2147483647"), 2147483647);
  EXPECT_EQ(as_integer("FORGE_MPI_MAX_COUNT", ""), 2147483647);  // INT_MAX, MPI's limit
  EXPECT_EQ(as_integer("FORGE_GEMM_SM_TARGET", ""), 0);          // 0: all SMs
  EXPECT_EQ(as_integer("FORGE_GEMM_SM_TARGET", "120"), 120);
  for (const char* bad : {"yes", "0", "-3", "2147483648", "99999999999999999999", "7x", "+7", " 7", "7.0", "1e3"}) {
    const std::string e = error_of([&] { env::parse("FORGE_MPI_MAX_COUNT", bad); });
    expect_has(e, std::string("FORGE_MPI_MAX_COUNT='") + bad + "'");
    expect_has(e, "an integer in [1, 2147483647]");
  }
  expect_has(error_of([] { env::parse("FORGE_GEMM_SM_TARGET", "-1"); }), "an integer in [0, 2147483647]");
}

TEST(Env, RealsAreFiniteNumbersInRange) {
  EXPECT_EQ(as_real("FORGE_DIST_TIMEOUT", ""), 300.0);
  EXPECT_EQ(as_real("FORGE_DIST_TIMEOUT", "5"), 5.0);
  EXPECT_EQ(as_real("FORGE_DIST_TIMEOUT", "0.25"), 0.25);
  EXPECT_EQ(as_real("FORGE_DIST_TIMEOUT", "1e3"), 1000.0);
  for (const char* bad : {"0", "-1", "five", "5s", "inf", "nan", " 5"}) {
    const std::string e = error_of([&] { env::parse("FORGE_DIST_TIMEOUT", bad); });
    expect_has(e, std::string("FORGE_DIST_TIMEOUT='") + bad + "'");
    expect_has(e, "a number > 0");
  }
}

TEST(Env, ChoicesAreOneOfTheirValues) {
  EXPECT_EQ(as_string("FORGE_BIND", ""), "auto");
  for (const char* m : {"auto", "numa", "none"}) EXPECT_EQ(as_string("FORGE_BIND", m), m);
  EXPECT_EQ(as_string("FORGE_CUDA_ALLOC", ""), "caching");
  EXPECT_EQ(as_string("FORGE_CUDA_ALLOC", "plain"), "plain");
  const std::string e = error_of([] { env::parse("FORGE_BIND", "socket"); });
  expect_has(e, "FORGE_BIND='socket'");
  expect_has(e, "one of auto, numa, none");
  expect_has(e, "default (auto)");
  expect_has(error_of([] { env::parse("FORGE_CUDA_ALLOC", "Plain"); }), "one of caching, plain");
}

TEST(Env, UndeclaredNamesAndWrongKindsAreProgrammingErrors) {
  const std::string e = error_of([] { env::flag("FORGE_NO_SUCH_SWITCH"); });
  expect_has(e, "FORGE_NO_SUCH_SWITCH");
  expect_has(e, "src/forge/core/env.cpp");
  error_of([] { env::parse("FORGE_NO_SUCH_SWITCH", "1"); });
  error_of([] { env::spec("FORGE_NO_SUCH_SWITCH"); });
  error_of([] { env::Override o("FORGE_NO_SUCH_SWITCH", "1"); });
  // Not switches: they are (or become) config keys or launch plumbing.
  for (const char* name :
       {"FORGE_DIST_SKIP_REDUCTIONS", "FORGE_TEST_ABORT_AT", "FORGE_TEST_HANG_AT", "FORGE_LAUNCHER", "FORGE_NCCL_ID",
        "FORGE_RESTART_COUNT", "FORGE_LAUNCH_STOP_SIGNAL", "FORGE_RDZV_TOKEN", "FORGE_OMP_DEFAULTS"})
    error_of([&] { env::spec(name); });
  // Reading a switch as another kind.
  expect_has(error_of([] { env::integer("FORGE_GELU_FUSION"); }), "read it with env::flag");
  expect_has(error_of([] { env::flag("FORGE_MPI_MAX_COUNT"); }), "read it with env::integer");
  expect_has(error_of([] { env::string("FORGE_DIST_TIMEOUT"); }), "read it with env::real");
  expect_has(error_of([] { env::real("FORGE_BIND"); }), "read it with env::string");
}

TEST(Env, TableDeclaresEverySwitchOnce) {
  const std::vector<std::pair<std::string, env::Category>> expected = {
      {"FORGE_ADAMW_PAIRS", env::Category::performance},
      {"FORGE_ADAMW_REGISTER_CAP", env::Category::performance},
      {"FORGE_ALLOW_TF32", env::Category::numerics},
      {"FORGE_BGRAD_EPILOGUE", env::Category::performance},
      {"FORGE_BIND", env::Category::performance},
      {"FORGE_CE_WIDE_ROWS", env::Category::performance},
      {"FORGE_CPU_MEMORY_LIMIT", env::Category::debugging},
      {"FORGE_CUDA_ALLOC", env::Category::debugging},
      {"FORGE_CUDA_MEMORY_LIMIT", env::Category::debugging},
      {"FORGE_CUDNN_PLAN_TUNING", env::Category::performance},
      {"FORGE_DIST_TIMEOUT", env::Category::debugging},
      {"FORGE_FLASH_ATTENTION", env::Category::performance},
      {"FORGE_FUSED_CLASSIFIER", env::Category::performance},
      {"FORGE_GELU_BIAS_GRAD", env::Category::performance},
      {"FORGE_GELU_FAST", env::Category::performance},
      {"FORGE_GELU_FUSION", env::Category::performance},
      {"FORGE_GELU_MLP", env::Category::performance},
      {"FORGE_GEMM_SM_TARGET", env::Category::performance},
      {"FORGE_GEMM_TUNE_CACHE", env::Category::performance},
      {"FORGE_GEMM_TUNE_IN_GRAPH", env::Category::performance},
      {"FORGE_GEMM_TUNING", env::Category::performance},
      {"FORGE_MPI_MAX_COUNT", env::Category::debugging},
      {"FORGE_NCCL_HIGH_PRIORITY", env::Category::performance},
      {"FORGE_NORM_BIAS_GRAD", env::Category::performance},
      {"FORGE_NORM_BLOCK_ROWS", env::Category::performance},
      {"FORGE_NO_GRAD_BUFFER_CLAIM", env::Category::diagnostic},
      {"FORGE_PACKED_QKV", env::Category::performance},
      {"FORGE_ROPE_PLANES", env::Category::performance},
      {"FORGE_SWIGLU_FAST", env::Category::performance},
      {"FORGE_TP_OVERLAP", env::Category::performance},
      {"FORGE_TRAIN_PHASES", env::Category::diagnostic},
      {"FORGE_TRAIN_SYNC_EACH_STEP", env::Category::diagnostic},
  };
  std::vector<std::string> names;
  for (const auto& s : env::table()) names.emplace_back(s.name);
  ASSERT_EQ(names.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(names[i], expected[i].first);  // alphabetical: the listing's order
    EXPECT_EQ(env::spec(expected[i].first).category, expected[i].second) << expected[i].first;
  }
  for (const auto& s : env::table()) {
    SCOPED_TRACE(std::string(s.name));
    EXPECT_EQ(s.name.substr(0, 6), "FORGE_");
    EXPECT_FALSE(s.meaning.empty());
    EXPECT_EQ(s.meaning.find('\n'), std::string_view::npos);  // one line
    EXPECT_NO_THROW(env::parse(s.name, ""));                  // the default is a valid value
    EXPECT_NO_THROW(env::parse(s.name, s.default_value));
    EXPECT_EQ(s.kind == env::Kind::choice, !s.choices.empty());
    // Only numerics switches may change results, and they say so.
    EXPECT_EQ(s.category == env::Category::numerics, s.meaning.find("changes results") != std::string_view::npos);
  }
  expect_has(std::string(env::spec("FORGE_ALLOW_TF32").meaning), "forge train ignores it and takes run.allow_tf32");
  expect_has(std::string(env::spec("FORGE_GEMM_TUNING").meaning), "forge train ignores it and takes run.gemm_tuning");
}

TEST(Env, AcceptedFormsAndNames) {
  EXPECT_EQ(env::accepted_forms(env::spec("FORGE_GELU_FUSION")), "0 or 1");
  EXPECT_EQ(env::accepted_forms(env::spec("FORGE_MPI_MAX_COUNT")), "an integer in [1, 2147483647]");
  EXPECT_EQ(env::accepted_forms(env::spec("FORGE_DIST_TIMEOUT")), "a number > 0");
  EXPECT_EQ(env::accepted_forms(env::spec("FORGE_BIND")), "one of auto, numa, none");
  EXPECT_STREQ(env::kind_name(env::Kind::choice), "choice");
  EXPECT_STREQ(env::category_name(env::Category::numerics), "numerics");
  const env::Spec text{.name = "X", .kind = env::Kind::string, .default_value = "", .meaning = "text"};
  EXPECT_EQ(env::accepted_forms(text), "any text");
}

// A switch is read from the environment once: setenv afterwards changes nothing.
TEST(Env, ReadOncePerProcess) {
  const char* name = "FORGE_NCCL_HIGH_PRIORITY";  // nothing in a CPU test process reads it
  const char* old = std::getenv(name);
  const std::string saved = old != nullptr ? old : "";
  const bool first = env::flag(name);
  ::setenv(name, first ? "0" : "1", 1);
  EXPECT_EQ(env::flag(name), first);
  ::setenv(name, "garbage", 1);
  EXPECT_EQ(env::flag(name), first);
  if (old != nullptr) ::setenv(name, saved.c_str(), 1);
  else ::unsetenv(name);
}

TEST(Env, OverrideStandsInForTheEnvironment) {
  const bool before = env::flag("FORGE_GELU_FUSION");
  const int64_t count_before = env::integer("FORGE_MPI_MAX_COUNT");
  {
    env::Override off("FORGE_GELU_FUSION", "0");
    EXPECT_FALSE(env::flag("FORGE_GELU_FUSION"));
    {
      env::Override on("FORGE_GELU_FUSION", "1");
      EXPECT_TRUE(env::flag("FORGE_GELU_FUSION"));
      env::Override count("FORGE_MPI_MAX_COUNT", "7");
      EXPECT_EQ(env::integer("FORGE_MPI_MAX_COUNT"), 7);
    }
    EXPECT_FALSE(env::flag("FORGE_GELU_FUSION"));  // the outer override again
    EXPECT_EQ(env::integer("FORGE_MPI_MAX_COUNT"), count_before);
    {
      env::Override unset("FORGE_GELU_FUSION", std::nullopt);
      EXPECT_TRUE(env::flag("FORGE_GELU_FUSION"));  // the default
    }
    {
      // A malformed value throws at every read, naming the variable.
      env::Override bad("FORGE_GELU_FUSION", "yes");
      expect_has(error_of([] { env::flag("FORGE_GELU_FUSION"); }), "FORGE_GELU_FUSION='yes'");
      expect_has(error_of([] { env::flag("FORGE_GELU_FUSION"); }), "0 or 1");
    }
  }
  EXPECT_EQ(env::flag("FORGE_GELU_FUSION"), before);
}

TEST(Env, SwitchesListEveryOneWithoutThrowing) {
  env::Override set("FORGE_GEMM_SM_TARGET", "12");
  env::Override bad("FORGE_BIND", "socket");
  env::Override unset("FORGE_CUDA_ALLOC", std::nullopt);
  const std::vector<env::Listing> all = env::switches();
  ASSERT_EQ(all.size(), env::table().size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i].spec, &env::table()[i]);
  const auto find = [&](std::string_view name) {
    return *std::find_if(all.begin(), all.end(), [&](const env::Listing& l) { return l.spec->name == name; });
  };
  EXPECT_EQ(find("FORGE_GEMM_SM_TARGET").raw, "12");
  EXPECT_TRUE(find("FORGE_GEMM_SM_TARGET").error.empty());
  EXPECT_EQ(find("FORGE_BIND").raw, "socket");
  expect_has(find("FORGE_BIND").error, "FORGE_BIND='socket'");
  EXPECT_FALSE(find("FORGE_CUDA_ALLOC").raw.has_value());
  EXPECT_TRUE(find("FORGE_CUDA_ALLOC").error.empty());
}

// ---- forge info --env ----------------------------------------------------------------------

using InfoEnvCliTest = testing::ForgeCliTest;

TEST_F(InfoEnvCliTest, TableListsEverySwitch) {
  const testing::CliRun r = testing::run_forge({"info", "--env"}, testing::Stderr::merged,
                                               {{"FORGE_GEMM_SM_TARGET", "12"}, {"FORGE_GELU_FUSION", "yes"}});
  ASSERT_EQ(r.status, 0) << r.out;  // a malformed value is listed, not thrown
  for (const auto& s : env::table()) {
    SCOPED_TRACE(std::string(s.name));
    const size_t at = r.out.find("\n  " + std::string(s.name) + " ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
    expect_has(line, std::string(s.meaning));
    expect_has(line, env::category_name(s.category));
  }
  expect_has(r.out, "NAME");
  expect_has(r.out, "(unset)");
  expect_has(r.out, "error: the environment variable FORGE_GELU_FUSION='yes' must be 0 or 1");
  const size_t sm = r.out.find("\n  FORGE_GEMM_SM_TARGET ");
  ASSERT_NE(sm, std::string::npos);
  expect_has(r.out.substr(sm, r.out.find('\n', sm + 1) - sm), " 12 ");
}

TEST_F(InfoEnvCliTest, JsonListsEverySwitch) {
  const testing::CliRun r = testing::run_forge({"info", "--env", "--json"}, testing::Stderr::dropped,
                                               {{"FORGE_DIST_TIMEOUT", "5"}, {"FORGE_MPI_MAX_COUNT", "0"}});
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["switches"].is_array());
  ASSERT_EQ(j["switches"].size(), env::table().size());
  std::set<std::string> names;
  for (const auto& s : j["switches"]) {
    for (const char* k : {"name", "value", "default", "kind", "accepted", "category", "meaning", "error"})
      EXPECT_TRUE(s.contains(k)) << k;
    names.insert(s["name"].get<std::string>());
    const std::string name = s["name"];
    if (name == "FORGE_DIST_TIMEOUT") {
      EXPECT_EQ(s["value"], "5");
      EXPECT_TRUE(s["error"].is_null());
      EXPECT_EQ(s["kind"], "real");
      EXPECT_EQ(s["default"], "300");
    } else if (name == "FORGE_MPI_MAX_COUNT") {
      EXPECT_EQ(s["value"], "0");
      expect_has(s["error"].get<std::string>(), "FORGE_MPI_MAX_COUNT='0'");
      EXPECT_EQ(s["accepted"], "an integer in [1, 2147483647]");
    }
  }
  for (const auto& s : env::table()) EXPECT_TRUE(names.count(std::string(s.name))) << s.name;
}

}  // namespace
}  // namespace forge
