// Tests of the Accelerator interface on the CPU implementation (budget, streams, events,
// overlap), and of the CUDA implementation where a device exists.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "offload/cpu_accelerator.h"
#include "offload/cuda_accelerator.h"
#include "offload/error.h"
#include "tests/common/seed.h"

namespace zinf::offload {
namespace {

// A latch the test opens by hand, to hold a stream's worker inside a host function.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(CpuAccelerator, AllocationsAreTrackedAgainstTheBudget) {
  CpuAccelerator accelerator(1000);
  DeviceBuffer a = accelerator.allocate(600);
  ASSERT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 600u);
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 600u);
  {
    DeviceBuffer b = accelerator.allocate(400);
    EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 1000u);
    EXPECT_EQ(accelerator.memory_stats().peak_bytes, 1000u);
  }
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 600u);
  DeviceBuffer moved = std::move(a);
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 600u);
  moved = DeviceBuffer();
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 0u);
  EXPECT_EQ(accelerator.memory_stats().allocations, 2u);
  EXPECT_EQ(accelerator.allocate(0).data(), nullptr);
}

TEST(CpuAccelerator, OverBudgetAllocationFailsWithTheNumbers) {
  CpuAccelerator accelerator(1000);
  DeviceBuffer a = accelerator.allocate(700);
  try {
    DeviceBuffer b = accelerator.allocate(301);
    FAIL() << "allocation over budget succeeded";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    const std::string message = e.what();
    EXPECT_NE(message.find("301 bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("700 bytes in use"), std::string::npos) << message;
    EXPECT_NE(message.find("budget 1000 bytes"), std::string::npos) << message;
  }
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 700u);  // nothing leaked
  EXPECT_THROW((void)accelerator.allocate(UINT64_MAX), OffloadError);
  DeviceBuffer c = accelerator.allocate(300);  // exactly at the budget is fine
  EXPECT_EQ(accelerator.memory_stats().in_use_bytes, 1000u);
}

TEST(CpuAccelerator, ConcurrentAllocationsNeverExceedTheBudget) {
  constexpr uint64_t kBudget = 64 * 1024;
  CpuAccelerator accelerator(kBudget);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<uint32_t>(t));
      for (int i = 0; i < 500; ++i) {
        try {
          DeviceBuffer b = accelerator.allocate(1024 + rng() % 8192);
          static_cast<char*>(b.data())[0] = 1;
        } catch (const OffloadError&) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  const AcceleratorMemoryStats stats = accelerator.memory_stats();
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_LE(stats.peak_bytes, kBudget);
  EXPECT_EQ(stats.allocations + static_cast<uint64_t>(failures.load()), 2000u);
}

TEST(CpuAccelerator, CopiesRoundTripThroughTheDevice) {
  const auto seed = static_cast<uint32_t>(zinf::testing::test_seed());
  ZINF_TRACE_SEED(seed);
  std::mt19937 rng(seed);
  CpuAccelerator accelerator(1 << 20);
  auto stream = accelerator.create_stream();
  std::vector<uint8_t> host(100003);
  for (auto& b : host) {
    b = static_cast<uint8_t>(rng());
  }
  DeviceBuffer device = accelerator.allocate(host.size());
  std::vector<uint8_t> back(host.size(), 0);
  accelerator.copy_to_device(device.data(), host.data(), host.size(), *stream);
  accelerator.copy_to_host(back.data(), device.data(), back.size(), *stream);
  stream->synchronize();
  EXPECT_EQ(back, host);
}

TEST(CpuAccelerator, StreamRunsWorkInOrderOnItsOwnThread) {
  CpuAccelerator accelerator(0);
  auto stream = accelerator.create_stream();
  std::vector<int> order;  // written only by the stream's worker
  std::thread::id worker_id;
  for (int i = 0; i < 100; ++i) {
    accelerator.launch_host_func(*stream, [&order, &worker_id, i] {
      order.push_back(i);
      worker_id = std::this_thread::get_id();
    });
  }
  stream->synchronize();
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
  EXPECT_NE(worker_id, std::this_thread::get_id());
}

TEST(CpuAccelerator, TwoStreamsRunConcurrently) {
  // Stream a blocks until stream b has run: only possible if they run at the same time.
  CpuAccelerator accelerator(0);
  auto a = accelerator.create_stream();
  auto b = accelerator.create_stream();
  Gate gate;
  bool a_saw_b = false;
  accelerator.launch_host_func(*a, [&] {
    gate.wait();
    a_saw_b = true;
  });
  accelerator.launch_host_func(*b, [&] { gate.open(); });
  a->synchronize();
  b->synchronize();
  EXPECT_TRUE(a_saw_b);
}

TEST(CpuAccelerator, EventsMarkPointsInAStream) {
  CpuAccelerator accelerator(0);
  auto stream = accelerator.create_stream();
  auto event = accelerator.create_event();
  EXPECT_TRUE(event->query());  // never recorded
  Gate gate;
  accelerator.launch_host_func(*stream, [&] { gate.wait(); });
  accelerator.record_event(*event, *stream);
  EXPECT_FALSE(event->query());  // the worker is held before the record
  gate.open();
  event->synchronize();
  EXPECT_TRUE(event->query());
  stream->synchronize();
}

TEST(CpuAccelerator, WaitEventOrdersWorkAcrossStreams) {
  CpuAccelerator accelerator(1 << 20);
  auto producer = accelerator.create_stream();
  auto consumer = accelerator.create_stream();
  auto ready = accelerator.create_event();
  DeviceBuffer device = accelerator.allocate(4096);
  std::vector<uint8_t> src(4096, 0x5a);
  std::vector<uint8_t> dst(4096, 0);
  Gate gate;
  accelerator.launch_host_func(*producer, [&] { gate.wait(); });
  accelerator.copy_to_device(device.data(), src.data(), src.size(), *producer);
  accelerator.record_event(*ready, *producer);
  accelerator.wait_event(*consumer, *ready);
  accelerator.copy_to_host(dst.data(), device.data(), dst.size(), *consumer);
  gate.open();
  consumer->synchronize();
  EXPECT_EQ(dst, src);
  producer->synchronize();
}

TEST(CpuAccelerator, HostFunctionErrorsSurfaceOnSynchronize) {
  CpuAccelerator accelerator(0);
  auto stream = accelerator.create_stream();
  int after = 0;
  accelerator.launch_host_func(*stream, [] { throw std::runtime_error("boom"); });
  accelerator.launch_host_func(*stream, [&] { after = 1; });
  try {
    stream->synchronize();
    FAIL() << "error not reported";
  } catch (const OffloadError& e) {
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos);
  }
  EXPECT_EQ(after, 1);    // later work still ran
  stream->synchronize();  // reported once
}

