// Tests of NvmeStore: round trips on an O_DIRECT file system and on tmpfs, the extent
// allocator, the swap directory's life cycle (stale files, live locks, removal), the
// free-space preflight and corrupted extents (injected I/O faults: nvme_store_fault_test.cc).
#include "offload/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "aio/backend.h"
#include "aio/fault_backend.h"
#include "aio/file_cache.h"
#include "offload/error.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/offload/test_util.h"

namespace zinf::offload {
namespace {

using testing::random_bytes;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

NvmeStoreConfig store_config(const std::string& dir, bool checksums) {
  NvmeStoreConfig config;
  config.nvme_path = dir;
  config.rank = 3;
  config.name = "test";
  config.checksums = checksums;
  config.aio.backend = aio::BackendKind::kPsync;  // works in every sandbox
  config.aio.intra_op_parallelism = 2;
  return config;
}

void corrupt_byte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  byte ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(offset)), 1);
  ASSERT_EQ(::fsync(fd), 0);
  ::close(fd);
}

class NvmeStoreRoundTrip : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(NvmeStoreRoundTrip, OddSizesComeBackIdentical) {
  const auto [on_tmpfs, checksums] = GetParam();
  if (on_tmpfs && !testing::have_dev_shm()) {
    GTEST_SKIP() << "no /dev/shm";
  }
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir(on_tmpfs ? "/dev/shm" : "");
  NvmeStore store(store_config(dir.path(), checksums));
  const std::vector<uint64_t> sizes = {1, 4095, 4096, 4097, 65536 + 123, 1 << 20, 3 * 4096};
  testing::WrittenExtents written = testing::write_and_check_extents(store, rng, sizes);
  const std::vector<ExtentId>& ids = written.ids;
  std::vector<std::vector<uint8_t>>& data = written.data;
  for (ExtentId id : ids) {
    EXPECT_EQ(store.extent(id).file_offset % 4096, 0u);
  }
  const NvmeStoreStats stats = store.stats();
  if (!on_tmpfs) {
    EXPECT_FALSE(stats.buffered);  // ext4/xfs take O_DIRECT (tmpfs does on Linux >= 6.6)
  }
  EXPECT_EQ(stats.writes, sizes.size());
  EXPECT_EQ(stats.reads, sizes.size());
  // Partial transfers inside an extent.
  std::vector<uint8_t> patch = random_bytes(rng, 1000);
  store.write_range(ids[4], 777, patch.data(), patch.size());
  std::copy(patch.begin(), patch.end(), data[4].begin() + 777);
  std::vector<uint8_t> part(5000);
  store.read_range(ids[4], 500, part.data(), part.size());
  EXPECT_TRUE(std::equal(part.begin(), part.end(), data[4].begin() + 500));
  std::vector<uint8_t> whole(sizes[4]);
  store.read(ids[4], whole.data());
  EXPECT_EQ(whole, data[4]);
}

INSTANTIATE_TEST_SUITE_P(Media, NvmeStoreRoundTrip,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const auto& param_info) {
                           return std::string(std::get<0>(param_info.param) ? "Tmpfs" : "Disk") +
                                  (std::get<1>(param_info.param) ? "Checksums" : "Plain");
                         });

TEST(NvmeStore, LayoutAndRemovalAtCleanExit) {
  TempDir dir;
  std::string swap_file;
  {
    NvmeStore store(store_config(dir.path(), false));
    swap_file = store.path();
    EXPECT_EQ(swap_file, dir.path() + "/zinf_swap/rank3/test.swp");
    EXPECT_TRUE(std::filesystem::exists(swap_file));
    const ExtentId id = store.allocate(10000);
    std::vector<uint8_t> data(10000, 7);
    store.write(id, data.data());
    EXPECT_GE(std::filesystem::file_size(swap_file), 12288u);
  }
  EXPECT_FALSE(std::filesystem::exists(swap_file));
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/zinf_swap"));
}

TEST(NvmeStore, FailedConstructionLeavesNothingBehind) {
  TempDir dir;
  NvmeStoreConfig config = store_config(dir.path(), false);
  config.backend_factory = [](const aio::AioConfig&) -> std::unique_ptr<aio::Backend> {
    throw std::runtime_error("no I/O backend here");
  };
  EXPECT_THROW(NvmeStore store(config), std::runtime_error);
  // No swap file, lock or directory is left for the next run to take for a crashed one.
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/zinf_swap"));
  NvmeStore store(store_config(dir.path(), false));
  EXPECT_FALSE(store.stats().replaced_stale);
}

