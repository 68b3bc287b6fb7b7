// The world group: which engine, how its ranks find each other, and the process's MPI
// lifetime (world.h).
//
// Note [world of one]: a CPU world of one process that no MPI launcher started does not
// initialise MPI at all (a singleton MPI_Init would work with Open MPI but forks helper
// daemons, needs the MPI runtime installed and usable where forge runs, and is slow to start).
// It is a "self" group (self_group.h): every collective is complete at once (a copy where output
// and input are different memory), and send/recv are refused as for any rank sending to itself.
// Under `mpirun -np 1` the world is a real MPI group of one. A CUDA world of one is an NCCL
// communicator of one rank (its id made locally), so its operations run on its stream as
// in a larger world.
#include "forge/parallel/world.h"

#include "forge/parallel/rendezvous.h"

#include <cstdlib>
#include <mutex>
#include <string>

#include "forge/core/error.h"
#include "forge/ops/creation.h"
#include "forge/parallel/mpi_group.h"
#include "forge/parallel/rendezvous.h"
#include "forge/parallel/self_group.h"
#ifdef FORGE_WITH_CUDA
#include "forge/parallel/nccl_group.h"
#endif

namespace forge::parallel {

namespace {

std::mutex g_mutex;
ProcessGroupPtr g_world;
bool g_atexit_registered = false;

void register_atexit() {
  if (g_atexit_registered) return;
  std::atexit([] { shutdown(); });
  g_atexit_registered = true;
}

void check_mpi_matches(const LaunchEnv& env) {
  const int r = mpi::world_rank(), s = mpi::world_size();
  FORGE_CHECK(r == env.rank && s == env.world_size, "init_world: MPI says this is rank ", r, " of ", s,
              " but the ", launcher_name(env.launcher), " environment says rank ", env.rank, " of ", env.world_size,
              s == 1 ? "; MPI started as a singleton: under Slurm start the job with `srun --mpi=pmix` "
                       "(or pmi2), or use mpirun"
                     : "; start every rank with one launcher");
}

ProcessGroupPtr make_cpu_world(const LaunchEnv& env) {
  if (env.uses_mpi()) return mpi::make_world_group();
  if (env.world_size == 1) return self_group(Device::cpu());
  FORGE_THROW("init_world: a CPU world of ", env.world_size, " ranks (started by ", launcher_name(env.launcher),
              ") needs MPI: start it with `mpirun -np ", env.world_size,
              " ...` (forge launch starts CPU ranks through mpirun), or train on CUDA devices (NCCL)");
}

ProcessGroupPtr make_cuda_world([[maybe_unused]] const LaunchEnv& env, [[maybe_unused]] Device device) {
#ifndef FORGE_WITH_CUDA
  FORGE_THROW("init_world: ", device.str(), " requested but this forge was built without CUDA (no NCCL); "
              "rebuild with -DFORGE_CUDA=ON or use the CPU (MPI)");
#else
  const int visible = cuda_device_count();
  FORGE_CHECK(device.index >= 0 && device.index < visible, "init_world: ", device.str(), " requested but ",
              visible, " CUDA device", visible == 1 ? " is" : "s are",
              " visible to this process; use cuda:LOCAL_RANK with one process per GPU (and check CUDA_VISIBLE_DEVICES)");
  std::string id;
  if (!env.nccl_id_hex.empty()) {
    parallel::check_nccl_id_hex(env.nccl_id_hex, "FORGE_NCCL_ID");
    id = env.nccl_id_hex;
  } else if (env.world_size == 1) {
    id = parallel::new_nccl_id_hex();
  } else if (env.uses_mpi()) {
    // Rank 0 makes the id and broadcasts it over MPI (mpirun, srun).
    id = env.rank == 0 ? parallel::new_nccl_id_hex() : std::string(256, '0');
    FORGE_CHECK(id.size() == 256, "init_world: unexpected NCCL id length ", id.size());
    mpi::broadcast_bytes(id.data(), static_cast<int>(id.size()), 0);
    parallel::check_nccl_id_hex(id, "the NCCL id broadcast by rank 0");
  } else if (env.launcher == Launcher::torchrun) {
    // torchrun without MPI: rank 0 serves its id on MASTER_ADDR:MASTER_PORT + 1 (rendezvous.h).
    id = rendezvous_exchange(env.master_addr, env.master_port + 1, env.rank, env.world_size,
                             env.rank == 0 ? parallel::new_nccl_id_hex() : std::string(), rendezvous_token_from_env(),
                             120.0, env.world_size > env.local_world_size);
    parallel::check_nccl_id_hex(id, "the NCCL id from rank 0's rendezvous");
  } else {
    FORGE_THROW("init_world: a CUDA world of ", env.world_size, " ranks started by ", launcher_name(env.launcher),
                " has no NCCL id; start it with forge launch, mpirun, srun or torchrun");
  }
  return parallel::make_nccl_group(id, env.rank, env.world_size, device.index);
#endif
}

}  // namespace

ProcessGroupPtr init_world(const LaunchEnv& env, Device device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  FORGE_CHECK(g_world == nullptr, "init_world: the world group already exists (", g_world->backend(), ", rank ",
              g_world->rank(), " of ", g_world->size(), "); use parallel::world(), or parallel::shutdown() first");
  FORGE_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "init_world: rank ", env.rank,
              " outside a world of ", env.world_size);
  try {
    if (env.uses_mpi()) {
      mpi::init();
      check_mpi_matches(env);
    }
    g_world = device.is_cpu() ? make_cpu_world(env) : make_cuda_world(env, device);
  } catch (...) {
    register_atexit();  // MPI may be initialised: finalise it at exit
    throw;
  }
  // Registered after the CUDA runtime and NCCL initialised (exit handlers run in reverse
  // order), so the world is destroyed before they tear down.
  register_atexit();
  return g_world;
}

ProcessGroupPtr world() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_world;
}

void shutdown() {
  ProcessGroupPtr w;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    w = std::move(g_world);
    g_world = nullptr;
  }
  w.reset();  // the world's communicator is freed before MPI goes
  mpi::finalize();
}

bool have_mpi() { return true; }

bool have_nccl() {
#ifdef FORGE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace forge::parallel
