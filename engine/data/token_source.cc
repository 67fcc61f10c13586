// The token sources: byte-level text and uint16/uint32 token files (memory-mapped), byte
// text held in memory, open_data's suffix rule and the unigram entropy.
#include <algorithm>
#include <cmath>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/data/data.h"
#include "engine/data/internal.h"
#include "engine/data/mapped_file.h"

namespace zinf::data {
namespace {

// Throws unless [offset, offset + count) lies inside a source of `size` tokens.
void check_range(const TokenSource& source, uint64_t offset, uint64_t count) {
  const uint64_t size = source.size();
  if (offset > size || count > size - offset) {
    throw DataError("read of tokens [" + std::to_string(offset) + ", " +
                    std::to_string(offset + count) + ") is outside " + source.description());
  }
}

void widen_bytes(const uint8_t* bytes, uint64_t count, int64_t* out) {
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = bytes[i];
  }
}

class MappedByteText final : public TokenSource {
 public:
  explicit MappedByteText(serialization::MappedFile file) : file_(std::move(file)) {}

  uint64_t size() const noexcept override { return file_.size(); }
  uint32_t vocab_size() const noexcept override { return 256; }
  void read(uint64_t offset, uint64_t count, int64_t* out) const override {
    check_range(*this, offset, count);
    widen_bytes(file_.data() + offset, count, out);
  }
  std::string description() const override {
    return "byte-level text " + file_.path() + " (" + std::to_string(size()) + " tokens)";
  }

 private:
  serialization::MappedFile file_;
};

class MemoryByteText final : public TokenSource {
 public:
  MemoryByteText(std::string bytes, std::string description)
      : bytes_(std::move(bytes)), description_(std::move(description)) {}

  uint64_t size() const noexcept override { return bytes_.size(); }
  uint32_t vocab_size() const noexcept override { return 256; }
  void read(uint64_t offset, uint64_t count, int64_t* out) const override {
    check_range(*this, offset, count);
    widen_bytes(reinterpret_cast<const uint8_t*>(bytes_.data()) + offset, count, out);
  }
  std::string description() const override { return description_; }

 private:
  const std::string bytes_;
  const std::string description_;
};

// Little-endian loads from any alignment (the compiler turns these into one load).
inline uint32_t load_le(const uint8_t* p, int width) noexcept {
  if (width == 2) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8;
  }
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

class MappedTokenFile final : public TokenSource {
 public:
  MappedTokenFile(serialization::MappedFile file, int width, uint32_t vocab_size)
      : file_(std::move(file)), width_(width), vocab_size_(vocab_size) {}

  uint64_t size() const noexcept override { return file_.size() / width_; }
  uint32_t vocab_size() const noexcept override { return vocab_size_; }
  void read(uint64_t offset, uint64_t count, int64_t* out) const override {
    check_range(*this, offset, count);
    const uint8_t* p = file_.data() + offset * width_;
    for (uint64_t i = 0; i < count; ++i, p += width_) {
      out[i] = load_le(p, width_);
    }
  }
  std::string description() const override {
    return std::string(width_ == 2 ? "uint16" : "uint32") + " tokens " + file_.path() + " (" +
           std::to_string(size()) + " tokens, vocab " + std::to_string(vocab_size_) + ")";
  }

 private:
  serialization::MappedFile file_;
  const int width_;
  const uint32_t vocab_size_;
};

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

}  // namespace

std::unique_ptr<TokenSource> open_byte_text(const std::string& path) {
  return std::make_unique<MappedByteText>(detail::map_file(path));
}