TEST(NvmeStore, DirectoriesSharedByTwoStoresGoWithTheLast) {
  TempDir dir;
  auto first = std::make_unique<NvmeStore>(store_config(dir.path(), false));
  NvmeStoreConfig other = store_config(dir.path(), false);
  other.name = "other";
  auto second = std::make_unique<NvmeStore>(other);
  first.reset();
  EXPECT_TRUE(std::filesystem::exists(second->path()));
  second.reset();
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/zinf_swap"));
}

// Stores of different ranks come and go in one nvme_path at once (ranks of a run, each in
// its own process): the last store of one rank removes the empty zinf_swap/ while another
// rank is between creating it and creating its own rank<r>/ in it. Every construction must
// still succeed.
TEST(NvmeStore, RanksCreatingAndRemovingTheSharedFolderAtOnceNeverFail) {
  TempDir dir;
  constexpr int kRanks = 3;
  constexpr int kRounds = 300;
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      NvmeStoreConfig config = store_config(dir.path(), false);
      config.rank = r;
      config.aio.intra_op_parallelism = 1;
      for (int i = 0; i < kRounds && errors[static_cast<size_t>(r)].empty(); ++i) {
        try {
          NvmeStore store(config);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = "round " + std::to_string(i) + ": " + e.what();
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/zinf_swap"));
}

// Opens with O_DIRECT are refused, as tmpfs before Linux 6.6 refuses them.
int open_refusing_direct(const char* path, int flags, unsigned mode) {
  if ((flags & O_DIRECT) != 0) {
    return -EINVAL;
  }
  const int fd = ::open(path, flags, mode);
  return fd >= 0 ? fd : -errno;
}

// Installs aio's open seam for its lifetime.
class ScopedOpenFunction {
 public:
  explicit ScopedOpenFunction(aio::OpenFunction function) {
    aio::set_open_function_for_testing(function);
  }
  ~ScopedOpenFunction() { aio::set_open_function_for_testing(nullptr); }
  ScopedOpenFunction(const ScopedOpenFunction&) = delete;
  ScopedOpenFunction& operator=(const ScopedOpenFunction&) = delete;
};

TEST(NvmeStore, BufferedFallbackIsReportedFromAnyQueue) {
  TempDir dir;
  const ScopedOpenFunction refuse_direct(&open_refusing_direct);
  {
    NvmeStore store(store_config(dir.path(), true));
    const ExtentId id = store.allocate(10000);
    std::vector<uint8_t> data(10000, 5);
    std::vector<uint8_t> back(10000, 0);
    auto queue = store.make_queue();  // not the store's own synchronous queue
    queue->async_write(id, data.data());
    queue->wait();
    queue->async_read(id, back.data());
    queue->wait();
    EXPECT_EQ(back, data);
    EXPECT_TRUE(store.stats().buffered);
  }
}

TEST(NvmeStore, AllocatorReusesFreedSpaceAligned) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  const ExtentId a = store.allocate(5000);  // [0, 8192)
  const ExtentId b = store.allocate(4096);  // [8192, 12288)
  const ExtentId c = store.allocate(100);   // [12288, 16384)
  EXPECT_EQ(store.extent(a).file_offset, 0u);
  EXPECT_EQ(store.extent(b).file_offset, 8192u);
  EXPECT_EQ(store.extent(c).file_offset, 12288u);
  EXPECT_EQ(store.extent(a).capacity, 8192u);
  store.free(a);
  store.free(b);  // merges with a: 12288 free bytes at 0
  const ExtentId d = store.allocate(12000);
  EXPECT_EQ(store.extent(d).file_offset, 0u);
  EXPECT_EQ(store.stats().file_bytes, 16384u);
  EXPECT_THROW((void)store.extent(a), OffloadError);
  EXPECT_THROW((void)store.allocate(0), OffloadError);
  std::vector<uint8_t> data(100);
  EXPECT_THROW(store.read(c, data.data()), OffloadError);  // never written
}

TEST(NvmeStore, StaleSwapFileFromACrashedRunIsReplaced) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() + "/zinf_swap/rank3");
  {
    std::ofstream stale(dir.path() + "/zinf_swap/rank3/test.swp");
    stale << std::string(10000, 'x');
  }
  NvmeStore store(store_config(dir.path(), true));
  EXPECT_TRUE(store.stats().replaced_stale);
  EXPECT_EQ(std::filesystem::file_size(store.path()), 0u);
  const ExtentId id = store.allocate(4096);
  std::vector<uint8_t> data(4096, 1);
  std::vector<uint8_t> back(4096, 0);
  store.write(id, data.data());
  store.read(id, back.data());
  EXPECT_EQ(back, data);
}

