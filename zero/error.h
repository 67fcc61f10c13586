// Error policy of the zero layer.
//
// Failures a user can cause or act on — a configuration the stages cannot run (names the
// config key and the numbers), a model the engine cannot partition, a loss scale that
// cannot be lowered any more, a call the object's state does not allow — are thrown as
// zinf::zero::ZeroError. Failures of the layers below pass through unchanged
// (offload::OffloadError for tiers, pools and swap files; zero::CommError for collectives),
// so a caller can tell a full disk from a dead peer. Nothing here asserts a runtime
// condition or exits the process.
#pragma once

#include <stdexcept>
#include <string>

namespace zinf::zero {

class ZeroError : public std::runtime_error {
 public:
  explicit ZeroError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace zinf::zero
