// forge::parallel::launch_env: the rank, world size and local rank of this process, read from the
// variables its launcher set (the table in env.h).
//
// Precedence, first match wins:
//   1. Open MPI (OMPI_COMM_WORLD_RANK)        -> mpi
//   2. MPICH / Hydra (PMI_RANK)               -> mpi
//   3. RANK: FORGE_LAUNCHER=forge -> forge, otherwise torchrun
//   4. Slurm (SLURM_PROCID)                   -> slurm
//   5. nothing                                -> rank 0 of 1
// MPI before RANK: mpirun started under a torchrun-style wrapper is an MPI job. RANK before
// Slurm: `srun` starting one `torchrun` / `forge launch` per node leaves SLURM_PROCID (the node's
// task) in the ranks' environment, and the per-GPU ranks are the ones RANK names.
//
// Empty variables count as unset. A set variable that is not a decimal integer, or a rank
// outside [0, world), is a forge::Error naming the variable, its value and who sets it.
#include "forge/parallel/env.h"

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "forge/core/error.h"

extern char** environ;

namespace forge::parallel {

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::none: return "none";
    case Launcher::forge: return "forge launch";
    case Launcher::torchrun: return "torchrun";
    case Launcher::mpi: return "mpirun";
    case Launcher::slurm: return "srun";
  }
  return "?";
}

namespace {

using Env = std::map<std::string, std::string>;

// The value of `name`, or nullopt when it is unset or empty.
std::optional<std::string> get(const Env& env, const char* name) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

int parse_int(const std::string& value, const char* name, const char* who) {
  int v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  const auto [p, ec] = std::from_chars(b, e, v);
  FORGE_CHECK(ec == std::errc() && p == e, "the environment variable ", name, "='", value,
              "' is not an integer (it is set by ", who, "; unset it or fix its value)");
  return v;
}

std::optional<int> get_int(const Env& env, const char* name, const char* who) {
  const auto v = get(env, name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, who);
}

int require_int(const Env& env, const char* name, const char* because, const char* who) {
  const auto v = get_int(env, name, who);
  FORGE_CHECK(v.has_value(), because, " is set but ", name, " is not (", who,
              " sets both; set it to the number of processes of the job)");
  return *v;
}

// Slurm's task counts per node, "2(x3),1" = 2, 2, 2, 1: the count of node `node`.
std::optional<int> slurm_tasks_on_node(const std::string& spec, int node, const char* name) {
  int index = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    int count = 0, repeat = 1;
    const size_t paren = item.find('(');
    const std::string count_str = item.substr(0, paren);
    count = parse_int(count_str, name, "Slurm");
    if (paren != std::string::npos) {
      FORGE_CHECK(item.size() > paren + 3 && item.compare(paren, 2, "(x") == 0 && item.back() == ')',
                  "the environment variable ", name, "='", spec, "' is not a Slurm task list such as 2(x3),1");
      repeat = parse_int(item.substr(paren + 2, item.size() - paren - 3), name, "Slurm");
    }
    if (node < index + repeat) return count;
    index += repeat;
    pos = end + 1;
  }
  return std::nullopt;
}

void check_ranks(const LaunchEnv& e, const char* rank_var, const char* size_var, const char* local_var,
                 const char* local_size_var) {
  const char* who = launcher_name(e.launcher);
  FORGE_CHECK(e.world_size >= 1, "the environment variable ", size_var, "=", e.world_size,
              " must be at least 1 (set by ", who, ")");
  FORGE_CHECK(e.rank >= 0 && e.rank < e.world_size, "the environment variable ", rank_var, "=", e.rank,
              " is outside [0, ", e.world_size, ") given by ", size_var, " (set by ", who, ")");
  FORGE_CHECK(e.local_world_size >= 1 && e.local_world_size <= e.world_size, "the environment variable ",
              local_size_var, "=", e.local_world_size, " must be in [1, ", e.world_size, "] given by ", size_var,
              " (set by ", who, ")");
  FORGE_CHECK(e.local_rank >= 0 && e.local_rank < e.local_world_size, "the environment variable ", local_var, "=",
              e.local_rank, " is outside [0, ", e.local_world_size, ") given by ", local_size_var, " (set by ", who,
              ")");
}

// Rank variables of an MPI launcher; local ones default to a single node.
LaunchEnv mpi_env(const Env& env, const char* rank_var, const char* size_var, const char* local_var,
                  const char* local_size_var) {
  LaunchEnv e;
  e.launcher = Launcher::mpi;
  const char* who = "mpirun";
  e.rank = *get_int(env, rank_var, who);
  e.world_size = require_int(env, size_var, rank_var, who);
  e.local_rank = get_int(env, local_var, who).value_or(e.rank);
  e.local_world_size = get_int(env, local_size_var, who).value_or(e.world_size);
  check_ranks(e, rank_var, size_var, local_var, local_size_var);
  return e;
}

