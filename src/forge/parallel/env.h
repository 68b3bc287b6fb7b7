#pragma once
// How a forge process learns its place in a job, from its environment, whoever started it:
//
//   started by            rank / world size / local rank variables                  NCCL id
//   forge launch          RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE             FORGE_NCCL_ID (hex)
//   torchrun              RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,            rank 0 makes it and serves it on
//                         MASTER_ADDR, MASTER_PORT                                   MASTER_ADDR:MASTER_PORT+1 (rendezvous.h)
//   mpirun (Open MPI)     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE      rank 0's id, MPI_Bcast
//   mpirun (MPICH/Hydra)  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS       rank 0's id, MPI_Bcast
//   srun (Slurm)          SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,                 rank 0's id, MPI_Bcast
//                         SLURM_NTASKS_PER_NODE
//   nothing               rank 0 of 1
//
// forge launch sets FORGE_LAUNCHER=forge; the MPI variables win over RANK & co when both
// are present (mpirun under a torchrun-style wrapper). A set but malformed variable (not an
// integer, rank outside [0, world), local rank outside [0, local world)) is an error naming
// the variable, raised before any work.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace forge::parallel {

enum class Launcher { none, forge, torchrun, mpi, slurm };
const char* launcher_name(Launcher l);

struct LaunchEnv {
  Launcher launcher = Launcher::none;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  // forge launch: the NCCL unique id of the job, hex-encoded (empty otherwise).
  std::string nccl_id_hex;
  // torchrun: where rank 0 serves the NCCL id.
  std::string master_addr;
  int master_port = 0;
  // Whether MPI must be initialised: started by an MPI launcher (mpirun / srun with PMI).
  bool uses_mpi() const { return launcher == Launcher::mpi || launcher == Launcher::slurm; }
  bool distributed() const { return world_size > 1; }
};

// Reads the variables of `env` (name -> value); tests pass their own map.
LaunchEnv launch_env_from(const std::map<std::string, std::string>& env);
// The same from the process environment.
LaunchEnv launch_env();

// Which attempt of the job this process belongs to: FORGE_RESTART_COUNT (forge launch
// --max-restarts sets it: 0 for the first start, k after k restarts) or torchrun's
// TORCHELASTIC_RESTART_COUNT; 0 when neither is set.
int restart_count();

}  // namespace forge::parallel
