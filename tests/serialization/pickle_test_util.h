// Helpers shared by pickle_test.cc and torch_archive_test.cc: running the Python fixture
// script (tests/serialization/fixtures/pickle_fixtures.py under /usr/bin/python3) and
// comparing the JSON descriptions it writes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

namespace zinf::serialization::test_util {

using Json = nlohmann::json;

inline constexpr const char* kPython = "/usr/bin/python3";

inline std::string fixture_script() {
  return std::string(ZINF_SERIALIZATION_FIXTURES) + "/pickle_fixtures.py";
}

// Runs a shell command; returns its exit status and collects its stdout.
inline int run(const std::string& command, std::string* output = nullptr) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    if (output != nullptr) output->append(buffer, n);
  }
  return ::pclose(pipe);
}

// Whether /usr/bin/python3 imports torch (the fixtures need it).
inline bool python_has_torch() {
  return run(std::string(kPython) + " -c 'import torch' 2>/dev/null") == 0;
}

inline Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}

inline std::string hex(std::span<const uint8_t> bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

inline std::string hex(std::string_view bytes) {
  return hex(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// Set elements sorted by their compact JSON, as the fixture script sorts them (Python's set
// order depends on the process's str hash seed).
inline Json canonical_order(Json items) {
  std::sort(items.begin(), items.end(),
            [](const Json& a, const Json& b) { return a.dump() < b.dump(); });
  return items;
}

// The path of the first place where `a` and `b` differ, with both values there; "" if equal.
inline std::string first_difference(const Json& a, const Json& b, const std::string& path = "$") {
  if (a == b) return {};
  if (a.type() == b.type() && a.is_array() && a.size() == b.size()) {
    for (size_t i = 0; i < a.size(); ++i) {
      std::string d = first_difference(a[i], b[i], path + "[" + std::to_string(i) + "]");
      if (!d.empty()) return d;
    }
  }
  if (a.type() == b.type() && a.is_object()) {
    for (const auto& [key, value] : a.items()) {
      if (!b.contains(key)) return path + "." + key + ": missing on the right";
      std::string d = first_difference(value, b[key], path + "." + key);
      if (!d.empty()) return d;
    }
  }
  return path + ": " + a.dump().substr(0, 300) + " vs " + b.dump().substr(0, 300);
}

}  // namespace zinf::serialization::test_util

#define EXPECT_SAME_JSON(a, b) \
  EXPECT_EQ(::zinf::serialization::test_util::first_difference((a), (b)), "")
