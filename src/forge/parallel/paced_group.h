#pragma once
// A process group whose operations take at least the time a slower link would need: simulated
// nodes on one host (dist.link_gbps; docs/dist.md "Several machines", scripts/simulate-nodes.sh).
//
//   auto g = parallel::make_paced(inter_node_group, {.gbps = 10, .latency_us = 30, .share = 2});
//
// Note [paced link]. The lab's cluster joins machines by 10-100 Gb/s Ethernet; one host's GPUs
// (or CPU ranks) talk over links tens of times faster. To measure layouts as they would run on the
// slow network, the groups whose traffic would cross machines are wrapped so that each operation
// completes no earlier than the link allows:
//   bytes  = what each rank sends in the operation's ring algorithm (process_group.h's collectives):
//            all_reduce 2(n-1)/n S, reduce_scatter and all_gather (n-1)/n of the whole, all_to_all
//            (n-1)/n S, broadcast/reduce S, send/recv S (S the tensor's bytes, n the group's size;
//            a recv is paced on the link's inbound direction, everything else on the outbound one);
//   time   = share x bytes / rate + steps x latency        (steps: the ring's 2(n-1), n-1 or 1)
//   end    = max(when the operation reaches the link, when the link's previous operation ended) + time
// `share` is how many such groups of this node use the link at once with the same traffic (the k
// inter-node groups of a hierarchical reduction, one per local rank: share = k), so each one sees
// 1/share of the rate, as k flows on one NIC do. The real transfer runs as well (its own time hides
// under the paced one as long as the real link is faster); the pacing only ever delays completion.
// CPU groups: wait() / is_completed() hold the operation until its end. GPU groups: the operation is
// queued on a stream of the group's own, behind a host callback that stamps when the device reached
// it and followed by one that sleeps until its end (runtime::SideStream::host_call; the CUDA driver
// runs callbacks one at a time, and not inside a CUDA graph: forge train turns graphs off with
// dist.link_gbps). What the link really delivered is measured, not assumed: `forge bench link`.
#include <chrono>
#include <memory>

#include "forge/parallel/process_group.h"

namespace forge::parallel {

// When each direction of a simulated link is free again. Groups paced with the same clock share
// one link (the pipeline's activation and gradient communicators); null: a group's own.
struct LinkClock;
std::shared_ptr<LinkClock> new_link_clock();

struct LinkPace {
  double gbps = 0;         // the simulated link's rate, 1e9 bits/s (> 0)
  double latency_us = 0;   // per ring step
  int share = 1;           // flows of this node sharing the link (see above)
  std::shared_ptr<LinkClock> clock = nullptr;
};

// Wraps `inner` (not collective; no new groups). gbps <= 0 returns `inner` itself.
ProcessGroupPtr make_paced(const ProcessGroupPtr& inner, const LinkPace& pace);

// The seconds the paced link needs for `bytes` sent over `steps` ring steps (the formula above).
double paced_seconds(const LinkPace& pace, double bytes, int steps);

}  // namespace forge::parallel
