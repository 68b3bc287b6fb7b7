#pragma once
// Mesh: the ranks of a job as a grid of named dimensions, each a kind of parallelism, and the
// process groups along them.
//
//   parallel::Mesh mesh = parallel::Mesh::carve(world_size, rank, /*tp=*/2, /*pp=*/2);   // world 8: dp 2
//   mesh.tp_rank(), mesh.pp_rank(), mesh.dp_rank();        // this rank's coordinates
//   mesh.attach(world);                                   // collective: the sub-groups
//   mesh.dp_group()->all_reduce(grad, ReduceOp::avg);     // across the replicas
//
// Dimensions (outermost first): dp (data-parallel replicas), pp (pipeline stages), cp (context
// parallelism: parts of each sequence), tp (tensor parallelism). Mesh::of takes any list of
// named dimensions; carve() builds this one. Megatron's order with cp beside tp: tp innermost,
// then cp, pp, and dp outermost:
//   rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank
// so the tp ranks of a group are consecutive (one host's NVLink when tp <= GPUs per host), a
// context-parallel ring is next closest (its K/V blocks pass every attention layer), a
// pipeline's stages are cp x tp apart, and the replicas of one position are cp x tp x pp apart.
// For world 8, tp 2, pp 2: tp groups {0,1} {2,3} {4,5} {6,7}; pp groups {0,2} {1,3} {4,6} {5,7};
// dp groups {0,4} {1,5} {2,6} {3,7}. With cp = 1 the numbering is the same as without cp.
//
// Groups along several dimensions: group_ranks({"dp", "cp"}) are the ranks that differ from this
// one only in dp and cp. The data-parallel reduction of a context-parallel run spans both
// (dp_cp_group(): every one of those ranks computes the gradient of other tokens of the same
// model replica's batch; Note [context-parallel sequence layout] in parallel/context_parallel.h).
//
// carve() checks the degrees before any work: tp, pp, cp >= 1 and world_size divisible by
// tp x pp x cp, each error naming dist.tp / dist.pp / dist.cp, the world size and the fix. Which
// model shapes a degree needs (heads by tp, layers by pp, sequence by cp) is the trainer's check
// (run/layout.h), which knows the model.
//
// attach(world) creates the groups this rank belongs to, by ProcessGroup::new_group, which is
// collective over the world: every rank calls attach with the same mesh shape, and the groups
// are created in one fixed order (every tp group, then every pp, cp, dp group, then every
// dp x cp group). A dimension of size 1 gets no group of its own (its accessor returns nullptr;
// nothing to reduce), a dimension that spans the whole world reuses the world group itself, and
// dp x cp is the dp or the cp group when the other has size 1.
#include <string>
#include <vector>

#include "forge/parallel/process_group.h"

namespace forge::parallel {

struct MeshDim {
  std::string name;
  int size = 1;
};

class Mesh {
 public:
  // A one-process mesh (every degree 1).
  Mesh() = default;
  // The mesh of the named dimensions (outermost first; names unique, sizes >= 1) for `rank`.
  static Mesh of(std::vector<MeshDim> dims, int rank);
  // The mesh of `world_size` ranks with tensor-parallel degree tp, pipeline degree pp and
  // context-parallel degree cp; dp = world_size / (tp * pp * cp). Throws forge::Error naming
  // dist.tp / dist.pp / dist.cp and the fix.
  static Mesh carve(int world_size, int rank, int tp, int pp, int cp = 1);

  int world_size() const;
  int rank() const { return rank_; }
  // A dimension's size (1 for a name the mesh does not have) and this rank's coordinate on it.
  int size(const std::string& dim) const;
  int coord(const std::string& dim) const;
  int dp() const { return size("dp"); }
  int tp() const { return size("tp"); }
  int pp() const { return size("pp"); }
  int cp() const { return size("cp"); }
  int dp_rank() const { return coord("dp"); }
  int pp_rank() const { return coord("pp"); }
  int cp_rank() const { return coord("cp"); }
  int tp_rank() const { return coord("tp"); }
  // The world rank at coordinates (dp_rank, pp_rank, tp_rank), at this rank's context-parallel
  // coordinate.
  int rank_at(int dp_rank, int pp_rank, int tp_rank) const;

  // The world ranks that differ from this one only along `dims`, in group-rank order (the
  // outer dimension's coordinate varies slowest).
  std::vector<int> group_ranks(const std::vector<std::string>& dims) const;
  // Every such group of the mesh, each in group-rank order, the groups in the order of the
  // other dimensions' coordinates (outermost slowest).
  std::vector<std::vector<int>> all_groups(const std::vector<std::string>& dims) const;
  std::vector<int> tp_group_ranks() const { return group_ranks({"tp"}); }
  std::vector<int> pp_group_ranks() const { return group_ranks({"pp"}); }
  std::vector<int> cp_group_ranks() const { return group_ranks({"cp"}); }
  std::vector<int> dp_group_ranks() const { return group_ranks({"dp"}); }
  std::vector<std::vector<int>> all_tp_groups() const { return all_groups({"tp"}); }
  std::vector<std::vector<int>> all_pp_groups() const { return all_groups({"pp"}); }
  std::vector<std::vector<int>> all_cp_groups() const { return all_groups({"cp"}); }
  std::vector<std::vector<int>> all_dp_groups() const { return all_groups({"dp"}); }

  // Creates this rank's sub-groups from `world` (collective; see above). world->size() must be
  // world_size() and world->rank() rank().
  void attach(const ProcessGroupPtr& world);
  const ProcessGroupPtr& world() const { return world_; }
  const ProcessGroupPtr& dp_group() const { return dp_group_; }  // nullptr when dp == 1
  const ProcessGroupPtr& tp_group() const { return tp_group_; }  // nullptr when tp == 1
  const ProcessGroupPtr& pp_group() const { return pp_group_; }  // nullptr when pp == 1
  const ProcessGroupPtr& cp_group() const { return cp_group_; }  // nullptr when cp == 1
  // The data-parallel reduction's group: dp x cp (nullptr when both are 1).
  const ProcessGroupPtr& dp_cp_group() const { return dp_cp_group_; }

  // "dp 2 x tp 2 x pp 2 (rank 5: dp 1, pp 0, tp 1)"; cp appears where it is > 1.
  std::string describe() const;

 private:
  std::vector<MeshDim> dims_;  // outermost first; empty: one process
  int rank_ = 0;
  ProcessGroupPtr world_, dp_group_, tp_group_, pp_group_, cp_group_, dp_cp_group_;
  int index_of(const std::string& dim) const;  // -1 when absent
  int stride_of(size_t i) const;
};

// A group holding this rank alone, carved from `world` (collective over it: every rank calls it;
// one new_group per rank). Where a layout needs a group of a dimension of size 1 (the
// data-parallel group of a job that tensor parallelism spans).
ProcessGroupPtr group_of_one(const ProcessGroupPtr& world);

}  // namespace forge::parallel
