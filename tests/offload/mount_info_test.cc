// Tests of the /proc/self/mountinfo helpers: the octal unescape of a field, and
// describe_filesystem naming the type and mount point of a temporary directory.
#include "offload/mount_info.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "aio/file_cache.h"
#include "tests/common/temp_dir.h"

namespace zinf::offload {
namespace {

TEST(MountInfo, UnescapeTurnsOctalEscapesIntoBytes) {
  EXPECT_EQ(unescape_mount_field("/mnt/my\\040disk"), "/mnt/my disk");
  EXPECT_EQ(unescape_mount_field("a\\011b\\012c\\134d"), "a\tb\nc\\d");
  EXPECT_EQ(unescape_mount_field("\\040"), " ");
  EXPECT_EQ(unescape_mount_field("end\\040"), "end ");
  EXPECT_EQ(unescape_mount_field("\\1234"), "S4");  // 0123 is 'S'; the fourth digit is text
  EXPECT_EQ(unescape_mount_field("/plain/path"), "/plain/path");
  EXPECT_EQ(unescape_mount_field(""), "");
}

TEST(MountInfo, UnescapeKeepsWhatIsNoEscape) {
  EXPECT_EQ(unescape_mount_field("a\\04"), "a\\04");  // too short
  EXPECT_EQ(unescape_mount_field("\\"), "\\");
  EXPECT_EQ(unescape_mount_field("\\089"), "\\089");  // 8 and 9 are not octal
  EXPECT_EQ(unescape_mount_field("\\x41"), "\\x41");
  EXPECT_EQ(unescape_mount_field("\\\\040"), "\\ ");  // the second backslash starts it
}

// "type at mount point", split at the first " at ".
void split_description(const std::string& text, std::string& type, std::string& point) {
  const size_t at = text.find(" at ");
  ASSERT_NE(at, std::string::npos) << text;
  type = text.substr(0, at);
  point = text.substr(at + 4);
}

TEST(MountInfo, DescribesTheFileSystemOfADirectory) {
  if (!std::filesystem::exists("/proc/self/mountinfo")) {
    GTEST_SKIP() << "no /proc/self/mountinfo";
  }
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const aio::UniqueFd fd(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(fd);
  const std::string text = describe_filesystem(dir.path(), fd.get());
  std::string type;
  std::string point;
  split_description(text, type, point);
  EXPECT_FALSE(type.empty()) << text;
  EXPECT_EQ(type.find(' '), std::string::npos) << text;
  // The mount point contains the directory (as realpath resolves it).
  const std::string resolved = std::filesystem::canonical(dir.path()).string();
  ASSERT_FALSE(point.empty()) << text;
  const bool contains = point == "/" || resolved == point ||
                        (resolved.rfind(point, 0) == 0 && resolved[point.size()] == '/');
  EXPECT_TRUE(contains) << text << " for " << resolved;
  // The root's own file system is the one mounted at /.
  const aio::UniqueFd root(::open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  split_description(describe_filesystem("/", root.get()), type, point);
  EXPECT_EQ(point, "/");
}

}  // namespace
}  // namespace zinf::offload
