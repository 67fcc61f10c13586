#include "zero/comm/make_communicator.h"

#include <memory>
#include <string>

#include "zero/comm/gloo_communicator.h"
#include "zero/comm/nccl_communicator.h"
#include "zero/comm/single_communicator.h"

namespace zinf::zero {

bool nccl_available() noexcept {
#ifdef ZINF_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> make_communicator(const LaunchEnv& env, const CommOptions& options) {
  const std::string& backend = options.backend;
  if (backend != "auto" && backend != "single" && backend != "gloo" && backend != "nccl") {
    throw CommError("make_communicator", env.rank,
                    "unknown backend \"" + backend + "\" (expected auto, single, gloo or nccl)");
  }
  if (options.timeout.count() <= 0) {
    throw CommError(
        "make_communicator", env.rank,
        "timeout must be positive, got " + std::to_string(options.timeout.count()) + " ms");
  }
  if (backend == "single" || (backend == "auto" && env.world_size == 1)) {
    if (env.world_size != 1) {
      throw CommError("make_communicator", env.rank,
                      "backend \"single\" needs a world size of 1, the launcher (" + env.launcher +
                          ") says " + std::to_string(env.world_size));
    }
    return std::make_unique<SingleCommunicator>(options.timeout);
  }
  if (backend == "gloo" || backend == "auto") {
    return std::make_unique<GlooCommunicator>(env, options);
  }
  // backend == "nccl"; without NCCL the constructor throws, saying so.
  return std::make_unique<NcclCommunicator>(env, options);
}

}  // namespace zinf::zero
