#pragma once
// Note [packed documents]: with data.packing = "documents" a training row of T tokens holds
// several documents (each ends with the end-of-text token), and the model treats each as if it
// were alone: attention stays inside a document (Note [document masks] in ops/attention.h) and
// positions restart at 0 with every document (GPT's position table, LLaMA's rotary embedding:
// Note [packed positions] in ops/rope.h). The row's first document may have begun before the
// window; it starts at position 0 all the same, as a document cut at a window's start does
// unpacked. Documents come from data::mark_documents (data/packing.h), which also drops the
// targets that would cross into the next document; they travel with the residual stream
// through the blocks (nn::Stream), so a checkpointed block's recomputation sees them too.
#include "forge/core/tensor.h"

namespace forge::nn {

struct Documents {
  Tensor ids;        // (B, T) i32: the document of each position within its row
  Tensor positions;  // (B, T) i64: each position's place in its document (0 at its first token)
  bool packed() const { return ids.defined(); }
};

}  // namespace forge::nn
