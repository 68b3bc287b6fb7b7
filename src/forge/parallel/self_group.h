#pragma once
// The "self" group: a process group of one rank with no engine behind it (process_group.h's
// contract for a group of one): no MPI, no NCCL communicator, nothing started. Every collective
// over one rank is complete at once: all_reduce (any op; avg divides by 1), reduce and broadcast
// leave the tensor as it is; all_gather, reduce_scatter, gather, scatter and all_to_all copy the
// input into the output where they are different memory (on the caller's current stream);
// barrier does nothing; send and recv are refused as for any rank sending to itself. new_group
// of {0} is another self group.
//
// Used for (1) a CPU world of one process that no MPI launcher started (Note [world of one],
// world.cpp), and (2) Note [one process is a data-parallel group of one]: a run of one process
// without ZeRO trains through the same executor as data parallelism
// (train/data_parallel_strategy.cpp) over a self group on its device (CPU or CUDA): its
// gradient buckets are the parameters' gradient memory, their reductions do nothing, and the
// update is DDP's over whole parameters, the one-process arithmetic. So one process and N ranks
// share one step, one evaluation and one checkpoint path.
#include "forge/parallel/process_group.h"

namespace forge::parallel {

// A self group communicating tensors on `device`.
ProcessGroupPtr self_group(Device device);

}  // namespace forge::parallel
