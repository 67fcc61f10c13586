// SmallTmpfs: a size-limited tmpfs mounted on a fresh temporary folder for the object's
// lifetime, for tests of full file systems. Mounting needs root (CAP_SYS_ADMIN): where it is
// refused, mounted() is false and error() says why, and the test skips with that reason.
//
// Thread safety: none (test code).
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/common/temp_dir.h"

namespace zinf::testing {

class SmallTmpfs {
 public:
  explicit SmallTmpfs(uint64_t bytes) {
    const std::string options = "size=" + std::to_string(bytes);
    if (::mount("zinf_test", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) !=
        0) {
      error_ = std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallTmpfs() {
    if (mounted_ && ::umount2(dir_.path().c_str(), MNT_DETACH) != 0) {
      ADD_FAILURE() << "umount " << dir_.path() << ": " << std::strerror(errno);
    }
  }
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;

  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return dir_.path(); }

  uint64_t free_bytes() const {
    struct statvfs fs {};
    return ::statvfs(dir_.path().c_str(), &fs) == 0
               ? static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize
               : 0;
  }

 private:
  TempDir dir_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace zinf::testing
