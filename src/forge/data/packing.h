#pragma once
// Note [packed documents] (nn/documents.h): with data.packing = "documents" a training window
// of T + 1 tokens still packs whatever documents the token stream holds there (each ends with
// the end-of-text token, data.eos_token), but the model treats them as separate sequences. This
// file marks a batch for that:
//   documents[b, t]  the document of token t within row b: 0 for the row's first, +1 after each
//                    end-of-text token (the end-of-text token belongs to the document it ends);
//   positions[b, t]  t minus the index of its document's first token in the row;
//   targets[b, t]    -100 (not trained) where inputs[b, t] is the end-of-text token: its target
//                    is the next document's first token, which nothing in its own document can
//                    predict once attention stops at the document's end.
// So a document's tokens get exactly the losses they would get alone in a row of their own
// (tests/train/test_packing.cpp): the same attention, the same positions, the same targets.
#include <cstdint>
#include <memory>
#include <optional>

#include "forge/data/loader.h"

namespace forge::data {

// Marks `batch` (inputs and targets (B, T) i64 on the CPU) as above, in place.
void mark_documents(Batch& batch, int64_t eos_id);

// A batch source whose batches come marked (mark_documents): wraps another, owned or not.
class DocumentMarking : public BatchSource {
 public:
  DocumentMarking(std::unique_ptr<BatchSource> source, int64_t eos_id);
  DocumentMarking(BatchSource& source, int64_t eos_id);  // `source` outlives this
  std::optional<Batch> next() override;
  SamplerState state() const override { return source_->state(); }
  void set_state(const SamplerState& state) override { source_->set_state(state); }

 private:
  std::unique_ptr<BatchSource> owned_;
  BatchSource* source_;
  int64_t eos_id_;
};

}  // namespace forge::data
