// Deadlines on every wait (AioConfig::io_timeout_s): a transfer held by a hung device (the
// fault backend's kStall) ends in an IoError naming the file, offset, length and the time
// waited, from pread/pwrite, wait() and wait_for(); the handle is then broken and fails
// later transfers at once; its destructor still waits for what the kernel holds. Runs on
// each backend, under ThreadSanitizer and AddressSanitizer in CI.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
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

constexpr double kTimeoutS = 0.2;
constexpr uint64_t kBytes = 256 * 1024 + 300;

// Releases the stalls when it goes out of scope, so a failing assertion that leaves the test
// early does not leave the handle's destructor waiting forever. Declare it after the handle.
class StallRelease {
 public:
  explicit StallRelease(FaultInjector& faults) : faults_(faults) {}
  ~StallRelease() { faults_.release_stalls(); }
  StallRelease(const StallRelease&) = delete;
  StallRelease& operator=(const StallRelease&) = delete;

 private:
  FaultInjector& faults_;
};

class TimeoutTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  TimeoutTest() : faults_(std::make_shared<FaultInjector>()) {
    config_.backend = GetParam();
    config_.block_size = 64 * 1024;
    config_.queue_depth = 4;
    config_.intra_op_parallelism = 2;
    config_.io_timeout_s = kTimeoutS;
    data_.resize(kBytes);
    fill_random(data_.data(), data_.size(), seed_);
  }

  // Writes data_ to `name` without faults and returns its path.
  std::string prepare_file(const std::string& name) {
    const std::string path = dir_.file(name);
    AioHandle clean(config_);
    clean.pwrite(data_.data(), data_.size(), path, 0);
    return path;
  }

  // Every request on a file whose path contains `name` hangs until release_stalls().
  void stall(const std::string& name) {
    faults_->add(FaultRule{.path = name, .count = 0, .kind = FaultKind::kStall});
  }

  // The timeout error names the transfer's range, the time waited and the deadline.
  static void expect_timeout_error(const IoError& e, const std::string& path, uint64_t offset,
                                   uint64_t length) {
    const std::string what = e.what();
    EXPECT_EQ(e.path(), path) << what;
    EXPECT_EQ(e.offset(), offset) << what;
    EXPECT_EQ(e.length(), length) << what;
    EXPECT_EQ(e.error(), ETIMEDOUT) << what;
    EXPECT_NE(what.find("'" + path + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("at offset " + std::to_string(offset)), std::string::npos) << what;
    EXPECT_NE(what.find("(length " + std::to_string(length) + ")"), std::string::npos) << what;
    EXPECT_NE(what.find("no completion after 0."), std::string::npos) << what;  // time waited
    EXPECT_NE(what.find("io_timeout_s = 0.2"), std::string::npos) << what;
  }

  AioConfig config_;
  std::shared_ptr<FaultInjector> faults_;
  std::vector<std::byte> data_;
  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
};

TEST_P(TimeoutTest, SyncReadTimesOutAndBreaksTheHandle) {
  const std::string path = prepare_file("stall.bin");
  const std::string other = dir_.file("other.bin");
  stall("stall.bin");
  // Declared before the handle: the kernel may write it until the handle is destroyed.
  ShiftedBuffer back(kBytes - 100, 3);  // unaligned: through staging memory too
  {
    AioHandle handle(config_, fault_backend_factory(faults_));
    StallRelease release(*faults_);
    const auto began = std::chrono::steady_clock::now();
    try {
      handle.pread(back.data(), back.size(), path, 100);
      FAIL() << "a stalled read did not time out";
    } catch (const IoError& e) {
      expect_timeout_error(e, path, 100, kBytes - 100);
    }
    EXPECT_GE(std::chrono::steady_clock::now() - began, std::chrono::milliseconds(200));
    EXPECT_TRUE(handle.broken());
    EXPECT_NE(handle.broken_reason().find(path), std::string::npos) << handle.broken_reason();
    // Later transfers fail at once, naming themselves and why the handle broke.
    for (int round = 0; round < 2; ++round) {
      try {
        if (round == 0) {
          handle.pwrite(data_.data(), 4096, other, 0);
        } else {
          handle.wait_for(handle.async_pwrite(data_.data(), 4096, other, 0));
        }
        FAIL() << "a transfer on a broken handle succeeded";
      } catch (const IoError& e) {
        const std::string what = e.what();
        EXPECT_EQ(e.path(), other) << what;
        EXPECT_NE(what.find("broken"), std::string::npos) << what;
        EXPECT_NE(what.find(path), std::string::npos) << what;
      }
    }
    faults_->release_stalls();
  }  // the destructor waits for the released requests
  EXPECT_EQ(faults_->abandoned_requests(), 0u);
}

