// Element conversion for consolidation: runs of torch storage elements (any float, integer or
// bool dtype) converted to the output dtype (float32, bfloat16 or float16), as torch's
// Tensor.to() does: float narrowing rounds to nearest even (NaN stays NaN, overflow becomes
// infinity), integers and bools go through float32.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "serialization/pickle_value.h"
#include "serialization/safetensors.h"

namespace zinf::consolidate {

// The dtypes consolidation writes.
enum class OutputDType { kFloat32, kBFloat16, kFloat16 };

// "fp32" / "bf16" / "fp16" (also "float32", "bfloat16", "float16"); nullopt otherwise.
[[nodiscard]] std::optional<OutputDType> parse_output_dtype(std::string_view name);
// Bytes per element of `dtype`.
[[nodiscard]] uint64_t output_dtype_bytes(OutputDType dtype);
// The torch storage dtype and the safetensors dtype of `dtype`.
[[nodiscard]] serialization::TensorDType output_storage_dtype(OutputDType dtype);
[[nodiscard]] serialization::Dtype output_safetensors_dtype(OutputDType dtype);

// Whether convert() can read elements of `from` (every dtype but complex and unknown ones).
[[nodiscard]] bool convertible(serialization::TensorDType from);

// Converts `count` elements at `source` (dtype `from`, little-endian, any alignment) to `to`
// at `destination` (count * output_dtype_bytes(to) bytes). `from` must be convertible().
void convert(const uint8_t* source, serialization::TensorDType from, uint64_t count,
             uint8_t* destination, OutputDType to);

}  // namespace zinf::consolidate
