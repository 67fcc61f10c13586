// JsonBlock: reads one JSON object of a config key by key, for the parsers of engine/config.
// Internal to zinf_config.
//
// Every getter takes the key's default, marks the key as read, and throws ConfigError naming
// the full JSON path, the expected type and the value seen when the value has the wrong type
// or range ("zero_optimization.stage: expected an integer in [0, 3], got \"eight\""). A key
// holding null reads as absent. finish() turns every key no getter read into one warning
// naming its path (with the nearest known key when one is close: typos are the usual cause).
//
// "auto": take_auto(key) consumes a key whose value is the string "auto" and records its path
// in the shared auto set; the getters themselves refuse "auto", so only keys whose parser asks
// accept it.
//
// Thread safety: none; one parse at a time per JsonBlock.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/config/run_config.h"

namespace zinf::config::detail {

using Json = nlohmann::json;

// What all blocks of one parse share: the source name for messages, the warnings and the
// "auto" paths collected so far.
struct ParseContext {
  std::string source;
  std::vector<std::string> warnings;
  std::set<std::string> auto_keys;

  [[noreturn]] void fail(const std::string& path, const std::string& reason) const;
  void warn(const std::string& path, const std::string& message);
};

// The JSON text of a value for messages: strings quoted, long values cut.
[[nodiscard]] std::string describe(const Json& value);

class JsonBlock {
 public:
  // `object` must outlive the block. `path` is the block's JSON path ("" for the top level).
  JsonBlock(const Json& object, std::string path, ParseContext& context);

  JsonBlock(const JsonBlock&) = delete;
  JsonBlock& operator=(const JsonBlock&) = delete;
  JsonBlock(JsonBlock&&) = default;

  // The path of `key` inside this block ("zero_optimization.stage").
  [[nodiscard]] std::string path_of(std::string_view key) const;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  [[nodiscard]] ParseContext& context() const noexcept { return *context_; }

  // Whether `key` is present with a non-null value (does not mark it read).
  [[nodiscard]] bool has(std::string_view key) const;
  // The raw value, marked read; nullptr when absent or null.
  [[nodiscard]] const Json* take(std::string_view key);
  // True (and the key read and recorded as auto) when the value is the string "auto".
  [[nodiscard]] bool take_auto(std::string_view key);

  [[nodiscard]] bool boolean(std::string_view key, bool fallback);
  // Any finite number in [min, max].
  [[nodiscard]] double number(std::string_view key, double fallback, double min, double max);
  // A whole number in [min, max]; exponent form (1e3) accepted when it is whole.
  [[nodiscard]] int64_t integer(std::string_view key, int64_t fallback, int64_t min, int64_t max);
  // An element count: a whole number >= 0 (exponent form accepted), up to 2^64 - 1.
  [[nodiscard]] uint64_t count(std::string_view key, uint64_t fallback);
  // A byte count: a whole number of bytes, or a string with a unit ("8GB", "8GiB", "512M").
  [[nodiscard]] std::optional<uint64_t> bytes(std::string_view key);
  [[nodiscard]] std::string string(std::string_view key, const std::string& fallback);
  // One of `choices`, compared case-insensitively; returns its index (fallback when absent).
  [[nodiscard]] size_t choice(std::string_view key, const std::vector<std::string_view>& choices,
                              size_t fallback);
  // A nested object, or nullopt when absent or null; a value of another type is an error.
  [[nodiscard]] std::optional<JsonBlock> block(std::string_view key);

  // Marks keys read without using them (accepted, no effect in zinf).
  void accept(std::initializer_list<std::string_view> keys);
  // Marks `key` read; when present and its value differs from `inert` (the value under which
  // zinf and DeepSpeed behave alike), warns that zinf does not support it.
  void unsupported(std::string_view key, const Json& inert, std::string_view note);

  // Warns once for every key no call above read. `known` lists the block's valid keys for
  // the "did you mean" hint.
  void finish(const std::vector<std::string_view>& known);

 private:
  [[noreturn]] void fail_type(std::string_view key, const Json& value,
                              const std::string& expected) const;

  const Json* object_;
  std::string path_;
  ParseContext* context_;
  std::set<std::string, std::less<>> read_;
};

// Parses a byte size as a user writes it: digits with an optional fraction and exponent, then
// an optional unit: B; K, M, G, T and KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB
// (powers of 1000); case-insensitive. nullopt for anything else, a negative value, a
// fraction of a byte, or a value of 2^63 or more.
[[nodiscard]] std::optional<uint64_t> parse_byte_size(std::string_view text);

// Sets config.zero.precision from the fp16 / bf16 blocks; throws ConfigError when both are
// enabled. (parse_config.cc; resolve_auto() runs it again once "auto" is resolved.)
void apply_precision(RunConfig& config);

}  // namespace zinf::config::detail
