// Tests of NvmeStore striping across several folders (zinf.nvme_paths): round trips of odd
// sizes across stripe boundaries, one file per folder with its share of the bytes, a folder
// without room reported by name, a broken engine on one folder, and concurrent queues.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aio/fault_backend.h"
#include "offload/error.h"
#include "offload/nvme_store.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/offload/test_util.h"

namespace zinf::offload {
namespace {

using testing::random_bytes;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kStripe = 64 << 10;  // small, so modest extents cross many stripes

NvmeStoreConfig striped_config(const std::vector<std::string>& folders, bool checksums) {
  NvmeStoreConfig config;
  config.nvme_paths = folders;
  config.rank = 3;
  config.name = "test";
  config.checksums = checksums;
  config.stripe_bytes = kStripe;
  config.aio.backend = aio::BackendKind::kPsync;
  config.aio.intra_op_parallelism = 2;
  return config;
}

class NvmeStoreStripe : public ::testing::TestWithParam<bool> {};

TEST_P(NvmeStoreStripe, OddSizesRoundTripAndEveryFolderHoldsItsShare) {
  const bool checksums = GetParam();
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir a;
  TempDir b;
  std::vector<std::string> files;
  {
    NvmeStore store(striped_config({a.path(), b.path()}, checksums));
    files = store.paths();
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(files[0], a.path() + "/zinf_swap/rank3/test.swp");
    EXPECT_EQ(files[1], b.path() + "/zinf_swap/rank3/test.swp");
    EXPECT_EQ(store.path(), files[0]);
    const std::vector<uint64_t> sizes = {1,           4095,          kStripe - 1, kStripe + 1,
                                         3 * kStripe, (1 << 20) + 7, 300001};
    testing::WrittenExtents written = testing::write_and_check_extents(store, rng, sizes);
    const std::vector<ExtentId>& ids = written.ids;
    std::vector<std::vector<uint8_t>>& data = written.data;
    // Each file holds its stripes of the allocated span, and together exactly the span.
    const NvmeStoreStats stats = store.stats();
    const uint64_t size_a = std::filesystem::file_size(files[0]);
    const uint64_t size_b = std::filesystem::file_size(files[1]);
    EXPECT_GT(size_a, 0u);
    EXPECT_GT(size_b, 0u);
    EXPECT_EQ(size_a + size_b, stats.file_bytes);
    EXPECT_EQ(stats.reserved_bytes, stats.file_bytes);
    // Partial transfers across a stripe boundary.
    std::vector<uint8_t> patch = random_bytes(rng, 5000);
    const uint64_t at = kStripe - 2000;
    store.write_range(ids[5], at, patch.data(), patch.size());
    std::copy(patch.begin(), patch.end(), data[5].begin() + static_cast<ptrdiff_t>(at));
    std::vector<uint8_t> part(3 * kStripe);
    store.read_range(ids[5], 100, part.data(), part.size());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), data[5].begin() + 100));
    std::vector<uint8_t> whole(sizes[5]);
    store.read(ids[5], whole.data());
    EXPECT_EQ(whole, data[5]);
    // Freeing the tail shrinks both files.
    for (size_t i = 0; i < ids.size(); ++i) {
      store.free(ids[i]);
    }
    EXPECT_EQ(std::filesystem::file_size(files[0]), 0u);
    EXPECT_EQ(std::filesystem::file_size(files[1]), 0u);
  }
  EXPECT_FALSE(std::filesystem::exists(a.path() + "/zinf_swap"));
  EXPECT_FALSE(std::filesystem::exists(b.path() + "/zinf_swap"));
}

INSTANTIATE_TEST_SUITE_P(Checksums, NvmeStoreStripe, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param_info) {
                           return std::string(param_info.param ? "Checksums" : "Plain");
                         });

// Reads `bytes` raw bytes of `path` at `offset`.
std::vector<uint8_t> raw_bytes(const std::string& path, uint64_t offset, size_t bytes) {
  std::vector<uint8_t> raw(bytes, 0);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  if (fd >= 0) {
    EXPECT_EQ(::pread(fd, raw.data(), bytes, static_cast<off_t>(offset)),
              static_cast<ssize_t>(bytes));
    ::close(fd);
  }
  return raw;
}

TEST(NvmeStoreStripe, StripesAlternateBetweenTheFolders) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir a;
  TempDir b;
  NvmeStore store(striped_config({a.path(), b.path()}, false));
  const ExtentId id = store.allocate(5 * kStripe);
  const std::vector<uint8_t> data = random_bytes(rng, 5 * kStripe);
  store.write(id, data.data());
  // Stripe k of the logical space lies in file k mod 2, at (k div 2) * kStripe.
  for (uint64_t k = 0; k < 5; ++k) {
    const auto begin = data.begin() + static_cast<ptrdiff_t>(k * kStripe);
    const std::vector<uint8_t> stripe(begin, begin + static_cast<ptrdiff_t>(kStripe));
    EXPECT_EQ(raw_bytes(store.paths()[k % 2], (k / 2) * kStripe, kStripe), stripe)
        << "stripe " << k;
  }
  EXPECT_EQ(std::filesystem::file_size(store.paths()[0]), 3 * kStripe);
  EXPECT_EQ(std::filesystem::file_size(store.paths()[1]), 2 * kStripe);
}

