// The pickle dicts of a checkpoint in DeepSpeed's layout (../shared/reference/checkpoint-
// format.md), written and read back: the model-states file's root dict (the module, its
// param_shapes, the counters, ds_config, zinf's own `zinf` record, the caller's client
// values), the optimizer-states file's root dict, the inner optimizer dict in its stage-1/2
// and stage-3 forms, and DeepSpeed's loss-scaler object. Readers take what zinf wrote and
// what DeepSpeed writes (its ZeroStageEnum, its scaler object, its ds_config).
//
// Errors: EngineError naming the file and key for a dict that does not fit the run;
// serialization::SerializationError for a value of the wrong kind.
//
// Thread safety: none needed; plain functions of the save's or load's thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/checkpoint/file_builder.h"
#include "engine/checkpoint/partition_stream.h"
#include "engine/engine.h"
#include "serialization/pickle_value.h"
#include "zero/loss_scaler.h"

namespace zinf::engine::checkpoint {

// The ds_version zinf writes.
inline constexpr const char* kVersion = "0.0.0+zinf";

// What a save's dicts record of the run: the engine's options and state at the save.
struct SavedRun {
  const EngineOptions& options;
  const zero::LossScaler& scaler;
  const PartitionView& view;
  const std::vector<zero::ZeroModel::Param>& params;  // every parameter, as ZeroModel lists them
  const torch::nn::Module& module;                    // its buffers are saved
  at::ScalarType dtype;  // compute precision: the 16-bit weights, stage 3's empty placeholders
  c10::Device device;    // the compute device, whose RNG state is saved when not the CPU
  int stage = 0;
  int rank = 0;
  int world = 1;
  double lr = 0.0;  // the optimizer's current lr
  int64_t global_steps = 0;
  int64_t global_samples = 0;
  int64_t skipped_steps = 0;
  int64_t applied_steps = 0;
};

// The storage keys of the partition's tensors in a file, [array][unit] (array 0: the fp32
// params, then the optimizer's states): what optimizer_dict() names them, for the streams.
using PartitionKeys = std::vector<std::vector<std::string>>;

// "adam", "adamw", "adagrad", "lion": how checkpoints name the optimizer in zinf's own fields.
[[nodiscard]] std::string optimizer_name(optimizer_cpu::OptimizerKind kind);
// `s` in lower case (ASCII).
[[nodiscard]] std::string lower(std::string s);

// ---- writing ----------------------------------------------------------------------------------

// Throws EngineError when a client-state key is one of DeepSpeed's (reserved) keys.
void check_client_keys(const ClientState& client_state);
// DeepSpeed's ds_config: the batch, the ZeRO stage and sub-group size, optimizer, precision.
serialization::PickleValue* ds_config(FileBuilder& b, const SavedRun& run);
// The inner optimizer dict, DeepSpeed's stage 1/2 or 3 form, the partition's tensors streamed
// (their keys in *keys).
serialization::PickleValue* optimizer_dict(FileBuilder& b, const SavedRun& run,
                                           PartitionKeys* keys);
// The model-states file's root dict. At stage 0 it holds the optimizer dict (keys in *keys).
serialization::PickleValue* model_states_dict(FileBuilder& b, const SavedRun& run,
                                              const ClientState& client_state, PartitionKeys* keys);
// The optimizer-states file's root dict (keys of its partition tensors in *keys).
serialization::PickleValue* optim_states_dict(FileBuilder& b, const SavedRun& run,
                                              PartitionKeys* keys);

// ---- reading ----------------------------------------------------------------------------------

// (name, shape) pairs of an OrderedDict name -> torch.Size (param_shapes' entries, frozen_
// param_shapes), or of a list of them.
void collect_shapes(const serialization::PickleValue& v,
                    std::vector<std::pair<std::string, std::vector<int64_t>>>& out);
// The tensor at state[index][name] of a torch optimizer state dict.
[[nodiscard]] const serialization::TensorRef& state_tensor(const serialization::PickleValue& state,
                                                           int64_t index, const char* name,
                                                           const std::string& file);
// The inner optimizer dict's zero_stage: an int, or DeepSpeed's ZeroStageEnum(n).
[[nodiscard]] int64_t saved_zero_stage(const serialization::PickleValue& inner);
// The inner optimizer dict's loss scaler: DeepSpeed's scaler object, or the dict zinf wrote
// before it wrote that object.
[[nodiscard]] zero::LossScaler::State saved_loss_scaler(const serialization::PickleValue& inner);
// ds_config.optimizer.type of a model-states root dict (DeepSpeed's), or nullptr.
[[nodiscard]] const serialization::PickleValue* ds_config_optimizer_type(
    const serialization::PickleValue& root);
// The model-states root dict's entries that are not DeepSpeed's or zinf's keys.
[[nodiscard]] ClientState saved_client_state(const serialization::PickleValue& root);

}  // namespace zinf::engine::checkpoint
