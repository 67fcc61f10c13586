// run_logged: runs a shell command with its stdout and stderr in a log file; a test failure
// that carries the command and the log's text when it does not exit 0. For tests that drive
// scripts and the real zinf binary (tests/engine).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace zinf::testing {

inline ::testing::AssertionResult run_logged(const std::string& command, const std::string& log) {
  if (std::system((command + " > '" + log + "' 2>&1").c_str()) == 0) {
    return ::testing::AssertionSuccess();
  }
  std::ifstream in(log);
  return ::testing::AssertionFailure() << command << " failed:\n"
                                       << std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace zinf::testing
