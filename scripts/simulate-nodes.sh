#!/usr/bin/env bash
# Runs one rank of a job as a member of a simulated node (docs/dist.md "Several machines"):
#
#   forge launch --nproc-per-node 4 -- scripts/simulate-nodes.sh 2 -- forge train my.toml \
#       --dist.node_size=2 --dist.dp_reduce=hierarchical --dist.link_gbps=10
#   mpirun -np 4 scripts/simulate-nodes.sh 2 -- forge bench collectives --node-size 2 --link-gbps 10
#
# Ranks LOCAL_RANK / NODE_SIZE form one node. For NCCL each node is a host of its own
# (NCCL_HOSTID differs between nodes), so their traffic leaves NVLink/PCIe peer copies and shared
# memory for NCCL's network transport: TCP sockets over the loopback interface (NCCL_NET=Socket,
# NCCL_SOCKET_IFNAME=lo, no InfiniBand), as between real machines on Ethernet. The rate of that
# link is set by forge (dist.link_gbps / --link-gbps: Note [paced link] in
# src/forge/parallel/paced_group.h) and measured by `forge bench collectives` over the same
# nodes; the loopback's own rate (tens of Gb/s) is the ceiling. CPU ranks (MPI) take the node
# size from dist.node_size alone. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -euo pipefail
if [[ $# -lt 3 || "$2" != "--" || ! "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/simulate-nodes.sh NODE_SIZE -- COMMAND [ARGS...]   (one rank; under forge launch or mpirun)" >&2
  exit 2
fi
node_size=$1; shift 2
local_rank="${LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-${SLURM_LOCALID:-}}}"
if [[ -z "$local_rank" ]]; then
  echo "simulate-nodes.sh: no LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID): run it under forge launch or mpirun" >&2
  exit 2
fi
export NCCL_HOSTID="forge-sim-node-$((local_rank / node_size))"
export NCCL_NET=Socket NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_NVLS_ENABLE=0
exec "$@"
