// FileBuilder: one torch.save file of a checkpoint being built — its pickle tree, the tensors
// whose bytes follow it whole, and the keys of the storages streamed after them (the
// partition, partition_stream.h). Storage keys are numbered in the order tensor() and
// streamed() are called, which is what a prepared save's records rely on (partition_keys).
// Also the one table of torch dtypes and the files' storage dtypes, used both ways.
//
// Errors: EngineError for a tensor of a dtype the files cannot hold; the writer's
// SerializationError for a failed write.
//
// Thread safety: none; one builder per file, on the save's thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "serialization/pickle_value.h"
#include "serialization/torch_archive.h"

namespace zinf::engine::checkpoint {

// The torch dtype of a stored tensor of `file`; throws EngineError naming `file` for one this
// engine does not load.
[[nodiscard]] at::ScalarType scalar_of(serialization::TensorDType d, const std::string& file);

class FileBuilder {
 public:
  using PickleValue = serialization::PickleValue;

  // `source`: the file's path, for the pickle's errors.
  explicit FileBuilder(std::string source) : doc_(std::move(source)) {}

  serialization::PickleDocument& doc() noexcept { return doc_; }
  PickleValue* str(std::string s) { return doc_.string(std::move(s)); }
  PickleValue* integer(int64_t v) { return doc_.integer(v); }
  PickleValue* real(double v) { return doc_.floating(v); }
  PickleValue* boolean(bool v) { return doc_.boolean(v); }
  PickleValue* none() { return doc_.none(); }
  PickleValue* dict(bool ordered = false) { return doc_.dict(ordered); }
  PickleValue* list() { return doc_.list(); }
  PickleValue* size(const std::vector<int64_t>& dims) { return doc_.torch_size(dims); }
  void put(PickleValue* d, std::string_view key, PickleValue* value) {
    doc_.set_item(d, doc_.string(std::string(key)), value);
  }

  // A tensor written whole after the pickle (a contiguous CPU copy is kept until then).
  PickleValue* tensor(const at::Tensor& t);

  // A 1-D fp32 tensor viewing the first `view_numel` of a `storage_numel`-element storage
  // streamed later under *key.
  PickleValue* streamed(uint64_t storage_numel, uint64_t view_numel, std::string* key);

  // Writes data.pkl and the whole tensors, then passes a crash point.
  void write_head(serialization::TorchArchiveWriter& writer, PickleValue* root);

 private:
  std::string next_key() { return std::to_string(keys_++); }

  serialization::PickleDocument doc_;
  int64_t keys_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> whole_;
};

}  // namespace zinf::engine::checkpoint
