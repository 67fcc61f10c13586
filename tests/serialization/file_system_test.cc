// The FileSystem seam (serialization/file_system.h) and the power-loss fake built on it
// (tests/common/fault_injection_file_system.h): the fake takes back exactly what was not
// synced — file bytes past the last fsync, directory entries changed since the directory's
// last fsync, newest first — and nothing that was; AtomicFile, with the power failing at
// every one of its calls in turn, leaves its path holding the old bytes or the new ones, and
// the new ones once commit() returned.
#include "serialization/file_system.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "serialization/atomic_file.h"
#include "serialization/serialization_error.h"
#include "tests/common/fault_injection_file_system.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"

namespace zinf::serialization {
namespace {

namespace fs = std::filesystem;
using zinf::testing::FaultInjectionFileSystem;
using zinf::testing::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `bytes` to a new file `path` through `files`; fsyncs it when `sync`.
void write_new(FileSystem& files, const std::string& path, const std::string& bytes, bool sync) {
  const int fd = files.open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(-fd);
  ASSERT_EQ(files.pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<int64_t>(bytes.size()));
  if (sync) {
    ASSERT_EQ(files.fsync(fd), 0);
  }
  ASSERT_EQ(files.close(fd), 0);
}

// The fake over a fresh folder: `dir` is where files go, the graveyard beside it.
struct Fixture {
  TempDir temp;
  std::string dir = temp.file("d");
  FaultInjectionFileSystem files{temp.file("graveyard")};
  Fixture() { fs::create_directories(dir); }  // made outside the fake: durable
  std::string at(const std::string& name) const { return dir + "/" + name; }
};

TEST(FileSystem, PosixIsTheDefaultAndATestCanReplaceIt) {
  EXPECT_EQ(&default_file_system(), &posix_file_system());
  Fixture f;
  FileSystem* previous = set_default_file_system(&f.files);
  EXPECT_EQ(previous, &posix_file_system());
  EXPECT_EQ(&default_file_system(), &f.files);
  EXPECT_EQ(set_default_file_system(nullptr), &f.files);
  EXPECT_EQ(&default_file_system(), &posix_file_system());
}

TEST(FileSystem, PosixCallsReturnMinusErrno) {
  TempDir temp;
  FileSystem& files = posix_file_system();
  EXPECT_EQ(files.open(temp.file("missing/x"), O_WRONLY | O_CREAT, 0644), -ENOENT);
  EXPECT_EQ(files.rename(temp.file("a"), temp.file("b")), -ENOENT);
  EXPECT_EQ(files.rmdir(temp.file("a")), -ENOENT);
  EXPECT_EQ(files.mkdir(temp.path(), 0777), -EEXIST);
  std::string failed;
  std::ofstream(temp.file("file")) << "x";
  EXPECT_EQ(create_directories(files, temp.file("file/sub"), &failed), -ENOTDIR);
  EXPECT_EQ(failed, temp.file("file/sub"));
}

TEST(FaultInjection, AFileNeverSyncedVanishes) {
  Fixture f;
  write_new(f.files, f.at("a"), "bytes", false);
  ASSERT_EQ(read_all(f.at("a")), "bytes");  // the process sees what it wrote
  const auto loss = f.files.drop_unsynced();
  EXPECT_FALSE(fs::exists(f.at("a")));
  EXPECT_EQ(loss.entries, 1);
}

TEST(FaultInjection, ASyncedFileVanishesUntilItsDirectoryIsSynced) {
  Fixture f;
  write_new(f.files, f.at("a"), "bytes", true);
  f.files.drop_unsynced();
  EXPECT_FALSE(fs::exists(f.at("a")));

  write_new(f.files, f.at("b"), "bytes", true);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("b")), "bytes");
}

TEST(FaultInjection, AnEntrySyncedWithoutItsDataKeepsNoBytes) {
  Fixture f;
  write_new(f.files, f.at("a"), "bytes", false);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);
  f.files.drop_unsynced();
  ASSERT_TRUE(fs::exists(f.at("a")));
  EXPECT_EQ(fs::file_size(f.at("a")), 0u);
}

TEST(FaultInjection, BytesPastTheLastFsyncAreCutAndSyncedBytesOverwrittenComeBack) {
  Fixture f;
  write_new(f.files, f.at("a"), "0123456789", true);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);
  const int fd = f.files.open(f.at("a"), O_WRONLY | O_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(f.files.pwrite(fd, "abcdefgh", 8, 6), 8);  // 4 synced bytes changed, 4 appended
  ASSERT_EQ(f.files.ftruncate(fd, 3), 0);              // and cut below the synced size
  ASSERT_EQ(f.files.pwrite(fd, "XY", 2, 1), 2);
  ASSERT_EQ(f.files.close(fd), 0);
  ASSERT_EQ(read_all(f.at("a")), "0XY");
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("a")), "0123456789");

  // Synced, the same changes stay.
  const int again = f.files.open(f.at("a"), O_WRONLY | O_TRUNC | O_CLOEXEC, 0);
  ASSERT_GE(again, 0);
  ASSERT_EQ(f.files.pwrite(again, "new", 3, 0), 3);
  ASSERT_EQ(f.files.fsync(again), 0);
  ASSERT_EQ(f.files.pwrite(again, "er", 2, 3), 2);
  ASSERT_EQ(f.files.close(again), 0);
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("a")), "new");
}

