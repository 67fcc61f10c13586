// AioHandle: round trips at odd sizes and offsets, splits over workers, files beyond 4 GiB,
// concurrent async transfers across files and threads, O_DIRECT fallback, error reporting.
// Every test runs on each backend.
#include "aio/handle.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "aio/error.h"
#include "aio/fault_backend.h"
#include "aio/file_cache.h"
#include "tests/aio/test_util.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"

namespace zinf::aio {
namespace {

using testing::all_backends;
using testing::backend_param_name;
using testing::fill_random;
using testing::first_difference;
using testing::numbered;
using testing::ShiftedBuffer;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kMiB = 1 << 20;

uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

class HandleTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  AioConfig config(int parallelism = 1, uint64_t block_size = kMiB, int queue_depth = 8) const {
    AioConfig c;
    c.backend = GetParam();
    c.intra_op_parallelism = parallelism;
    c.block_size = block_size;
    c.queue_depth = queue_depth;
    return c;
  }

  // Writes `bytes` random bytes from a buffer shifted by `write_shift` at `offset`, reads
  // them back into a buffer shifted by `read_shift`, and compares.
  void round_trip(AioHandle& handle, const std::string& path, uint64_t bytes, uint64_t offset,
                  size_t write_shift, size_t read_shift, uint64_t seed) {
    SCOPED_TRACE(::testing::Message()
                 << "seed=" << seed << " bytes=" << bytes << " offset=" << offset
                 << " write_shift=" << write_shift << " read_shift=" << read_shift);
    ShiftedBuffer out(bytes, write_shift);
    fill_random(out.data(), bytes, seed);
    handle.pwrite(out.data(), bytes, path, offset);
    ShiftedBuffer in(bytes, read_shift);
    fill_random(in.data(), bytes, ~seed);  // garbage that must be overwritten
    handle.pread(in.data(), bytes, path, offset);
    ASSERT_EQ(first_difference(out.data(), in.data(), bytes), -1);
  }

  void check_buffered_fallback(const std::string& path);

  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
};

TEST_P(HandleTest, RoundTripsOddSizesOffsetsAndBuffers) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(3, 64 * 1024, 4));
  const uint64_t seed = seed_;
  const std::vector<uint64_t> sizes = {0, 1, 511, 4096, kMiB + 7};
  const std::vector<uint64_t> offsets = {0, 3 * 4096, 1234};
  int n = 0;
  for (uint64_t bytes : sizes) {
    for (uint64_t offset : offsets) {
      for (size_t shift : {size_t{0}, size_t{5}}) {
        const std::string path = dir_.file(numbered("f", n++));
        round_trip(handle, path, bytes, offset, shift, (shift + 3) % 7, seed + n);
        if (HasFatalFailure()) return;
        // Writes never extend a file beyond the last byte written.
        EXPECT_EQ(file_size(path), bytes == 0 ? 0 : offset + bytes) << path;
      }
    }
  }
}

TEST_P(HandleTest, RoundTrips64MiB) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(4, kMiB, 8));
  round_trip(handle, dir_.file("aligned"), 64 * kMiB, 0, 0, 0, seed_);
  round_trip(handle, dir_.file("unaligned"), 64 * kMiB, 123, 7, 0, seed_ + 1);
}

