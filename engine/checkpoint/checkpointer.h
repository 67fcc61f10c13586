// Checkpointer: saves and loads an Engine's checkpoints in DeepSpeed's layout. engine/
// checkpoint.h describes the files, the partitions in them and the crash-safety protocol;
// Engine::save_checkpoint, prepare_checkpoint and load_checkpoint check that the engine is at
// a step boundary and call save, prepare and load here.
//
// A Checkpointer holds references to what a checkpoint reads and restores of the engine
// (EngineParts): the module, the ZeroModel, the CPU optimizer, the communicator, the
// accelerator, the loss scaler, the options, the last step's report and the step counters;
// and at most one prepared save. The calls are in files of their own:
//
//   save.cc            save: agree on a prepared save across ranks, refuse a tag folder
//                      holding foreign entries, write the model states, the optimizer states
//                      and the 16-bit weights into the staging folder, publish
//   prepared_save.cc   prepare, and the PreparedSave the next optimizer step writes into
//   load.cc            load: open and check the model-states file (zinf's or DeepSpeed's),
//                      match parameters by name, open the optimizer file and its units,
//                      restore the partition, the frozen parameters, the counters, scaler, RNG
//
// beside the pieces they share: folder.h (tags, staging, publish, latest, the crash seam),
// partition_stream.h (units and the sub-group streams), file_builder.h (a file's pickle),
// deepspeed_layout.h (the dicts).
//
// Errors: as engine/checkpoint.h says (EngineError, serialization::SerializationError).
//
// Thread safety: the engine's driving thread. save, prepare and load are collective: every
// rank calls them in the same order, and each issues its collectives (host_all_reduce,
// host_all_gather, barrier, gather_master) in the same order on every rank.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "engine/checkpoint.h"
#include "engine/checkpoint/partition_stream.h"
#include "engine/engine.h"

namespace zinf::engine::checkpoint {

class PreparedSave;

// The engine's step counters, which a save records and a load sets.
struct StepCounters {
  int64_t& global_steps;    // optimizer steps taken (applied + skipped)
  int64_t& global_samples;  // samples of all ranks
  int64_t& skipped_steps;   // skipped for an fp16 overflow
  int64_t& applied_steps;   // applied: the LR schedule's and the optimizer's step
};

// What a checkpoint reads and restores of an Engine. Each part must outlive the Checkpointer.
struct EngineParts {
  const torch::nn::Module& module;  // its buffers are saved
  zero::ZeroModel& model;
  const optimizer_cpu::Optimizer& optimizer;  // which state arrays it keeps, their names
  zero::Communicator& comm;
  offload::Accelerator& accelerator;
  zero::LossScaler& scaler;
  const EngineOptions& options;
  const StepReport& last_step;  // its lr is saved
  c10::Device device;           // the compute device (its RNG state is saved)
  StepCounters counters;
};

class Checkpointer {
 public:
  explicit Checkpointer(EngineParts parts);
  // Drops a prepared save that no save took (rank 0 removes its staging folder).
  ~Checkpointer();

  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Engine::save_checkpoint after its step-boundary check (engine/engine.h).
  CheckpointReport save(const std::string& dir, const std::string& tag,
                        const ClientState& client_state);
  // Engine::prepare_checkpoint after its step-boundary check.
  bool prepare(const std::string& dir, const std::string& tag);
  // Engine::load_checkpoint after its step-boundary check.
  CheckpointReport load(const std::string& dir, const std::string& tag);

  // The prepared save to show the next optimizer step to (once), or nullptr.
  offload::StepObserver* prepared_observer() noexcept;
  // Whether a prepared save waits to be shown the next optimizer step (takes nothing).
  [[nodiscard]] bool save_prepared() const noexcept;
  // After the step shown to the prepared save: whether it was applied (not skipped).
  void prepared_step_done(bool applied) noexcept;

 private:
  class Save;  // one save in progress (save.cc)
  class Load;  // one load in progress (load.cc)

  // What a save and a load both take of the run at their start: this rank of how many, the
  // ZeRO stage, the precision, and the rank's partition.
  struct Run {
    explicit Run(const EngineParts& e);
    const int rank;
    const int world;
    const int stage;
    const bool bf16;  // bf16 precision: the optimizer file's "bf16_" name
    const PartitionView view;
  };

  // A line for the engine's log (rank 0, when the options have a log).
  void log(const std::string& line) const;

  EngineParts e_;
  // Last: ends (its writer thread joined) before anything it observes.
  std::unique_ptr<PreparedSave> prepared_;
};

}  // namespace zinf::engine::checkpoint