TEST(NvmeStoreStripe, OnePathInTheListIsTheSingleFolderLayout) {
  TempDir dir;
  NvmeStore store(striped_config({dir.path()}, true));
  EXPECT_EQ(store.paths(), std::vector<std::string>{dir.path() + "/zinf_swap/rank3/test.swp"});
  const ExtentId a = store.allocate(5000);
  const ExtentId b = store.allocate(3 * kStripe + 1);
  std::vector<uint8_t> data(3 * kStripe + 1, 0x3c);
  store.write(b, data.data());
  EXPECT_EQ(store.extent(a).file_offset, 0u);
  EXPECT_EQ(store.extent(b).file_offset, 8192u);  // the logical offset is the file offset
  EXPECT_EQ(std::filesystem::file_size(store.path()), store.stats().file_bytes);
  // The bytes lie in the file where the extent says.
  const int fd = ::open(store.path().c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> raw(data.size());
  ASSERT_EQ(::pread(fd, raw.data(), raw.size(), 8192), static_cast<ssize_t>(raw.size()));
  ::close(fd);
  EXPECT_EQ(raw, data);
}

TEST(NvmeStoreStripe, AFolderListedTwiceIsAConfigError) {
  TempDir dir;
  try {
    NvmeStore store(striped_config({dir.path(), dir.path() + "/."}, false));
    FAIL() << "one folder striped with itself";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
  }
  NvmeStoreConfig bad = striped_config({dir.path()}, false);
  bad.stripe_bytes = 1000;
  EXPECT_THROW(NvmeStore store(bad), OffloadError);
}

// The folder whose file the seam refuses (set by the test).
std::string& refused_folder() {
  static std::string folder;
  return folder;
}

int fallocate_refusing_one_folder(int fd, int mode, int64_t offset, int64_t length) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[PATH_MAX];
  const ssize_t n = ::readlink(link, target, sizeof(target) - 1);
  if (n > 0 && std::string(target, static_cast<size_t>(n)).find(refused_folder()) == 0) {
    return -ENOSPC;
  }
  return ::fallocate(fd, mode, offset, length) == 0 ? 0 : -errno;
}

TEST(NvmeStoreStripe, AFolderWithoutRoomIsReportedByName) {
  TempDir a;
  TempDir b;
  refused_folder() = std::filesystem::canonical(b.path()).string();
  set_fallocate_function_for_testing(&fallocate_refusing_one_folder);
  {
    NvmeStore store(striped_config({a.path(), b.path()}, true));
    const ExtentId id = store.allocate(4 * kStripe);
    std::vector<uint8_t> data(4 * kStripe, 1);
    try {
      store.write(id, data.data());
      ADD_FAILURE() << "a full folder went unnoticed";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kSpace);
      const std::string message = e.what();
      EXPECT_NE(message.find(store.paths()[1]), std::string::npos) << message;
      EXPECT_NE(message.find("reserving " + std::to_string(2 * kStripe) + " more bytes"),
                std::string::npos)
          << message;
    }
    // Nothing stays reserved in the folder that had room.
    EXPECT_EQ(std::filesystem::file_size(store.paths()[0]), 0u);
    EXPECT_EQ(store.stats().reserved_bytes, 0u);
    // The preflight (statvfs) names the folder, the needed and the free bytes too.
    set_fallocate_function_for_testing(nullptr);
    const ExtentId huge = store.allocate(uint64_t{1} << 60);
    try {
      store.reserve();
      ADD_FAILURE() << "2^60 bytes reserved";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kSpace);
      const std::string message = e.what();
      EXPECT_NE(message.find(store.paths()[0]), std::string::npos) << message;
      EXPECT_NE(message.find("bytes free"), std::string::npos) << message;
    }
    store.free(huge);
    store.write(id, data.data());  // room again: the store goes on
    std::vector<uint8_t> back(4 * kStripe, 0);
    store.read(id, back.data());
    EXPECT_EQ(back, data);
  }
  set_fallocate_function_for_testing(nullptr);
}

TEST(NvmeStoreStripe, BrokenEngineOnOneFolderIsReplaced) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir a;
  TempDir b;
  auto faults = std::make_shared<aio::FaultInjector>();
  NvmeStoreConfig config = striped_config({a.path(), b.path()}, true);
  config.backend_factory = aio::fault_backend_factory(faults);
  NvmeStore store(config);
  const ExtentId id = store.allocate(5 * kStripe + 99);
  const std::vector<uint8_t> data = random_bytes(rng, 5 * kStripe + 99);
  faults->add(aio::FaultRule{
      .op = aio::Op::kWrite, .path = b.path(), .kind = aio::FaultKind::kEngine, .error = EIO});
  try {
    store.write(id, data.data());
    FAIL() << "engine failure not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(store.paths()[1]), std::string::npos) << e.what();
  }
  for (int round = 0; round < 2; ++round) {
    store.write(id, data.data());
    std::vector<uint8_t> back(data.size(), 0);
    store.read(id, back.data());
    EXPECT_EQ(back, data) << "round " << round;
  }
}

TEST(NvmeStoreStripe, ConcurrentQueuesOnDisjointExtents) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  TempDir a;
  TempDir b;
  TempDir c;
  NvmeStore store(striped_config({a.path(), b.path(), c.path()}, true));
  const std::vector<int> failures =
      testing::concurrent_queue_round_trips(store, seed, 4, 6, 400000);
  for (size_t t = 0; t < failures.size(); ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace zinf::offload
