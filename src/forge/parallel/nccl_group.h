#pragma once
// The NCCL engine of forge::parallel: ProcessGroups over NCCL communicators for CUDA tensors.
// Plain C++ (no CUDA or NCCL headers), so parallel/world.cpp and forge launch can include it
// under #ifdef FORGE_WITH_CUDA. Its implementation needs the CUDA and NCCL headers, so it is
// compiled with the CUDA backend's objects (CMakeLists.txt: the parallel/nccl_*.cpp sources).
//
// Note [NCCL groups]:
//   - One ncclComm_t per group and one non-blocking communication stream of its own
//     (cuda::Stream::create). Every operation: an event on the caller's current stream,
//     the communication stream waits for it, the NCCL call(s) on the communication stream,
//     cuda::record_stream of every tensor on it, an event after it. Work::wait() makes the
//     caller's current stream wait for that event (no host block); Work::synchronize()
//     blocks the host.
//   - synchronize() polls (cudaEventQuery, then ncclCommGetAsyncError, about every ms)
//     instead of blocking in cudaEventSynchronize, so a dead or failed peer ends in
//     ncclCommAbort and a forge::Error "NCCL: <op> on rank r of W ..." instead of a hang.
//     It also gives up (abort + error) after FORGE_DIST_TIMEOUT seconds (default 300).
//     After an abort every call on the group throws.
//   - avg is ncclAvg; bf16 is ncclBfloat16. gather / scatter are grouped ncclSend/ncclRecv
//     (ncclGroupStart/End) plus a device copy of the root's own slice. barrier() is an
//     all-reduce of one element whose wait() also blocks the host.
//   - new_group is ncclCommSplit (collective over the parent group; ranks outside the list
//     pass NCCL_SPLIT_NOCOLOR and get nullptr). Sub-groups get their own stream.
#include <string>
#include <vector>

#include "forge/parallel/process_group.h"

namespace forge::parallel {

// A new NCCL unique id (ncclGetUniqueId), hex-encoded (256 characters): forge launch makes
// one per job and hands it to the ranks as FORGE_NCCL_ID.
std::string new_nccl_id_hex();
// Checks that `hex` is a hex-encoded NCCL id (256 hex digits); throws naming `where`
// (e.g. "FORGE_NCCL_ID") otherwise.
void check_nccl_id_hex(const std::string& hex, const char* where);

// Rank `rank` of a `size`-rank NCCL group on cuda:`device`, from a hex id every rank got
// from the same new_nccl_id_hex() (ncclCommInitRank: blocks until every rank has joined).
ProcessGroupPtr make_nccl_group(const std::string& id_hex, int rank, int size, int device);

// NCCL's version as "2.28.9" (the library loaded at run time).
std::string nccl_version();

}  // namespace forge::parallel
