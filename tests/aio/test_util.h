// Helpers shared by the aio tests: seeded random bytes, shifted buffers, and the list of
// backends every suite is parameterized over. The temporary directory and the seed policy
// are the shared ones in tests/common.
//
// Thread safety: fill_random(), first_difference() and numbered() are pure functions;
// ShiftedBuffer is not synchronized.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "aio/config.h"

namespace zinf::aio::testing {

// splitmix64: fast and good enough to tell bytes apart; deterministic per seed.
inline void fill_random(std::byte* data, size_t bytes, uint64_t seed) {
  uint64_t state = seed;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    state += 0x9e3779b97f4a7c15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(data + i, &z, 8);
  }
  for (; i < bytes; ++i) data[i] = static_cast<std::byte>((seed >> (i % 8)) + i);
}

// Index of the first differing byte, or -1.
inline int64_t first_difference(const std::byte* a, const std::byte* b, size_t bytes) {
  if (std::memcmp(a, b, bytes) == 0) return -1;
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// `bytes` bytes whose first byte lies `shift` bytes past a 4096-byte boundary.
class ShiftedBuffer {
 public:
  ShiftedBuffer(size_t bytes, size_t shift) : storage_(bytes + shift + 4096), bytes_(bytes) {
    const auto base = reinterpret_cast<uintptr_t>(storage_.data());
    const uintptr_t aligned = (base + 4095) / 4096 * 4096;
    data_ = storage_.data() + (aligned - base) + shift;
  }
  std::byte* data() { return data_; }
  size_t size() const { return bytes_; }

 private:
  std::vector<std::byte> storage_;
  size_t bytes_;
  std::byte* data_;
};

// prefix + decimal n (built by appending: GCC 12 warns falsely on `"x" + std::to_string(n)`).
inline std::string numbered(const char* prefix, int n) {
  std::string name(prefix);
  name.append(std::to_string(n));
  return name;
}

inline const std::vector<BackendKind>& all_backends() {
  static const std::vector<BackendKind> kinds = {BackendKind::kIoUring, BackendKind::kLibaio,
                                                 BackendKind::kPsync};
  return kinds;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<BackendKind>& info) {
  return std::string(to_string(info.param));
}

}  // namespace zinf::aio::testing
