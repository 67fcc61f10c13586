// Engine's checkpoint calls: the step-boundary check, then the engine's Checkpointer
// (engine/checkpoint/checkpointer.h), which holds the save, the prepared save and the load.

#include "engine/checkpoint.h"

#include "engine/checkpoint/checkpointer.h"
#include "engine/engine.h"

namespace zinf::engine {

void Engine::CheckpointerDelete::operator()(checkpoint::Checkpointer* c) const noexcept {
  delete c;
}

// Made at the first checkpoint call: everything it refers to is in place once the engine is.
checkpoint::Checkpointer& Engine::checkpointer() {
  if (!checkpointer_) {
    checkpointer_.reset(new checkpoint::Checkpointer(
        checkpoint::EngineParts{*module_,
                                *model_,
                                *optimizer_,
                                *comm_,
                                *accelerator_,
                                scaler_,
                                options_,
                                report_,
                                device_,
                                {global_steps_, global_samples_, skipped_steps_, applied_steps_}}));
  }
  return *checkpointer_;
}

bool Engine::save_prepared() const noexcept {
  return checkpointer_ && checkpointer_->save_prepared();
}

offload::StepObserver* Engine::prepared_observer() noexcept {
  return checkpointer_ ? checkpointer_->prepared_observer() : nullptr;
}

void Engine::prepared_step_done(bool applied) noexcept {
  if (checkpointer_) checkpointer_->prepared_step_done(applied);
}

CheckpointReport Engine::save_checkpoint(const std::string& dir, const std::string& tag,
                                         const ClientState& client_state) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("save_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  return checkpointer().save(dir, tag, client_state);
}

bool Engine::prepare_checkpoint(const std::string& dir, const std::string& tag) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("prepare_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  return checkpointer().prepare(dir, tag);
}

CheckpointReport Engine::load_checkpoint(const std::string& dir, const std::string& tag) {
  if (in_micro_batch_ || micro_batch_ != 0) {
    throw EngineError("load_checkpoint() inside an optimizer step: call it at a step boundary");
  }
  return checkpointer().load(dir, tag);
}

}  // namespace zinf::engine
