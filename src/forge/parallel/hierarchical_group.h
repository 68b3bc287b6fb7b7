#pragma once
// A data-parallel group whose reductions go within each node first (dist.dp_reduce =
// "hierarchical"; docs/dist.md "Several machines").
//
//   auto g = parallel::make_hierarchical(dp_group, /*per_node=*/2);   // collective over dp_group
//   g->all_reduce(bucket, ReduceOp::avg);     // RS in the node, AR across nodes, AG in the node
//
// Note [hierarchical data-parallel reduction]. A flat ring all-reduce over W ranks on N nodes of
// k ranks sends 2(W-1)/W of the bytes through every rank, so each node's network link carries
// the whole bucket twice over whatever the node's internal links could do. Reducing in the node
// first (reduce-scatter over its k ranks: each rank then holds 1/k of the node's sum), then across
// nodes over those slices (the k ranks of the same local index form k independent groups of N,
// each moving 1/k of the bytes: a node's link carries 2(N-1)/N of the bucket in all, shared by
// k parallel streams), then all-gathering in the node, moves the inter-node bytes of an
// N-rank ring instead of a W-rank one and lets the fast intra-node link do the rest (the
// 2D/hierarchical all-reduce of Horovod and of NCCL's tree across nodes; the planner's
// group_link prices it so, plan/time_model.h).
//
// The group's ranks are numbered node-major (rank = node * k + local, as the mesh numbers the
// data-parallel ranks when the launcher fills each node with consecutive ranks), and its
// operations keep the flat group's meaning exactly, rank for rank:
//   all_reduce(t):          intra reduce-scatter (in place, t's k slices; t padded to a multiple
//                           of k in a copy when it is not one) -> inter all-reduce of the slice
//                           -> intra all-gather (in place).
//   reduce_scatter(out, in): rank r = n*k + l owns slice r of in. The slices are reordered local-
//                           major ((N, k, s) -> (k, N, s)), reduce-scattered in the node (rank l
//                           gets the node's sum of slices (n', l) for every n'), then reduce-
//                           scattered across nodes (rank n gets slice (n, l) = r).
//   all_gather(out, in):    across nodes first (slices (n', l)), then in the node, then put back
//                           node-major.
// sum and max/min keep their op at each stage; avg averages at each stage (k then N: W in all).
// Reduced 16-bit values are rounded once per stage instead of once (within the tolerances of a
// different summation order). Everything else (broadcast, send/recv, ...) goes to the flat group.
//
// Ordering (process_group.h): on a CPU group each stage starts when the previous one is done,
// which wait(), synchronize() and is_completed() drive on the calling thread (MPI is funnelled).
// On a GPU the whole chain is queued at the call on a stream of the group's own that first waits
// for the caller's current stream (runtime::SideStream), each stage's collective waiting for the
// one before on the device, so the compute stream is never stalled and backward keeps
// overlapping the buckets' reductions; wait() makes the caller's current stream wait for the
// chain's end.
#include <optional>
#include <vector>

#include "forge/parallel/paced_group.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel {

// The flat group `flat` (every rank calls this: new_group is collective over it) seen as N =
// size / per_node nodes of per_node consecutive ranks. Returns `flat` itself when per_node is 1 or
// the whole group (nothing to split). Throws forge::Error naming dist.node_size when per_node
// does not divide the group's size.
// `inter`: the simulated network between nodes (Note [paced link]) the inter-node groups are paced
// by (its share set by the caller: node_aware_group gives the node size); gbps 0 = none.
ProcessGroupPtr make_hierarchical(const ProcessGroupPtr& flat, int per_node, const LinkPace& inter = {});

// The groups a group made by make_hierarchical reduces through: its node's (intra, per_node ranks)
// and its local index's across the nodes (inter, paced); nullopt for any other group. For
// reductions that do their own inter-node stage (fp8_reduce.h).
struct NodeGroups {
  ProcessGroupPtr intra, inter;
  int per_node = 1;
};
std::optional<NodeGroups> node_groups(const ProcessGroupPtr& g);

// The number of a group's ranks on each node, the group given by its members' world ranks (in
// group-rank order) on nodes of `node_size` consecutive world ranks. Throws forge::Error naming
// dist.node_size unless every node holding a member holds the same number of them, numbered
// node-major (what make_hierarchical needs).
int group_ranks_per_node(const std::vector<int>& world_ranks, int node_size);

// How a data-parallel group meets the nodes it spans: the node size in world ranks, whether it
// reduces within each node first, and the simulated link between nodes (gbps 0: none).
struct NodeLayout {
  int node_size = 1;
  bool hierarchical = false;
  LinkPace link;
};
// The group the data-parallel reductions use (collective over `flat` when it creates groups):
// `flat` itself when it lies within one node or nothing is asked; make_hierarchical when asked
// (its inter-node groups paced, each node's node_size of them sharing its link); else `flat` paced
// by paced_across_nodes. world_ranks: the members' world ranks in group-rank order.
ProcessGroupPtr node_aware_group(const ProcessGroupPtr& flat, const std::vector<int>& world_ranks, const NodeLayout& nodes);
// Group `g` paced by `link` when its members span several nodes (else `g`): a ring over m members
// per node crosses each node's link once per step, and the node holds node_size / m such groups
// (the other tensor-, context- or pipeline-parallel coordinates) that cross it at the same time:
// share = node_size / m. For the flat data-parallel ring and the pipeline's stage-to-stage sends.
ProcessGroupPtr paced_across_nodes(const ProcessGroupPtr& g, const std::vector<int>& world_ranks, int node_size,
                                   const LinkPace& link);

}  // namespace forge::parallel
