// Injected faults through FaultBackend: every one ends in either correct data (short
// transfers, EINTR, EAGAIN, delays) or an IoError naming the file and the failing range
// (EIO, ENOSPC, persistent EINTR) — never silent wrong data. Runs on each backend.
#include <gtest/gtest.h>

#include <cerrno>
#include <memory>
#include <string>
#include <vector>

#include "aio/error.h"
#include "aio/fault_backend.h"
#include "aio/handle.h"
#include "tests/aio/test_util.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"

namespace zinf::aio {
namespace {

using testing::all_backends;
using testing::backend_param_name;
using testing::fill_random;
using testing::first_difference;
using testing::ShiftedBuffer;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kBlockSize = 64 * 1024;
constexpr uint64_t kBytes = 1024 * 1024 + 4096 + 300;  // 16 whole requests, a block, a tail

class FaultTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  FaultTest() : faults_(std::make_shared<FaultInjector>()) {
    config_.backend = GetParam();
    config_.block_size = kBlockSize;
    config_.queue_depth = 4;
    config_.intra_op_parallelism = 2;
    data_.resize(kBytes);
    fill_random(data_.data(), data_.size(), seed_);
  }

  AioHandle make_handle() { return AioHandle(config_, fault_backend_factory(faults_)); }

  // Writes data_ to `name` without faults and returns its path.
  std::string prepare_file(const std::string& name) {
    const std::string path = dir_.file(name);
    AioHandle clean(config_);
    clean.pwrite(data_.data(), data_.size(), path, 0);
    return path;
  }

  // Reads `path` back without faults and compares it to data_.
  void expect_file_matches(const std::string& path) {
    AioHandle clean(config_);
    std::vector<std::byte> back(data_.size());
    clean.pread(back.data(), back.size(), path, 0);
    EXPECT_EQ(first_difference(data_.data(), back.data(), data_.size()), -1);
  }

  // Reads `path` through a faulty handle into a shifted buffer and compares.
  void expect_faulty_read_matches(const std::string& path, size_t shift) {
    SCOPED_TRACE(::testing::Message() << "shift=" << shift);
    AioHandle handle = make_handle();
    ShiftedBuffer back(data_.size(), shift);
    fill_random(back.data(), back.size(), ~seed_);
    handle.pread(back.data(), back.size(), path, 0);
    EXPECT_EQ(first_difference(data_.data(), back.data(), data_.size()), -1);
  }

