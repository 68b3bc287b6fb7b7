#pragma once
// Mesh: the ranks of a job carved into data-, tensor- and pipeline-parallel groups.
//
//   parallel::Mesh mesh = parallel::Mesh::carve(world_size, rank, /*tp=*/2, /*pp=*/2);   // world 8: dp 2
//   mesh.tp_rank(), mesh.pp_rank(), mesh.dp_rank();        // this rank's coordinates
//   mesh.attach(world);                                   // collective: the sub-groups
//   mesh.dp_group()->all_reduce(grad, ReduceOp::avg);     // across the replicas
//
// Order (Megatron's, DESIGN.md "Parallelism"): tp innermost, then pp, dp outermost:
//   rank = (dp_rank * pp + pp_rank) * tp + tp_rank
// so the tp ranks of a group are consecutive (one host's NVLink when tp <= GPUs per host),
// a pipeline's stages are tp apart, and the replicas of one (pp, tp) position are tp * pp
// apart. For world 8, tp 2, pp 2: tp groups {0,1} {2,3} {4,5} {6,7}; pp groups {0,2} {1,3}
// {4,6} {5,7}; dp groups {0,4} {1,5} {2,6} {3,7}.
//
// carve() checks the degrees before any work: tp, pp >= 1 and world_size divisible by
// tp * pp, each error naming dist.tp / dist.pp, the world size and the fix. Which model shapes
// a degree needs (heads by tp, layers by pp) is the trainer's check (train/layout.h), which
// knows the model.
//
// attach(world) creates the groups this rank belongs to, by ProcessGroup::new_group, which is
// collective over the world: every rank calls attach with the same mesh shape, and the groups
// are created in one fixed order (every tp group, then every pp group, then every dp group). A
// dimension of size 1 gets no group of its own (its accessor returns nullptr; nothing to
// reduce), and a dimension that spans the whole world reuses the world group itself.
#include <string>
#include <vector>

#include "forge/parallel/process_group.h"

namespace forge::parallel {

class Mesh {
 public:
  // A one-process mesh (dp = tp = pp = 1).
  Mesh() = default;
  // The mesh of `world_size` ranks with tensor-parallel degree tp and pipeline degree pp;
  // dp = world_size / (tp * pp). Throws forge::Error naming dist.tp / dist.pp and the fix.
  static Mesh carve(int world_size, int rank, int tp, int pp);

  int world_size() const { return dp_ * tp_ * pp_; }
  int rank() const { return rank_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp_rank() const { return rank_ / (tp_ * pp_); }
  int pp_rank() const { return (rank_ / tp_) % pp_; }
  int tp_rank() const { return rank_ % tp_; }
  // The world rank at coordinates (dp_rank, pp_rank, tp_rank).
  int rank_at(int dp_rank, int pp_rank, int tp_rank) const { return (dp_rank * pp_ + pp_rank) * tp_ + tp_rank; }

  // The world ranks of this rank's groups, in group-rank order.
  std::vector<int> tp_group_ranks() const;
  std::vector<int> pp_group_ranks() const;
  std::vector<int> dp_group_ranks() const;
  // Every group of one dimension, each in group-rank order (what attach() creates).
  std::vector<std::vector<int>> all_tp_groups() const;
  std::vector<std::vector<int>> all_pp_groups() const;
  std::vector<std::vector<int>> all_dp_groups() const;

  // Creates this rank's sub-groups from `world` (collective; see above). world->size() must be
  // world_size() and world->rank() rank().
  void attach(const ProcessGroupPtr& world);
  const ProcessGroupPtr& world() const { return world_; }
  const ProcessGroupPtr& dp_group() const { return dp_group_; }  // nullptr when dp == 1
  const ProcessGroupPtr& tp_group() const { return tp_group_; }  // nullptr when tp == 1
  const ProcessGroupPtr& pp_group() const { return pp_group_; }  // nullptr when pp == 1

  // "dp 2 x tp 2 x pp 2 (rank 5: dp 1, pp 0, tp 1)"
  std::string describe() const;

 private:
  int dp_ = 1, tp_ = 1, pp_ = 1, rank_ = 0;
  ProcessGroupPtr world_, dp_group_, tp_group_, pp_group_;
};

// A group holding this rank alone, carved from `world` (collective over it: every rank calls it;
// one new_group per rank). Where a layout needs a group of a dimension of size 1 (the
// data-parallel group of a job that tensor parallelism spans).
ProcessGroupPtr group_of_one(const ProcessGroupPtr& world);

}  // namespace forge::parallel