TEST(NvmeStore, SwapFileInUseByALiveStoreIsAnError) {
  TempDir dir;
  NvmeStore first(store_config(dir.path(), false));
  try {
    NvmeStore second(store_config(dir.path(), false));
    FAIL() << "two stores share one swap file";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("in use by another live process"), std::string::npos)
        << e.what();
  }
  NvmeStoreConfig other = store_config(dir.path(), false);
  other.name = "other";
  NvmeStore third(other);  // another name in the same rank directory is fine
}

TEST(NvmeStore, OutOfSpacePreflightNamesPathNeededAndFree) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  const ExtentId small = store.allocate(4096);
  const ExtentId huge = store.allocate(uint64_t{1} << 60);  // bookkeeping only: no error yet
  try {
    store.reserve();
    FAIL() << "preflight passed for 2^60 bytes";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace);
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    EXPECT_NE(message.find("needs " + std::to_string((uint64_t{1} << 60) + 4096)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("bytes free"), std::string::npos) << message;
  }
  EXPECT_EQ(std::filesystem::file_size(store.path()), 0u);  // nothing was reserved
  // A write reserves what it needs when not everything fits: the small extent works.
  std::vector<uint8_t> data(4096, 3);
  store.write(small, data.data());
  // The huge one is refused before any byte moves (its buffer is never touched).
  try {
    store.write(huge, data.data());
    FAIL() << "write of 2^60 bytes passed the space check";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kSpace);
    EXPECT_NE(std::string(e.what()).find("needs " + std::to_string(uint64_t{1} << 60)),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(store.reserve(), OffloadError);
  std::vector<uint8_t> back(4096, 0);
  store.read(small, back.data());
  EXPECT_EQ(back, data);
}

// Defect 2 of issue 8: free() never lowered the allocated end, so one allocation that did not
// fit made every later write demand its bytes again, even writes to reserved extents.
TEST(NvmeStore, AFailedReservationDoesNotWedgeTheStore) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  const ExtentId a = store.allocate(10000);
  const std::vector<uint8_t> data_a = random_bytes(rng, 10000);
  store.write(a, data_a.data());
  const uint64_t reserved = store.stats().reserved_bytes;
  EXPECT_EQ(reserved, 12288u);

  // A swapper whose constructor allocates more than the disk holds fails its preflight...
  const ExtentId huge = store.allocate(uint64_t{1} << 60);
  EXPECT_THROW(store.reserve(), OffloadError);
  // ...and meanwhile the extent whose space is reserved keeps working.
  const std::vector<uint8_t> next_a = random_bytes(rng, 10000);
  store.write(a, next_a.data());
  std::vector<uint8_t> back(10000, 0);
  store.read(a, back.data());
  EXPECT_EQ(back, next_a);

  // Once the failed allocation is returned, the store is as before it.
  store.free(huge);
  EXPECT_EQ(store.stats().file_bytes, 12288u);
  store.reserve();
  const ExtentId b = store.allocate(50000);
  EXPECT_EQ(store.extent(b).file_offset, 12288u);  // the freed tail is reused from its start
  const std::vector<uint8_t> data_b = random_bytes(rng, 50000);
  store.write(b, data_b.data());
  std::vector<uint8_t> back_b(50000, 0);
  store.read(b, back_b.data());
  EXPECT_EQ(back_b, data_b);
  store.read(a, back.data());
  EXPECT_EQ(back, next_a);
}

