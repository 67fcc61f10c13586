// The engine layer's errors, in a header of their own so that code which only reports them
// (the checkpoint folder, the file builder) need not include the Engine and LibTorch's module.
//
// EngineError: a call the engine's state does not allow, or a checkpoint that does not fit
// the run (naming the file and what differs). PlanError: a memory plan that needs more than
// a tier gives.
#pragma once

#include <stdexcept>
#include <string>

namespace zinf::engine {

class EngineError : public std::runtime_error {
 public:
  explicit EngineError(const std::string& message) : std::runtime_error(message) {}
};

// A memory plan that needs more than a tier gives (the accelerator budget, the pinned-memory
// limit, the host memory available): the config or the model asks for more than this
// machine has. A config error to the CLI (exit code 2).
class PlanError : public EngineError {
 public:
  explicit PlanError(const std::string& message) : EngineError(message) {}
};

}  // namespace zinf::engine
