#include "forge/parallel/mesh.h"

#include <sstream>
#include <utility>

#include "forge/core/error.h"

namespace forge::parallel {

Mesh Mesh::of(std::vector<MeshDim> dims, int rank) {
  int world = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    FORGE_CHECK(dims[i].size >= 1, "Mesh: dimension '", dims[i].name, "' has size ", dims[i].size, "; sizes are >= 1");
    for (size_t j = 0; j < i; ++j)
      FORGE_CHECK(dims[j].name != dims[i].name, "Mesh: dimension '", dims[i].name, "' is named twice");
    world *= dims[i].size;
  }
  FORGE_CHECK(rank >= 0 && rank < world, "Mesh: rank ", rank, " is outside a world of ", world);
  Mesh m;
  m.dims_ = std::move(dims);
  m.rank_ = rank;
  return m;
}

Mesh Mesh::carve(int world_size, int rank, int tp, int pp, int cp) {
  FORGE_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "Mesh: rank ", rank, " is outside a world of ",
              world_size);
  FORGE_CHECK(tp >= 1, "dist.tp must be >= 1 (1 = no tensor parallelism), got ", tp);
  FORGE_CHECK(pp >= 1, "dist.pp must be >= 1 (1 = no pipeline parallelism), got ", pp);
  FORGE_CHECK(cp >= 1, "dist.cp must be >= 1 (1 = no context parallelism), got ", cp);
  const int per_replica = tp * pp * cp;
  if (world_size % per_replica != 0) {
    std::ostringstream what, keys;
    what << "dist.tp = " << tp << " x dist.pp = " << pp;
    keys << "dist.tp / dist.pp";
    if (cp > 1) {
      what << " x dist.cp = " << cp;
      keys.str("dist.tp / dist.pp / dist.cp");
    }
    FORGE_THROW(what.str(), " = ", per_replica, " ranks per model replica, but the world has ", world_size,
                world_size == 1 ? " process" : " processes", ", which is not a multiple of ", per_replica,
                "; start a multiple of ", per_replica, " processes (e.g. forge launch --nproc-per-node ", per_replica,
                " -- forge train ...) or lower ", keys.str());
  }
  return of({{"dp", world_size / per_replica}, {"pp", pp}, {"cp", cp}, {"tp", tp}}, rank);
}

int Mesh::world_size() const {
  int w = 1;
  for (const MeshDim& d : dims_) w *= d.size;
  return w;
}

int Mesh::index_of(const std::string& dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return static_cast<int>(i);
  return -1;
}

int Mesh::stride_of(size_t i) const {
  int s = 1;
  for (size_t j = i + 1; j < dims_.size(); ++j) s *= dims_[j].size;
  return s;
}

int Mesh::size(const std::string& dim) const {
  const int i = index_of(dim);
  return i < 0 ? 1 : dims_[static_cast<size_t>(i)].size;
}

int Mesh::coord(const std::string& dim) const {
  const int i = index_of(dim);
  if (i < 0) return 0;
  return (rank_ / stride_of(static_cast<size_t>(i))) % dims_[static_cast<size_t>(i)].size;
}

int Mesh::rank_at(int dp_rank, int pp_rank, int tp_rank) const {
  int r = rank_;
  auto set = [&](const char* dim, int c) {
    const int i = index_of(dim);
    if (i < 0) return;
    const int stride = stride_of(static_cast<size_t>(i));
    r += (c - (r / stride) % dims_[static_cast<size_t>(i)].size) * stride;
  };
  set("dp", dp_rank);
  set("pp", pp_rank);
  set("tp", tp_rank);
  return r;
}

namespace {
// The ranks of the group through `base` spanning the dimensions flagged in `in` (outer varies slowest).
std::vector<int> span(const std::vector<MeshDim>& dims, const std::vector<int>& strides, const std::vector<bool>& in,
                      int base) {
  std::vector<int> ranks{base};
  for (size_t i = 0; i < dims.size(); ++i) {
    if (!in[i]) continue;
    std::vector<int> next;
    for (int r : ranks)
      for (int c = 0; c < dims[i].size; ++c) next.push_back(r + c * strides[i]);
    ranks = std::move(next);
  }
  return ranks;
}
}  // namespace

std::vector<int> Mesh::group_ranks(const std::vector<std::string>& dims) const {
  std::vector<bool> in(dims_.size(), false);
  std::vector<int> strides(dims_.size());
  int base = rank_;
  for (size_t i = 0; i < dims_.size(); ++i) strides[i] = stride_of(i);
  for (const std::string& d : dims) {
    const int i = index_of(d);
    if (i < 0) continue;
    in[static_cast<size_t>(i)] = true;
    base -= coord(d) * strides[static_cast<size_t>(i)];
  }
  return span(dims_, strides, in, base);
}

std::vector<std::vector<int>> Mesh::all_groups(const std::vector<std::string>& dims) const {
  std::vector<bool> in(dims_.size(), false);
  std::vector<int> strides(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) strides[i] = stride_of(i);
  for (const std::string& d : dims)
    if (const int i = index_of(d); i >= 0) in[static_cast<size_t>(i)] = true;
  std::vector<bool> out(in.size());
  for (size_t i = 0; i < in.size(); ++i) out[i] = !in[i];
  std::vector<std::vector<int>> groups;
  for (int base : span(dims_, strides, out, 0)) groups.push_back(span(dims_, strides, in, base));
  return groups;
}

void Mesh::attach(const ProcessGroupPtr& world) {
  FORGE_CHECK(world != nullptr, "Mesh::attach: no world process group");
  FORGE_CHECK(world->size() == world_size() && world->rank() == rank_, "Mesh::attach: the world group has rank ",
              world->rank(), " of ", world->size(), ", but the mesh was carved for rank ", rank_, " of ", world_size());
  world_ = world;
  // The groups along `dims`: none when they have size 1, the world itself when they span it,
  // else new_group for every group in order (collective over the world), keeping this rank's.
  auto make = [&](const std::vector<std::string>& dims) -> ProcessGroupPtr {
    int size = 1;
    for (const std::string& d : dims) size *= this->size(d);
    if (size == 1) return nullptr;
    if (size == world_size()) return world;
    ProcessGroupPtr mine;
    for (const auto& g : all_groups(dims))
      if (auto pg = world->new_group(g)) mine = pg;
    return mine;
  };
  tp_group_ = make({"tp"});
  pp_group_ = make({"pp"});
  cp_group_ = make({"cp"});
  dp_group_ = make({"dp"});
  dp_cp_group_ = cp() == 1 ? dp_group_ : dp() == 1 ? cp_group_ : make({"dp", "cp"});
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
  os << "dp " << dp() << " x tp " << tp() << " x pp " << pp();
  if (cp() > 1) os << " x cp " << cp();
  os << " (rank " << rank_ << ": dp " << dp_rank() << ", pp " << pp_rank() << ", tp " << tp_rank();
  if (cp() > 1) os << ", cp " << cp_rank();
  os << ")";
  return os.str();
}

}  // namespace forge::parallel