TEST(NvmeStore, FreeingTheTailGivesItsSpaceBack) {
  TempDir dir;
  NvmeStore store(store_config(dir.path(), false));
  const ExtentId a = store.allocate(4096);
  const ExtentId b = store.allocate(8192);
  const ExtentId c = store.allocate(4096);
  std::vector<uint8_t> data(8192, 9);
  store.write(a, data.data());
  store.write(b, data.data());
  store.write(c, data.data());
  EXPECT_EQ(store.stats().file_bytes, 16384u);
  EXPECT_EQ(std::filesystem::file_size(store.path()), 16384u);
  store.free(b);  // a hole: the file keeps its size
  EXPECT_EQ(store.stats().file_bytes, 16384u);
  store.free(c);  // c and the hole before it form the tail
  EXPECT_EQ(store.stats().file_bytes, 4096u);
  EXPECT_EQ(store.stats().reserved_bytes, 4096u);
  EXPECT_EQ(std::filesystem::file_size(store.path()), 4096u);
  std::vector<uint8_t> back(4096, 0);
  store.read(a, back.data());
  EXPECT_EQ(back, std::vector<uint8_t>(4096, 9));
  store.free(a);
  EXPECT_EQ(store.stats().file_bytes, 0u);
  const ExtentId d = store.allocate(100);
  EXPECT_EQ(store.extent(d).file_offset, 0u);
}

// Routes spdlog's default logger into a string for its lifetime.
class LogCapture {
 public:
  LogCapture()
      : previous_(spdlog::default_logger()),
        sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("capture", sink_));
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() {
    sink_->flush();
    return stream_.str();
  }
  // Lines containing `part`.
  int count(const std::string& part) {
    std::istringstream lines(text());
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
      n += line.find(part) != std::string::npos ? 1 : 0;
    }
    return n;
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> previous_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

int fallocate_not_supported(int, int, int64_t, int64_t) { return -EOPNOTSUPP; }

// Installs the store's fallocate seam for its lifetime.
class ScopedFallocateFunction {
 public:
  explicit ScopedFallocateFunction(FallocateFunction function) {
    set_fallocate_function_for_testing(function);
  }
  ~ScopedFallocateFunction() { set_fallocate_function_for_testing(nullptr); }
  ScopedFallocateFunction(const ScopedFallocateFunction&) = delete;
  ScopedFallocateFunction& operator=(const ScopedFallocateFunction&) = delete;
};

// Defect 9 of issue 8: without fallocate the store fell back to ftruncate silently.
TEST(NvmeStore, WithoutFallocateOneWarningNamesTheFileSystemAndNoSpaceIsACleanError) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const bool on_tmpfs = testing::have_dev_shm();
  TempDir dir(on_tmpfs ? "/dev/shm" : "");
  const ScopedFallocateFunction no_fallocate(&fallocate_not_supported);
  LogCapture log;
  auto faults = std::make_shared<aio::FaultInjector>();
  NvmeStoreConfig config = store_config(dir.path(), true);
  config.backend_factory = aio::fault_backend_factory(faults);
  NvmeStore store(config);
  const ExtentId a = store.allocate(100000);
  const std::vector<uint8_t> data_a = random_bytes(rng, 100000);
  store.write(a, data_a.data());
  const ExtentId b = store.allocate(200000);  // grows the file a second time
  const std::vector<uint8_t> data_b = random_bytes(rng, 200000);
  store.write(b, data_b.data());
  store.reserve();
  EXPECT_TRUE(store.stats().no_fallocate);
  EXPECT_EQ(store.stats().reserved_bytes, store.stats().file_bytes);
  EXPECT_EQ(log.count("does not support fallocate"), 1) << log.text();
  EXPECT_NE(log.text().find(store.path()), std::string::npos) << log.text();
  if (on_tmpfs) {
    EXPECT_NE(log.text().find("(tmpfs at "), std::string::npos) << log.text();
  }
  // The disk fills up: the write fails with a clean I/O error naming file and offset.
  const uint64_t offset_b = store.extent(b).file_offset;
  faults->add(aio::FaultRule{.op = aio::Op::kWrite,
                             .path = "test.swp",
                             .offset_begin = offset_b,
                             .kind = aio::FaultKind::kError,
                             .error = ENOSPC});
  const std::vector<uint8_t> next_b = random_bytes(rng, 200000);
  try {
    store.write(b, next_b.data());
    FAIL() << "injected ENOSPC not reported";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    // The offset of the failed request, inside the extent (which worker's part hit the fault
    // first is up to the scheduler).
    const size_t at = message.find("at offset ");
    ASSERT_NE(at, std::string::npos) << message;
    const uint64_t offset = std::stoull(message.substr(at + 10));
    EXPECT_GE(offset, offset_b) << message;
    EXPECT_LT(offset, offset_b + 200000) << message;
    EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
    EXPECT_NE(message.find("no fallocate"), std::string::npos) << message;
  }
  // What was written before is still served; once space is back the write goes through.
  std::vector<uint8_t> back_a(100000, 0);
  store.read(a, back_a.data());
  EXPECT_EQ(back_a, data_a);
  faults->clear();
  store.write(b, next_b.data());
  std::vector<uint8_t> back_b(200000, 0);
  store.read(b, back_b.data());
  EXPECT_EQ(back_b, next_b);
  EXPECT_EQ(log.count("does not support fallocate"), 1) << log.text();
}

