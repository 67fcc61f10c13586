// check_save_folder: the --save folder of `zinf train` is made and probed at start-up, and a
// folder holding another run's checkpoints is refused unless the run resumes from it or says
// --overwrite.
#include "tools/save_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include "tests/common/temp_dir.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;
using zinf::testing::TempDir;

// A checkpoint as `zinf train --save` leaves one: `latest` and a tag folder.
void fake_checkpoint(const std::string& root, const std::string& tag) {
  fs::create_directories(root + "/" + tag);
  std::ofstream(root + "/" + tag + "/mp_rank_00_model_states.pt") << "x";
  std::ofstream(root + "/latest") << tag;
}

std::string refusal(const std::string& save, const std::string& load, bool overwrite) {
  try {
    (void)check_save_folder(save, load, overwrite);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

TEST(SaveFolder, AMissingFolderIsCreatedWithItsParents) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string save = dir.path() + "/a/b/ck";
  const SaveFolderState s = check_save_folder(save, "", false);
  EXPECT_TRUE(s.created);
  EXPECT_TRUE(fs::is_directory(save));
  EXPECT_TRUE(fs::is_empty(save)) << "the write probe is removed";
}

TEST(SaveFolder, AnEmptyOrForeignFolderIsAccepted) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::ofstream(dir.path() + "/notes.txt") << "mine";
  fs::create_directories(dir.path() + "/data");
  const SaveFolderState s = check_save_folder(dir.path(), "", false);
  EXPECT_FALSE(s.created);
  EXPECT_TRUE(s.latest.empty());
  EXPECT_TRUE(s.tags.empty());
}

TEST(SaveFolder, AnotherRunsCheckpointsAreRefusedNamingLatestAndTheWaysOut) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  fake_checkpoint(dir.path(), "global_step2");
  fake_checkpoint(dir.path(), "global_step4");
  const std::string why = refusal(dir.path(), "", false);
  ASSERT_FALSE(why.empty()) << "accepted";
  EXPECT_NE(why.find("--save " + dir.path()), std::string::npos) << why;
  EXPECT_NE(why.find("latest global_step4"), std::string::npos) << why;
  EXPECT_NE(why.find("2 checkpoint folders (global_step2 ... global_step4)"), std::string::npos)
      << why;
  EXPECT_NE(why.find("--load"), std::string::npos) << why;
  EXPECT_NE(why.find("--overwrite"), std::string::npos) << why;

  // A folder holding tags but no `latest` (a copied one) is another run's too.
  fs::remove(dir.path() + "/latest");
  EXPECT_FALSE(refusal(dir.path(), "", false).empty());
}

TEST(SaveFolder, ResumingFromTheFolderOrOverwriteIsAccepted) {
  TempDir dir, other;
  ASSERT_TRUE(dir.ok() && other.ok());
  fake_checkpoint(dir.path(), "global_step4");
  // The same folder under another spelling.
  const SaveFolderState resumed = check_save_folder(dir.path(), dir.path() + "/./", false);
  EXPECT_TRUE(resumed.resumes_from_it);
  EXPECT_EQ(resumed.latest, "global_step4");
  // Loading from elsewhere does not make this folder the run's.
  EXPECT_FALSE(refusal(dir.path(), other.path(), false).empty());
  const SaveFolderState forced = check_save_folder(dir.path(), other.path(), true);
  EXPECT_TRUE(forced.overwrite_allowed);
  EXPECT_EQ(forced.tags, std::vector<std::string>{"global_step4"});
}

TEST(SaveFolder, AFolderThatCannotBeMadeOrWrittenIsNamed) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // procfs takes no new folders.
  const std::string in_proc = refusal("/proc/zinf-save-test", "", false);
  EXPECT_NE(
      in_proc.find("--save /proc/zinf-save-test: cannot create /proc/zinf-save-test in /proc"),
      std::string::npos)
      << in_proc;
  // A file where the folder should be.
  std::ofstream(dir.path() + "/file") << "x";
  const std::string file = refusal(dir.path() + "/file", "", false);
  EXPECT_NE(file.find("exists and is not a folder"), std::string::npos) << file;
  const std::string under_file = refusal(dir.path() + "/file/ck", "", false);
  EXPECT_NE(under_file.find("cannot create"), std::string::npos) << under_file;
}

TEST(SaveFolder, CheckpointTagsAreTheSubfoldersWithModelStates) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  fake_checkpoint(dir.path(), "global_step7");
  fs::create_directories(dir.path() + "/.global_step8.partial");  // a save's staging
  std::ofstream(dir.path() + "/.global_step8.partial/mp_rank_00_model_states.pt") << "x";
  fs::create_directories(dir.path() + "/plots");
  fs::create_directories(dir.path() + "/stage3");
  std::ofstream(dir.path() + "/stage3/zero_pp_rank_1_mp_rank_00_model_states.pt") << "x";
  EXPECT_EQ(checkpoint_tags(dir.path()), (std::vector<std::string>{"global_step7", "stage3"}));
  EXPECT_TRUE(checkpoint_tags(dir.path() + "/missing").empty());
}

}  // namespace
}  // namespace zinf::tools
