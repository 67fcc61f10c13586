// Pieces shared by the sources of engine/data; internal to zinf_data.
//
// Thread safety: the functions are pure; SplitMix64 is a value type used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/data/data.h"

namespace zinf::data::detail {

// SplitMix64 (Steele, Lea, Flood 2014): a fixed, portable 64-bit generator, so a shuffle or
// a generated corpus is the same with every compiler and standard library (std::shuffle and
// the std distributions are not).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) noexcept : state_(seed) {}

  uint64_t next() noexcept {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }

  // Uniform in [0, bound), bound > 0, without modulo bias (rejects the short top range).
  uint64_t below(uint64_t bound) noexcept {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    for (;;) {
      const uint64_t r = next();
      if (r >= threshold) {
        return r % bound;
      }
    }
  }

 private:
  uint64_t state_;
};

// Byte-level text held in memory (vocab 256); `description` is returned as is.
[[nodiscard]] std::unique_ptr<TokenSource> make_memory_text(std::string bytes,
                                                            std::string description);

// The built-in corpus: English-like sentences from a small grammar, deterministic, at least
// `min_bytes` long (it ends at a sentence end).
[[nodiscard]] std::string generated_corpus_text(uint64_t min_bytes);

}  // namespace zinf::data::detail
