#include "consolidate/element_convert.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace zinf::consolidate {

using serialization::TensorDType;

std::optional<OutputDType> parse_output_dtype(std::string_view name) {
  if (name == "fp32" || name == "float32") return OutputDType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return OutputDType::kBFloat16;
  if (name == "fp16" || name == "float16") return OutputDType::kFloat16;
  return std::nullopt;
}

uint64_t output_dtype_bytes(OutputDType dtype) { return dtype == OutputDType::kFloat32 ? 4 : 2; }

TensorDType output_storage_dtype(OutputDType dtype) {
  switch (dtype) {
    case OutputDType::kFloat32:
      return TensorDType::kFloat32;
    case OutputDType::kBFloat16:
      return TensorDType::kBFloat16;
    case OutputDType::kFloat16:
      return TensorDType::kFloat16;
  }
  return TensorDType::kFloat32;
}

serialization::Dtype output_safetensors_dtype(OutputDType dtype) {
  switch (dtype) {
    case OutputDType::kFloat32:
      return serialization::Dtype::kF32;
    case OutputDType::kBFloat16:
      return serialization::Dtype::kBF16;
    case OutputDType::kFloat16:
      return serialization::Dtype::kF16;
  }
  return serialization::Dtype::kF32;
}

bool convertible(TensorDType from) {
  return from != TensorDType::kComplex64 && from != TensorDType::kComplex128 &&
         from != TensorDType::kUnknown;
}

namespace {

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// Round to nearest even; NaN keeps a quiet NaN (the carry could turn it into infinity).
uint16_t float_to_bf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// IEEE binary16 through the compiler's _Float16 (GCC and Clang on x86-64 and AArch64), which
// rounds to nearest even and handles subnormals, overflow and NaN.
uint16_t float_to_fp16(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}
float fp16_to_float(uint16_t bits) { return static_cast<float>(std::bit_cast<_Float16>(bits)); }

float element_as_float(const uint8_t* p, TensorDType from) {
  switch (from) {
    case TensorDType::kFloat32:
      return load<float>(p);
    case TensorDType::kFloat64:
      return static_cast<float>(load<double>(p));
    case TensorDType::kFloat16:
      return fp16_to_float(load<uint16_t>(p));
    case TensorDType::kBFloat16:
      return bf16_to_float(load<uint16_t>(p));
    case TensorDType::kInt64:
      return static_cast<float>(load<int64_t>(p));
    case TensorDType::kInt32:
      return static_cast<float>(load<int32_t>(p));
    case TensorDType::kInt16:
      return static_cast<float>(load<int16_t>(p));
    case TensorDType::kInt8:
      return static_cast<float>(load<int8_t>(p));
    case TensorDType::kUInt8:
      return static_cast<float>(load<uint8_t>(p));
    case TensorDType::kBool:
      return load<uint8_t>(p) != 0 ? 1.0F : 0.0F;
    default:
      return 0.0F;
  }
}

void store(float value, uint8_t* p, OutputDType to) {
  switch (to) {
    case OutputDType::kFloat32:
      std::memcpy(p, &value, 4);
      return;
    case OutputDType::kBFloat16: {
      const uint16_t bits = float_to_bf16(value);
      std::memcpy(p, &bits, 2);
      return;
    }
    case OutputDType::kFloat16: {
      const uint16_t bits = float_to_fp16(value);
      std::memcpy(p, &bits, 2);
      return;
    }
  }
}

}  // namespace

void convert(const uint8_t* source, TensorDType from, uint64_t count, uint8_t* destination,
             OutputDType to) {
  if (from == output_storage_dtype(to)) {
    std::memcpy(destination, source, count * output_dtype_bytes(to));
    return;
  }
  // The common cases as tight loops the compiler vectorizes.
  if (from == TensorDType::kFloat32 && to == OutputDType::kBFloat16) {
    for (uint64_t i = 0; i < count; ++i) {
      const uint16_t bits = float_to_bf16(load<float>(source + 4 * i));
      std::memcpy(destination + 2 * i, &bits, 2);
    }
    return;
  }
  if (from == TensorDType::kBFloat16 && to == OutputDType::kFloat32) {
    for (uint64_t i = 0; i < count; ++i) {
      const float value = bf16_to_float(load<uint16_t>(source + 2 * i));
      std::memcpy(destination + 4 * i, &value, 4);
    }
    return;
  }
  const uint64_t in = serialization::dtype_size_bytes(from);
  const uint64_t out = output_dtype_bytes(to);
  for (uint64_t i = 0; i < count; ++i) {
    store(element_as_float(source + in * i, from), destination + out * i, to);
  }
}

}  // namespace zinf::consolidate
