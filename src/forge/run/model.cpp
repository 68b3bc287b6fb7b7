// train::Model's whole-model view (contracts in model.h).
#include "forge/run/model.h"

#include "forge/autograd/grad_mode.h"
#include "forge/core/error.h"

namespace forge::train {

Shape Model::whole_shape(const std::string& name) const {
  if (split) return split->at(name).whole_shape;
  if (stage) return stage->whole_shapes.at(name);
  for (const auto& [n, t] : module->state_dict())
    if (n == name) return t.shape();
  FORGE_THROW("Model::whole_shape: no tensor '", name, "'");
}

io::NamedShapes Model::whole_shapes() const {
  io::NamedShapes out;
  for (const auto& [name, t] : module->state_dict())
    out.emplace_back(name, split ? split->at(name).whole_shape : stage ? stage->whole_shapes.at(name) : t.shape());
  return out;
}

int64_t Model::whole_parameters() const {
  if (split) return split->whole_parameters(*module);
  if (!stage) return module->num_parameters();
  int64_t n = 0;
  for (const auto& [name, p] : module->named_parameters()) n += shape_numel(stage->whole_shapes.at(name));
  return n;
}

void Model::load_whole_state(const io::NamedTensors& state, bool only_present) {
  if (!split && !stage && !only_present) {
    module->load_state_dict(state.items());
    return;
  }
  // Each tensor this rank holds (a pipeline stage's), or its shard of it (tensor parallelism).
  NoGradGuard no_grad;
  for (auto& [name, t] : module->state_dict()) {
    if (stage && !stage->held.count(name)) continue;
    const Tensor* w = state.find(name);
    if (w == nullptr && only_present) continue;
    FORGE_CHECK(w != nullptr, "checkpoint: no tensor '", name,
                "'; load the state of the same model built without tensor or pipeline parallelism");
    const Tensor value = split ? split->local_of(name, *w) : *w;
    FORGE_CHECK(value.shape() == t.shape(), "checkpoint: '", name, "' has shape ", value.shape(), " here, not ",
                t.shape());
    Tensor dst = t;
    dst.copy_(value.to(t.device(), t.dtype()));
  }
}

}  // namespace forge::train
