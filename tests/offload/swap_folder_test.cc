// Tests of the swap folder on its own: the names, taking it (folders, lock, empty swap file),
// a second taker refused while the lock is held, a stale swap file replaced, and removal
// leaving nothing behind.
#include "offload/swap_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "offload/error.h"
#include "tests/common/temp_dir.h"

namespace zinf::offload {
namespace {

namespace fs = std::filesystem;

SwapFolder named(const std::string& nvme_path, int rank, const std::string& name) {
  SwapFolder folder;
  folder.nvme_path = nvme_path;
  name_swap_folder(folder, rank, name);
  return folder;
}

TEST(SwapFolder, NamesTheFolderAndItsFiles) {
  const SwapFolder folder = named("/mnt/nvme", 3, "params");
  EXPECT_EQ(folder.directory, "/mnt/nvme/zinf_swap/rank3");
  EXPECT_EQ(folder.path, "/mnt/nvme/zinf_swap/rank3/params.swp");
  EXPECT_EQ(folder.lock_path, "/mnt/nvme/zinf_swap/rank3/params.lock");
  EXPECT_FALSE(folder.lock_fd);
  EXPECT_FALSE(folder.file_fd);
}

TEST(SwapFolder, TakeLocksAndRemoveLeavesNothing) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  SwapFolder folder = named(dir.path(), 0, "store");
  EXPECT_FALSE(take_swap_folder(folder));
  EXPECT_TRUE(folder.lock_fd);
  EXPECT_TRUE(folder.file_fd);
  EXPECT_TRUE(fs::exists(folder.lock_path));
  EXPECT_EQ(fs::file_size(folder.path), 0u);

  // A second taker (its own open file description) finds the lock held.
  SwapFolder other = named(dir.path(), 0, "store");
  try {
    (void)take_swap_folder(other);
    ADD_FAILURE() << "a held lock was taken twice";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("in use by another live process"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(other.lock_fd);
  remove_swap_folder(other);  // not ours: the files stay, the folders are not empty
  EXPECT_TRUE(fs::exists(folder.path));
  EXPECT_TRUE(fs::exists(folder.lock_path));

  remove_swap_folder(folder);
  EXPECT_FALSE(folder.lock_fd);
  EXPECT_FALSE(folder.file_fd);
  EXPECT_FALSE(fs::exists(dir.path() + "/zinf_swap"));
}

TEST(SwapFolder, ReplacesAStaleSwapFile) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  SwapFolder folder = named(dir.path(), 1, "store");
  fs::create_directories(folder.directory);
  {
    std::ofstream stale(folder.path);
    stale << std::string(5000, 'x');
  }
  EXPECT_TRUE(take_swap_folder(folder));
  EXPECT_EQ(fs::file_size(folder.path), 0u);
  remove_swap_folder(folder);
  EXPECT_FALSE(fs::exists(dir.path() + "/zinf_swap"));
}

}  // namespace
}  // namespace zinf::offload
