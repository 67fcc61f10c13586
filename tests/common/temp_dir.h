// A self-removing temporary directory for tests: a fresh directory made with mkdtemp under a
// given parent (default: $TMPDIR, else /tmp), removed with its contents on destruction. When
// mkdtemp fails the test gets a non-fatal failure naming the parent and errno, and ok() is
// false.
//
// Thread safety: a TempDir is not synchronized; construct and destroy it on one thread. Its
// accessors are const and may be read from several threads once it is constructed.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace zinf::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& parent = {}) {
    std::string root = parent;
    if (root.empty()) {
      const char* env = std::getenv("TMPDIR");
      root = env != nullptr && *env != '\0' ? env : "/tmp";
    }
    const std::string pattern = root + "/zinf_test.XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp under " << root << " failed: " << std::strerror(errno);
    } else {
      path_ = buffer.data();
    }
  }
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(path_, ignored);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Whether the directory was made.
  bool ok() const { return !path_.empty(); }
  // The directory's path; empty when mkdtemp failed.
  const std::string& path() const { return path_; }
  // The path of `name` inside the directory.
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace zinf::testing
