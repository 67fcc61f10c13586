// AioHandle::wait_for: tickets of async transfers, waiting for some transfers while others
// stay pending, an error thrown by the wait for its own transfer and not again by wait(),
// tickets already collected by wait(), unknown tickets, and several threads sharing one
// handle, each waiting for its own batch (run under ThreadSanitizer). Every test runs on
// each backend.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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
using testing::numbered;
using zinf::testing::TempDir;
using zinf::testing::test_seed;

constexpr uint64_t kBytes = 256 * 1024 + 4096 + 123;  // whole blocks, an aligned block, a tail

class WaitForTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  WaitForTest() : faults_(std::make_shared<FaultInjector>()) {
    config_.backend = GetParam();
    config_.block_size = 64 * 1024;
    config_.queue_depth = 4;
    config_.intra_op_parallelism = 2;
  }

  // kBytes of seeded data unique to `n`.
  std::vector<std::byte> data_for(int n) const {
    std::vector<std::byte> data(kBytes);
    fill_random(data.data(), data.size(), seed_ + static_cast<uint64_t>(n));
    return data;
  }

  AioConfig config_;
  std::shared_ptr<FaultInjector> faults_;
  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
};

TEST_P(WaitForTest, TicketsAreIssuedInOrderAndWaitForCollectsOnlyItsOwn) {
  AioHandle handle(config_);
  const std::vector<std::byte> a = data_for(1);
  const std::vector<std::byte> b = data_for(2);
  const uint64_t ta = handle.async_pwrite(a.data(), a.size(), dir_.file("a.bin"), 0);
  const uint64_t tb = handle.async_pwrite(b.data(), b.size(), dir_.file("b.bin"), 0);
  EXPECT_EQ(ta, 1u);
  EXPECT_EQ(tb, 2u);
  handle.wait_for(ta);
  EXPECT_EQ(handle.pending(), 1);  // b, done or not, is still for someone to collect
  std::vector<std::byte> back(kBytes);
  handle.pread(back.data(), back.size(), dir_.file("a.bin"), 0);
  EXPECT_EQ(first_difference(a.data(), back.data(), kBytes), -1);
  EXPECT_EQ(handle.wait(), 1);  // only b
  handle.pread(back.data(), back.size(), dir_.file("b.bin"), 0);
  EXPECT_EQ(first_difference(b.data(), back.data(), kBytes), -1);
  EXPECT_EQ(handle.pending(), 0);
}

TEST_P(WaitForTest, ErrorIsThrownByTheWaitForItsTransferOnly) {
  AioHandle handle(config_, fault_backend_factory(faults_));
  faults_->add(FaultRule{.path = "bad.bin", .count = 0, .kind = FaultKind::kError, .error = EIO});
  const std::vector<std::byte> data = data_for(3);
  const uint64_t bad = handle.async_pwrite(data.data(), data.size(), dir_.file("bad.bin"), 0);
  const uint64_t good = handle.async_pwrite(data.data(), data.size(), dir_.file("good.bin"), 0);
  handle.wait_for(good);  // the other transfer's failure is not this wait's
  try {
    handle.wait_for(bad);
    FAIL() << "the failed write was not reported";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(handle.wait(), 0);  // reported once, by wait_for
  handle.wait_for(bad);         // already collected: skipped, not thrown again
}

TEST_P(WaitForTest, GroupWaitsForAllAndThrowsTheFirstFailure) {
  AioHandle handle(config_, fault_backend_factory(faults_));
  faults_->add(FaultRule{.path = "bad", .count = 0, .kind = FaultKind::kError, .error = EIO});
  const std::vector<std::byte> data = data_for(4);
  std::vector<uint64_t> group;
  group.push_back(handle.async_pwrite(data.data(), data.size(), dir_.file("ok1.bin"), 0));
  group.push_back(handle.async_pwrite(data.data(), data.size(), dir_.file("bad1.bin"), 0));
  const uint64_t other = handle.async_pwrite(data.data(), data.size(), dir_.file("x.bin"), 0);
  group.push_back(handle.async_pwrite(data.data(), data.size(), dir_.file("bad2.bin"), 0));
  try {
    handle.wait_for(group);
    FAIL() << "the group's failures were not reported";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("bad1.bin"), std::string::npos) << e.what();
  }
  EXPECT_EQ(handle.pending(), 1);  // `other` is not part of the group
  handle.wait_for(other);
  EXPECT_EQ(handle.pending(), 0);
  std::vector<std::byte> back(kBytes);
  handle.pread(back.data(), back.size(), dir_.file("ok1.bin"), 0);
  EXPECT_EQ(first_difference(data.data(), back.data(), kBytes), -1);
}

TEST_P(WaitForTest, TicketsCollectedByWaitAreSkippedAndUnknownOnesRefused) {
  AioHandle handle(config_);
  const std::vector<std::byte> data = data_for(5);
  const uint64_t t = handle.async_pwrite(data.data(), data.size(), dir_.file("w.bin"), 0);
  EXPECT_EQ(handle.wait(), 1);
  handle.wait_for(t);
  EXPECT_THROW(handle.wait_for(0), std::invalid_argument);
  EXPECT_THROW(handle.wait_for(t + 1), std::invalid_argument);
  // A bad transfer (null buffer) gets a ticket too, and fails at its wait.
  const uint64_t null_read = handle.async_pread(nullptr, 4096, dir_.file("w.bin"), 0);
  EXPECT_THROW(handle.wait_for(null_read), IoError);
  EXPECT_EQ(handle.pending(), 0);
}

// Threads share one handle, each writing and reading back its own files and waiting only
// for its own tickets, while the others keep theirs in flight.
TEST_P(WaitForTest, ThreadsWaitForTheirOwnBatchesOnOneHandle) {
  AioHandle handle(config_);
  constexpr int kThreads = 4;
  constexpr int kRounds = 5;
  std::vector<int64_t> mismatch(kThreads, -1);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        const std::vector<std::byte> data = data_for(100 + t);
        std::vector<std::byte> back(kBytes);
        for (int r = 0; r < kRounds && mismatch[t] == -1; ++r) {
          const std::string path = dir_.file(numbered("t", t) + numbered("_r", r));
          std::vector<uint64_t> writes = {
              handle.async_pwrite(data.data(), kBytes / 2, path, 0),
              handle.async_pwrite(data.data() + kBytes / 2, kBytes - kBytes / 2, path, kBytes / 2)};
          handle.wait_for(writes);
          handle.wait_for(handle.async_pread(back.data(), kBytes, path, 0));
          mismatch[t] = first_difference(data.data(), back.data(), kBytes);
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(mismatch[t], -1) << "thread " << t;
  }
  EXPECT_EQ(handle.pending(), 0);
  EXPECT_EQ(handle.wait(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, WaitForTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
