// Fault paths of NvmeStore on every aio backend (io_uring, libaio, psync): requests that
// fail, come back short and then fail, and engines that break. Faults are injected through
// aio's FaultBackend; the store must report each as a clean OffloadError naming the swap
// file and offset, mark what it cannot vouch for as torn, and keep serving everything else.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "aio/config.h"
#include "aio/fault_backend.h"
#include "aio/handle.h"
#include "aio/pinned_buffer.h"
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

class NvmeStoreFault : public ::testing::TestWithParam<aio::BackendKind> {
 protected:
  void SetUp() override {
    const auto seed = static_cast<uint32_t>(test_seed());
    rng_.seed(seed);
    seed_ = seed;
    // A sandbox may forbid io_uring (or lack libaio): say so rather than fail.
    aio::AioConfig probe;
    probe.backend = GetParam();
    try {
      aio::AioHandle handle(probe);
    } catch (const std::exception& e) {
      GTEST_SKIP() << to_string(GetParam()) << " is not usable here: " << e.what();
    }
  }

  NvmeStoreConfig config(bool checksums, int parallelism = 2) {
    NvmeStoreConfig c;
    c.nvme_path = dir_.path();
    c.rank = 0;
    c.name = "fault";
    c.checksums = checksums;
    c.aio.backend = GetParam();
    c.aio.intra_op_parallelism = parallelism;
    c.backend_factory = aio::fault_backend_factory(faults_);
    return c;
  }

  TempDir dir_;
  std::shared_ptr<aio::FaultInjector> faults_ = std::make_shared<aio::FaultInjector>();
  std::mt19937 rng_;
  uint32_t seed_ = 0;
};

// Expects `call` to throw OffloadError of `kind` whose message contains every one of `parts`.
template <typename Call>
void expect_error(Call&& call, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    call();
    ADD_FAILURE() << "no error";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' missing in: " << e.what();
    }
  }
}

TEST_P(NvmeStoreFault, WriteErrorTearsTheExtent) {
  ZINF_TRACE_SEED(seed_);
  NvmeStore store(config(false));
  const ExtentId a = store.allocate(1 << 20);
  const std::vector<uint8_t> data = random_bytes(rng_, 1 << 20);
  store.write(a, data.data());
  faults_->add(aio::FaultRule{.op = aio::Op::kWrite,
                              .path = "fault.swp",
                              .nth = 1,
                              .count = 1,
                              .kind = aio::FaultKind::kError,
                              .error = EIO});
  const std::vector<uint8_t> next = random_bytes(rng_, 1 << 20);
  expect_error([&] { store.write(a, next.data()); }, ErrorKind::kIo,
               {"fault.swp", "Input/output error"});
  std::vector<uint8_t> back(1 << 20);
  expect_error([&] { store.read(a, back.data()); }, ErrorKind::kCorrupt, {"torn"});
  store.write(a, next.data());  // the fault fired once: a rewrite succeeds
  store.read(a, back.data());
  EXPECT_EQ(back, next);
}

TEST_P(NvmeStoreFault, ReadErrorsAreReportedAndShortReadsContinue) {
  ZINF_TRACE_SEED(seed_);
  NvmeStore store(config(true));
  const ExtentId a = store.allocate(3 << 20);
  const std::vector<uint8_t> data = random_bytes(rng_, 3 << 20);
  store.write(a, data.data());
  std::vector<uint8_t> back(3 << 20, 0);
  faults_->add(aio::FaultRule{
      .op = aio::Op::kRead, .count = 3, .kind = aio::FaultKind::kShort, .short_bytes = 8192});
  store.read(a, back.data());  // short transfers are continued, and the checksum agrees
  EXPECT_EQ(back, data);
  faults_->clear();
  faults_->add(aio::FaultRule{.op = aio::Op::kRead, .kind = aio::FaultKind::kError, .error = EIO});
  auto queue = store.make_queue();
  queue->async_read(a, back.data());
  expect_error([&] { queue->wait(); }, ErrorKind::kIo, {"fault.swp"});
  store.read(a, back.data());  // the extent itself is fine
  EXPECT_EQ(back, data);
}

