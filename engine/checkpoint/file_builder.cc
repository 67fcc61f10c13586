// FileBuilder (file_builder.h): a checkpoint file's pickle and whole tensors; the dtype table.

#include "engine/checkpoint/file_builder.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/checkpoint/folder.h"
#include "engine/engine_error.h"

namespace zinf::engine::checkpoint {
namespace {

namespace ser = zinf::serialization;

// torch dtypes and the storage dtypes of the files, one table for both directions.
constexpr std::pair<at::ScalarType, ser::TensorDType> kDTypes[] = {
    {at::kFloat, ser::TensorDType::kFloat32},     {at::kDouble, ser::TensorDType::kFloat64},
    {at::kBFloat16, ser::TensorDType::kBFloat16}, {at::kHalf, ser::TensorDType::kFloat16},
    {at::kLong, ser::TensorDType::kInt64},        {at::kInt, ser::TensorDType::kInt32},
    {at::kShort, ser::TensorDType::kInt16},       {at::kChar, ser::TensorDType::kInt8},
    {at::kByte, ser::TensorDType::kUInt8},        {at::kBool, ser::TensorDType::kBool},
};

ser::TensorDType tensor_dtype(at::ScalarType t) {
  for (const auto& [scalar, stored] : kDTypes) {
    if (scalar == t) return stored;
  }
  throw EngineError(fmt::format("checkpoint: tensors of {} cannot be saved", c10::toString(t)));
}

std::vector<int64_t> row_major_stride(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) {
    stride[i - 1] = stride[i] * std::max<int64_t>(shape[i], 1);
  }
  return stride;
}

}  // namespace

at::ScalarType scalar_of(ser::TensorDType d, const std::string& file) {
  for (const auto& [scalar, stored] : kDTypes) {
    if (stored == d) return scalar;
  }
  throw EngineError(
      fmt::format("{}: a tensor of {}, which this engine does not load", file, ser::dtype_name(d)));
}

using ser::PickleValue;

PickleValue* FileBuilder::tensor(const at::Tensor& t) {
  at::Tensor cpu = t.detach().to(at::kCPU).contiguous();
  const std::string key = next_key();
  const ser::TensorDType dt = tensor_dtype(cpu.scalar_type());
  ser::TensorRef ref;
  ref.storage = {key, std::string(ser::storage_type_of(dt)), dt, "cpu", cpu.numel()};
  ref.shape = cpu.sizes().vec();
  ref.stride = row_major_stride(ref.shape);
  whole_.emplace_back(key, std::move(cpu));
  return doc_.tensor(std::move(ref));
}

PickleValue* FileBuilder::streamed(uint64_t storage_numel, uint64_t view_numel, std::string* key) {
  *key = next_key();
  ser::TensorRef ref;
  ref.storage = {*key, "FloatStorage", ser::TensorDType::kFloat32, "cpu",
                 static_cast<int64_t>(storage_numel)};
  ref.shape = {static_cast<int64_t>(view_numel)};
  ref.stride = {1};
  return doc_.tensor(std::move(ref));
}

void FileBuilder::write_head(ser::TorchArchiveWriter& writer, PickleValue* root) {
  doc_.set_root(root);
  writer.write_pickle(doc_.root());
  for (const auto& [key, t] : whole_) {
    writer.add_storage(
        key, {static_cast<const uint8_t*>(t.data_ptr()), static_cast<size_t>(t.nbytes())});
  }
  whole_.clear();
  crash_point();
}

}  // namespace zinf::engine::checkpoint
