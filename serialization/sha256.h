// SHA-256 (FIPS 180-4), for fingerprints that other tools compute too: the tokenizer files a
// token file's sidecar names (scripts/tokenize-text.py hashes them with Python's hashlib).
// Not for secrets (no constant-time guarantees are needed or given).
//
// Thread safety: a Sha256 is used by one thread; the free functions are reentrant.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace zinf::serialization {

class Sha256 {
 public:
  Sha256() noexcept;
  void update(std::span<const uint8_t> bytes) noexcept;
  // The digest of everything updated so far; the object must not be updated afterwards.
  [[nodiscard]] std::array<uint8_t, 32> finish() noexcept;

 private:
  void block(const uint8_t* p) noexcept;
  std::array<uint32_t, 8> state_{};
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes
};

// Lower-case hex of a digest.
[[nodiscard]] std::string to_hex(std::span<const uint8_t> digest);
// Hex SHA-256 of `bytes`.
[[nodiscard]] std::string sha256_hex(std::span<const uint8_t> bytes);
// Hex SHA-256 of a file's contents; throws SerializationError naming the file when it cannot
// be read.
[[nodiscard]] std::string sha256_file_hex(const std::string& path);

}  // namespace zinf::serialization