// Test gap of issue 8: a request that comes back short, whose continuation then fails with
// ENOSPC (a disk filling up in the middle of a write).
TEST_P(NvmeStoreFault, ShortWriteThenNoSpaceIsACleanErrorAndTheStoreGoesOn) {
  ZINF_TRACE_SEED(seed_);
  // One worker and one request per extent, so "the continuation" is the second request.
  NvmeStore store(config(true, /*parallelism=*/1));
  const ExtentId a = store.allocate(100000);
  const ExtentId b = store.allocate(64 << 10);
  const std::vector<uint8_t> data_a = random_bytes(rng_, 100000);
  store.write(a, data_a.data());
  const uint64_t offset_b = store.extent(b).file_offset;
  const size_t short_rule = faults_->add(aio::FaultRule{.op = aio::Op::kWrite,
                                                        .path = "fault.swp",
                                                        .offset_begin = offset_b,
                                                        .nth = 1,
                                                        .count = 1,
                                                        .kind = aio::FaultKind::kShort,
                                                        .short_bytes = 4096});
  const size_t space_rule = faults_->add(aio::FaultRule{.op = aio::Op::kWrite,
                                                        .path = "fault.swp",
                                                        .offset_begin = offset_b + 4096,
                                                        .nth = 1,
                                                        .count = 1,
                                                        .kind = aio::FaultKind::kError,
                                                        .error = ENOSPC});
  const std::vector<uint8_t> data_b = random_bytes(rng_, 64 << 10);
  expect_error(
      [&] { store.write(b, data_b.data()); }, ErrorKind::kIo,
      {"fault.swp", "offset " + std::to_string(offset_b + 4096), "No space left on device"});
  EXPECT_EQ(faults_->fired(short_rule), 1u);
  EXPECT_EQ(faults_->fired(space_rule), 1u);
  // The half-written extent is torn, never half new and half stale...
  std::vector<uint8_t> back_b(64 << 10, 0);
  expect_error([&] { store.read(b, back_b.data()); }, ErrorKind::kCorrupt, {"torn"});
  // ...its neighbour is intact, and once space is back the store goes on.
  std::vector<uint8_t> back_a(100000, 0);
  store.read(a, back_a.data());
  EXPECT_EQ(back_a, data_a);
  store.write(b, data_b.data());
  store.read(b, back_b.data());
  EXPECT_EQ(back_b, data_b);
}

// Defect 5 of issue 8 (store part): a queue whose aio engine broke was used again, so every
// later transfer on it failed with "engine failed".
TEST_P(NvmeStoreFault, BrokenEngineIsReplacedOnTheSyncQueue) {
  ZINF_TRACE_SEED(seed_);
  NvmeStore store(config(true));
  const ExtentId a = store.allocate(1 << 20);
  const ExtentId b = store.allocate(12345);
  const std::vector<uint8_t> data_a = random_bytes(rng_, 1 << 20);
  const std::vector<uint8_t> data_b = random_bytes(rng_, 12345);
  store.write(b, data_b.data());
  faults_->add(aio::FaultRule{.op = aio::Op::kWrite,
                              .path = "fault.swp",
                              .nth = 1,
                              .count = 1,
                              .kind = aio::FaultKind::kEngine,
                              .error = EIO});
  expect_error([&] { store.write(a, data_a.data()); }, ErrorKind::kIo,
               {store.path(), "at offset", "engine failed"});
  // Every later transfer gets a working engine.
  for (int round = 0; round < 3; ++round) {
    store.write(a, data_a.data());
    std::vector<uint8_t> back_a(1 << 20, 0);
    store.read(a, back_a.data());
    EXPECT_EQ(back_a, data_a) << "round " << round;
    std::vector<uint8_t> back_b(12345, 0);
    store.read(b, back_b.data());
    EXPECT_EQ(back_b, data_b) << "round " << round;
  }
}

TEST_P(NvmeStoreFault, BrokenEngineIsReplacedOnAQueueAndKeepsItsRegisteredBuffers) {
  ZINF_TRACE_SEED(seed_);
  NvmeStore store(config(false));
  constexpr uint64_t kBytes = 256 << 10;
  const ExtentId a = store.allocate(kBytes);
  const ExtentId b = store.allocate(kBytes);
  aio::PinnedBuffer pinned(2 * kBytes);
  const std::vector<uint8_t> data = random_bytes(rng_, 2 * kBytes);
  std::memcpy(pinned.data(), data.data(), data.size());
  auto queue = store.make_queue();
  const std::pair<void*, size_t> range{pinned.data(), pinned.capacity()};
  const bool fixed = queue->register_buffers({&range, 1});
  faults_->add(aio::FaultRule{.op = aio::Op::kRead,
                              .path = "fault.swp",
                              .nth = 1,
                              .count = 1,
                              .kind = aio::FaultKind::kEngine,
                              .error = EBADF});
  queue->async_write(a, pinned.data());
  queue->async_write(b, pinned.data() + kBytes);
  queue->wait();
  std::vector<uint8_t> back(2 * kBytes, 0);
  queue->async_read(a, back.data());
  expect_error([&] { queue->wait(); }, ErrorKind::kIo, {store.path(), "at offset"});
  const uint64_t fixed_before = store.stats().fixed_io_requests;
  for (int round = 0; round < 2; ++round) {
    queue->async_write(a, pinned.data());
    queue->async_write(b, pinned.data() + kBytes);
    queue->wait();
    queue->async_read(a, back.data());
    queue->async_read(b, back.data() + kBytes);
    queue->wait();
    EXPECT_EQ(back, data) << "round " << round;
  }
  if (fixed) {  // the new engine got the registered range too
    EXPECT_GT(store.stats().fixed_io_requests, fixed_before);
  }
  queue->unregister_buffers({&range, 1});
}

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreFault,
                         ::testing::Values(aio::BackendKind::kIoUring, aio::BackendKind::kLibaio,
                                           aio::BackendKind::kPsync),
                         [](const ::testing::TestParamInfo<aio::BackendKind>& param_info) {
                           return std::string(to_string(param_info.param));
                         });

}  // namespace
}  // namespace zinf::offload