TEST_P(TimeoutTest, SyncWriteTimesOut) {
  const std::string path = dir_.file("stall_w.bin");
  stall("stall_w.bin");
  AioHandle handle(config_, fault_backend_factory(faults_));
  StallRelease release(*faults_);
  try {
    handle.pwrite(data_.data(), data_.size(), path, 4096);
    FAIL() << "a stalled write did not time out";
  } catch (const IoError& e) {
    expect_timeout_error(e, path, 4096, kBytes);
  }
  EXPECT_TRUE(handle.broken());
  faults_->release_stalls();
}

TEST_P(TimeoutTest, WaitTimesOutNamingTheStalledTransfer) {
  const std::string path = prepare_file("stall.bin");
  stall("stall.bin");
  std::vector<std::byte> back(kBytes);
  AioHandle handle(config_, fault_backend_factory(faults_));
  StallRelease release(*faults_);
  // A stalled worker holds every request it has, so the transfer queued before the stalled
  // one is one that ended at once (its file is missing): the stalled one is named.
  handle.async_pread(back.data(), 4096, dir_.file("missing.bin"), 0);
  handle.async_pread(back.data(), 8192, path, 4096);
  try {
    handle.wait();
    FAIL() << "a stalled read did not time out";
  } catch (const IoError& e) {
    expect_timeout_error(e, path, 4096, 8192);
  }
  EXPECT_EQ(handle.pending(), 0);  // the waited transfers are the handle's to finish now
  EXPECT_TRUE(handle.broken());
  faults_->release_stalls();
}

TEST_P(TimeoutTest, WaitForTimesOutAndLeavesOtherTicketsPending) {
  const std::string path = prepare_file("stall.bin");
  const std::string good = dir_.file("good.bin");
  stall("stall.bin");
  // Both outlive the handle (the kernel may write them until it is destroyed); `late` gets
  // its own memory, the stalled read may still be writing `back`.
  std::vector<std::byte> back(kBytes);
  std::vector<std::byte> late_back(4096);
  AioHandle handle(config_, fault_backend_factory(faults_));
  StallRelease release(*faults_);
  const uint64_t written = handle.async_pwrite(data_.data(), data_.size(), good, 0);
  handle.wait_for(written);  // not stalled: completes in time
  const uint64_t stalled = handle.async_pread(back.data(), back.size(), path, 0);
  const uint64_t late = handle.async_pread(late_back.data(), late_back.size(), good, 0);
  try {
    handle.wait_for(stalled);
    FAIL() << "a stalled read did not time out";
  } catch (const IoError& e) {
    expect_timeout_error(e, path, 0, kBytes);
  }
  EXPECT_EQ(handle.pending(), 1);  // `late`, still the caller's to collect
  faults_->release_stalls();
  try {
    handle.wait_for(late);  // queued before the timeout: it ran (or was cancelled) normally
  } catch (const IoError& e) {
    EXPECT_EQ(e.path(), good) << e.what();
  }
  EXPECT_EQ(handle.pending(), 0);
}

// Without faults the deadline changes nothing.
TEST_P(TimeoutTest, TransfersWithinTheDeadlineAreUnaffected) {
  AioHandle handle(config_);
  const std::string path = dir_.file("plain.bin");
  handle.pwrite(data_.data(), data_.size(), path, 0);
  std::vector<std::byte> back(kBytes);
  handle.wait_for(handle.async_pread(back.data(), back.size(), path, 0));
  EXPECT_EQ(first_difference(data_.data(), back.data(), kBytes), -1);
  EXPECT_FALSE(handle.broken());
  EXPECT_EQ(handle.broken_reason(), "");
}

INSTANTIATE_TEST_SUITE_P(Backends, TimeoutTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
