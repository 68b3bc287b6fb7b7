// train::Model's whole-model view (contracts in model.h).
#include "forge/train/model.h"

namespace forge::train {

io::NamedShapes Model::whole_shapes() const {
  io::NamedShapes out;
  for (const auto& [name, t] : module->state_dict())
    out.emplace_back(name, split ? split->at(name).whole_shape : t.shape());
  return out;
}

int64_t Model::whole_parameters() const {
  return split ? split->whole_parameters(*module) : module->num_parameters();
}

void Model::load_whole_state(const io::NamedTensors& state) {
  if (!split) {
    module->load_state_dict(state.items());
    return;
  }
  std::map<std::string, Tensor> whole;
  for (const auto& [name, t] : state) whole.emplace(name, t);
  split->load_whole(*module, whole);
}

}  // namespace forge::train
