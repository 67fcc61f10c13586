// Paths a user gets wrong are named for what they are: a parent that is a file, a
// character device (/dev/null, /dev/zero: nothing to time).
#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>
#include <string>

#include "tests/common/temp_dir.h"
#include "tools/io_job.h"

namespace zinf::tools {
namespace {

std::string error_of(const IoJob& job) {
  try {
    (void)run_io_job(job);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(IoJobPaths, ParentThatIsAFileIsNotAFolder) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::ofstream(dir.file("plain")) << "x";
  for (const std::string& path : {dir.file("plain/io.dat"), dir.file("plain/sub/io.dat")}) {
    IoJob j;
    j.path = path;
    j.size_bytes = 4096;
    j.loops = 1;
    std::string error = error_of(j);
    EXPECT_NE(error.find(dir.file("plain") + " is not a folder"), std::string::npos) << error;
    EXPECT_EQ(error.find("does not exist"), std::string::npos) << error;
  }
}

TEST(IoJobPaths, CharacterDevicesAreRefused) {
  for (const char* device : {"/dev/null", "/dev/zero"}) {
    for (bool write : {true, false}) {
      IoJob j;
      j.path = device;
      j.size_bytes = 4096;
      j.loops = 1;
      j.write = write;
      j.aio.backend = aio::BackendKind::kPsync;
      std::string error = error_of(j);
      EXPECT_NE(error.find("character device"), std::string::npos) << device << ": " << error;
    }
  }
}

}  // namespace
}  // namespace zinf::tools
