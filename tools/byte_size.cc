#include "tools/byte_size.h"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace zinf::tools {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

double multiplier_for(std::string_view suffix) {
  static const std::array<std::pair<std::string_view, double>, 14> kUnits = {{
      {"", 1.0},
      {"b", 1.0},
      {"k", 0x1p10},
      {"kib", 0x1p10},
      {"m", 0x1p20},
      {"mib", 0x1p20},
      {"g", 0x1p30},
      {"gib", 0x1p30},
      {"t", 0x1p40},
      {"tib", 0x1p40},
      {"kb", 1e3},
      {"mb", 1e6},
      {"gb", 1e9},
      {"tb", 1e12},
  }};
  for (const auto& [name, factor] : kUnits) {
    if (name == suffix) return factor;
  }
  return 0.0;
}

}  // namespace

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  auto fail = [&](std::string_view why) {
    return std::invalid_argument(
        fmt::format("{}: '{}' is not a byte size ({}); examples: "
                    "4096, 512K, 8M, 2G, 1.5GiB, 5GB, 1e9",
                    what, text, why));
  };
  size_t begin = 0;
  while (begin < text.size() && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  std::string_view body = text.substr(begin);
  if (body.empty()) throw fail("empty");
  if (body.front() == '-') throw fail("negative");

  // The numeric part: digits, one '.', and an exponent only when followed by a digit, so
  // that "1e9" is a number but "8e" is not silently accepted.
  size_t end = 0;
  bool seen_dot = false;
  while (end < body.size()) {
    char c = body[end];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      ++end;
    } else if (c == '.' && !seen_dot) {
      seen_dot = true;
      ++end;
    } else if ((c == 'e' || c == 'E') && end > 0 && end + 1 < body.size() &&
               (std::isdigit(static_cast<unsigned char>(body[end + 1])) || body[end + 1] == '+')) {
      ++end;
      if (body[end] == '+') ++end;
      while (end < body.size() && std::isdigit(static_cast<unsigned char>(body[end]))) ++end;
      break;
    } else {
      break;
    }
  }
  if (end == 0) throw fail("no number");
  std::string number(body.substr(0, end));
  double value = 0;
  auto [ptr, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || ptr != number.data() + number.size()) throw fail("bad number");

  std::string suffix = lower(body.substr(end));
  while (!suffix.empty() && std::isspace(static_cast<unsigned char>(suffix.back()))) {
    suffix.pop_back();
  }
  double factor = multiplier_for(suffix);
  if (factor == 0.0) throw fail(fmt::format("unknown unit '{}'", suffix));
  double bytes = value * factor;
  if (!std::isfinite(bytes) || bytes >= 0x1p63) throw fail("too large");
  if (bytes != std::floor(bytes)) throw fail("not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  static constexpr std::array<std::string_view, 5> kNames = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  uint64_t scale = 1;
  while (bytes / scale >= 1024 && unit + 1 < kNames.size()) {
    scale *= 1024;
    ++unit;
  }
  if (unit == 0 || bytes % scale == 0) return fmt::format("{} {}", bytes / scale, kNames[unit]);
  // Two decimals alone only when they are exact (1.50 GiB, 1.25 MiB). Otherwise the exact
  // bytes, so that 4095 never reads as "4.00 KiB"; from 1 MiB on with the rounded value
  // first, which is what a person reads ("953.67 MiB (1000000000 B)").
  const std::string rounded = fmt::format(
      "{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(scale), kNames[unit]);
  if ((bytes % scale) * 100 % scale == 0) return rounded;
  if (unit < 2) return fmt::format("{} B", bytes);
  return fmt::format("{} ({} B)", rounded, bytes);
}

}  // namespace zinf::tools
