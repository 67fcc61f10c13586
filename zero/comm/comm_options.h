// Options of a Communicator, as the engine reads them from the config (`zinf.comm_*` keys)
// or a caller sets them. Plain data: copy freely.
#pragma once

#include <chrono>
#include <string>

namespace zinf::zero {

// How the Gloo communicator implements reduce_scatter (this Gloo has none).
enum class GlooReduceScatter {
  kAuto,       // the faster one measured (see zero/comm/gloo_communicator.h)
  kRing,       // ring reduce-scatter on Gloo's transport: (W-1)/W of the data per rank
  kAllReduce,  // all_reduce of a copy of send, keep this rank's slice: twice the traffic
};

// How the Gloo communicator implements all_gather (this Gloo has no _allgather_base).
enum class GlooAllGather {
  kAuto,  // the faster one measured (see zero/comm/gloo_communicator.h)
  kRing,  // Gloo's ring allgather straight into the caller's recv buffer
  kC10d,  // ProcessGroupGloo::allgather into narrow() views of recv (c10d stages a copy)
};

struct CommOptions {
  // "auto" (single when the world size is 1, else gloo), "single", "gloo" or "nccl". The
  // engine asks for nccl on CUDA; auto never picks it.
  std::string backend = "auto";
  // Deadline of the rendezvous and of every collective (`zinf.comm_timeout_s`, 300 s).
  std::chrono::milliseconds timeout{300'000};
  // Period of the liveness heartbeat each rank writes to the rendezvous store; it bounds how
  // fast a failure reported by one rank reaches the others, and diagnosing a failure takes
  // about three periods. 0: timeout / 20, clamped to [50 ms, 1 s].
  std::chrono::milliseconds heartbeat_interval{0};
  GlooReduceScatter gloo_reduce_scatter = GlooReduceScatter::kAuto;
  GlooAllGather gloo_all_gather = GlooAllGather::kAuto;
  // Network interface Gloo binds (e.g. "eth0"). Empty: GLOO_SOCKET_IFNAME when set, else
  // 127.0.0.1 when the rendezvous address is a loopback one, else the address this host's
  // name resolves to (what torch.distributed does).
  std::string gloo_interface;
  // CUDA device of the NCCL communicator; -1: the local rank.
  int cuda_device = -1;
};

}  // namespace zinf::zero
