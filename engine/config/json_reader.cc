#include "engine/config/json_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace zinf::config::detail {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Edit distance, for "did you mean" hints on misspelt keys.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({above + 1, row[j - 1] + 1, substitute});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// A JSON number as a double, or nullopt for any other type.
std::optional<double> as_double(const Json& value) {
  if (value.is_number()) return value.get<double>();
  return std::nullopt;
}

}  // namespace

void ParseContext::fail(const std::string& path, const std::string& reason) const {
  throw ConfigError(source, path, reason);
}

void ParseContext::warn(const std::string& path, const std::string& message) {
  warnings.push_back(fmt::format("{}: {}: {}", source, path, message));
}

std::string describe(const Json& value) {
  std::string text = value.dump();
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

JsonBlock::JsonBlock(const Json& object, std::string path, ParseContext& context)
    : object_(&object), path_(std::move(path)), context_(&context) {}

std::string JsonBlock::path_of(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

bool JsonBlock::has(std::string_view key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

const Json* JsonBlock::take(std::string_view key) {
  read_.emplace(key);
  auto it = object_->find(key);
  if (it == object_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonBlock::take_auto(std::string_view key) {
  auto it = object_->find(key);
  if (it == object_->end() || !it->is_string() || it->get_ref<const std::string&>() != kAuto) {
    return false;
  }
  read_.emplace(key);
  context_->auto_keys.insert(path_of(key));
  return true;
}

void JsonBlock::fail_type(std::string_view key, const Json& value,
                          const std::string& expected) const {
  std::string seen = describe(value);
  if (value.is_string() && value.get_ref<const std::string&>() == kAuto) {
    seen += " (\"auto\" is not accepted for this key)";
  }
  context_->fail(path_of(key), fmt::format("expected {}, got {}", expected, seen));
}

bool JsonBlock::boolean(std::string_view key, bool fallback) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) fail_type(key, *value, "true or false");
  return value->get<bool>();
}

double JsonBlock::number(std::string_view key, double fallback, double min, double max) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  const std::string expected = max == std::numeric_limits<double>::max()
                                   ? fmt::format("a number >= {}", min)
                                   : fmt::format("a number in [{}, {}]", min, max);
  std::optional<double> d = as_double(*value);
  if (!d || !std::isfinite(*d) || *d < min || *d > max) fail_type(key, *value, expected);
  return *d;
}

int64_t JsonBlock::integer(std::string_view key, int64_t fallback, int64_t min, int64_t max) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  // Limits at the type's end (int or int64) are not worth printing.
  const std::string expected = max >= std::numeric_limits<int>::max()
                                   ? fmt::format("a whole number >= {}", min)
                                   : fmt::format("a whole number in [{}, {}]", min, max);
  if (value->is_number_integer() && !value->is_number_unsigned()) {
    const int64_t v = value->get<int64_t>();
    if (v < min || v > max) fail_type(key, *value, expected);
    return v;
  }
  if (value->is_number_unsigned()) {
    const uint64_t v = value->get<uint64_t>();
    if (v > static_cast<uint64_t>(max) || static_cast<int64_t>(v) < min) {
      fail_type(key, *value, expected);
    }
    return static_cast<int64_t>(v);
  }
  std::optional<double> d = as_double(*value);
  // 2^63 is the first double past int64's range.
  if (!d || *d != std::floor(*d) || *d < -0x1p63 || *d >= 0x1p63) {
    fail_type(key, *value, expected);
  }
  const auto v = static_cast<int64_t>(*d);
  if (v < min || v > max) fail_type(key, *value, expected);
  return v;
}

uint64_t JsonBlock::count(std::string_view key, uint64_t fallback) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  const std::string expected = "a whole number >= 0 (a count; 5e8 form accepted)";
  if (value->is_number_unsigned()) return value->get<uint64_t>();
  if (value->is_number_integer()) {
    const int64_t v = value->get<int64_t>();
    if (v < 0) fail_type(key, *value, expected);
    return static_cast<uint64_t>(v);
  }
  std::optional<double> d = as_double(*value);
  if (!d || *d != std::floor(*d) || *d < 0 || *d >= 0x1p64) fail_type(key, *value, expected);
  return static_cast<uint64_t>(*d);
}

