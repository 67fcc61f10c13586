// NvmeStore on a real, full file system: an 8 MiB tmpfs mounted by the test on a temporary
// folder and unmounted at its end (skipped, with the reason, where mounting is not
// permitted). With fallocate the store refuses what does not fit before any byte moves and
// keeps serving what does; without it (the fallocate seam answers EOPNOTSUPP) the kernel's
// ENOSPC strikes in the middle of a write, which must be a clean error after which the store
// goes on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "offload/error.h"
#include "offload/nvme_store.h"
#include "tests/common/seed.h"
#include "tests/common/small_tmpfs.h"
#include "tests/common/temp_dir.h"
#include "tests/offload/test_util.h"

namespace zinf::offload {
namespace {

using zinf::testing::SmallTmpfs;

using testing::random_bytes;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Writes a file of up to `bytes` bytes (another user of the disk); returns how many it got
// before the file system was full.
uint64_t fill(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    ADD_FAILURE() << "open " << path << ": " << std::strerror(errno);
    return 0;
  }
  const std::vector<uint8_t> block(64 << 10, 0x5a);
  uint64_t written = 0;
  while (written < bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(block.size(), bytes - written));
    const ssize_t rc = ::write(fd, block.data(), want);
    if (rc < 0 && errno == EINTR) {
      continue;
    }
    if (rc <= 0) {
      break;  // ENOSPC: full
    }
    written += static_cast<uint64_t>(rc);
  }
  ::close(fd);
  return written;
}

int fallocate_not_supported(int, int, int64_t, int64_t) { return -EOPNOTSUPP; }

class ScopedFallocateFunction {
 public:
  explicit ScopedFallocateFunction(FallocateFunction function) {
    set_fallocate_function_for_testing(function);
  }
  ~ScopedFallocateFunction() { set_fallocate_function_for_testing(nullptr); }
  ScopedFallocateFunction(const ScopedFallocateFunction&) = delete;
  ScopedFallocateFunction& operator=(const ScopedFallocateFunction&) = delete;
};

NvmeStoreConfig store_config(const std::string& dir) {
  NvmeStoreConfig config;
  config.nvme_path = dir;
  config.name = "full";
  config.checksums = true;
  config.aio.backend = aio::BackendKind::kPsync;
  config.aio.intra_op_parallelism = 2;
  return config;
}

#define ZINF_MOUNT_OR_SKIP(fs)                                                                     \
  if (!(fs).mounted()) {                                                                           \
    GTEST_SKIP() << "cannot mount a size-limited tmpfs on " << (fs).path() << " (" << (fs).error() \
                 << "); this test needs CAP_SYS_ADMIN (run it as root)";                           \
  }

TEST(NvmeStoreFullFileSystem, WhatDoesNotFitIsRefusedAndWhatFitsIsServed) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  SmallTmpfs fs(8 * kMiB);
  ZINF_MOUNT_OR_SKIP(fs);
  NvmeStore store(store_config(fs.path()));
  const ExtentId a = store.allocate(5 * kMiB);
  const std::vector<uint8_t> data_a = random_bytes(rng, 5 * kMiB);
  store.write(a, data_a.data());
  // 4 MiB more do not fit in the 3 MiB left: refused before a byte moves, naming the path.
  const ExtentId b = store.allocate(4 * kMiB);
  const std::vector<uint8_t> data_b = random_bytes(rng, 4 * kMiB);
  try {
    store.write(b, data_b.data());
    FAIL() << "4 MiB written into 3 MiB";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace) << e.what();
    EXPECT_NE(std::string(e.what()).find(store.path()), std::string::npos) << e.what();
  }
  // The extent that fits goes on being rewritten and read.
  const std::vector<uint8_t> next_a = random_bytes(rng, 5 * kMiB);
  store.write(a, next_a.data());
  std::vector<uint8_t> back(5 * kMiB, 0);
  store.read(a, back.data());
  EXPECT_EQ(back, next_a);
  // Returning the failed allocation lets a smaller one take its place.
  store.free(b);
  const ExtentId c = store.allocate(2 * kMiB);
  const std::vector<uint8_t> data_c = random_bytes(rng, 2 * kMiB);
  store.write(c, data_c.data());
  std::vector<uint8_t> back_c(2 * kMiB, 0);
  store.read(c, back_c.data());
  EXPECT_EQ(back_c, data_c);
  // Reserved space is the store's: another file cannot take it.
  const uint64_t other = fill(fs.path() + "/other.bin", 8 * kMiB);
  EXPECT_LE(other, 1 * kMiB + 64 * 1024);
  store.write(c, data_c.data());
  store.read(a, back.data());
  EXPECT_EQ(back, next_a);
}

