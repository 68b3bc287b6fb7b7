#pragma once
// The bootstrap of a job started by torchrun without MPI: rank 0 hands one small payload (the
// NCCL unique id) to every other rank over TCP. Only the id travels this way; tensors go
// through NCCL. (torchrun's own TCPStore listens on MASTER_PORT, so forge uses MASTER_PORT + 1.)
//
//   const std::string id = dist::rendezvous_exchange("10.0.0.1", 29501, rank, world, rank == 0 ? make_id() : "");
//
// Rank 0 listens on every interface at `port`, accepts world_size - 1 connections and sends
// each the payload; the other ranks connect to addr:port (retrying until rank 0 listens) and
// receive it. Every rank returns the payload. Throws forge::Error naming addr:port, the rank
// and the fix when the deadline (`timeout_s`) passes, the address does not resolve, the port is
// taken, or a peer hangs up — never hangs past the deadline.
#include <string>

namespace forge::dist {

std::string rendezvous_exchange(const std::string& addr, int port, int rank, int world_size, const std::string& payload,
                                double timeout_s = 120.0);

}  // namespace forge::dist
