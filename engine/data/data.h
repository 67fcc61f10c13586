// Training data for `zinf train`: token streams and the sampler that cuts them into samples
// and deals them to ranks. No LibTorch (the trainer turns a micro-batch into a tensor).
//
//   TokenSource   a read-only stream of token ids: byte-level text (any file; each byte is a
//                 token, vocab 256) or a pre-tokenized file (flat little-endian uint16 or
//                 uint32, memory-mapped), or the default corpus held in memory.
//   SampleLoader  cuts a source into samples of seq_len + 1 consecutive tokens (input and
//                 shifted target), non-overlapping, shuffled per epoch from a seed. The
//                 global order is the same for any world size; rank r takes every
//                 world_size-th sample of it (as PyTorch's DistributedSampler does), so one
//                 rank with micro-batch 4 and two ranks with micro-batch 2 see the same
//                 global batch.
//
// The default corpus is the text of the Debian `fortunes` packages' files (found at their
// standard location, /usr/share/games/fortunes); when they are absent a built-in generated
// corpus that a small model can learn, with a note saying so.
//
// Errors: DataError, naming the file, the offset and what was wrong (a file too short for one
// sample, a token-file size that is not a multiple of the token width, a token id not below
// the vocab size). Thread safety: a TokenSource is immutable after opening and may be read
// from any thread; a SampleLoader is used by one thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zinf::data {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& message) : std::runtime_error(message) {}
};

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Number of tokens.
  [[nodiscard]] virtual uint64_t size() const noexcept = 0;
  // Token ids are below this (256 for byte-level text).
  [[nodiscard]] virtual uint32_t vocab_size() const noexcept = 0;
  // Copies tokens [offset, offset + count) into `out`; throws DataError when the range is
  // outside the source.
  virtual void read(uint64_t offset, uint64_t count, int64_t* out) const = 0;
  // What this is, for the start-up lines: "byte-level text /path (123456 tokens)".
  [[nodiscard]] virtual std::string description() const = 0;
};

// Any file read as bytes, each byte a token (vocab 256). Memory-mapped.
[[nodiscard]] std::unique_ptr<TokenSource> open_byte_text(const std::string& path);

// A flat little-endian array of uint16 (width 2) or uint32 (width 4) token ids,
// memory-mapped. `vocab_size` 0: the largest id + 1 (one pass over the file), which must not
// exceed `max_vocab` when that is not 0; otherwise every id must be below `vocab_size`.
// Either check is one pass, naming the offset of the first id that fails it.
[[nodiscard]] std::unique_ptr<TokenSource> open_token_file(const std::string& path, int width,
                                                           uint32_t vocab_size = 0,
                                                           uint32_t max_vocab = 0);

// A file chosen by name: "*.u16" / "*.bin16" -> uint16 tokens, "*.u32" / "*.bin32" -> uint32
// tokens (with open_token_file's `vocab_size` and `max_vocab`), anything else byte-level text
// (vocab 256, which must fit both when they are given).
[[nodiscard]] std::unique_ptr<TokenSource> open_data(const std::string& path,
                                                     uint32_t vocab_size = 0,
                                                     uint32_t max_vocab = 0);

// Whether open_data reads `path` as a token file (its suffix is .u16, .bin16, .u32 or .bin32).
[[nodiscard]] bool is_token_file(const std::string& path) noexcept;

// What made a token file: the sidecar `<file>.json` that scripts/tokenize-text.py writes beside
// it ("format": "zinf-tokens/1").
struct TokenSidecar {
  std::string path;              // the sidecar file
  std::string tokenizer_class;   // "PreTrainedTokenizerFast", ...
  std::string tokenizer_source;  // the model folder the tokenizer was read from
  std::string tokenizer_sha256;  // combined over tokenizer_files (see tokenizer_fingerprint)
  std::map<std::string, std::string> tokenizer_files;  // file name -> SHA-256
  uint64_t vocab_size = 0;                             // the tokenizer's, added tokens included
  std::optional<uint64_t> eos_id;
  std::optional<uint64_t> bos_id;
  uint64_t tokens = 0;
  uint64_t documents = 0;
  int width = 0;  // bytes per id
};

