// AioHandle::register_buffers: round trips through io_uring fixed buffers, requests only
// partly inside a registered range taking the normal path, unregistering, argument checks,
// short transfers continued on a fixed buffer, and registration racing with transfers.
// Every test runs on each backend (a no-op registration outside io_uring).
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "aio/fault_backend.h"
#include "aio/handle.h"
#include "aio/pinned_buffer.h"
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

using Range = std::pair<void*, size_t>;

constexpr uint64_t kBlockSize = 64 * 1024;

class RegisteredBuffersTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  AioConfig config(int parallelism = 2) const {
    AioConfig c;
    c.backend = GetParam();
    c.block_size = kBlockSize;
    c.queue_depth = 4;
    c.intra_op_parallelism = parallelism;
    return c;
  }

  bool uring() const { return GetParam() == BackendKind::kIoUring; }

  // Registers `ranges`; on io_uring the kernel may still refuse (RLIMIT_MEMLOCK without
  // CAP_IPC_LOCK), which the handle reports by returning false: such a run checks data only.
  bool register_or_note(AioHandle& handle, std::vector<Range> ranges) {
    const bool fixed = handle.register_buffers(ranges);
    if (!uring()) {
      EXPECT_FALSE(fixed) << "only io_uring has fixed buffers";
    } else if (!fixed) {
      ADD_FAILURE() << "io_uring refused the registration (RLIMIT_MEMLOCK?): run as a user "
                       "allowed to lock this much memory";
    }
    return fixed;
  }

  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
};

TEST_P(RegisteredBuffersTest, RoundTripsUseFixedBuffers) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config());
  const uint64_t bytes = (1 << 20) + 7;
  PinnedBuffer out(bytes + 4096);
  PinnedBuffer in(bytes + 4096);
  const bool fixed =
      register_or_note(handle, {{out.data(), out.capacity()}, {in.data(), in.capacity()}});
  const uint64_t seed = seed_;
  int n = 0;
  for (uint64_t offset :
       {uint64_t{0}, uint64_t{12288}, uint64_t{1234}, uint64_t{(5ull << 30) + 4096}}) {
    const std::string path = dir_.file(numbered("f", n++));
    fill_random(out.data(), bytes, seed + offset);
    fill_random(in.data(), bytes, ~seed);
    const AioStats before = handle.stats();
    handle.pwrite(out.data(), bytes, path, offset);
    handle.pread(in.data(), bytes, path, offset);
    const AioStats after = handle.stats();
    ASSERT_EQ(first_difference(out.data(), in.data(), bytes), -1) << "offset " << offset;
    if (fixed && offset % 4096 == 0) {
      // Aligned, congruent: every request uses a fixed buffer, the partial tail block's
      // write (buffered descriptor, user memory) included, except the tail's read, which
      // goes through bounce memory that is not registered.
      EXPECT_EQ(after.fixed_requests - before.fixed_requests, after.requests - before.requests - 1);
    } else if (!fixed) {
      EXPECT_EQ(after.fixed_requests, 0u);
    }
  }
}

TEST_P(RegisteredBuffersTest, MemoryPartlyOutsideARangeTakesTheNormalPath) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config(1));
  const std::string path = dir_.file("partly");
  constexpr uint64_t kBytes = 8 * kBlockSize;
  PinnedBuffer buffer(kBytes);
  // Registered: the middle of the buffer, not on request boundaries at either end, so the
  // requests at both ends straddle it and the ones between lie inside.
  const bool fixed =
      register_or_note(handle, {{buffer.data() + kBlockSize / 2, kBytes - kBlockSize}});
  fill_random(buffer.data(), kBytes, seed_);
  std::vector<std::byte> copy(buffer.data(), buffer.data() + kBytes);
  handle.pwrite(buffer.data(), kBytes, path, 0);
  AioStats s = handle.stats();
  EXPECT_EQ(s.requests, 8u);
  EXPECT_EQ(s.fixed_requests, fixed ? 6u : 0u);
  // Memory entirely outside any range: no fixed request.
  std::vector<std::byte> outside(kBytes);
  handle.pread(outside.data(), kBytes, path, 0);
  EXPECT_EQ(handle.stats().fixed_requests, s.fixed_requests);
  EXPECT_EQ(first_difference(copy.data(), outside.data(), kBytes), -1);
  // Read back into the partly registered buffer.
  fill_random(buffer.data(), kBytes, ~seed_);
  handle.pread(buffer.data(), kBytes, path, 0);
  EXPECT_EQ(handle.stats().fixed_requests, fixed ? 12u : 0u);
  EXPECT_EQ(first_difference(copy.data(), buffer.data(), kBytes), -1);
}

