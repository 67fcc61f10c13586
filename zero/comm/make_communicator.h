// The Communicator factory: one call that turns a launch environment and options into the
// communicator the engine uses.
//
//   backend "auto"    world size 1: SingleCommunicator; else GlooCommunicator.
//   backend "single"  SingleCommunicator; an error unless the world size is 1.
//   backend "gloo"    GlooCommunicator (host memory), any world size.
//   backend "nccl"    NcclCommunicator (CUDA device memory), any world size; a CommError
//                     (op "make_communicator") when zinf was built without NCCL ("zinf was
//                     built without NCCL ...") or the CUDA device is not usable (the CUDA
//                     error text), before any rendezvous.
// Anything else is a CommError naming the value. Constructing a Gloo or NCCL communicator
// performs the rendezvous: it blocks until every rank has joined, or throws CommError after
// options.timeout naming the ranks that did not join.
//
// Thread safety: may be called from any thread; each call makes an independent communicator
// (all ranks must make their communicators in the same order).
#pragma once

#include <memory>

#include "zero/comm/comm_options.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launch_env.h"

namespace zinf::zero {

[[nodiscard]] std::unique_ptr<Communicator> make_communicator(const LaunchEnv& env,
                                                              const CommOptions& options);

// Whether this build has the NCCL communicator (it may still find no CUDA device at run
// time: see nccl_unavailable_reason() in zero/comm/nccl_communicator.h).
[[nodiscard]] bool nccl_available() noexcept;

}  // namespace zinf::zero