std::optional<uint64_t> JsonBlock::bytes(std::string_view key) {
  const Json* value = take(key);
  if (value == nullptr) return std::nullopt;
  const std::string expected =
      "a byte size: a whole number of bytes or a string such as \"8GB\", \"8GiB\", \"512M\"";
  if (value->is_string()) {
    std::optional<uint64_t> parsed = parse_byte_size(value->get_ref<const std::string&>());
    if (!parsed) fail_type(key, *value, expected);
    return parsed;
  }
  std::optional<double> d = as_double(*value);
  if (!d || *d != std::floor(*d) || *d < 0 || *d >= 0x1p63) fail_type(key, *value, expected);
  return value->is_number_unsigned() ? value->get<uint64_t>() : static_cast<uint64_t>(*d);
}

std::string JsonBlock::string(std::string_view key, const std::string& fallback) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  if (!value->is_string()) fail_type(key, *value, "a string");
  return value->get<std::string>();
}

size_t JsonBlock::choice(std::string_view key, const std::vector<std::string_view>& choices,
                         size_t fallback) {
  const Json* value = take(key);
  if (value == nullptr) return fallback;
  std::string list;
  for (std::string_view c : choices) {
    list += fmt::format("{}\"{}\"", list.empty() ? "" : ", ", c);
  }
  const std::string expected = fmt::format("one of {}", list);
  if (!value->is_string()) fail_type(key, *value, expected);
  const std::string seen = lower(value->get_ref<const std::string&>());
  for (size_t i = 0; i < choices.size(); ++i) {
    if (lower(choices[i]) == seen) return i;
  }
  fail_type(key, *value, expected);
}

std::optional<JsonBlock> JsonBlock::block(std::string_view key) {
  const Json* value = take(key);
  if (value == nullptr) return std::nullopt;
  if (!value->is_object()) fail_type(key, *value, "an object ({...})");
  return JsonBlock(*value, path_of(key), *context_);
}

void JsonBlock::accept(std::initializer_list<std::string_view> keys) {
  for (std::string_view key : keys) read_.emplace(key);
}

void JsonBlock::unsupported(std::string_view key, const Json& inert, std::string_view note) {
  const Json* value = take(key);
  if (value == nullptr || *value == inert) return;
  context_->warn(path_of(key), fmt::format("{} is not supported by zinf and is ignored{}{}",
                                           describe(*value), note.empty() ? "" : ": ", note));
}

void JsonBlock::finish(const std::vector<std::string_view>& known) {
  for (const auto& [key, value] : object_->items()) {
    if (read_.count(key) != 0) continue;
    std::string_view nearest;
    size_t best = 3;  // suggest only keys within two edits
    for (std::string_view candidate : known) {
      const size_t d = edit_distance(lower(key), lower(candidate));
      if (d < best) {
        best = d;
        nearest = candidate;
      }
    }
    context_->warn(path_of(key),
                   nearest.empty()
                       ? std::string("unknown key, ignored")
                       : fmt::format("unknown key, ignored (did you mean \"{}\"?)", nearest));
  }
}

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  // The number ends where the unit's letters begin; an 'e' followed by a digit or sign is an
  // exponent ("1e9"), not a unit.
  size_t split = 0;
  while (split < text.size()) {
    const char c = text[split];
    const bool exponent = (c == 'e' || c == 'E') && split > 0 && split + 1 < text.size() &&
                          (std::isdigit(static_cast<unsigned char>(text[split + 1])) ||
                           text[split + 1] == '+' || text[split + 1] == '-');
    if (std::isalpha(static_cast<unsigned char>(c)) && !exponent) break;
    split += exponent ? 2 : 1;
  }
  std::string_view number = text.substr(0, split);
  while (!number.empty() && std::isspace(static_cast<unsigned char>(number.back()))) {
    number.remove_suffix(1);
  }
  if (number.empty() || number.front() == '-' || number.front() == '+') return std::nullopt;
  double value = 0.0;
  auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (error != std::errc() || end != number.data() + number.size()) return std::nullopt;

  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"", 1.0},       {"b", 1.0},    {"k", 0x1p10},   {"kib", 0x1p10}, {"m", 0x1p20},
      {"mib", 0x1p20}, {"g", 0x1p30}, {"gib", 0x1p30}, {"t", 0x1p40},   {"tib", 0x1p40},
      {"kb", 1e3},     {"mb", 1e6},   {"gb", 1e9},     {"tb", 1e12},
  };
  const std::string unit = lower(text.substr(split));
  for (const auto& [name, factor] : kUnits) {
    if (name != unit) continue;
    const double bytes = value * factor;
    if (!std::isfinite(bytes) || bytes >= 0x1p63 || bytes != std::floor(bytes)) {
      return std::nullopt;
    }
    return static_cast<uint64_t>(bytes);
  }
  return std::nullopt;
}

}  // namespace zinf::config::detail