TEST_P(RegisteredBuffersTest, UnregisteredRangesAreNoLongerUsed) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config());
  const std::string path = dir_.file("unregister");
  PinnedBuffer a(4 * kBlockSize);
  PinnedBuffer b(4 * kBlockSize);
  fill_random(a.data(), a.size(), seed_);
  fill_random(b.data(), b.size(), seed_ + 1);
  const std::vector<Range> ranges = {{a.data(), a.capacity()}, {b.data(), b.capacity()}};
  const bool fixed = register_or_note(handle, ranges);
  handle.pwrite(a.data(), a.size(), path, 0);
  const uint64_t after_a = handle.stats().fixed_requests;
  EXPECT_EQ(after_a, fixed ? 4u : 0u);
  const std::vector<Range> drop_a = {ranges[0]};
  handle.unregister_buffers(drop_a);
  handle.pwrite(a.data(), a.size(), path, a.size());  // a: normal path now
  EXPECT_EQ(handle.stats().fixed_requests, after_a);
  handle.pwrite(b.data(), b.size(), path, 2 * a.size());  // b: still registered
  EXPECT_EQ(handle.stats().fixed_requests, after_a + (fixed ? 4u : 0u));
  handle.unregister_buffers(ranges);  // b, and a again (ignored)
  handle.unregister_buffers(ranges);  // nothing left: no-op
  const uint64_t before = handle.stats().fixed_requests;
  std::vector<std::byte> back(3 * a.size());
  handle.pread(b.data(), b.size(), path, 2 * a.size());
  EXPECT_EQ(handle.stats().fixed_requests, before);
  handle.pread(back.data(), back.size(), path, 0);
  EXPECT_EQ(first_difference(a.data(), back.data(), a.size()), -1);
  EXPECT_EQ(first_difference(a.data(), back.data() + a.size(), a.size()), -1);
  EXPECT_EQ(first_difference(b.data(), back.data() + 2 * a.size(), b.size()), -1);
  // Registering again works after everything was dropped.
  EXPECT_EQ(handle.register_buffers(ranges), fixed);
}

TEST_P(RegisteredBuffersTest, RejectsBadRangesAndIgnoresRepeats) {
  AioHandle handle(config());
  PinnedBuffer buffer(3 * 4096);
  std::vector<Range> bad = {{nullptr, 4096}};
  EXPECT_THROW(handle.register_buffers(bad), std::invalid_argument);
  bad = {{buffer.data(), 0}};
  EXPECT_THROW(handle.register_buffers(bad), std::invalid_argument);
  const std::vector<Range> whole = {{buffer.data(), buffer.capacity()}};
  const bool fixed = register_or_note(handle, whole);
  EXPECT_EQ(handle.register_buffers(whole), fixed);  // exact repeat: no change
  bad = {{buffer.data() + 4096, 4096}};              // inside, not equal: overlap
  EXPECT_THROW(handle.register_buffers(bad), std::invalid_argument);
}

// A fixed-buffer request cut short continues on the same registered buffer.
TEST_P(RegisteredBuffersTest, ShortTransfersContinueOnFixedBuffers) {
  ASSERT_TRUE(dir_.ok());
  auto faults = std::make_shared<FaultInjector>();
  faults->add(FaultRule{.count = 0, .kind = FaultKind::kShort, .short_bytes = 8192});
  AioHandle handle(config(), fault_backend_factory(faults));
  const std::string path = dir_.file("short");
  const uint64_t bytes = 16 * kBlockSize;
  PinnedBuffer out(bytes);
  PinnedBuffer in(bytes);
  const bool fixed =
      register_or_note(handle, {{out.data(), out.capacity()}, {in.data(), in.capacity()}});
  fill_random(out.data(), bytes, seed_);
  handle.pwrite(out.data(), bytes, path, 0);
  handle.pread(in.data(), bytes, path, 0);
  EXPECT_GT(faults->fired(0), 32u);
  EXPECT_EQ(first_difference(out.data(), in.data(), bytes), -1);
  const AioStats s = handle.stats();
  if (fixed) {
    EXPECT_EQ(s.fixed_requests, s.requests);  // continuations included
  }
}

// Registration is a barrier per worker: it may be called while other threads keep transfers
// in flight; their data stays right (run under ThreadSanitizer in CI).
TEST_P(RegisteredBuffersTest, RegistrationWhileTransfersAreInFlight) {
  ASSERT_TRUE(dir_.ok());
  AioHandle handle(config());
  constexpr int kWriters = 2;
  constexpr int kRounds = 6;
  constexpr uint64_t kBytes = 6 * kBlockSize + 100;
  std::vector<PinnedBuffer> out;
  std::vector<PinnedBuffer> in;
  std::vector<Range> ranges;
  for (int t = 0; t < kWriters; ++t) {
    out.emplace_back(kBytes);
    in.emplace_back(kBytes);
    fill_random(out.back().data(), kBytes, seed_ + static_cast<uint64_t>(t));
    ranges.emplace_back(out.back().data(), out.back().capacity());
    ranges.emplace_back(in.back().data(), in.back().capacity());
  }
  std::atomic<bool> done{false};
  std::thread registrar([&] {
    while (!done.load()) {
      handle.register_buffers(ranges);
      handle.unregister_buffers(ranges);
    }
  });
  std::vector<std::thread> writers;
  std::vector<int> mismatches(kWriters, 0);
  for (int t = 0; t < kWriters; ++t) {
    writers.emplace_back([&, t] {
      const std::string path = dir_.file(numbered("w", t));
      for (int round = 0; round < kRounds; ++round) {
        handle.pwrite(out[t].data(), kBytes, path, static_cast<uint64_t>(round) * 4096);
        handle.pread(in[t].data(), kBytes, path, static_cast<uint64_t>(round) * 4096);
        if (first_difference(out[t].data(), in[t].data(), kBytes) != -1) ++mismatches[t];
      }
    });
  }
  for (auto& writer : writers) writer.join();
  done.store(true);
  registrar.join();
  for (int t = 0; t < kWriters; ++t) EXPECT_EQ(mismatches[t], 0) << "writer " << t;
}

INSTANTIATE_TEST_SUITE_P(Backends, RegisteredBuffersTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