TEST(FaultInjection, ARenameOverAFileIsUndoneUntilTheDirectoryIsSynced) {
  Fixture f;
  std::ofstream(f.at("old")) << "old";  // outside the fake: durable
  write_new(f.files, f.at("tmp"), "new", true);
  ASSERT_EQ(f.files.rename(f.at("tmp"), f.at("old")), 0);
  ASSERT_EQ(read_all(f.at("old")), "new");
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("old")), "old") << "the replaced file is back";
  EXPECT_FALSE(fs::exists(f.at("tmp"))) << "created, never made durable";

  write_new(f.files, f.at("tmp"), "new", true);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);  // tmp durable
  ASSERT_EQ(f.files.rename(f.at("tmp"), f.at("old")), 0);
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("old")), "old");
  EXPECT_EQ(read_all(f.at("tmp")), "new") << "the rename went back";

  ASSERT_EQ(f.files.rename(f.at("tmp"), f.at("old")), 0);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("old")), "new");
  EXPECT_FALSE(fs::exists(f.at("tmp")));
  EXPECT_TRUE(fs::is_empty(f.temp.file("graveyard"))) << "the replaced file is gone for good";
}

TEST(FaultInjection, ExchangesRemovalsAndFoldersAreUndone) {
  Fixture f;
  fs::create_directories(f.at("a"));
  fs::create_directories(f.at("b"));
  std::ofstream(f.at("a/x")) << "a";
  std::ofstream(f.at("b/x")) << "b";
  std::ofstream(f.at("c")) << "c";
  ASSERT_EQ(f.files.exchange(f.at("a"), f.at("b")), 0);
  ASSERT_EQ(read_all(f.at("a/x")), "b");
  ASSERT_EQ(f.files.unlink(f.at("c")), 0);
  ASSERT_EQ(remove_all(f.files, f.at("b")), 0);  // the old a, and its file
  ASSERT_EQ(f.files.mkdir(f.at("new"), 0777), 0);
  write_new(f.files, f.at("new/y"), "y", true);
  ASSERT_EQ(sync_directory(f.files, f.at("new")), 0);  // its entry in d is still unsynced
  const auto loss = f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("a/x")), "a");
  EXPECT_EQ(read_all(f.at("b/x")), "b");
  EXPECT_EQ(read_all(f.at("c")), "c");
  EXPECT_FALSE(fs::exists(f.at("new"))) << "a folder whose entry was not synced";
  // The exchange, the unlinks of c and b/x, the rmdir of b, the mkdir (y's creation was synced).
  EXPECT_EQ(loss.entries, 5);

  // Removed durably from d, b's file is gone with it although b itself was never synced.
  ASSERT_EQ(remove_all(f.files, f.at("b")), 0);
  ASSERT_EQ(sync_directory(f.files, f.dir), 0);
  f.files.drop_unsynced();
  EXPECT_FALSE(fs::exists(f.at("b")));
  EXPECT_TRUE(fs::is_empty(f.temp.file("graveyard")));
}

TEST(FaultInjection, AFolderMadeAgainUnderItsNameIsAnotherFolder) {
  Fixture f;
  fs::create_directories(f.at("s"));
  std::ofstream(f.at("s/old")) << "old";
  ASSERT_EQ(remove_all(f.files, f.at("s")), 0);
  ASSERT_EQ(f.files.mkdir(f.at("s"), 0777), 0);
  write_new(f.files, f.at("s/new"), "new", true);
  ASSERT_EQ(sync_directory(f.files, f.at("s")), 0);  // the new folder's entries, not the old's
  f.files.drop_unsynced();
  EXPECT_EQ(read_all(f.at("s/old")), "old") << "the old folder is back, with its file";
  EXPECT_FALSE(fs::exists(f.at("s/new")));
}

TEST(FaultInjection, CreateDirectoriesSurvivesAPowerLoss) {
  Fixture f;
  ASSERT_EQ(create_directories(f.files, f.at("x/y/z")), 0);
  ASSERT_EQ(create_directories(f.files, f.at("x/y/z")), 0);  // all there: nothing to do
  f.files.drop_unsynced();
  EXPECT_TRUE(fs::is_directory(f.at("x/y/z")));
}

