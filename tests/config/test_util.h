// Helpers shared by the config tests: the message of the ConfigError a config gives, and
// assertions on its JSON path and reason.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <string_view>

#include "engine/config/run_config.h"

namespace zinf::config::testing {

// The ConfigError `action` throws; a test failure (and an empty error) when it throws none.
inline ConfigError error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const ConfigError& e) {
    return e;
  }
  ADD_FAILURE() << "no ConfigError was thrown";
  return ConfigError("", "", "");
}

// The ConfigError parsing `json` gives.
inline ConfigError parse_error(std::string_view json) {
  return error_of([&] { (void)parse_config_string(json, "test.json"); });
}

// Asserts that `e` names `path` and that its message contains each of `parts`.
inline void expect_error(const ConfigError& e, std::string_view path,
                         std::initializer_list<std::string_view> parts) {
  EXPECT_EQ(e.path(), path) << e.what();
  const std::string message = e.what();
  EXPECT_NE(message.find(std::string(path)), std::string::npos) << message;
  for (std::string_view part : parts) {
    EXPECT_NE(message.find(std::string(part)), std::string::npos)
        << "missing \"" << part << "\" in: " << message;
  }
}

// Whether any warning contains all of `parts`.
inline bool has_warning(const RunConfig& c, std::initializer_list<std::string_view> parts) {
  for (const std::string& w : c.warnings) {
    bool all = true;
    for (std::string_view part : parts) all = all && w.find(std::string(part)) != std::string::npos;
    if (all) return true;
  }
  return false;
}

}  // namespace zinf::config::testing
