// Launch environment: which rank this process is, how many ranks there are, and where they
// meet, read from the variables a launcher sets. No network access happens here; the
// Communicator factory (zero/comm/make_communicator.h) turns a LaunchEnv into a rendezvous.
//
// Sources, first match wins:
//   torchrun / "env"  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                     MASTER_PORT. launcher is "torchrun" when TORCHELASTIC_RUN_ID is set,
//                     else "env" (variables exported by hand, DeepSpeed's launcher, ...).
//                     TORCHELASTIC_USE_AGENT_STORE=True (torchrun's default static
//                     rendezvous) means the torchrun agent already serves the TCPStore at
//                     MASTER_ADDR:MASTER_PORT: every worker, rank 0 included, connects as a
//                     client, under the key prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>.
//   OpenMPI           OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                     OMPI_COMM_WORLD_LOCAL_SIZE; MASTER_ADDR and MASTER_PORT from the
//                     environment.
//   SLURM (srun)      SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, else
//                     SLURM_NPROCS), SLURM_LOCALID, and this node's task count from
//                     SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE, "2(x3),1" form)
//                     at index SLURM_NODEID; MASTER_ADDR and MASTER_PORT from the environment
//                     (e.g. MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" |
//                     head -n1) in the batch script).
//   none of these     a single process: rank 0 of 1, launcher "none".
//
// Defaults: a missing local rank or local world size means "all ranks on this node"
// (local_rank = rank, local_world_size = world_size). A missing MASTER_ADDR is 127.0.0.1
// when every rank is on this node (local_world_size == world_size), an error otherwise.
// MASTER_PORT is required whenever world_size > 1.
//
// Errors: a variable that is missing where it is required (RANK without WORLD_SIZE, ...),
// empty, not a decimal integer, out of range (rank >= world size, local rank >= local world
// size, port outside 1..65535), or inconsistent with another is a CommError with op
// "launch environment" and rank -1, whose message names the variable and its value.
//
// Thread safety: detect_launch_env() reads the process environment (std::getenv), which is
// safe as long as no thread modifies the environment at the same time.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace zinf::zero {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes of this node
  int local_world_size = 1;  // processes on this node
  std::string master_addr;   // host of the rendezvous store; empty for a single process
  int master_port = 0;       // its TCP port; 0 for a single process
  bool agent_store = false;  // the launcher's agent serves the store (torchrun): all connect
  std::string store_prefix;  // key prefix in that store ("/worker/attempt_0"), else empty
  std::string launcher;      // "torchrun", "openmpi", "slurm", "env" or "none"
};

// Looks up one environment variable: its value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads the process environment. Throws CommError (see above).
[[nodiscard]] LaunchEnv detect_launch_env();
// Same, through `lookup` (tests pass a map).
[[nodiscard]] LaunchEnv detect_launch_env(const EnvLookup& lookup);

// "rank 1 of 4 (local 1 of 2), launcher torchrun, store 10.0.0.1:29500 (agent, prefix
// /worker/attempt_0)" — for logs.
[[nodiscard]] std::string to_string(const LaunchEnv& env);

}  // namespace zinf::zero
