// Helpers shared by the serialization tests: whole-file I/O, running a /usr/bin/python3
// script (Debian's python3, which has zipfile and python3-torch; it may not be the python3
// first on PATH), and catching the SerializationError an action throws.
#pragma once

#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "serialization/serialization_error.h"

namespace zinf::serialization::testing {

inline constexpr const char* kPython = "/usr/bin/python3";

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

struct PythonResult {
  int status = -1;     // exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `script` (written to `dir`/name) with /usr/bin/python3 and `args`.
inline PythonResult run_python(const std::string& dir, const std::string& name,
                               const std::string& script, const std::vector<std::string>& args) {
  const std::string script_path = dir + "/" + name;
  {
    std::ofstream out(script_path);
    out << script;
  }
  std::string command = std::string(kPython) + " '" + script_path + "'";
  for (const std::string& arg : args) command += " '" + arg + "'";
  command += " 2>&1";
  PythonResult result;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  char chunk[4096];
  size_t got;
  while ((got = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0) result.output.append(chunk, got);
  const int status = ::pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.status = WEXITSTATUS(status);
  return result;
}

// The SerializationError `action` throws; a test failure and nullopt when it throws none.
inline std::optional<SerializationError> error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const SerializationError& e) {
    return e;
  }
  ADD_FAILURE() << "no SerializationError was thrown";
  return std::nullopt;
}

// Asserts that `action` throws a SerializationError whose message contains `part`.
inline void expect_error(const std::function<void()>& action, const std::string& part) {
  const std::optional<SerializationError> e = error_of(action);
  if (e) {
    EXPECT_NE(std::string(e->what()).find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << e->what();
  }
}

}  // namespace zinf::serialization::testing
