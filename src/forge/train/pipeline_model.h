#pragma once
// The model of a pipeline-parallel run (dist.pp > 1; issue 17): each rank keeps the tensors of its
// stage of the task's whole model (built from run.seed on the CPU like every run's), the others
// emptied before anything moves to the device. Stage s of P runs blocks [begin, end) of
// pp::stage_blocks; the first stage also the embeddings, the last the final norm and the head
// (GPT's tied head: the last stage holds a copy of wte, Model::Stage::tied).
#include <iosfwd>

#include "forge/parallel/layout.h"
#include "forge/parallel/mesh.h"
#include "forge/run/config.h"
#include "forge/run/model.h"

namespace forge::train {

// For pp > 1: sets model.stage and empties the tensors other stages hold. A no-op for pp = 1.
void stage_model_for_layout(const RunConfig& cfg, const parallel::Layout& layout, const parallel::Mesh& mesh, Model& model,
                            std::ostream& log);

}  // namespace forge::train
