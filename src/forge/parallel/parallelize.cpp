// The composed layer spec of a layout (parallelize.h).
#include "forge/parallel/parallelize.h"

#include "forge/core/error.h"
#include "forge/parallel/context_parallel.h"
#include "forge/parallel/tensor_parallel.h"

namespace forge::parallel {

nn::LayerSpec layer_spec_of(const Mesh& mesh, const Layout& layout, int64_t head_dim) {
  nn::LayerSpec spec;
  if (layout.tp > 1) {
    FORGE_CHECK(mesh.tp_group() != nullptr && mesh.tp_group()->size() == layout.tp,
                "tensor parallelism: the mesh has no tensor-parallel group of ", layout.tp, " ranks attached");
    spec = tp::layer_spec(mesh.tp_group(), layout.sequence_parallel, head_dim);
  }
  if (layout.cp > 1) {
    FORGE_CHECK(mesh.cp_group() != nullptr && mesh.cp_group()->size() == layout.cp,
                "context parallelism: the mesh has no context-parallel group of ", layout.cp, " ranks attached");
    spec = cp::layer_spec(std::move(spec), mesh.cp_group(),
                          layout.cp_kind == ContextKind::ulysses ? cp::Kind::ulysses : cp::Kind::ring);
  }
  return spec;
}

}  // namespace forge::parallel