TEST(FaultInjection, TheKthCallFailsAndEveryLaterOne) {
  Fixture f;
  f.files.kill_at(3);
  const int64_t before = f.files.calls();
  const int fd = f.files.open(f.at("a"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);  // 1
  ASSERT_GE(fd, 0);
  EXPECT_EQ(f.files.pwrite(fd, "ab", 2, 0), 2);  // 2
  EXPECT_FALSE(f.files.dead());
  EXPECT_EQ(f.files.fsync(fd), -EIO);  // 3: the power fails
  EXPECT_TRUE(f.files.dead());
  EXPECT_EQ(f.files.pwrite(fd, "cd", 2, 2), -EIO);
  EXPECT_EQ(f.files.rename(f.at("a"), f.at("b")), -EIO);
  EXPECT_EQ(f.files.close(fd), 0) << "the descriptor is still released";
  EXPECT_EQ(read_all(f.at("a")), "ab") << "nothing changed after the failure";
  EXPECT_EQ(f.files.calls() - before, 3);
  f.files.drop_unsynced();
  EXPECT_FALSE(f.files.dead());
  EXPECT_FALSE(fs::exists(f.at("a")));
  EXPECT_EQ(f.files.mkdir(f.at("m"), 0777), 0) << "alive again";
}

TEST(FaultInjection, ARenameBetweenDirectoriesIsRefused) {
  Fixture f;
  fs::create_directories(f.at("sub"));
  std::ofstream(f.at("a")) << "a";
  EXPECT_EQ(f.files.rename(f.at("a"), f.at("sub/a")), -EXDEV);
  f.files.refuse_exchange(true);
  EXPECT_EQ(f.files.exchange(f.at("a"), f.at("sub")), -EINVAL);
}

// ---- AtomicFile under power loss ---------------------------------------------------------------

// Writes `bytes` to `path` with AtomicFile through `files`, in pieces: appends, a hole of
// `hole` bytes (zeros in `bytes` from its middle on), a patch; returns whether commit()
// returned.
bool write_atomic(FaultInjectionFileSystem& files, const std::string& path,
                  const std::vector<uint8_t>& bytes, size_t hole, AtomicFile::Mode mode) {
  FileSystem* const previous = set_default_file_system(&files);
  bool committed = false;
  try {
    AtomicFile file(path, mode);
    const size_t half = bytes.size() / 2;
    file.append(std::span(bytes).first(half));
    file.skip(hole);
    file.append(std::span(bytes).subspan(half + hole));
    file.patch(1, std::span(bytes).subspan(1, 3));
    file.commit();
    committed = true;
  } catch (const SerializationError&) {
    // the power failed; the fake refuses every call now
  }
  set_default_file_system(previous);
  return committed;
}

TEST(AtomicFileUnderPowerLoss, ThePathHoldsTheOldBytesOrTheNewOnesAtEveryCall) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  for (const AtomicFile::Mode mode : {AtomicFile::Mode::kDirect, AtomicFile::Mode::kBuffered}) {
    SCOPED_TRACE(mode == AtomicFile::Mode::kDirect ? "O_DIRECT" : "buffered");
    Fixture f;
    const std::string path = f.at("file");
    std::vector<uint8_t> old_bytes(1000 + rng() % 9000);
    for (uint8_t& b : old_bytes) b = static_cast<uint8_t>(rng());
    {
      std::ofstream out(path, std::ios::binary);  // outside the fake: durable
      out.write(reinterpret_cast<const char*>(old_bytes.data()),
                static_cast<std::streamsize>(old_bytes.size()));
    }
    // Odd sizes around the 4 KiB block, a hole in the middle.
    constexpr size_t kHole = 5000;
    std::vector<uint8_t> new_bytes(20000 + rng() % 70000);
    for (uint8_t& b : new_bytes) b = static_cast<uint8_t>(rng());
    std::fill_n(new_bytes.begin() + static_cast<long>(new_bytes.size() / 2), kHole, 0);
    const std::string old_text(old_bytes.begin(), old_bytes.end());
    const std::string new_text(new_bytes.begin(), new_bytes.end());

    const int64_t before = f.files.calls();
    ASSERT_TRUE(write_atomic(f.files, path, new_bytes, kHole, mode));
    const int64_t calls = f.files.calls() - before;
    ASSERT_GE(calls, 8);  // open(s), writes, ftruncate, fsync, rename, directory open+fsync
    f.files.drop_unsynced();
    ASSERT_TRUE(read_all(path) == new_text) << "commit() returned: the file is durable";

    for (int64_t k = 1; k <= calls + 1; ++k) {
      SCOPED_TRACE("the power fails at call " + std::to_string(k) + " of " + std::to_string(calls));
      // Back to the old bytes, durably.
      ASSERT_TRUE(write_atomic(f.files, path, old_bytes, 0, mode));
      f.files.drop_unsynced();
      ASSERT_TRUE(read_all(path) == old_text);
      f.files.kill_at(k);
      const bool committed = write_atomic(f.files, path, new_bytes, kHole, mode);
      EXPECT_EQ(committed, k > calls);
      f.files.drop_unsynced();
      // Until the directory's fsync, the last call, the rename is not durable: the old bytes.
      const std::string now = read_all(path);
      EXPECT_TRUE(now == (committed ? new_text : old_text))
          << now.size() << " bytes, " << (now == new_text ? "the new ones" : "neither");
      for (const auto& e : fs::directory_iterator(f.dir)) {
        EXPECT_EQ(e.path().filename(), "file") << "a temporary file survived";
      }
    }
  }
}

}  // namespace
}  // namespace zinf::serialization
