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
// copied (MADV_DONTNEED), so mapped pages do not pile up in the resident set. Files appear through
// AtomicFile (complete and fsynced, or absent); the index is written last.
//
// Errors: SerializationError naming the output file (write failures, from the serialization
// writers) or std::invalid_argument for bad options; a worker's error is rethrown on the
// calling thread after every worker has stopped.
//
// Thread safety: one call at a time per output folder; `progress` is called on the calling
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/consolidate/checkpoint_plan.h"
#include "engine/consolidate/element_convert.h"

namespace zinf::consolidate {

enum class OutputFormat { kTorchBin, kSafetensors };

struct WriteOptions {
  OutputFormat format = OutputFormat::kTorchBin;
  OutputDType dtype = OutputDType::kFloat32;
  uint64_t max_shard_bytes = 5'000'000'000;  // Hugging Face's default "5GB"
  int threads = 4;                           // gather/convert workers (>= 1)
  uint64_t chunk_bytes = 8ULL << 20;         // output bytes per chunk (rounded to 16)
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
};

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

// Writes the plan into `output_dir` (created if missing).
WriteSummary write_consolidated(const CheckpointPlan& plan, const std::string& output_dir,
                                const WriteOptions& options);

}  // namespace zinf::consolidate