// Random writes (sizes 0..300 KiB, offsets anywhere in 1 MiB or past 4 GiB, shifted buffers)
// over an in-memory model of the file; every write is read back at once, and the whole
// range at the end, so a write that damaged its neighbours' bytes is caught.
TEST_P(HandleTest, RandomWritesMatchAModelOfTheFile) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(3, 64 * 1024, 4));
  const uint64_t seed = seed_;
  std::mt19937_64 rng(seed);
  for (uint64_t base : {uint64_t{0}, uint64_t{(4ull << 30) + 333}}) {
    const std::string path = dir_.file(numbered("model", base == 0 ? 0 : 1));
    constexpr uint64_t kSpan = kMiB + 300 * 1024;
    std::vector<std::byte> model(kSpan, std::byte{0});
    uint64_t written_end = 0;
    for (int i = 0; i < 24; ++i) {
      const uint64_t bytes = rng() % (300 * 1024);
      const uint64_t offset = rng() % kMiB;
      const size_t shift = rng() % 4096;
      SCOPED_TRACE(::testing::Message() << "write " << i << ": " << bytes << " bytes at "
                                        << base + offset << " shift " << shift);
      ShiftedBuffer out(bytes, shift);
      fill_random(out.data(), bytes, rng());
      handle.pwrite(out.data(), bytes, path, base + offset);
      std::copy(out.data(), out.data() + bytes, model.begin() + static_cast<ptrdiff_t>(offset));
      if (bytes > 0) written_end = std::max(written_end, offset + bytes);
      ShiftedBuffer in(bytes, rng() % 4096);
      handle.pread(in.data(), bytes, path, base + offset);
      ASSERT_EQ(first_difference(out.data(), in.data(), bytes), -1);
    }
    std::vector<std::byte> whole(written_end);
    handle.pread(whole.data(), whole.size(), path, base);
    ASSERT_EQ(first_difference(model.data(), whole.data(), whole.size()), -1);
    EXPECT_EQ(file_size(path), base + written_end);
  }
}

// A direct file has two descriptors: partial blocks are written through the buffered one
// (page cache), everything else O_DIRECT. Each read right after a write of the other kind
// must see it: direct block writes over dirty partial-block pages, partial writes into
// blocks last written directly, reads of both kinds of bytes through either path.
TEST_P(HandleTest, MixedDirectAndPartialBlockWritesStayCoherent) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(2, 16 * 1024, 4));
  const std::string path = dir_.file("mixed");
  constexpr uint64_t kSpan = 16 * 4096;
  std::vector<std::byte> model(kSpan);
  std::mt19937_64 rng(seed_);
  ShiftedBuffer first(kSpan, 0);
  fill_random(first.data(), kSpan, rng());
  handle.pwrite(first.data(), kSpan, path, 0);  // all direct
  std::copy(first.data(), first.data() + kSpan, model.begin());
  uint64_t block = 0;
  for (int i = 0; i < 40; ++i) {
    // Alternate: a few bytes inside one block (buffered), then two whole blocks (direct)
    // starting at that block, so they overwrite the bytes just written; every other partial
    // write goes into the second block the direct write just wrote.
    const bool partial = i % 2 == 0;
    // block + 1 <= 14, so the two direct blocks that follow end inside kSpan.
    if (partial) block = i % 4 == 2 ? block + 1 : rng() % 14;
    const uint64_t offset = partial ? block * 4096 + 1 + rng() % 4000 : block * 4096;
    const uint64_t bytes = partial ? 1 + rng() % (block * 4096 + 4095 - offset) : 4096 * 2;
    SCOPED_TRACE(::testing::Message() << "step " << i << ": " << bytes << " bytes at " << offset);
    ShiftedBuffer out(bytes, 0);
    fill_random(out.data(), bytes, rng());
    handle.pwrite(out.data(), bytes, path, offset);
    std::copy(out.data(), out.data() + bytes, model.begin() + static_cast<ptrdiff_t>(offset));
    // Aligned direct read of the blocks around it, and an unaligned read (bounce).
    ShiftedBuffer around(3 * 4096, 0);
    const uint64_t around_offset = std::min(kSpan - 3 * 4096, offset / 4096 * 4096);
    handle.pread(around.data(), around.size(), path, around_offset);
    ASSERT_EQ(first_difference(model.data() + around_offset, around.data(), around.size()), -1);
    ShiftedBuffer inner(bytes, 1);
    handle.pread(inner.data(), bytes, path, offset);
    ASSERT_EQ(first_difference(out.data(), inner.data(), bytes), -1);
  }
  std::vector<std::byte> whole(kSpan);
  handle.pread(whole.data(), kSpan, path, 0);
  EXPECT_EQ(first_difference(model.data(), whole.data(), kSpan), -1);
}