// The sidecar of the token file `data_path` (`data_path` + ".json"), nullopt when there is
// none or the file is not a token file (by open_data's suffix rule). Throws DataError naming
// the sidecar and the key when it is malformed, or when it does not describe `source` (the
// token count and the id width differ: it was written for another file).
[[nodiscard]] std::optional<TokenSidecar> read_token_sidecar(const std::string& data_path,
                                                             const TokenSource& source);

// The tokenizer files of a Hugging Face model folder, hashed as tokenize-text.py hashes them:
// the SHA-256 of "name\0<sha256 of the file>\n" over the files present among
// kTokenizerFiles, in name order. "" when the folder holds none.
inline constexpr const char* kTokenizerFiles[] = {
    "added_tokens.json", "merges.txt",      "special_tokens_map.json",
    "tokenizer.json",    "tokenizer.model", "tokenizer_config.json",
    "vocab.json"};
[[nodiscard]] std::string tokenizer_fingerprint(const std::string& folder);

// The default corpus: the fortunes files' text concatenated (byte-level), or, when none is
// found under `fortunes_dir`, a generated text corpus; `note` receives one line saying which
// ("fortunes: 412 KiB of text from 12 files in /usr/share/games/fortunes" or "the fortunes
// package is not installed (...); using a generated corpus of N KiB"). The fortunes text is
// every regular file directly in `fortunes_dir`, in sorted path order, less the `.dat`
// indexes and the `.u8` links; subfolders (`off/`, the offensive ones) are not read; the `%`
// separators stay. The generated corpus is the same on every run and platform. Throws
// DataError when a fortunes file exists but cannot be read.
[[nodiscard]] std::unique_ptr<TokenSource> default_corpus(
    std::string* note, const std::string& fortunes_dir = "/usr/share/games/fortunes");

// Unigram entropy of the source's tokens in nats (the loss a model that ignores context
// cannot beat): -sum p log p over the token frequencies.
[[nodiscard]] double unigram_entropy_nats(const TokenSource& source);

struct LoaderOptions {
  int64_t seq_len = 128;  // tokens per sample input (each sample reads seq_len + 1)
  uint64_t seed = 1234;   // shuffle seed (epoch e uses seed + e)
  int rank = 0;
  int world_size = 1;
  bool shuffle = true;
};

class SampleLoader {
 public:
  // Throws DataError when the source holds fewer than world_size samples (or seq_len < 1, or
  // rank is not in [0, world_size)). `source` must outlive the loader.
  SampleLoader(const TokenSource& source, LoaderOptions options);

  // Global samples per epoch (source size / (seq_len + 1), rounded down to a multiple of the
  // world size so every rank gets as many). The epoch's order is the first
  // samples_per_epoch() entries of one seeded permutation of all the source's samples, so
  // two world sizes that keep the same count (both divide it) see the same global order in
  // every epoch, and any two see it within the first epoch.
  [[nodiscard]] int64_t samples_per_epoch() const noexcept;
  // This rank's next `micro_batch` samples: `inputs` and `targets` each receive
  // micro_batch x seq_len ids, row-major (targets are the inputs shifted by one token).
  // Wraps into the next epoch (reshuffled) when this one runs out.
  void next(int64_t micro_batch, std::vector<int64_t>& inputs, std::vector<int64_t>& targets);
  [[nodiscard]] int64_t epoch() const noexcept { return epoch_; }
  // Global samples consumed so far by all ranks together (for resuming).
  [[nodiscard]] int64_t global_position() const noexcept;
  // Continue from a global position (every rank passes the same value). Throws DataError when
  // it is negative or not a multiple of the world size (a position reported after whole
  // global batches always is).
  void seek(int64_t global_position);

 private:
  const TokenSource& source_;
  LoaderOptions options_;
  // Builds order_ for epoch_.
  void order_epoch();

  int64_t source_samples_ = 0;  // whole samples in the source (before rounding to ranks)
  int64_t samples_ = 0;         // global samples per epoch
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;  // this epoch's next global index for rank 0's turn
  // This epoch's order: the first samples_ entries of a permutation of [0, source_samples_)
  // (all samples take part in the shuffle; the ones past the multiple of the world size
  // differ from epoch to epoch, as with DistributedSampler's drop_last).
  std::vector<int64_t> order_;
};

}  // namespace zinf::data
