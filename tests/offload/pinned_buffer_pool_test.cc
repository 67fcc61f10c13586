// Tests of PinnedBufferPool: sizes and alignment, registration with the accelerator,
// back-pressure across threads, all-or-nothing multi-buffer requests, and requests that can
// never be satisfied failing at once instead of hanging.
#include "offload/pinned_buffer_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "aio/pinned_buffer.h"
#include "offload/cpu_accelerator.h"
#include "offload/error.h"
#include "tests/common/seed.h"

namespace zinf::offload {
namespace {

TEST(PinnedBufferPool, BuffersAreAlignedDistinctAndRegistered) {
  CpuAccelerator accelerator(0);
  {
    PinnedBufferPool pool(3, 10000, &accelerator, "test pool");
    EXPECT_EQ(accelerator.registered_host_bytes(), 3u * 12288u);  // rounded to 4096
    std::vector<PinnedBufferPool::Lease> leases = pool.acquire(3);
    std::set<std::byte*> seen;
    for (auto& lease : leases) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(lease.data()) % 4096, 0u);
      EXPECT_EQ(lease.size(), 10000u);
      std::memset(lease.data(), 0xab, lease.size());
      seen.insert(lease.data());
    }
    EXPECT_EQ(seen.size(), 3u);
    const PinnedPoolStats stats = pool.stats();
    EXPECT_EQ(stats.in_use, 3u);
    EXPECT_EQ(stats.high_water, 3u);
    EXPECT_EQ(stats.pinned_bytes, 3u * 12288u);
    EXPECT_FALSE(pool.try_acquire().has_value());
    leases.clear();
    EXPECT_EQ(pool.stats().in_use, 0u);
    EXPECT_TRUE(pool.try_acquire().has_value());
  }
  EXPECT_EQ(accelerator.registered_host_bytes(), 0u);
}

TEST(PinnedBufferPool, FailedConstructionUnregistersWhatItRegistered) {
  CpuAccelerator accelerator(0);
  // The third buffer cannot be had (its pin hook fails, as an allocation could).
  int pins = 0;
  aio::PinHooks hooks;
  hooks.on_pin = [&pins](void*, size_t) {
    if (++pins == 3) {
      throw std::bad_alloc();
    }
  };
  aio::set_pin_hooks(hooks);
  EXPECT_THROW(PinnedBufferPool(4, 4096, &accelerator, "test pool"), std::bad_alloc);
  aio::set_pin_hooks({});
  EXPECT_EQ(pins, 3);
  EXPECT_EQ(accelerator.registered_host_bytes(), 0u);  // the two made were unregistered
}

TEST(PinnedBufferPool, ImpossibleRequestsFailAtOnceWithTheNumbers) {
  PinnedBufferPool pool(4, 4096, nullptr, "optimizer pool");
  try {
    (void)pool.acquire(5);
    FAIL() << "request for 5 of 4 buffers did not fail";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPool);
    const std::string message = e.what();
    EXPECT_NE(message.find("optimizer pool"), std::string::npos) << message;
    EXPECT_NE(message.find("5 buffers of 4096 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("has 4 buffers"), std::string::npos) << message;
  }
  // Holding 3, a request for 2 more could only be met by this thread's own releases.
  std::vector<PinnedBufferPool::Lease> held = pool.acquire(3);
  try {
    (void)pool.acquire(2);
    FAIL() << "self-deadlocking request did not fail";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("3 of them held by the requesting thread"),
              std::string::npos)
        << e.what();
  }
  PinnedBufferPool::Lease last = pool.acquire();  // 3 + 1 <= 4 is fine
  EXPECT_THROW((void)pool.acquire(), OffloadError);
  EXPECT_THROW((void)pool.acquire_bytes(5 * 4096), OffloadError);
  EXPECT_THROW(PinnedBufferPool(0, 4096), OffloadError);
}

TEST(PinnedBufferPool, AcquireBytesSplitsAcrossBuffers) {
  PinnedBufferPool pool(4, 1000);
  EXPECT_EQ(pool.acquire_bytes(1).size(), 1u);
  EXPECT_EQ(pool.acquire_bytes(1000).size(), 1u);
  EXPECT_EQ(pool.acquire_bytes(1001).size(), 2u);
  EXPECT_EQ(pool.acquire_bytes(4000).size(), 4u);
}

TEST(PinnedBufferPool, WaitsForABufferReleasedByAnotherThread) {
  PinnedBufferPool pool(1, 4096);
  PinnedBufferPool::Lease held = pool.acquire();
  std::atomic<bool> got{false};
  std::thread waiter([&] {
    PinnedBufferPool::Lease lease = pool.acquire();  // blocks until `held` is released
    got = true;
  });
  // No sleep: the release below is what lets the waiter through, whenever it arrives.
  held.release();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(pool.stats().in_use, 0u);
}

TEST(PinnedBufferPool, LeaseReleasedOnAnotherThreadCountsForItsAcquirer) {
  PinnedBufferPool pool(2, 4096);
  std::vector<PinnedBufferPool::Lease> leases = pool.acquire(2);
  std::thread releaser([l = std::move(leases)]() mutable { l.clear(); });
  releaser.join();
  EXPECT_EQ(pool.acquire(2).size(), 2u);  // nothing counted as still held by this thread
}

TEST(PinnedBufferPool, ManyThreadsNeverShareABufferOrExceedTheCount) {
  const auto seed = static_cast<uint32_t>(zinf::testing::test_seed());
  ZINF_TRACE_SEED(seed);
  constexpr size_t kBuffers = 5;
  PinnedBufferPool pool(kBuffers, 4096, nullptr, "stress pool");
  std::atomic<int> concurrent{0};
  std::atomic<int> max_concurrent{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed + static_cast<uint32_t>(t));
      for (int i = 0; i < 300; ++i) {
        const size_t count = 1 + rng() % 3;
        std::vector<PinnedBufferPool::Lease> leases = pool.acquire(count);
        const int now = concurrent.fetch_add(static_cast<int>(count)) + static_cast<int>(count);
        int seen = max_concurrent.load();
        while (now > seen && !max_concurrent.compare_exchange_weak(seen, now)) {
        }
        const auto tag = static_cast<uint8_t>(t * 16 + i % 16);
        for (auto& lease : leases) {
          std::memset(lease.data(), tag, 64);
        }
        for (auto& lease : leases) {
          for (int b = 0; b < 64; ++b) {
            if (std::to_integer<uint8_t>(lease.data()[b]) != tag) {
              errors.fetch_add(1);  // someone else wrote into a buffer leased to us
            }
          }
        }
        concurrent.fetch_sub(static_cast<int>(count));
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(errors.load(), 0);
  EXPECT_LE(max_concurrent.load(), static_cast<int>(kBuffers));
  const PinnedPoolStats stats = pool.stats();
  EXPECT_EQ(stats.in_use, 0u);
  EXPECT_LE(stats.high_water, kBuffers);
}

TEST(PinnedBufferPool, LeasesOutliveThePool) {
  std::optional<PinnedBufferPool::Lease> lease;
  {
    PinnedBufferPool pool(1, 4096);
    lease = pool.acquire();
  }
  std::memset(lease->data(), 1, 4096);  // still valid memory
  lease.reset();
}

}  // namespace
}  // namespace zinf::offload
