// Small file helpers for the tools tests: write seeded random bytes, read a whole file.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace zinf::testing {

// Writes `bytes` random bytes drawn from `seed` to `path` (replacing it); returns them.
inline std::string write_random_file(const std::string& path, uint64_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string data(bytes, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  return data;
}

// The whole content of `path` ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace zinf::testing
