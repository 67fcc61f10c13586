// Helpers shared by the optimizer_cpu tests: typed buffers at chosen misalignments, seeded
// random data, and conversions between the element types and double.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "optimizer_cpu/half.h"
#include "optimizer_cpu/optimizer.h"

namespace zinf::optimizer_cpu::testing {

// `numel` elements of `dtype`, starting `misalign` elements past a 64-byte boundary.
class Buffer {
 public:
  Buffer(DType dtype, std::size_t numel, std::size_t misalign = 0)
      : dtype_(dtype), numel_(numel), storage_((numel + misalign) * 4 + 128) {
    const auto base = reinterpret_cast<std::uintptr_t>(storage_.data());
    const std::uintptr_t aligned = (base + 63) & ~std::uintptr_t{63};
    data_ = storage_.data() + (aligned - base) + misalign * dtype_size(dtype);
  }

  void* data() { return data_; }
  const void* data() const { return data_; }
  float* f32() { return reinterpret_cast<float*>(data_); }
  DType dtype() const { return dtype_; }
  std::size_t numel() const { return numel_; }

  double get(std::size_t i) const {
    if (dtype_ == DType::kFloat32) {
      float x;
      std::memcpy(&x, data_ + i * 4, 4);
      return x;
    }
    std::uint16_t bits;
    std::memcpy(&bits, data_ + i * 2, 2);
    return dtype_ == DType::kBFloat16 ? bf16_to_float(bits) : fp16_to_float(bits);
  }

  // Stores `value` rounded to the buffer's type (fp32 first, then 16 bits).
  void set(std::size_t i, double value) {
    const auto x = static_cast<float>(value);
    if (dtype_ == DType::kFloat32) {
      std::memcpy(data_ + i * 4, &x, 4);
      return;
    }
    const std::uint16_t bits = dtype_ == DType::kBFloat16 ? float_to_bf16(x) : float_to_fp16(x);
    std::memcpy(data_ + i * 2, &bits, 2);
  }

  std::uint16_t bits16(std::size_t i) const {
    std::uint16_t bits;
    std::memcpy(&bits, data_ + i * 2, 2);
    return bits;
  }
  void set_bits16(std::size_t i, std::uint16_t bits) { std::memcpy(data_ + i * 2, &bits, 2); }

  std::vector<double> values() const {
    std::vector<double> out(numel_);
    for (std::size_t i = 0; i < numel_; ++i) out[i] = get(i);
    return out;
  }

  // Raw bytes of the elements, for bit-exact comparisons.
  std::vector<unsigned char> bytes() const {
    return std::vector<unsigned char>(data_, data_ + numel_ * dtype_size(dtype_));
  }

 private:
  DType dtype_;
  std::size_t numel_;
  std::vector<unsigned char> storage_;
  unsigned char* data_ = nullptr;
};

inline std::string dtype_name(DType d) { return std::string(to_string(d)); }

// Seed for a test: fixed, overridable with ZINF_TEST_SEED, printed by the caller on failure.
inline std::uint64_t test_seed() {
  const char* env = std::getenv("ZINF_TEST_SEED");
  return env != nullptr ? std::strtoull(env, nullptr, 10) : 20240229u;
}

}  // namespace zinf::optimizer_cpu::testing
