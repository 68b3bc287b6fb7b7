#pragma once
// The world group of a job: every rank, on the engine that fits the training device.
//
//   const parallel::LaunchEnv env = parallel::launch_env();           // env.h
//   auto world = parallel::init_world(env, device);               // once per process
//   ... world->all_reduce(...) ...
//   parallel::shutdown();                                         // at exit (also run by atexit)
//
// device cpu  -> an MPI group over MPI_COMM_WORLD (MPI is initialised here, threads
//                FUNNELED). Needs an MPI launcher when world_size > 1 (forge launch starts
//                CPU ranks through mpirun).
// device cuda -> an NCCL group on that GPU with its own communication stream. The NCCL id
//                comes from FORGE_NCCL_ID (forge launch), MPI_Bcast from rank 0 (mpirun,
//                srun) or rank 0's rendezvous (torchrun).
// A world of one process works on both (no MPI needed for it). init_world throws forge::Error
// with the reason and the fix (no MPI launcher for CPU ranks, NCCL missing, device index not
// visible, ...) before any collective is attempted.
//
// Failures: an NCCL group polls for asynchronous errors while waiting and aborts the
// communicator (never hangs) when a peer dies; the launchers end the job when a rank exits
// non-zero. Note [rank failure].
#include "forge/core/device.h"
#include "forge/parallel/env.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel {

ProcessGroupPtr init_world(const LaunchEnv& env, Device device);
// The group init_world made (null before).
ProcessGroupPtr world();
// Destroys the world group and finalises MPI if init_world initialised it. Idempotent.
void shutdown();

// The engines compiled into this build.
bool have_mpi();
bool have_nccl();

}  // namespace forge::parallel