// Issue 8: checksums are on unless the config turns them off (zinf.swap_checksums).
TEST(NvmeStore, ChecksumsAreOnByDefault) {
  EXPECT_TRUE(NvmeStoreConfig{}.checksums);
  TempDir dir;
  NvmeStoreConfig config;
  config.nvme_path = dir.path();
  config.aio.backend = aio::BackendKind::kPsync;
  NvmeStore store(config);
  const ExtentId id = store.allocate(8192);
  const std::vector<uint8_t> data(8192, 0x21);
  store.write(id, data.data());
  corrupt_byte(store.path(), store.extent(id).file_offset + 5000);
  std::vector<uint8_t> back(8192, 0);
  try {
    store.read(id, back.data());
    FAIL() << "a corrupted extent was read without error under the default config";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
  }
}

TEST(NvmeStore, CorruptExtentIsReportedWithFileAndOffset) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  const ExtentId a = store.allocate(20000);
  const ExtentId b = store.allocate(20000);
  const std::vector<uint8_t> data_a = random_bytes(rng, 20000);
  const std::vector<uint8_t> data_b = random_bytes(rng, 20000);
  store.write(a, data_a.data());
  store.write(b, data_b.data());
  const uint64_t offset_b = store.extent(b).file_offset;
  corrupt_byte(store.path(), offset_b + 12345);
  std::vector<uint8_t> back(20000);
  store.read(a, back.data());  // the neighbour is intact
  EXPECT_EQ(back, data_a);
  try {
    store.read(b, back.data());
    FAIL() << "corrupted extent read without error";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kCorrupt);
    const std::string message = e.what();
    EXPECT_NE(message.find(store.path()), std::string::npos) << message;
    EXPECT_NE(message.find("offset " + std::to_string(offset_b)), std::string::npos) << message;
  }
  // A partial read goes through the whole-extent check too.
  EXPECT_THROW(store.read_range(b, 0, back.data(), 10), OffloadError);
  // Rewriting the extent heals it.
  store.write(b, data_b.data());
  store.read(b, back.data());
  EXPECT_EQ(back, data_b);
}

// Extents over 2 MiB are hashed block by block on all cores: a flipped byte in any block,
// the short last one included, is still caught, and an intact extent reads back.
TEST(NvmeStore, LargeExtentChecksumCatchesACorruptByteInAnyBlock) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  constexpr uint64_t kBytes = (5u << 20) + 12288;  // 5 whole 1 MiB blocks and a short one
  const ExtentId id = store.allocate(kBytes);
  const std::vector<uint8_t> data = random_bytes(rng, kBytes);
  std::vector<uint8_t> back(kBytes);
  for (const uint64_t at : {uint64_t{0}, uint64_t{3u << 20} + 17, kBytes - 1}) {
    SCOPED_TRACE("corrupt byte at " + std::to_string(at));
    store.write(id, data.data());
    store.read(id, back.data());
    EXPECT_EQ(back, data);
    corrupt_byte(store.path(), store.extent(id).file_offset + at);
    try {
      store.read(id, back.data());
      FAIL() << "a corrupted large extent was read without error";
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kCorrupt) << e.what();
    }
  }
}

TEST(NvmeStore, ConcurrentQueuesOnDisjointExtents) {
  const auto seed = static_cast<uint32_t>(test_seed());
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  NvmeStore store(store_config(dir.path(), true));
  const std::vector<int> failures =
      testing::concurrent_queue_round_trips(store, seed, 4, 8, 200000);
  for (size_t t = 0; t < failures.size(); ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  }
}

}  // namespace
}  // namespace zinf::offload