  AioConfig config_;
  std::shared_ptr<FaultInjector> faults_;
  std::vector<std::byte> data_;
  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
};

TEST_P(FaultTest, EioOnReadNamesFileAndOffset) {
  const std::string path = prepare_file("eio.bin");
  const uint64_t bad = 5 * kBlockSize;
  faults_->add(FaultRule{.op = Op::kRead,
                         .path = "eio.bin",
                         .offset_begin = bad,
                         .offset_end = bad + 1,
                         .kind = FaultKind::kError,
                         .error = EIO});
  AioHandle handle = make_handle();
  std::vector<std::byte> back(data_.size());
  try {
    handle.pread(back.data(), back.size(), path, 0);
    FAIL() << "EIO was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.op(), "read");
    EXPECT_EQ(e.error(), EIO);
    EXPECT_EQ(e.offset(), bad);
    EXPECT_EQ(e.length(), kBlockSize);
    EXPECT_NE(std::string(e.what()).find("Input/output error"), std::string::npos) << e.what();
  }
  EXPECT_EQ(faults_->fired(0), 1u);
}

TEST_P(FaultTest, NthRequestFailureReportsThatRequest) {
  config_.intra_op_parallelism = 1;
  config_.queue_depth = 1;
  const std::string path = dir_.file("nth.bin");
  faults_->add(FaultRule{.op = Op::kWrite, .nth = 3, .kind = FaultKind::kError, .error = EIO});
  AioHandle handle = make_handle();
  try {
    handle.pwrite(data_.data(), data_.size(), path, 0);
    FAIL() << "EIO was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.offset(), 2 * kBlockSize);
  }
}

TEST_P(FaultTest, EnospcOnWriteNamesFile) {
  const std::string path = dir_.file("full.bin");
  faults_->add(FaultRule{.op = Op::kWrite,
                         .path = "full.bin",
                         .offset_begin = 3 * kBlockSize,
                         .count = 0,
                         .kind = FaultKind::kError,
                         .error = ENOSPC});
  AioHandle handle = make_handle();
  try {
    handle.pwrite(data_.data(), data_.size(), path, 0);
    FAIL() << "ENOSPC was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.op(), "write");
    EXPECT_EQ(e.error(), ENOSPC);
    EXPECT_GE(e.offset(), 3 * kBlockSize);
  }
  // The same handle keeps working for other files.
  const std::string other = dir_.file("other.bin");
  handle.pwrite(data_.data(), data_.size(), other, 0);
  expect_file_matches(other);
}

TEST_P(FaultTest, EnospcOnUnalignedTailWriteNamesFile) {
  const std::string path = dir_.file("tail.bin");
  // Only the buffered partial-block write of the 300-byte tail matches.
  faults_->add(FaultRule{.op = Op::kWrite,
                         .offset_begin = kBytes - 1,
                         .offset_end = kBytes,
                         .kind = FaultKind::kError,
                         .error = ENOSPC});
  AioHandle handle = make_handle();
  try {
    handle.pwrite(data_.data(), data_.size(), path, 0);
    FAIL() << "ENOSPC was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.offset(), kBytes - 300);
    EXPECT_EQ(e.length(), 300u);
  }
}

TEST_P(FaultTest, ShortReadsContinue) {
  const std::string path = prepare_file("short_read.bin");
  faults_->add(
      FaultRule{.op = Op::kRead, .count = 0, .kind = FaultKind::kShort, .short_bytes = 8192});
  expect_faulty_read_matches(path, 0);
  EXPECT_GT(faults_->fired(0), 16u);
  expect_faulty_read_matches(path, 3);  // through staging memory
}

TEST_P(FaultTest, ShortWritesContinue) {
  const std::string path = dir_.file("short_write.bin");
  faults_->add(
      FaultRule{.op = Op::kWrite, .count = 0, .kind = FaultKind::kShort, .short_bytes = 4096});
  AioHandle handle = make_handle();
  handle.pwrite(data_.data(), data_.size(), path, 0);
  EXPECT_GT(faults_->fired(0), 16u);
  expect_file_matches(path);
  // Unaligned source buffer (through staging memory), and the buffered 300-byte tail write
  // shortened to 100 bytes (the 4096-byte rule does not apply to requests that small).
  const size_t tail_rule = faults_->add(FaultRule{.op = Op::kWrite,
                                                  .offset_begin = kBytes - 1,
                                                  .count = 0,
                                                  .kind = FaultKind::kShort,
                                                  .short_bytes = 100});
  ShiftedBuffer shifted(data_.size(), 9);
  std::copy(data_.begin(), data_.end(), shifted.data());
  handle.pwrite(shifted.data(), shifted.size(), path, 0);
  EXPECT_GE(faults_->fired(tail_rule), 1u);
  expect_file_matches(path);
}

TEST_P(FaultTest, InterruptedAndBusyRequestsAreRetried) {
  const std::string path = dir_.file("retry.bin");
  faults_->add(
      FaultRule{.op = Op::kWrite, .nth = 2, .count = 3, .kind = FaultKind::kRetry, .error = EINTR});
  faults_->add(
      FaultRule{.op = Op::kRead, .nth = 1, .count = 5, .kind = FaultKind::kRetry, .error = EAGAIN});
  AioHandle handle = make_handle();
  handle.pwrite(data_.data(), data_.size(), path, 0);
  EXPECT_EQ(faults_->fired(0), 3u);
  expect_file_matches(path);
  expect_faulty_read_matches(path, 0);
  EXPECT_EQ(faults_->fired(1), 5u);
}

TEST_P(FaultTest, PersistentEintrEndsInAnError) {
  const std::string path = prepare_file("eintr.bin");
  faults_->add(FaultRule{.op = Op::kRead,
                         .offset_begin = 0,
                         .offset_end = 1,
                         .count = 0,
                         .kind = FaultKind::kRetry,
                         .error = EINTR});
  AioHandle handle = make_handle();
  std::vector<std::byte> back(data_.size());
  try {
    handle.pread(back.data(), back.size(), path, 0);
    FAIL() << "endless EINTR was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), path);
    EXPECT_EQ(e.offset(), 0u);
    EXPECT_EQ(e.error(), EINTR);
  }
}

TEST_P(FaultTest, DelayedRequestsStillComplete) {
  const std::string path = dir_.file("delay.bin");
  faults_->add(FaultRule{
      .nth = 2, .count = 4, .kind = FaultKind::kDelay, .delay = std::chrono::milliseconds(2)});
  AioHandle handle = make_handle();
  handle.async_pwrite(data_.data(), data_.size() / 2, path, 0);
  handle.async_pwrite(data_.data() + data_.size() / 2, data_.size() - data_.size() / 2, path,
                      data_.size() / 2);
  EXPECT_EQ(handle.wait(), 2);
  EXPECT_EQ(faults_->fired(0), 4u);
  expect_file_matches(path);
}

TEST_P(FaultTest, AsyncFailureIsReportedByWaitAfterOthersFinish) {
  const std::string good = dir_.file("good.bin");
  const std::string bad = dir_.file("bad.bin");
  faults_->add(FaultRule{.path = "bad.bin", .count = 0, .kind = FaultKind::kError, .error = EIO});
  AioHandle handle = make_handle();
  handle.async_pwrite(data_.data(), data_.size(), bad, 0);
  handle.async_pwrite(data_.data(), data_.size(), good, 0);
  try {
    handle.wait();
    FAIL() << "the failed async write was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), bad);
  }
  EXPECT_EQ(handle.pending(), 0);
  expect_file_matches(good);
}

// The engine itself breaks (its reap fails): the worker tears it down after the kernel's
// requests ended, every transfer it held fails with an error naming its file, later ones
// fail too instead of hanging, and the handle is still destroyed cleanly.
TEST_P(FaultTest, BrokenEngineFailsItsTransfersAndLaterOnes) {
  config_.intra_op_parallelism = 1;
  const std::string a = dir_.file("a.bin");
  const std::string b = dir_.file("b.bin");
  faults_->add(FaultRule{
      .op = Op::kWrite, .path = "a.bin", .nth = 3, .kind = FaultKind::kEngine, .error = EBADF});
  AioHandle handle = make_handle();
  handle.async_pwrite(data_.data(), data_.size(), a, 0);
  handle.async_pwrite(data_.data(), data_.size(), b, 0);
  try {
    handle.wait();
    FAIL() << "the broken engine was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), a);
    EXPECT_EQ(e.error(), EBADF);
    EXPECT_NE(std::string(e.what()).find("engine"), std::string::npos) << e.what();
  }
  EXPECT_EQ(handle.pending(), 0);
  EXPECT_EQ(faults_->fired(0), 1u);
  std::vector<std::byte> back(4096);
  try {
    handle.pread(back.data(), back.size(), a, 0);
    FAIL() << "a transfer on a broken engine succeeded";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), a);
    EXPECT_NE(std::string(e.what()).find("engine failed"), std::string::npos) << e.what();
  }
}