TEST_P(HandleTest, SplitsNotDivisibleByParallelism) {
  ASSERT_TRUE(dir_.ok());
  const uint64_t bytes = 3 * 4096 * 7 + 12345;  // not divisible by 3 or 4, not block aligned
  for (int parallelism : {1, 3, 4}) {
    for (bool overlap : {true, false}) {
      for (bool single : {false, true}) {
        AioConfig c = config(parallelism, 16 * 1024, 3);
        c.overlap_events = overlap;
        c.single_submit = single;
        AioHandle handle(c);
        SCOPED_TRACE(::testing::Message() << "parallelism=" << parallelism << " overlap=" << overlap
                                          << " single=" << single);
        const std::string path =
            dir_.file(numbered("p", parallelism * 100 + overlap * 10 + single));
        round_trip(handle, path, bytes, 0, 0, 0, seed_ + parallelism);
        round_trip(handle, path, bytes, 100, 3, 0, seed_ + 7 * parallelism);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_P(HandleTest, OffsetsBeyondFourGiBOnSparseFile) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(3));
  const std::string path = dir_.file("sparse");
  const uint64_t far = (5ull << 30) + 100;  // past 2^32, unaligned
  round_trip(handle, path, kMiB + 7, far, 0, 0, seed_);
  round_trip(handle, path, 64 * 1024, 1ull << 32, 0, 0, seed_ + 1);  // aligned at 2^32
  EXPECT_EQ(file_size(path), far + kMiB + 7);
  // The hole before it reads as zeros.
  std::vector<std::byte> hole(10000, std::byte{0xff});
  handle.pread(hole.data(), hole.size(), path, 3ull << 30);
  EXPECT_TRUE(std::all_of(hole.begin(), hole.end(), [](std::byte b) { return b == std::byte{0}; }));
}

TEST_P(HandleTest, ConcurrentAsyncTransfersAcrossFilesAndThreads) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(2, 64 * 1024, 4));
  constexpr int kThreads = 4;
  constexpr int kFilesPerThread = 3;
  constexpr int kChunks = 4;
  constexpr uint64_t kChunk = 256 * 1024 + 13;
  const uint64_t seed = seed_;
  std::vector<std::vector<std::byte>> data(kThreads * kFilesPerThread);
  for (size_t i = 0; i < data.size(); ++i) {
    data[i].resize(kChunks * kChunk);
    fill_random(data[i].data(), data[i].size(), seed + i);
  }
  auto name = [&](size_t i) { return dir_.file(numbered("c", static_cast<int>(i))); };
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int f = 0; f < kFilesPerThread; ++f) {
          const size_t i = static_cast<size_t>(t * kFilesPerThread + f);
          for (int c = 0; c < kChunks; ++c) {
            handle.async_pwrite(data[i].data() + c * kChunk, kChunk, name(i), c * kChunk);
          }
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  EXPECT_EQ(handle.wait(), kThreads * kFilesPerThread * kChunks);
  EXPECT_EQ(handle.pending(), 0);

  // Read back: each thread issues its reads and a synchronous read of its own, while
  // another thread waits.
  std::vector<std::vector<std::byte>> back(data.size());
  for (auto& b : back) b.resize(kChunks * kChunk);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int f = 0; f < kFilesPerThread; ++f) {
        const size_t i = static_cast<size_t>(t * kFilesPerThread + f);
        handle.async_pread(back[i].data(), kChunk * (kChunks - 1), name(i), 0);
        handle.pread(back[i].data() + (kChunks - 1) * kChunk, kChunk, name(i),
                     (kChunks - 1) * kChunk);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(handle.wait(), kThreads * kFilesPerThread);
  for (size_t i = 0; i < data.size(); ++i) {
    ASSERT_EQ(first_difference(data[i].data(), back[i].data(), data[i].size()), -1) << name(i);
  }
}

TEST_P(HandleTest, NeighbouringUnalignedAsyncWritesKeepEachOthersBytes) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(2, 4096, 8));
  const std::string path = dir_.file("neighbours");
  constexpr size_t kPiece = 100;
  constexpr size_t kPieces = 200;  // pieces share 4096-byte blocks
  std::vector<std::byte> data(kPiece * kPieces);
  fill_random(data.data(), data.size(), seed_);
  for (size_t i = 0; i < kPieces; ++i) {
    handle.async_pwrite(data.data() + i * kPiece, kPiece, path, i * kPiece);
  }
  EXPECT_EQ(handle.wait(), static_cast<int>(kPieces));
  std::vector<std::byte> back(data.size());
  handle.pread(back.data(), back.size(), path, 0);
  EXPECT_EQ(first_difference(data.data(), back.data(), data.size()), -1);
  EXPECT_EQ(file_size(path), data.size());
}

