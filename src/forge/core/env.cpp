// forge's environment switches (env.h): the one table of FORGE_* variables, the strict parser,
// the once-per-process reads and the tests' overrides. docs/environment.md lists the same table.
#include "forge/core/env.h"

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <sstream>
#include <system_error>

#include "forge/core/error.h"

namespace forge::env {

namespace {

constexpr double kIntMax = 2147483647.0;  // INT_MAX: MPI's counts, cuBLASLt's int32 attributes
constexpr double kNoLimit = std::numeric_limits<double>::infinity();

}  // namespace

// The table: every FORGE_* switch forge reads, in alphabetical order. A new switch is a row
// here, a line in docs/environment.md and, if it changes results, a config key instead.
// (Not here: FORGE_LAUNCHER, FORGE_NCCL_ID, FORGE_RESTART_COUNT and FORGE_LAUNCH_STOP_SIGNAL,
// forge launch's plumbing to its ranks, parallel/env.h and parallel/launch.h; the result-changing switches that are config keys instead: debug.skip_reductions,
// debug.abort_at, debug.hang_at, run.allow_tf32 for forge train; FORGE_GEMM_TUNING is the default of
// programs that do not set it, forge train takes run.gemm_tuning.) The table and the kept values are never destroyed: a read may come from a
// static destructor.
const std::vector<Spec>& table() {
  static const auto* rows = new std::vector<Spec>{
      {.name = "FORGE_ADAMW_PAIRS",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: the CUDA AdamW kernel for bf16/f16 parameters loads two vectors of every operand a thread "
                  "before it stores either, twice the loads in flight (the same bits; docs/performance.md item 36); "
                  "off until measured (written for the H200, where AdamW reaches 67% of the bandwidth)"},
      {.name = "FORGE_ADAMW_REGISTER_CAP",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: the CUDA AdamW kernel is compiled to 45 registers so that five 256-thread blocks fit an SM "
                  "instead of four (the same bits; docs/performance.md item 31); off: 0.994x on an H100 (A/B), "
                  "not yet tried on an H200"},
      {.name = "FORGE_ALLOW_TF32",
       .kind = Kind::flag,
       .category = Category::numerics,
       .default_value = "0",
       .meaning = "1: f32 GEMMs on CUDA use TF32 tensor cores (as ops::set_allow_tf32(true); relative error ~1e-3) in "
                  "programs that do not set it themselves; changes results, so forge train ignores it and takes "
                  "run.allow_tf32 from its config"},
      {.name = "FORGE_BGRAD_EPILOGUE",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: a CUDA linear's bias gradient comes from forge's column-sum kernel instead of the weight "
                  "gradient GEMM's cuBLASLt BGRADB epilogue (docs/performance.md)"},
      {.name = "FORGE_BIND",
       .kind = Kind::choice,
       .category = Category::performance,
       .default_value = "auto",
       .meaning = "NUMA binding of a rank's threads and host memory: auto (with 2+ nodes, unless mpirun/srun "
                  "bound it), numa, none; forge launch --bind sets it (docs/dist.md)",
       .choices = {"auto", "numa", "none"}},
      {.name = "FORGE_CE_WIDE_ROWS",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: the CUDA cross-entropy forward and the fused classifier give every row a 256-thread block "
                  "instead of 1024 threads for rows of 2048 16-byte vectors and more (GPT-2's and LLaMA's "
                  "vocabularies; docs/performance.md item 30)"},
      {.name = "FORGE_CPU_MEMORY_LIMIT",
       .kind = Kind::string,
       .category = Category::debugging,
       .default_value = "",
       .meaning = "a byte limit for the CPU allocator (512MB, 2GiB, ...): beyond it allocations fail as on a "
                  "full GPU, with the out-of-memory snapshot (Note [memory owners]; docs/train.md)"},
      {.name = "FORGE_CUDA_ALLOC",
       .kind = Kind::choice,
       .category = Category::debugging,
       .default_value = "caching",
       .meaning = "plain: a cudaMalloc/cudaFree per storage instead of the caching allocator, so "
                  "compute-sanitizer pins a fault on its tensor (docs/cuda.md)",
       .choices = {"caching", "plain"}},
      {.name = "FORGE_CUDA_MEMORY_LIMIT",
       .kind = Kind::string,
       .category = Category::debugging,
       .default_value = "",
       .meaning = "a byte limit (512MB, 40GiB, ...) on the device memory each GPU's caching allocator takes "
                  "from cudaMalloc: beyond it allocations fail as on a full GPU, with the out-of-memory snapshot "
                  "by owner (a smaller GPU simulated on a larger one; Note [memory owners]; docs/train.md)"},
      {.name = "FORGE_CUDNN_PLAN_TUNING",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: cuDNN's fused attention runs its heuristic's first plan instead of timing the heuristics' "
                  "candidates once per shape and running the fastest (never timed in deterministic mode; Note "
                  "[cuDNN attention], docs/cuda-kernels.md)"},
      {.name = "FORGE_DIST_TIMEOUT",
       .kind = Kind::real,
       .category = Category::debugging,
       .default_value = "300",
       .meaning = "seconds a blocking MPI wait or an NCCL collective may take before the rank reports it and "
                  "ends the job (a stuck or dead peer; docs/dist.md)",
       .min = 0,
       .max = kNoLimit,
       .min_exclusive = true},
      {.name = "FORGE_FLASH_ATTENTION",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: CUDA attention always takes the GEMM path instead of the flash kernels "
                  "(docs/cuda-kernels.md)"},
      {.name = "FORGE_FUSED_CLASSIFIER",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: a language model's loss on CUDA runs the cross-entropy forward and backward as two kernels "
                  "instead of computing dlogits inside the forward and writing them over the logits (one read of "
                  "the logits less; docs/performance.md item 24)"},
      {.name = "FORGE_GELU_BIAS_GRAD",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: linear_gelu's backward on CUDA runs the GELU gradient as an elementwise kernel and leaves the "
                  "bias gradient to the weight-gradient GEMM, instead of one pass that writes the GELU gradient and "
                  "its column sums (docs/cuda-kernels.md)"},
      {.name = "FORGE_GELU_FAST",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: linear_gelu's one-pass CUDA backward on bf16/f16 forms the GELU gradient from one __expf "
                  "and one reciprocal instead of tanhf (docs/performance.md item 29); off: 0.995x on an H100 "
                  "(A/B), not yet tried on an H200"},
      {.name = "FORGE_GELU_FUSION",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: nn::MLP on CUDA runs linear, then gelu, instead of one cuBLASLt GEMM with a GELU epilogue "
                  "(docs/cuda-kernels.md)"},
      {.name = "FORGE_GELU_MLP",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: nn::MLP on CUDA runs as ops::gelu_mlp, the GELU gradient inside the down projection's GEMM "
                  "(docs/cuda-kernels.md); off until a same-session A/B shows it faster"},
      {.name = "FORGE_GEMM_SM_TARGET",
       .kind = Kind::integer,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "N > 0: plan every cuBLASLt GEMM for N SMs (SM_COUNT_TARGET), leaving the rest to a concurrent "
                  "stream (NCCL); 0: all SMs (docs/dist.md)",
       .min = 0,
       .max = kIntMax},
      {.name = "FORGE_GEMM_TUNE_CACHE",
       .kind = Kind::string,
       .category = Category::performance,
       .default_value = "",
       .meaning = "the GEMM tuning cache file (the algorithm timed for each GEMM shape, reused by later runs); "
                  "unset: $XDG_CACHE_HOME/forge/gemm_tuning.json or ~/.cache/forge/gemm_tuning.json; none: no file "
                  "(docs/cuda-kernels.md)"},
      {.name = "FORGE_GEMM_TUNE_IN_GRAPH",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: GEMM tuning times each cuBLASLt candidate as a CUDA graph of its runs, as the captured "
                  "training step replays it (an algorithm's workspace memset costs more there), with a tuning "
                  "cache section of its own (docs/performance.md item 35); off until a same-session A/B shows "
                  "it faster"},
      {.name = "FORGE_GEMM_TUNING",
       .kind = Kind::choice,
       .category = Category::performance,
       .default_value = "cached",
       .meaning = "cached: time cuBLASLt's candidate algorithms once per GEMM shape and keep the fastest (and in "
                  "FORGE_GEMM_TUNE_CACHE); off: the heuristic's first choice; in programs that do not set it "
                  "themselves (as ops::set_gemm_tuning); forge train ignores it and takes run.gemm_tuning",
       .choices = {"cached", "off"}},
      {.name = "FORGE_MPI_MAX_COUNT",
       .kind = Kind::integer,
       .category = Category::debugging,
       .default_value = "2147483647",
       .meaning = "the most elements of one MPI call; larger messages are split into several (the same on every "
                  "rank; the tests lower it to run the split path; docs/dist.md)",
       .min = 1,
       .max = kIntMax},
      {.name = "FORGE_NCCL_HIGH_PRIORITY",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: NCCL's communication stream gets the device's highest priority (as PyTorch's "
                  "TORCH_NCCL_HIGH_PRIORITY; docs/dist.md)"},
      {.name = "FORGE_NORM_BIAS_GRAD",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: GPT's c_proj takes its bias gradient from its weight-gradient GEMM again, instead of from the "
                  "column sums of dx that the CUDA add_layer_norm backward writes beside dx (docs/performance.md "
                  "item 23)"},
      {.name = "FORGE_NORM_BLOCK_ROWS",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: the CUDA layer/RMS norm backward of rows up to 1024 columns (GPT-2's 768) runs a warp per "
                  "row, as before the block-per-row kernel took them (docs/performance.md)"},
      {.name = "FORGE_NO_GRAD_BUFFER_CLAIM",
       .kind = Kind::flag,
       .category = Category::diagnostic,
       .default_value = "0",
       .meaning = "1: backward computes every gradient into memory of its own and copies it into the gradient "
                  "buffer, as before the claimed buffers (what they save; docs/dist.md)"},
      {.name = "FORGE_PACKED_QKV",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: LLaMA's q, k and v projections run as one GEMM over their concatenated weights, with rope "
                  "and attention as one op (ops::qkv_rope_attention, docs/performance.md); off until a same-session "
                  "A/B shows it faster"},
      {.name = "FORGE_ROPE_PLANES",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: CUDA rope on 16-byte rows runs a capped grid-stride loop with three divisions an item instead "
                  "of a 2-D grid, a (batch, head) plane per grid row and one item a thread (the same bits; "
                  "docs/performance.md item 26)"},
      {.name = "FORGE_SWIGLU_FAST",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "0",
       .meaning = "1: CUDA SwiGLU and its backward on bf16/f16 compute the sigmoid with __expf and one "
                  "reciprocal instead of expf and IEEE divisions (docs/performance.md item 29); off: even on an "
                  "H100 (A/B 1.000x), not yet tried on an H200"},
      {.name = "FORGE_TP_OVERLAP",
       .kind = Kind::flag,
       .category = Category::performance,
       .default_value = "1",
       .meaning = "0: tensor parallelism computes a column-parallel region's weight gradients before, not while, "
                  "the collective on its input gradient runs (what the overlap saves; docs/dist.md)"},
      {.name = "FORGE_TRAIN_PHASES",
       .kind = Kind::flag,
       .category = Category::diagnostic,
       .default_value = "0",
       .meaning = "1 (CUDA): timing events at the phase boundaries of every step; at the end each rank prints "
                  "its mean device time per phase (docs/train.md)"},
      {.name = "FORGE_TRAIN_SYNC_EACH_STEP",
       .kind = Kind::flag,
       .category = Category::diagnostic,
       .default_value = "0",
       .meaning = "1: the host reads each step's loss and norm as soon as it is queued, not one step late, so "
                  "the device drains every step (what the deferred read saves; docs/train.md)"},
  };
  return *rows;
}

namespace {

// ---- the parser ------------------------------------------------------------------------------

std::string number_text(double x) {
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::ostringstream os;
  if (x == std::floor(x) && std::fabs(x) < 1e15) os << static_cast<int64_t>(x);
  else os << x;
  return os.str();
}

[[noreturn]] void malformed(const Spec& s, std::string_view text) {
  FORGE_THROW("the environment variable ", s.name, "='", text, "' must be ", accepted_forms(s),
              "; correct it, or unset it for the default (", s.default_value, "). ", s.name, ": ", s.meaning);
}

bool in_range(const Spec& s, double v) {
  return (s.min_exclusive ? v > s.min : v >= s.min) && v <= s.max;
}

Value parse_spec(const Spec& s, std::string_view text) {
  if (text.empty()) text = s.default_value;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  switch (s.kind) {
    case Kind::flag:
      if (text == "0") return false;
      if (text == "1") return true;
      break;
    case Kind::integer: {
      int64_t v = 0;
      const auto [p, ec] = std::from_chars(first, last, v);
      if (ec == std::errc() && p == last && in_range(s, static_cast<double>(v))) return v;
      break;
    }
    case Kind::real: {
      double v = 0;
      const auto [p, ec] = std::from_chars(first, last, v);
      if (ec == std::errc() && p == last && std::isfinite(v) && in_range(s, v)) return v;
      break;
    }
    case Kind::string: return std::string(text);
    case Kind::choice:
      for (const auto& c : s.choices)
        if (text == c) return std::string(text);
      break;
  }
  malformed(s, text);
}

// ---- the kept values and the overrides -------------------------------------------------------

size_t index_of(std::string_view name) {
  const auto& t = table();
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i].name == name) return i;
  FORGE_THROW("forge::env: '", name, "' is not a declared environment switch: declare it in the table of ",
              "src/forge/core/env.cpp (and docs/environment.md) before reading it");
}

// A switch's state for the process: read and parsed once.
struct Slot {
  std::once_flag once;
  std::optional<std::string> raw;
  std::optional<Value> value;  // set when well-formed
  std::string error;           // set when malformed
};

Slot& slot(size_t i) {
  static Slot* const slots = new Slot[table().size()];
  Slot& s = slots[i];
  std::call_once(s.once, [&] {
    const Spec& sp = table()[i];
    if (const char* v = std::getenv(std::string(sp.name).c_str())) s.raw = v;
    try {
      s.value = parse_spec(sp, s.raw.value_or(""));
    } catch (const Error& e) {
      s.error = e.what();
    }
  });
  return s;
}

struct Overrides {
  std::mutex mu;
  std::vector<std::optional<std::optional<std::string>>> by_index;  // engaged: overridden (inner nullopt: unset)
  Overrides() : by_index(table().size()) {}
  std::atomic<int> live{0};  // Override objects alive: none -> reads skip the lock
};

Overrides& overrides() {
  static auto* const o = new Overrides;
  return *o;
}

// The override of switch i, if a test set one.
std::optional<std::optional<std::string>> override_of(size_t i) {
  Overrides& o = overrides();
  if (o.live.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(o.mu);
  return o.by_index[i];
}

Value read(size_t i) {
  if (const auto o = override_of(i)) return parse_spec(table()[i], o->value_or(""));
  const Slot& s = slot(i);
  if (!s.value) throw Error(s.error);
  return *s.value;
}

const char* reader_of(Kind k) {
  switch (k) {
    case Kind::flag: return "flag";
    case Kind::integer: return "integer";
    case Kind::real: return "real";
    case Kind::string:
    case Kind::choice: return "string";
  }
  return "?";
}

// The index of `name`, checked to be read by `reader` (env::flag, env::integer, ...).
size_t index_for(std::string_view name, const char* reader) {
  const size_t i = index_of(name);
  const Kind k = table()[i].kind;
  FORGE_CHECK(std::string_view(reader_of(k)) == reader, "forge::env::", reader, "(\"", name, "\"): ", name,
              " is declared as a ", kind_name(k), " switch; read it with env::", reader_of(k));
  return i;
}

}  // namespace

bool flag(std::string_view name) { return std::get<bool>(read(index_for(name, "flag"))); }
int64_t integer(std::string_view name) { return std::get<int64_t>(read(index_for(name, "integer"))); }
double real(std::string_view name) { return std::get<double>(read(index_for(name, "real"))); }
std::string string(std::string_view name) { return std::get<std::string>(read(index_for(name, "string"))); }

Value parse(std::string_view name, std::string_view text) { return parse_spec(spec(name), text); }

const Spec& spec(std::string_view name) { return table()[index_of(name)]; }

std::vector<Listing> switches() {
  std::vector<Listing> out;
  for (size_t i = 0; i < table().size(); ++i) {
    Listing l{&table()[i], std::nullopt, ""};
    if (const auto o = override_of(i)) {
      l.raw = *o;
      try {
        parse_spec(table()[i], l.raw.value_or(""));
      } catch (const Error& e) {
        l.error = e.what();
      }
    } else {
      const Slot& s = slot(i);
      l.raw = s.raw;
      l.error = s.error;
    }
    out.push_back(std::move(l));
  }
  return out;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::flag: return "flag";
    case Kind::integer: return "integer";
    case Kind::real: return "real";
    case Kind::string: return "string";
    case Kind::choice: return "choice";
  }
  return "?";
}

const char* category_name(Category c) {
  switch (c) {
    case Category::diagnostic: return "diagnostic";
    case Category::performance: return "performance";
    case Category::debugging: return "debugging";
    case Category::numerics: return "numerics";
  }
  return "?";
}

std::string accepted_forms(const Spec& s) {
  switch (s.kind) {
    case Kind::flag: return "0 or 1";
    case Kind::string: return "any text";
    case Kind::choice: {
      std::string r = "one of ";
      for (size_t i = 0; i < s.choices.size(); ++i) r += (i > 0 ? ", " : "") + std::string(s.choices[i]);
      return r;
    }
    case Kind::integer:
    case Kind::real: {
      const std::string what = s.kind == Kind::integer ? "an integer" : "a number";
      if (std::isinf(s.max)) return what + (s.min_exclusive ? " > " : " >= ") + number_text(s.min);
      return what + " in " + (s.min_exclusive ? "(" : "[") + number_text(s.min) + ", " + number_text(s.max) + "]";
    }
  }
  return "?";
}

Override::Override(std::string_view name, std::optional<std::string> raw) : index_(index_of(name)) {
  Overrides& o = overrides();
  std::lock_guard<std::mutex> lock(o.mu);
  previous_ = o.by_index[index_];
  o.by_index[index_].emplace(std::move(raw));
  o.live.fetch_add(1, std::memory_order_release);
}

Override::~Override() {
  Overrides& o = overrides();
  std::lock_guard<std::mutex> lock(o.mu);
  o.by_index[index_] = std::move(previous_);
  o.live.fetch_sub(1, std::memory_order_release);
}

}  // namespace forge::env
