// Marking packed documents: see packing.h.
#include "forge/data/packing.h"

#include <limits>
#include <utility>

#include "forge/core/error.h"
#include "forge/ops/creation.h"

namespace forge::data {

void mark_documents(Batch& batch, int64_t eos_id) {
  const Tensor& in = batch.inputs;
  FORGE_CHECK(in.defined() && in.dim() == 2 && in.dtype() == DType::i64 && in.is_cpu() && batch.targets.defined() &&
                  batch.targets.shape() == in.shape() && batch.targets.dtype() == DType::i64 &&
                  batch.targets.is_cpu(),
              "mark_documents: expects token inputs and targets (B, T) i64 on the CPU, got inputs ",
              in.defined() ? in.shape() : Shape{}, " and targets ",
              batch.targets.defined() ? batch.targets.shape() : Shape{});
  FORGE_CHECK(eos_id >= 0, "mark_documents: the end-of-text token id must be >= 0, got ", eos_id);
  const int64_t B = in.size(0), T = in.size(1);
  FORGE_CHECK(T <= std::numeric_limits<int32_t>::max(), "mark_documents: rows of ", T, " tokens are too long");
  const Tensor inputs = in.contiguous();
  Tensor targets = batch.targets.contiguous().clone();
  Tensor documents = empty({B, T}, {.dtype = DType::i32});
  Tensor positions = empty({B, T}, {.dtype = DType::i64});
  const int64_t* x = inputs.data<int64_t>();
  int64_t* y = targets.data<int64_t>();
  int32_t* d = documents.data<int32_t>();
  int64_t* p = positions.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    int32_t doc = 0;
    int64_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t;
      d[i] = doc;
      p[i] = t - start;
      if (x[i] == eos_id) {  // the document ends here: its last token predicts nothing of it
        y[i] = -100;
        ++doc;
        start = t + 1;
      }
    }
  }
  batch.inputs = inputs;
  batch.targets = std::move(targets);
  batch.documents = std::move(documents);
  batch.positions = std::move(positions);
}

DocumentMarking::DocumentMarking(std::unique_ptr<BatchSource> source, int64_t eos_id)
    : owned_(std::move(source)), source_(owned_.get()), eos_id_(eos_id) {
  FORGE_CHECK(source_ != nullptr, "DocumentMarking: no batch source to wrap");
}

DocumentMarking::DocumentMarking(BatchSource& source, int64_t eos_id) : source_(&source), eos_id_(eos_id) {}

std::optional<Batch> DocumentMarking::next() {
  std::optional<Batch> b = source_->next();
  if (b) mark_documents(*b, eos_id_);
  return b;
}

}  // namespace forge::data
