#pragma once
// The bootstrap of a job started by torchrun without MPI: rank 0 hands one small payload (the
// NCCL unique id) to every other rank over TCP. Only the id travels this way; tensors go
// through NCCL. (torchrun's own TCPStore listens on MASTER_PORT, so forge uses MASTER_PORT + 1.)
//
//   const std::string id = parallel::rendezvous_exchange("10.0.0.1", 29501, rank, world, rank == 0 ? make_id() : "",
//                                                    parallel::rendezvous_token_from_env());
//
// Note [rendezvous trust] (SECURITY.md): rank 0 listens on MASTER_ADDR's interface alone (the
// address the others connect to, not every interface), and serves only a peer that presents the
// job's token: a hello of magic "FRDZ", version 1, its rank, and the token (FORGE_RDZV_TOKEN, the
// same on every rank; `token`). A peer with another token, a rank outside the world or already
// served, a malformed or oversized hello, or no hello within kPeerSeconds is disconnected and
// counted, never served, and cannot take a rank's place; each connection is bounded in bytes and
// time. The token travels in clear: it keeps out stray and hostile connections, not an observer
// of the network (NCCL's own traffic is unauthenticated too). Every rank returns the payload.
// Throws forge::Error naming addr:port, the rank and the fix when the deadline (`timeout_s`)
// passes, the address does not resolve or is not this host's (rank 0), the port is taken, or
// rank 0 hangs up (a wrong token) — never hangs past the deadline.
#include <cstddef>
#include <string>

namespace forge::parallel {

inline constexpr double kRendezvousPeerSeconds = 5.0;
inline constexpr size_t kRendezvousMaxToken = 256;

// `multi_host`: some ranks run on other hosts (world > local world); rank 0 then refuses a
// MASTER_ADDR that resolves to loopback addresses alone (a host name mapped to 127.0.1.1 in
// /etc/hosts), which no other host could reach, naming the fix (torchrun --local-addr).
std::string rendezvous_exchange(const std::string& addr, int port, int rank, int world_size, const std::string& payload,
                                const std::string& token, double timeout_s = 120.0, bool multi_host = false);

// The job's token from the environment: FORGE_RDZV_TOKEN (1 to 256 bytes). A job started by
// torchrun needs it (the same on every rank: e.g. `export FORGE_RDZV_TOKEN=$(head -c 16 /dev/urandom |
// od -An -tx1 | tr -d ' \n')` in the job script before torchrun); throws with that fix when it is missing.
std::string rendezvous_token_from_env();

}  // namespace forge::parallel