TEST(CpuAccelerator, ForeignStreamsAreRejected) {
  CpuAccelerator one(0);
  class OtherStream final : public Stream {
   public:
    void synchronize() override {}
  } other;
  EXPECT_THROW(one.launch_host_func(other, [] {}), OffloadError);
}

TEST(CpuAccelerator, DestroyingAStreamRunsQueuedWork) {
  CpuAccelerator accelerator(0);
  std::atomic<int> ran{0};
  {
    auto stream = accelerator.create_stream();
    for (int i = 0; i < 50; ++i) {
      accelerator.launch_host_func(*stream, [&] { ran.fetch_add(1); });
    }
  }
  EXPECT_EQ(ran.load(), 50);
}

TEST(CpuAccelerator, PinHooksAndRegistrationAreCounted) {
  CpuAccelerator accelerator(0);
  std::vector<char> memory(8192);
  accelerator.register_host(memory.data(), memory.size());
  EXPECT_EQ(accelerator.registered_host_bytes(), 8192u);
  aio::PinHooks hooks = accelerator.pin_hooks();
  hooks.on_pin(memory.data(), 4096);
  EXPECT_EQ(accelerator.registered_host_bytes(), 8192u + 4096u);
  hooks.on_unpin(memory.data(), 4096);
  accelerator.unregister_host(memory.data(), memory.size());
  EXPECT_EQ(accelerator.registered_host_bytes(), 0u);
}

// ---- CUDA ------------------------------------------------------------------------------

TEST(CudaAccelerator, WithoutADeviceConstructionFailsClearly) {
  if (cuda_device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present";
  }
  try {
    CudaAccelerator accelerator;
    FAIL() << "constructed without a device";
  } catch (const OffloadError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kDevice);
    EXPECT_FALSE(cuda_unavailable_reason().empty());
  }
}

TEST(CudaAccelerator, CopiesEventsAndBudget) {
  if (cuda_device_count() == 0) {
    GTEST_SKIP() << "no CUDA device: " << cuda_unavailable_reason();
  }
  CudaAccelerator accelerator(0, 1 << 20);
  auto stream = accelerator.create_stream();
  auto event = accelerator.create_event();
  std::vector<uint8_t> host(65536);
  std::iota(host.begin(), host.end(), 0);
  std::vector<uint8_t> back(host.size(), 0);
  accelerator.register_host(host.data(), host.size());
  EXPECT_EQ(accelerator.registered_host_bytes(), host.size());
  DeviceBuffer device = accelerator.allocate(host.size());
  accelerator.copy_to_device(device.data(), host.data(), host.size(), *stream);
  accelerator.copy_to_host(back.data(), device.data(), back.size(), *stream);
  accelerator.record_event(*event, *stream);
  event->synchronize();
  EXPECT_TRUE(event->query());
  EXPECT_EQ(back, host);
  int ran = 0;
  accelerator.launch_host_func(*stream, [&] { ran = 1; });
  stream->synchronize();
  EXPECT_EQ(ran, 1);
  accelerator.unregister_host(host.data(), host.size());
  EXPECT_THROW((void)accelerator.allocate(2 << 20), OffloadError);
}

}  // namespace
}  // namespace zinf::offload
