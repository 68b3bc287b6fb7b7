#pragma once
// The MPI engine of forge::parallel: ProcessGroups over MPI communicators for CPU tensors, and
// the process's MPI lifetime. Plain C++ (no mpi.h here); world.cpp is its only user.
//
// Note [MPI groups]:
//   - Every group owns a communicator of its own (MPI_Comm_dup of MPI_COMM_WORLD for the
//     world, MPI_Comm_split for new_group), with MPI_ERRORS_RETURN: MPI failures become a
//     forge::Error "MPI: <op> on rank r of W failed: <MPI_Error_string>", never an abort
//     inside MPI.
//   - Every operation is one or more non-blocking MPI calls (MPI_Iallreduce, MPI_Ibcast, ...)
//     held by one Work: wait()/synchronize() = MPI_Waitall, is_completed() = MPI_Testall.
//     What must run on the host after the data arrived (avg's division, converting 16-bit
//     results back) runs inside wait(). Open MPI progresses non-blocking collectives only
//     inside MPI calls, so overlap with computation is limited to what the network does on
//     its own; correctness never depends on it.
//   - Element counts above FORGE_MPI_MAX_COUNT (default INT_MAX, the limit of MPI's int
//     counts; Open MPI 4.1 has no MPI-4 _c calls) are split into several calls of at most
//     that many elements, held by one Work. all_gather / gather / scatter chunks use a
//     resized contiguous datatype so every rank's slice lands in place; reduce_scatter packs
//     each chunk's W slices into one buffer. FORGE_MPI_MAX_COUNT must be the same on every
//     rank (the tests lower it to exercise this path).
//   - bf16 / f16: reductions (all_reduce, reduce, reduce_scatter) convert to f32 buffers,
//     reduce in f32 with MPI's own operations and round back once (more accurate than
//     pairwise 16-bit sums, at twice the bytes on the wire); data movement (broadcast,
//     gather, scatter, send/recv) sends the 2-byte values as they are.
//   - avg: sum, then divide by W on the host in the tensor's dtype (f32 for 16-bit tensors,
//     before rounding back).
//   - MPI is used with MPI_THREAD_FUNNELED: every MPI call, including group operations and
//     Work::wait, must come from the thread that called init_world.
#include <cstdint>
#include <string>

#include "forge/parallel/process_group.h"

namespace forge::parallel::mpi {

// MPI_Init_thread(FUNNELED) unless MPI is already initialised (then it is left to its owner).
void init();
// MPI_Finalize if init() initialised MPI and it is still active. Idempotent.
void finalize();
// Initialised and not yet finalised.
bool active();
int world_rank();
int world_size();
// MPI_Bcast of `bytes` bytes over MPI_COMM_WORLD (MPI must be active).
void broadcast_bytes(void* data, int bytes, int root);

// A group over a duplicate of MPI_COMM_WORLD (MPI must be active).
ProcessGroupPtr make_world_group();

// The largest element count of one MPI call: FORGE_MPI_MAX_COUNT or INT_MAX.
int64_t max_count();

}  // namespace forge::parallel::mpi
