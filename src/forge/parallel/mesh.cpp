#include "forge/parallel/mesh.h"

#include <sstream>

#include "forge/core/error.h"

namespace forge::parallel {

Mesh Mesh::carve(int world_size, int rank, int tp, int pp) {
  FORGE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "Mesh: rank ", rank, " is outside a world of ",
              world_size);
  FORGE_CHECK(tp >= 1, "dist.tp must be >= 1 (1 = no tensor parallelism), got ", tp);
  FORGE_CHECK(pp >= 1, "dist.pp must be >= 1 (1 = no pipeline parallelism), got ", pp);
  FORGE_CHECK(world_size % (tp * pp) == 0, "dist.tp = ", tp, " x dist.pp = ", pp, " = ", tp * pp,
              " ranks per model replica, but the world has ", world_size, world_size == 1 ? " process" : " processes",
              ", which is not a multiple of ", tp * pp, "; start a multiple of ", tp * pp,
              " processes (e.g. forge launch --nproc-per-node ", tp * pp, " -- forge train ...) or lower dist.tp / dist.pp");
  Mesh m;
  m.tp_ = tp;
  m.pp_ = pp;
  m.dp_ = world_size / (tp * pp);
  m.rank_ = rank;
  return m;
}

std::vector<std::vector<int>> Mesh::all_tp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_; ++d)
    for (int p = 0; p < pp_; ++p) {
      std::vector<int> g;
      for (int t = 0; t < tp_; ++t) g.push_back(rank_at(d, p, t));
      out.push_back(std::move(g));
    }
  return out;
}

std::vector<std::vector<int>> Mesh::all_pp_groups() const {
  std::vector<std::vector<int>> out;
  for (int d = 0; d < dp_; ++d)
    for (int t = 0; t < tp_; ++t) {
      std::vector<int> g;
      for (int p = 0; p < pp_; ++p) g.push_back(rank_at(d, p, t));
      out.push_back(std::move(g));
    }
  return out;
}

std::vector<std::vector<int>> Mesh::all_dp_groups() const {
  std::vector<std::vector<int>> out;
  for (int p = 0; p < pp_; ++p)
    for (int t = 0; t < tp_; ++t) {
      std::vector<int> g;
      for (int d = 0; d < dp_; ++d) g.push_back(rank_at(d, p, t));
      out.push_back(std::move(g));
    }
  return out;
}

std::vector<int> Mesh::tp_group_ranks() const {
  std::vector<int> g;
  for (int t = 0; t < tp_; ++t) g.push_back(rank_at(dp_rank(), pp_rank(), t));
  return g;
}

std::vector<int> Mesh::pp_group_ranks() const {
  std::vector<int> g;
  for (int p = 0; p < pp_; ++p) g.push_back(rank_at(dp_rank(), p, tp_rank()));
  return g;
}

std::vector<int> Mesh::dp_group_ranks() const {
  std::vector<int> g;
  for (int d = 0; d < dp_; ++d) g.push_back(rank_at(d, pp_rank(), tp_rank()));
  return g;
}

void Mesh::attach(const ProcessGroupPtr& world) {
  FORGE_CHECK(world != nullptr, "Mesh::attach: no world process group");
  FORGE_CHECK(world->size() == world_size() && world->rank() == rank_, "Mesh::attach: the world group has rank ",
              world->rank(), " of ", world->size(), ", but the mesh was carved for rank ", rank_, " of ", world_size());
  world_ = world;
  // One dimension's groups: none when it has size 1, the world itself when it spans it, else
  // new_group for every group in order (collective over the world), keeping this rank's.
  auto make = [&](int size, const std::vector<std::vector<int>>& groups) -> ProcessGroupPtr {
    if (size == 1) return nullptr;
    if (size == world_size()) return world;
    ProcessGroupPtr mine;
    for (const auto& g : groups)
      if (auto pg = world->new_group(g)) mine = pg;
    return mine;
  };
  tp_group_ = make(tp_, all_tp_groups());
  pp_group_ = make(pp_, all_pp_groups());
  dp_group_ = make(dp_, all_dp_groups());
}

ProcessGroupPtr group_of_one(const ProcessGroupPtr& world) {
  FORGE_CHECK(world != nullptr, "group_of_one: no world process group");
  ProcessGroupPtr mine;
  for (int r = 0; r < world->size(); ++r)
    if (auto pg = world->new_group({r})) mine = pg;
  return mine;
}

std::string Mesh::describe() const {
  std::ostringstream os;
  os << "dp " << dp_ << " x tp " << tp_ << " x pp " << pp_ << " (rank " << rank_ << ": dp " << dp_rank() << ", pp "
     << pp_rank() << ", tp " << tp_rank() << ")";
  return os.str();
}

}  // namespace forge::parallel
