// CheckpointPlan: what `zinf zero-to-fp32` will write, read from a DeepSpeed-layout ZeRO
// checkpoint (../shared/reference/checkpoint-format.md) without copying any tensor data.
//
// Every output tensor is a list of pieces: runs of elements inside the memory-mapped storage
// records of the checkpoint's torch.save files, in the order they concatenate to the
// consolidated tensor. The plan owns the mapped archives, so the pieces stay valid while it
// lives. Reading the pieces is left to the writer (consolidate_writer.h), which streams them.
//
// Supported inputs: stages 1 and 2 (`single_partition_of_fp32_groups`, merged as DeepSpeed's
// zero_to_fp32 does, with its alignment check), stage 3 (`fp32_flat_groups`; a param's slice
// may cross a sub-group boundary), bf16 ZeRO-1 files (no `zero_stage`: merged like stage 1),
// `bf16_` prefixes, and stage 0 (no optimizer partitions: the model file's `module` weights,
// in the dtype they were saved in; the plan says so in notes). Frozen params come from
// `frozen_param_fragments` (stage 2: whole, stage 3: one slice per rank) or, where those are
// absent (stage 1), from the 16-bit `module` weights, which DeepSpeed's tool drops. Tied
// params are aliases (shared_params): the target's data under a second name.
// Output order: buffers (module order), frozen params, trainable params, then aliases.
// Model parallelism (mp_rank other than 00) is refused.
//
// Integrity: every piece names the storage record it lies in (CheckpointPlan::records, with the
// CRC-32 the zip recorded), so the writer can check each record's CRC as its bytes stream by
// (WriteOptions::verify_crc); with PlanOptions::verify_crc the pickle record of every file
// read is checked before it is decoded.
//
// Errors: SerializationError naming the file and what is wrong (missing `latest`, tag folder,
// model or optimizer file of a rank, named by the file that is missing; keys missing or of the
// wrong kind; partition sizes that do not add up; storages shorter than their tensors; a pickle
// record that fails its CRC-32), thrown by read_checkpoint_plan().
//
// Thread safety: a plan is immutable after read_checkpoint_plan() returns; its pieces may be
// read from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "serialization/torch_archive.h"

namespace zinf::consolidate {

// A piece that lies in no recorded storage record (not checked).
inline constexpr size_t kNoRecord = static_cast<size_t>(-1);

// A run of `numel` elements of `dtype` at `data` (inside a mapped archive of the plan), in
// the storage record plan.records[record].
struct Piece {
  const uint8_t* data = nullptr;
  serialization::TensorDType dtype = serialization::TensorDType::kFloat32;
  uint64_t numel = 0;
  size_t record = kNoRecord;
};

// A storage record of a checkpoint file that pieces lie in.
struct SourceRecord {
  std::string file;                // the checkpoint file
  std::string name;                // the record ("archive/data/3")
  uint64_t data_offset = 0;        // of the record's first byte in the file
  std::span<const uint8_t> bytes;  // the whole record, in the plan's mapping
  uint32_t crc32 = 0;              // as the zip's central directory records it
};

enum class TensorRole { kBuffer, kFrozen, kTrainable };

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel = 0;  // product of shape; the pieces hold exactly this many elements
  TensorRole role = TensorRole::kTrainable;
  std::vector<Piece> pieces;
};

struct Alias {
  std::string name;    // the tied name ("lm_head.weight")
  std::string target;  // the name that holds the data ("embed.weight")
};

struct PlanOptions {
  std::string tag;  // empty: read `latest`
  bool exclude_frozen = false;
  bool verify_crc = true;  // check each file's pickle record against its CRC-32 before decoding
};

class CheckpointPlan {
 public:
  CheckpointPlan() = default;
  CheckpointPlan(CheckpointPlan&&) noexcept = default;
  CheckpointPlan& operator=(CheckpointPlan&&) noexcept = default;
  CheckpointPlan(const CheckpointPlan&) = delete;
  CheckpointPlan& operator=(const CheckpointPlan&) = delete;

  std::string tag;
  std::string tag_dir;  // checkpoint_dir/tag
  int stage = 0;
  int world_size = 1;
  bool bf16_zero1 = false;             // bf16 ZeRO-1 optimizer files (no zero_stage key)
  std::vector<PlannedTensor> tensors;  // in output order
  std::vector<Alias> aliases;          // targets are names in `tensors`
  std::vector<std::string> notes;      // what a user should know (stage 0 weights, ...)
  std::vector<std::string> files;      // the checkpoint files the plan reads
  std::vector<SourceRecord> records;   // the storage records the pieces lie in
  // The mapped archives the pieces point into.
  std::vector<std::unique_ptr<serialization::TorchArchive>> archives;
};

// Reads `checkpoint_dir` (the folder holding `latest` and the tag folders). Throws
// SerializationError.
[[nodiscard]] CheckpointPlan read_checkpoint_plan(const std::string& checkpoint_dir,
                                                  const PlanOptions& options);

// The tag `latest` names in `checkpoint_dir` (trailing whitespace and newline dropped).
[[nodiscard]] std::string read_latest_tag(const std::string& checkpoint_dir);

}  // namespace zinf::consolidate
