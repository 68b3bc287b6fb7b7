// Argument checks shared by every ProcessGroup backend (process_group.h). They run before
// anything is started, and depend only on arguments that every rank passes the same way
// (shapes, dtypes, roots), so a mistake throws on every rank rather than leaving some
// ranks blocked in a collective the others never joined.
#include "forge/parallel/process_group.h"

#include "forge/core/error.h"

namespace forge::parallel {

namespace {
class CompletedWork final : public Work {
 public:
  void wait() override {}
  void synchronize() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkPtr completed_work() {
  static const WorkPtr done = std::make_shared<CompletedWork>();
  return done;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

namespace detail {

void check_tensor(const ProcessGroup& pg, const char* op, const char* arg, const Tensor& t) {
  FORGE_CHECK(t.defined(), op, ": argument '", arg, "' is an undefined tensor");
  FORGE_CHECK(t.device() == pg.device(), op, ": argument '", arg, "' is on ", t.device().str(), " but this ",
              pg.backend(), " group communicates tensors on ", pg.device().str(), "; move it with .to(",
              pg.device().str(), ")");
  FORGE_CHECK(t.is_contiguous(), op, ": argument '", arg, "' (shape ", t.shape(), ", strides ", t.strides(),
              ") is not contiguous; pass .contiguous() and copy the result back");
  switch (t.dtype()) {
    case DType::f32: case DType::f64: case DType::bf16: case DType::f16:
    case DType::i32: case DType::i64: case DType::u8:
      break;
    default:
      FORGE_THROW(op, ": argument '", arg, "' has dtype ", dtype_name(t.dtype()),
                  ", which cannot be communicated; use f32, f64, bf16, f16, i32, i64 or u8 (e.g. .to(DType::u8))");
  }
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  FORGE_CHECK(a.dtype() == b.dtype(), op, ": output and input dtypes differ (", dtype_name(a.dtype()), " vs ",
              dtype_name(b.dtype()), "); convert one with .to(", dtype_name(a.dtype()), ")");
}

void check_rank(const ProcessGroup& pg, const char* op, const char* arg, int r) {
  FORGE_CHECK(r >= 0 && r < pg.size(), op, ": ", arg, " ", r, " is not a rank of this group of ", pg.size(),
              " (valid: 0..", pg.size() - 1, ")");
}

void check_peer(const ProcessGroup& pg, const char* op, const char* arg, int peer) {
  check_rank(pg, op, arg, peer);
  FORGE_CHECK(peer != pg.rank(), op, ": ", arg, " ", peer, " is this process's own rank; a rank cannot ", op,
              " to itself (copy the tensor instead)");
}

void check_reduce_op(const char* op, ReduceOp rop, DType dtype) {
  if (rop == ReduceOp::avg) {
    FORGE_CHECK(is_floating(dtype), op, ": ReduceOp::avg needs a floating-point tensor, got ", dtype_name(dtype),
                "; reduce with ReduceOp::sum and divide, or convert to f32 first");
  }
  switch (rop) {
    case ReduceOp::sum: case ReduceOp::avg: case ReduceOp::max: case ReduceOp::min: return;
  }
  FORGE_THROW(op, ": unknown ReduceOp ", static_cast<int>(rop));
}

std::vector<int> check_group_ranks(const ProcessGroup& pg, const std::vector<int>& ranks) {
  FORGE_CHECK(!ranks.empty(), "new_group: the rank list is empty; name at least one rank of this group of ",
              pg.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    FORGE_CHECK(ranks[i] >= 0 && ranks[i] < pg.size(), "new_group: rank ", ranks[i],
                " is not a rank of this group of ", pg.size(), " (valid: 0..", pg.size() - 1, ")");
    FORGE_CHECK(i == 0 || ranks[i] > ranks[i - 1], "new_group: ranks must be strictly increasing; got ",
                ranks[i - 1], " then ", ranks[i], " at position ", i);
  }
  return ranks;
}

void check_all_gather(const ProcessGroup& pg, const Tensor& output, const Tensor& input) {
  check_tensor(pg, "all_gather", "output", output);
  check_tensor(pg, "all_gather", "input", input);
  check_same_dtype("all_gather", output, input);
  FORGE_CHECK(output.numel() == input.numel() * pg.size(), "all_gather: output has ", output.numel(),
              " elements but needs group size x input elements = ", pg.size(), " x ", input.numel(), " = ",
              input.numel() * pg.size());
}

void check_reduce_scatter(const ProcessGroup& pg, const Tensor& output, const Tensor& input, ReduceOp op) {
  check_tensor(pg, "reduce_scatter", "output", output);
  check_tensor(pg, "reduce_scatter", "input", input);
  check_same_dtype("reduce_scatter", output, input);
  check_reduce_op("reduce_scatter", op, input.dtype());
  FORGE_CHECK(input.numel() == output.numel() * pg.size(), "reduce_scatter: input has ", input.numel(),
              " elements but needs group size x output elements = ", pg.size(), " x ", output.numel(), " = ",
              output.numel() * pg.size());
}

void check_gather(const ProcessGroup& pg, const Tensor& output, const Tensor& input, int root) {
  check_rank(pg, "gather", "root", root);
  check_tensor(pg, "gather", "input", input);
  if (pg.rank() != root) return;  // output is ignored off root
  check_tensor(pg, "gather", "output", output);
  check_same_dtype("gather", output, input);
  FORGE_CHECK(output.numel() == input.numel() * pg.size(), "gather: output on root ", root, " has ",
              output.numel(), " elements but needs group size x input elements = ", pg.size(), " x ",
              input.numel(), " = ", input.numel() * pg.size());
}

void check_scatter(const ProcessGroup& pg, const Tensor& output, const Tensor& input, int root) {
  check_rank(pg, "scatter", "root", root);
  check_tensor(pg, "scatter", "output", output);
  if (pg.rank() != root) return;  // input is ignored off root
  check_tensor(pg, "scatter", "input", input);
  check_same_dtype("scatter", output, input);
  FORGE_CHECK(input.numel() == output.numel() * pg.size(), "scatter: input on root ", root, " has ",
              input.numel(), " elements but needs group size x output elements = ", pg.size(), " x ",
              output.numel(), " = ", output.numel() * pg.size());
}

void check_all_to_all(const ProcessGroup& pg, const Tensor& output, const Tensor& input) {
  check_tensor(pg, "all_to_all", "output", output);
  check_tensor(pg, "all_to_all", "input", input);
  check_same_dtype("all_to_all", output, input);
  FORGE_CHECK(output.numel() == input.numel(), "all_to_all: output has ", output.numel(),
              " elements but input has ", input.numel(), "; both hold one block per rank, the same size");
  FORGE_CHECK(input.numel() % pg.size() == 0, "all_to_all: input has ", input.numel(),
              " elements, not a multiple of the group size ", pg.size(), " (one equal block per rank); pad it");
  const auto* o = static_cast<const char*>(output.data_ptr());
  const auto* i = static_cast<const char*>(input.data_ptr());
  const size_t bytes = static_cast<size_t>(input.numel()) * input.element_size();
  FORGE_CHECK(bytes == 0 || o + bytes <= i || i + bytes <= o,
              "all_to_all: output and input overlap; it is not an in-place operation, give it a separate output");
}

}  // namespace detail
}  // namespace forge::parallel