TEST_P(HandleTest, ReadingPastEndOfFileIsAnErrorNamingTheFile) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(2, 16 * 1024, 4));
  const std::string path = dir_.file("short");
  std::vector<std::byte> data(10000);
  fill_random(data.data(), data.size(), seed_);
  handle.pwrite(data.data(), data.size(), path, 0);
  // Up to the exact end works (the last block is partial).
  std::vector<std::byte> back(data.size());
  handle.pread(back.data(), back.size(), path, 0);
  EXPECT_EQ(first_difference(data.data(), back.data(), data.size()), -1);
  for (uint64_t offset : {uint64_t{0}, uint64_t{8192}, uint64_t{20000}}) {
    std::vector<std::byte> big(20000);
    try {
      handle.pread(big.data(), big.size(), path, offset);
      FAIL() << "read past the end succeeded at offset " << offset;
    } catch (const IoError& e) {
      EXPECT_EQ(e.path(), path);
      EXPECT_EQ(e.op(), "read");
      EXPECT_NE(std::string(e.what()).find("end of file"), std::string::npos) << e.what();
      EXPECT_GE(e.offset(), offset);
    }
  }
}

TEST_P(HandleTest, MissingFileFailsToOpenForRead) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config());
  const std::string path = dir_.file("missing");
  std::byte b[16];
  try {
    handle.pread(b, sizeof(b), path, 0);
    FAIL() << "read of a missing file succeeded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.op(), "open");
    EXPECT_EQ(e.error(), ENOENT);
  }
  // Async: reported by wait(), other transfers still complete.
  const std::string other = dir_.file("other");
  std::vector<std::byte> data(5000, std::byte{7});
  handle.async_pread(b, sizeof(b), path, 0);
  handle.async_pwrite(data.data(), data.size(), other, 0);
  EXPECT_THROW(handle.wait(), IoError);
  EXPECT_EQ(handle.pending(), 0);
  EXPECT_EQ(file_size(other), data.size());
}

// A transfer that fails before it starts (its file cannot be opened) is done at once. A wait()
// looping on another thread may collect and free it the moment it is queued: async_pread must
// not touch it afterwards (a heap use-after-free under AddressSanitizer before the fix).
TEST_P(HandleTest, FailedAsyncTransferRacingAWaitLoop) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(2));
  const std::string missing = dir_.file("missing");
  constexpr int kIterations = 20000;
  std::atomic<bool> submitting{true};
  std::atomic<int> failures{0};
  std::string wrong_error;  // written by the waiter only, read after join
  std::thread waiter([&] {
    for (;;) {
      const bool last = !submitting.load(std::memory_order_acquire);
      try {
        handle.wait();
      } catch (const IoError& e) {
        failures.fetch_add(1, std::memory_order_relaxed);
        if (e.path() != missing || e.error() != ENOENT) wrong_error = e.what();
      }
      if (last) return;
    }
  });
  std::byte b[16];
  for (int i = 0; i < kIterations; ++i) handle.async_pread(b, sizeof(b), missing, 0);
  submitting.store(false, std::memory_order_release);
  waiter.join();
  EXPECT_EQ(wrong_error, "");
  EXPECT_GE(failures.load(), 1);
  EXPECT_EQ(handle.pending(), 0);
}

// tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: either way transfers work,
// and the path is listed as buffered exactly when O_DIRECT was refused.
TEST_P(HandleTest, WorksOnTmpfsWithOrWithoutODirect) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "/dev/shm is missing";
  TempDir shm("/dev/shm");
  if (!shm.ok()) GTEST_SKIP() << "cannot create a directory in /dev/shm";
  const std::string probe = shm.file("probe");
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  const bool refused = fd < 0 && errno == EINVAL;
  if (fd >= 0) ::close(fd);
  const std::string path = shm.file("data");
  AioHandle handle(config(3, 64 * 1024, 4));
  round_trip(handle, path, kMiB + 7, 0, 0, 0, seed_);
  round_trip(handle, path, 511, 777, 3, 1, seed_ + 1);
  const std::vector<std::string> buffered = handle.buffered_paths();
  EXPECT_EQ(std::find(buffered.begin(), buffered.end(), path) != buffered.end(), refused);
}

// Filesystems that accept O_DIRECT: refuse it for paths containing "nodirect" through the
// open seam, so the buffered path is exercised on every kernel.
TEST_P(HandleTest, FallsBackToBufferedIoWhenODirectIsRefused) {
  ASSERT_TRUE(dir_.ok());
  set_open_function_for_testing([](const char* path, int flags, unsigned mode) -> int {
    if ((flags & O_DIRECT) != 0 && std::string_view(path).find("nodirect") != std::string::npos) {
      return -EINVAL;
    }
    const int fd = ::open(path, flags, mode);
    return fd >= 0 ? fd : -errno;
  });
  struct Restore {
    ~Restore() { set_open_function_for_testing(nullptr); }
  } restore;
  check_buffered_fallback(dir_.file("nodirect.bin"));
}

void HandleTest::check_buffered_fallback(const std::string& path) {
  AioHandle handle(config(3, 64 * 1024, 4));
  round_trip(handle, path, kMiB + 7, 0, 0, 0, seed_);
  round_trip(handle, path, 511, 777, 3, 1, seed_ + 1);
  const std::vector<std::string> buffered = handle.buffered_paths();
  EXPECT_NE(std::find(buffered.begin(), buffered.end(), path), buffered.end());
}

TEST_P(HandleTest, StatsCountBytesAndBouncing) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(1, 64 * 1024, 4));
  EXPECT_EQ(handle.backend_name(), to_string(GetParam()));
  const std::string path = dir_.file("stats");
  ShiftedBuffer aligned(256 * 1024, 0);
  fill_random(aligned.data(), aligned.size(), seed_);
  handle.pwrite(aligned.data(), aligned.size(), path, 0);
  AioStats s = handle.stats();
  EXPECT_EQ(s.bytes_written, aligned.size());
  EXPECT_EQ(s.bounced_bytes, 0u);  // congruent buffer: straight from user memory
  ShiftedBuffer shifted(256 * 1024, 1);
  handle.pread(shifted.data(), shifted.size(), path, 0);
  s = handle.stats();
  EXPECT_EQ(s.bytes_read, shifted.size());
  EXPECT_EQ(s.bounced_bytes, shifted.size());
  EXPECT_GE(s.requests, 8u);
}

TEST_P(HandleTest, DestructorDrainsInFlightTransfers) {
  ASSERT_TRUE(dir_.ok());
  const std::string path = dir_.file("drain");
  std::vector<std::byte> data(4 * kMiB);
  fill_random(data.data(), data.size(), seed_);
  // Every request's submission is held back a little, so the transfer is surely still in
  // flight when the destructor starts.
  auto faults = std::make_shared<FaultInjector>();
  faults->add(
      FaultRule{.count = 0, .kind = FaultKind::kDelay, .delay = std::chrono::microseconds(500)});
  {
    AioHandle handle(config(2, 256 * 1024, 4), fault_backend_factory(faults));
    handle.async_pwrite(data.data(), data.size(), path, 0);
    EXPECT_EQ(handle.pending(), 1);
  }  // no wait(): the destructor finishes the write
  EXPECT_EQ(faults->fired(0), 16u);
  AioHandle handle(config());
  std::vector<std::byte> back(data.size());
  handle.pread(back.data(), back.size(), path, 0);
  EXPECT_EQ(first_difference(data.data(), back.data(), data.size()), -1);
}

TEST(HandleConfigTest, RejectsBadConfig) {
  AioConfig c;
  c.block_size = 1000;
  EXPECT_THROW(AioHandle{c}, std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, HandleTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