// The engine breaks and its waits keep failing for a while (more than the 16 failed waits
// after which the io_uring engine used to give up): the handle keeps reaping until the kernel
// has returned every request before it destroys the engine, so no memory is released while
// the kernel may still write it.
TEST_P(FaultTest, BrokenEngineIsDrainedBeforeItIsDestroyed) {
  config_.intra_op_parallelism = 1;
  const std::string a = dir_.file("a.bin");
  faults_->add(FaultRule{.op = Op::kWrite,
                         .path = "a.bin",
                         .nth = 2,
                         .kind = FaultKind::kEngine,
                         .error = EBADF,
                         .reap_failures = 40});
  {
    AioHandle handle = make_handle();
    handle.async_pwrite(data_.data(), data_.size(), a, 0);
    EXPECT_THROW(handle.wait(), IoError);
    EXPECT_EQ(faults_->fired(0), 1u);
  }
  EXPECT_EQ(faults_->abandoned_requests(), 0u);
}

// The error of the transfer that broke the engine, of every later transfer (on any file), and
// broken_reason() all name the file and offset of the request in flight when it broke.
TEST_P(FaultTest, BrokenEngineErrorsNameTheRequestThatBrokeIt) {
  config_.intra_op_parallelism = 1;
  config_.queue_depth = 1;  // one request in flight: the one that broke the engine
  const std::string a = dir_.file("a.bin");
  const std::string b = dir_.file("b.bin");
  const uint64_t breaking_offset = 2 * kBlockSize;
  faults_->add(FaultRule{
      .op = Op::kWrite, .path = "a.bin", .nth = 3, .kind = FaultKind::kEngine, .error = EBADF});
  AioHandle handle = make_handle();
  EXPECT_FALSE(handle.broken());
  const std::string names_it = "'" + a + "' at offset " + std::to_string(breaking_offset);
  try {
    handle.pwrite(data_.data(), data_.size(), a, 0);
    FAIL() << "the broken engine was not reported";
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), a);
    EXPECT_EQ(e.offset(), breaking_offset);
    EXPECT_NE(std::string(e.what()).find(names_it), std::string::npos) << e.what();
  }
  EXPECT_TRUE(handle.broken());
  EXPECT_NE(handle.broken_reason().find(names_it), std::string::npos) << handle.broken_reason();
  std::vector<std::byte> back(4096);
  for (int round = 0; round < 2; ++round) {
    try {
      if (round == 0) {
        handle.pwrite(data_.data(), 4096, b, 8192);
      } else {
        handle.async_pread(back.data(), back.size(), b, 0);
        handle.wait();
      }
      FAIL() << "a transfer on a broken handle succeeded";
    } catch (const IoError& e) {
      EXPECT_EQ(e.path(), b);
      EXPECT_NE(std::string(e.what()).find(names_it), std::string::npos) << e.what();
    }
  }
}

TEST(FaultInjectorTest, MatchesByOpPathOffsetAndCount) {
  FaultInjector injector;
  injector.add(FaultRule{
      .op = Op::kWrite, .path = "x", .offset_begin = 100, .offset_end = 200, .nth = 2, .count = 2});
  Request r{.op = Op::kWrite, .fd = 3, .bytes = 50, .offset = 160, .path = "/a/x"};
  EXPECT_FALSE(injector.decide(r));  // 1st match
  EXPECT_TRUE(injector.decide(r));   // 2nd
  EXPECT_TRUE(injector.decide(r));   // 3rd
  EXPECT_FALSE(injector.decide(r));  // count exhausted
  EXPECT_EQ(injector.fired(0), 2u);
  Request other = r;
  other.offset = 200;  // [200, 250) misses [100, 200)
  EXPECT_FALSE(injector.decide(other));
  other = r;
  other.op = Op::kRead;
  EXPECT_FALSE(injector.decide(other));
  other = r;
  other.path = "/a/y";
  EXPECT_FALSE(injector.decide(other));
}

INSTANTIATE_TEST_SUITE_P(Backends, FaultTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