std::unique_ptr<TokenSource> open_token_file(const std::string& path, int width,
                                             uint32_t vocab_size, uint32_t max_vocab) {
  if (width != 2 && width != 4) {
    throw DataError(path + ": token width " + std::to_string(width) +
                    " is not supported (2 for uint16, 4 for uint32)");
  }
  serialization::MappedFile file = detail::map_file(path);
  const uint64_t size_bytes = file.size();
  if (size_bytes % static_cast<uint64_t>(width) != 0) {
    throw DataError(path + ": size " + std::to_string(size_bytes) +
                    " bytes is not a multiple of the token width " + std::to_string(width) +
                    " (uint" + std::to_string(width * 8) + " tokens)");
  }
  // One pass: the largest id, or the first id not below the given vocab size.
  const uint8_t* data = file.data();
  uint32_t largest = 0;
  for (uint64_t offset = 0; offset < size_bytes; offset += static_cast<uint64_t>(width)) {
    const uint32_t id = load_le(data + offset, width);
    if (vocab_size != 0 && id >= vocab_size) {
      throw DataError(path + ": token id " + std::to_string(id) + " at byte offset " +
                      std::to_string(offset) + " (token " + std::to_string(offset / width) +
                      ") is not below the vocab size " + std::to_string(vocab_size));
    }
    if (vocab_size == 0 && max_vocab != 0 && id >= max_vocab) {
      throw DataError(path + ": token id " + std::to_string(id) + " at byte offset " +
                      std::to_string(offset) + " (token " + std::to_string(offset / width) +
                      ") is not below the largest vocabulary allowed, " +
                      std::to_string(max_vocab));
    }
    largest = std::max(largest, id);
  }
  if (vocab_size == 0) {
    if (largest == UINT32_MAX) {
      throw DataError(path + ": token id " + std::to_string(largest) +
                      " leaves no vocab size that fits 32 bits");
    }
    vocab_size = largest + 1;
  }
  return std::make_unique<MappedTokenFile>(std::move(file), width, vocab_size);
}

std::unique_ptr<TokenSource> open_data(const std::string& path, uint32_t vocab_size,
                                       uint32_t max_vocab) {
  if (ends_with(path, ".u16") || ends_with(path, ".bin16")) {
    return open_token_file(path, 2, vocab_size, max_vocab);
  }
  if (ends_with(path, ".u32") || ends_with(path, ".bin32")) {
    return open_token_file(path, 4, vocab_size, max_vocab);
  }
  std::unique_ptr<TokenSource> text = open_byte_text(path);
  const uint32_t limit = vocab_size != 0 ? vocab_size : max_vocab;
  if (limit != 0 && limit < text->vocab_size()) {
    throw DataError(path + ": byte-level text has 256 token ids, more than the vocab size " +
                    std::to_string(limit));
  }
  return text;
}

double unigram_entropy_nats(const TokenSource& source) {
  const uint64_t size = source.size();
  if (size == 0) {
    return 0.0;
  }
  // Dense counts for vocabularies of practical size; a sparse map past 2^24 ids.
  constexpr uint32_t kDenseVocab = 1U << 24;
  const bool dense = source.vocab_size() <= kDenseVocab;
  std::vector<uint64_t> dense_counts(dense ? source.vocab_size() : 0);
  std::unordered_map<int64_t, uint64_t> sparse_counts;
  constexpr uint64_t kChunk = 1U << 16;
  std::vector<int64_t> chunk(kChunk);
  for (uint64_t offset = 0; offset < size; offset += kChunk) {
    const uint64_t count = std::min(kChunk, size - offset);
    source.read(offset, count, chunk.data());
    for (uint64_t i = 0; i < count; ++i) {
      if (dense) {
        ++dense_counts[static_cast<size_t>(chunk[i])];
      } else {
        ++sparse_counts[chunk[i]];
      }
    }
  }
  if (!dense) {
    for (const auto& [id, count] : sparse_counts) {
      dense_counts.push_back(count);
    }
    std::sort(dense_counts.begin(), dense_counts.end());  // a fixed summation order
  }
  const auto total = static_cast<double>(size);
  double entropy = 0.0;
  for (const uint64_t count : dense_counts) {
    if (count != 0) {
      const double p = static_cast<double>(count) / total;
      entropy -= p * std::log(p);
    }
  }
  return entropy;
}

namespace detail {

std::unique_ptr<TokenSource> make_memory_text(std::string bytes, std::string description) {
  return std::make_unique<MemoryByteText>(std::move(bytes), std::move(description));
}

}  // namespace detail
}  // namespace zinf::data