bool is_hex(const std::string& s) {
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

LaunchEnv launch_env_from(const Env& env) {
  // 1-2. MPI launchers.
  if (get(env, "OMPI_COMM_WORLD_RANK"))
    return mpi_env(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (get(env, "PMI_RANK")) return mpi_env(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS");

  // 3. forge launch / torchrun.
  const auto forge_launcher = get(env, "FORGE_LAUNCHER");
  if (forge_launcher)
    FORGE_CHECK(*forge_launcher == "forge", "the environment variable FORGE_LAUNCHER='", *forge_launcher,
                "' is not 'forge' (forge launch sets it for its ranks; unset it)");
  if (get(env, "RANK") || forge_launcher) {
    LaunchEnv e;
    e.launcher = forge_launcher ? Launcher::forge : Launcher::torchrun;
    const char* who = launcher_name(e.launcher);
    const auto rank = get_int(env, "RANK", who);
    FORGE_CHECK(rank.has_value(), "FORGE_LAUNCHER is set but RANK is not (forge launch sets both)");
    e.rank = *rank;
    e.world_size = require_int(env, "WORLD_SIZE", "RANK", who);
    e.local_rank = get_int(env, "LOCAL_RANK", who).value_or(e.rank);
    e.local_world_size = get_int(env, "LOCAL_WORLD_SIZE", who).value_or(e.world_size);
    check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
    if (e.launcher == Launcher::forge) {
      if (const auto id = get(env, "FORGE_NCCL_ID")) {
        FORGE_CHECK(id->size() % 2 == 0 && is_hex(*id), "the environment variable FORGE_NCCL_ID is not a hex string",
                    " of whole bytes (", id->size(), " characters; forge launch sets it for GPU ranks)");
        e.nccl_id_hex = *id;
      }
    } else {
      if (const auto addr = get(env, "MASTER_ADDR")) e.master_addr = *addr;
      if (const auto port = get_int(env, "MASTER_PORT", who)) {
        FORGE_CHECK(*port > 0 && *port < 65535, "the environment variable MASTER_PORT=", *port,
                    " is not a TCP port in [1, 65534] (rank 0 serves the NCCL id on MASTER_PORT+1)");
        e.master_port = *port;
      }
      FORGE_CHECK(e.world_size == 1 || (!e.master_addr.empty() && e.master_port > 0),
                  "RANK and WORLD_SIZE=", e.world_size, " are set (torchrun-style) but ",
                  e.master_addr.empty() ? "MASTER_ADDR" : "MASTER_PORT",
                  " is not: the ranks meet at MASTER_ADDR:MASTER_PORT (torchrun sets both; or start the job with "
                  "forge launch, mpirun or srun)");
    }
    return e;
  }

  // 4. Slurm.
  if (get(env, "SLURM_PROCID")) {
    LaunchEnv e;
    e.launcher = Launcher::slurm;
    const char* who = "srun";
    e.rank = *get_int(env, "SLURM_PROCID", who);
    e.world_size = require_int(env, "SLURM_NTASKS", "SLURM_PROCID", who);
    e.local_rank = get_int(env, "SLURM_LOCALID", who).value_or(0);
    // Tasks on this node: SLURM_NTASKS_PER_NODE (set with --ntasks-per-node), else this node's
    // entry of SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1"), else one node.
    const char* local_size_var = "SLURM_NTASKS_PER_NODE";
    if (const auto n = get_int(env, "SLURM_NTASKS_PER_NODE", who)) {
      e.local_world_size = *n;
    } else {
      std::optional<int> n_node;
      const auto node = get_int(env, "SLURM_NODEID", who);
      for (const char* var : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
        const auto spec = get(env, var);
        if (!spec || !node) continue;
        n_node = slurm_tasks_on_node(*spec, *node, var);
        local_size_var = var;
        break;
      }
      e.local_world_size = n_node.value_or(e.world_size);
    }
    check_ranks(e, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", local_size_var);
    return e;
  }

  return LaunchEnv{};
}

LaunchEnv launch_env() {
  Env env;
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    const std::string_view kv(*p);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return launch_env_from(env);
}

int restart_count() {
  for (const char* var : {"FORGE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == '\0') continue;
    int n = 0;
    const auto [ptr, ec] = std::from_chars(v, v + std::strlen(v), n);
    FORGE_CHECK(ec == std::errc() && *ptr == '\0' && n >= 0, "the environment variable ", var, "='", v,
                "' is not a restart count (a non-negative integer; forge launch sets it)");
    return n;
  }
  return 0;
}

}  // namespace forge::parallel
