// write_consolidated: streams a CheckpointPlan (checkpoint_plan.h) into Hugging Face named
// output files: `pytorch_model.bin` (a torch.save zip that torch.load(weights_only=True)
// reads) or `model.safetensors`, or, when the tensors exceed max_shard_bytes,
// `pytorch_model-0000i-of-0000N.bin` / `model-0000i-of-0000N.safetensors` plus the index
// `pytorch_model.bin.index.json` / `model.safetensors.index.json` ({"metadata": {"total_size"},
// "weight_map"}, sorted keys, indent 2, final newline). Shards are cut as Hugging Face's
// split_torch_state_dict_into_shards cuts them (in order; a tensor larger than the limit gets
// a shard of its own).
//
// Aliases (tied params): in .bin output the alias is a second name of the target's tensor
// (one storage, so torch.load gives tensors that share memory; the index maps it to the
// target's shard); safetensors forbids aliases, so the data is written once and every shard's
// __metadata__ carries "aliases": a JSON object alias -> target (beside "format": "pt").
//
// Streaming: the output is cut into chunks of chunk_bytes; `threads` workers gather and
// convert the chunks' elements from the mapped inputs into a ring of threads + 2 chunk
// buffers while the calling thread writes the finished chunks in order, so reading and
// writing overlap and memory stays at the ring (no shard, let alone the model, is held
// whole). For .bin output the workers also compute the CRC-32 of each tensor's bytes in the
// chunk as they convert them; the writing thread only combines those CRCs and writes. Input pages
// are requested ahead (MADV_WILLNEED, 128 MiB of output ahead) and dropped from the process once
// copied (MADV_DONTNEED), so mapped pages do not pile up in the resident set.
//
// Integrity (verify_crc, the default): the workers also compute the CRC-32 of the input bytes
// they read, per piece; the writing thread combines them per storage record (zlib's
// crc32_combine; the plan reads each record front to back, and bytes no piece reads, such as
// partition padding, are read for the CRC alone) and compares each record's CRC with the one
// its zip recorded as soon as the record is complete. A record that fails stops the export:
// SerializationError naming the checkpoint file, the record and its offset.
//
// The output folder: the shards and the index are written into a staging folder inside it
// (`.zero-to-fp32-XXXXXX`, through AtomicFile: complete and fsynced) and renamed into place,
// shards first, index last, only once everything is written and verified; after a failure the
// staging folder is removed and the output folder is as it was. A folder holding an earlier
// export (any file with a name this writer writes: earlier_export_files()) is refused with
// EarlierExportError unless `overwrite`; with it, the earlier export's files are replaced (same
// name) or removed (the others) after the new files are in place, and the summary names each.
// No other file of the folder is touched.
//
// Errors: SerializationError naming the output file (write failures, from the serialization
// writers) or the checkpoint file (a record that fails its CRC-32), EarlierExportError, or
// std::invalid_argument for bad options; a worker's error is rethrown on the calling thread
// after every worker has stopped.
//
// Thread safety: one call at a time per output folder; `progress` is called on the calling
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "consolidate/checkpoint_plan.h"
#include "consolidate/element_convert.h"

namespace zinf::consolidate {

enum class OutputFormat { kTorchBin, kSafetensors };

struct WriteOptions {
  OutputFormat format = OutputFormat::kTorchBin;
  OutputDType dtype = OutputDType::kFloat32;
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default "5GB"
  int threads = 4;                           // gather/convert workers (>= 1)
  uint64_t chunk_bytes = 8ULL << 20;         // output bytes per chunk (rounded to 16)
  bool verify_crc = true;                    // check the CRC-32 of every record read
  bool overwrite = false;  // replace an earlier export in the output folder (else refuse it)
  // Called after each chunk is written with the bytes written so far and the total.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> progress;
};

struct WriteSummary {
  uint64_t tensors = 0;            // tensors written (aliases not counted)
  uint64_t aliases = 0;            // alias names recorded
  uint64_t elements = 0;           // elements written
  uint64_t data_bytes = 0;         // tensor bytes written
  double finish_seconds = 0;       // spent completing the files (mostly fsync: the disk)
  std::vector<std::string> files;  // output file names (shards, then the index if any)
  uint64_t verified_records = 0;   // checkpoint records whose CRC-32 was checked
  // Files of an earlier export (overwrite): replaced by a new file of the same name, or
  // removed (paths in the output folder).
  std::vector<std::string> replaced;
  std::vector<std::string> removed;
};

// The output folder holds an earlier export and WriteOptions::overwrite is not set.
class EarlierExportError : public std::invalid_argument {
 public:
  EarlierExportError(const std::string& output_dir, std::vector<std::string> files);
  const std::vector<std::string>& files() const noexcept { return files_; }  // paths

 private:
  std::vector<std::string> files_;
};

// Whether `file_name` is one this writer writes: pytorch_model.bin, model.safetensors, their
// shards (pytorch_model-00001-of-00002.bin, model-00001-of-00002.safetensors) and indexes.
[[nodiscard]] bool is_export_file_name(std::string_view file_name);
// The paths of the entries of `output_dir` with such names, sorted (none when the folder does
// not exist).
[[nodiscard]] std::vector<std::string> earlier_export_files(const std::string& output_dir);

// One output shard: the tensors (indices into plan.tensors) it holds, in order.
struct ShardPlan {
  std::string file_name;
  std::vector<size_t> tensors;
  std::vector<size_t> aliases;  // indices into plan.aliases whose target is in this shard
  uint64_t data_bytes = 0;
};

// The shards write_consolidated() writes (exposed for tests and the summary).
[[nodiscard]] std::vector<ShardPlan> plan_shards(const CheckpointPlan& plan,
                                                 const WriteOptions& options);

// Writes the plan into `output_dir` (created if missing; see the header comment for what
// happens to an earlier export there).
WriteSummary write_consolidated(const CheckpointPlan& plan, const std::string& output_dir,
                                const WriteOptions& options);

}  // namespace zinf::consolidate
