#pragma once
// Collectives and local work run one after another as one Work: the stages of a hierarchical
// reduction (hierarchical_group.h) and of a compressed one (fp8_reduce.h).
//
//   std::vector<parallel::Stage> stages;
//   stages.push_back([&] { return intra->reduce_scatter(slice, buf); });   // a collective: its Work
//   stages.push_back([&]() -> WorkPtr { slice.mul_(2); return nullptr; });   // local work, done at once
//   WorkPtr w = parallel::chain_work(std::move(stages), side.get(), {buf});
//
// CPU (side == nullptr): the first stage starts at the call, each next one when the previous is
// done, as wait() / synchronize() / is_completed() find it on the calling thread (MPI is
// funnelled); the stages not started when the Work is destroyed run then (they are collectives the
// other ranks wait for). GPU: every stage is queued at the call on the side stream (which first
// waits for the caller's current stream; each collective's Work waited there, a stream wait), the
// end marked by an event; wait() makes the caller's current stream wait for it, so the compute
// stream is never stalled. `keep`: tensors the stages read or write (on a GPU the side stream keeps
// their memory until its work is done; on the CPU they are held until the chain ends).
#include <functional>
#include <vector>

#include "forge/backends/device_runtime.h"
#include "forge/parallel/process_group.h"

namespace forge::parallel {

// One stage: starts a collective (returns its Work) or does its own work at once (returns nullptr).
using Stage = std::function<WorkPtr()>;

WorkPtr chain_work(std::vector<Stage> stages, runtime::SideStream* side, std::vector<Tensor> keep);

}  // namespace forge::parallel