TEST(NvmeStoreFullFileSystem, WithoutFallocateNoSpaceStrikesMidWriteAndTheStoreGoesOn) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  SmallTmpfs fs(8 * kMiB);
  ZINF_MOUNT_OR_SKIP(fs);
  const ScopedFallocateFunction no_fallocate(&fallocate_not_supported);
  NvmeStore store(store_config(fs.path()));
  const ExtentId a = store.allocate(3 * kMiB);
  const ExtentId b = store.allocate(3 * kMiB);
  store.reserve();  // passes its free-space check; reserves nothing (a sparse file)
  EXPECT_TRUE(store.stats().no_fallocate);
  const std::vector<uint8_t> data_a = random_bytes(rng, 3 * kMiB);
  store.write(a, data_a.data());
  // Another user of the disk leaves 1 MiB: b's write runs out of space part-way.
  const std::string other = fs.path() + "/other.bin";
  const uint64_t left = 1 * kMiB;
  ASSERT_GT(fs.free_bytes(), left);
  fill(other, fs.free_bytes() - left);
  const std::vector<uint8_t> data_b = random_bytes(rng, 3 * kMiB);
  const uint64_t offset_b = store.extent(b).file_offset;
  try {
    store.write(b, data_b.data());
    FAIL() << "3 MiB written into 1 MiB";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
    EXPECT_NE(message.find("no fallocate"), std::string::npos) << message;
    const size_t at = message.find("at offset ");
    ASSERT_NE(at, std::string::npos) << message;
    const uint64_t offset = std::stoull(message.substr(at + 10));
    EXPECT_GE(offset, offset_b) << message;
    EXPECT_LT(offset, offset_b + 3 * kMiB) << message;
  }
  // The half-written extent is torn; the one written before is intact and still served.
  std::vector<uint8_t> back(3 * kMiB, 0);
  EXPECT_THROW(store.read(b, back.data()), OffloadError);
  store.read(a, back.data());
  EXPECT_EQ(back, data_a);
  store.write(a, data_a.data());  // its blocks are allocated: a rewrite needs no space
  // Returning the torn extent gives its blocks back; what fits is served.
  store.free(b);
  const ExtentId c = store.allocate(512 << 10);
  const std::vector<uint8_t> data_c = random_bytes(rng, 512 << 10);
  store.write(c, data_c.data());
  std::vector<uint8_t> back_c(512 << 10, 0);
  store.read(c, back_c.data());
  EXPECT_EQ(back_c, data_c);
  // Once the disk has room again, a full-size extent goes through too.
  ASSERT_EQ(::unlink(other.c_str()), 0);
  const ExtentId d = store.allocate(3 * kMiB);
  store.write(d, data_b.data());
  store.read(d, back.data());
  EXPECT_EQ(back, data_b);
}

TEST(NvmeStoreFullFileSystem, AFullFolderAmongStripedOnesIsReportedByName) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  SmallTmpfs small(8 * kMiB);
  ZINF_MOUNT_OR_SKIP(small);
  TempDir roomy;
  NvmeStoreConfig config = store_config(small.path());
  config.nvme_paths = {roomy.path(), small.path()};
  NvmeStore store(config);
  // 20 MiB striped over two folders: 10 MiB each, and the tmpfs has 8.
  const ExtentId big = store.allocate(20 * kMiB);
  const std::vector<uint8_t> data = random_bytes(rng, 20 * kMiB);
  try {
    store.write(big, data.data());
    FAIL() << "10 MiB reserved on an 8 MiB tmpfs";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace) << e.what();
    const std::string message = e.what();
    EXPECT_NE(message.find(store.paths()[1]), std::string::npos) << message;
    EXPECT_NE(message.find("needs " + std::to_string(10 * kMiB)), std::string::npos) << message;
    EXPECT_NE(message.find("bytes free"), std::string::npos) << message;
  }
  // What fits in both goes on.
  store.free(big);
  const ExtentId fits = store.allocate(6 * kMiB);
  const std::vector<uint8_t> part(data.begin(), data.begin() + 6 * kMiB);
  store.write(fits, part.data());
  std::vector<uint8_t> back(6 * kMiB, 0);
  store.read(fits, back.data());
  EXPECT_EQ(back, part);
}

}  // namespace
}  // namespace zinf::offload
