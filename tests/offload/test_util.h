// Helpers shared by the offload tests: random data drawn from a seeded generator, a check
// for /dev/shm, an Accelerator whose host registration fails on a chosen call (a failure
// injected midway through a constructor that builds pools), and a probe of the extents a
// store still holds. The temporary directory and the seed policy (test_seed(),
// ZINF_TRACE_SEED) are the shared ones in tests/common.
//
// Thread safety: the helpers hold no state; a generator passed in must not be shared.
// RefusingAccelerator is for one thread (it counts calls unsynchronized).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "aio/config.h"
#include "offload/accelerator.h"
#include "offload/error.h"
#include "offload/nvme_store.h"

namespace zinf::offload::testing {

inline std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (auto& b : data) {
    b = static_cast<uint8_t>(rng());
  }
  return data;
}

inline std::vector<float> random_floats(std::mt19937& rng, size_t numel, float scale = 1.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> data(numel);
  for (auto& x : data) {
    x = normal(rng);
  }
  return data;
}

// The aio backends every fault-path suite runs on.
inline const std::vector<aio::BackendKind>& all_backends() {
  static const std::vector<aio::BackendKind> kinds = {
      aio::BackendKind::kIoUring, aio::BackendKind::kLibaio, aio::BackendKind::kPsync};
  return kinds;
}

inline std::string backend_param_name(const ::testing::TestParamInfo<aio::BackendKind>& info) {
  return std::string(aio::to_string(info.param));
}

// Whether /dev/shm is a usable tmpfs for the buffered-fallback tests.
inline bool have_dev_shm() { return std::filesystem::is_directory("/dev/shm"); }

// An accelerator whose register_host() throws OffloadError(kDevice) on call number
// `fail_at` (1-based; 0: never) and counts the others. It has no streams or device memory:
// only the pools' host registration is exercised.
class RefusingAccelerator final : public Accelerator {
 public:
  explicit RefusingAccelerator(uint64_t fail_at) : Accelerator(0), fail_at_(fail_at) {}

  std::string_view name() const noexcept override { return "refusing"; }
  std::unique_ptr<Stream> create_stream() override { throw unused(); }
  std::unique_ptr<Event> create_event() override { throw unused(); }
  void copy_to_device(void*, const void*, size_t, Stream&) override { throw unused(); }
  void copy_to_host(void*, const void*, size_t, Stream&) override { throw unused(); }
  void copy_on_device(void*, const void*, size_t, Stream&) override { throw unused(); }
  void fill_zero(void*, size_t, Stream&) override { throw unused(); }
  ComputeView compute_view(void*, size_t) override { throw unused(); }
  ComputeView compute_device() const noexcept override { return {}; }
  bool host_reads_device_memory() const noexcept override { return false; }
  void launch_host_func(Stream&, std::function<void()>) override { throw unused(); }
  void record_event(Event&, Stream&) override { throw unused(); }
  void wait_event(Stream&, Event&) override { throw unused(); }

  void register_host(void* /*ptr*/, size_t bytes) override {
    if (++calls_ == fail_at_) {
      throw OffloadError(ErrorKind::kDevice, "injected: host registration refused");
    }
    registered_ += bytes;
  }
  void unregister_host(void* /*ptr*/, size_t bytes) noexcept override { registered_ -= bytes; }
  uint64_t registered_host_bytes() const noexcept override { return registered_; }
  aio::PinHooks pin_hooks() override { return {}; }

  uint64_t calls() const noexcept { return calls_; }

 protected:
  void* device_malloc(size_t /*bytes*/, std::string_view /*what*/) override {
    throw std::bad_alloc();
  }
  void device_free(void* /*ptr*/, size_t /*bytes*/) noexcept override {}

 private:
  static OffloadError unused() {
    return OffloadError(ErrorKind::kUsage,
                        "refusing accelerator: only host registration is part of this fake (device "
                        "memory, streams and copies are not)");
  }
  const uint64_t fail_at_;
  uint64_t calls_ = 0;
  uint64_t registered_ = 0;
};

// Whether `store` holds no extent: ids are handed out in order and never reused, so a probe
// extent's id is the number ever allocated, and every id below it must be free (unknown to
// extent()). The probe is freed again. Also reports, through `probe_offset`, where the
// probe landed (0 when the freed space is reused first-fit from the start).
inline ::testing::AssertionResult holds_no_extent(NvmeStore& store, uint64_t* probe_offset) {
  const ExtentId probe = store.allocate(1);
  *probe_offset = store.extent(probe).file_offset;
  store.free(probe);
  for (ExtentId id = 0; id < probe; ++id) {
    try {
      (void)store.extent(id);
      return ::testing::AssertionFailure()
             << "extent " << id << " of " << probe << " ever allocated is still held";
    } catch (const OffloadError&) {
      // free, as expected
    }
  }
  return ::testing::AssertionSuccess() << probe << " extents allocated, none held";
}

// Extents of `sizes` bytes allocated in `store`, written with random bytes through one
// queue, each read back whole and expected equal: what the store tests start from.
struct WrittenExtents {
  std::vector<ExtentId> ids;
  std::vector<std::vector<uint8_t>> data;  // what each extent holds
};
inline WrittenExtents write_and_check_extents(NvmeStore& store, std::mt19937& rng,
                                              const std::vector<uint64_t>& sizes) {
  WrittenExtents out;
  for (uint64_t size : sizes) {
    out.ids.push_back(store.allocate(size));
    out.data.push_back(random_bytes(rng, size));
  }
  auto queue = store.make_queue();
  for (size_t i = 0; i < out.ids.size(); ++i) {
    queue->async_write(out.ids[i], out.data[i].data());
  }
  queue->wait();
  for (size_t i = 0; i < out.ids.size(); ++i) {
    std::vector<uint8_t> back(sizes[i], 0);
    store.read(out.ids[i], back.data());
    EXPECT_EQ(back, out.data[i]) << "extent " << i << " of " << sizes[i] << " bytes";
  }
  return out;
}

// Runs `threads` threads, each with its own queue of `store`, writing `extents` extents of
// 1 .. max_bytes random bytes, reading them back and freeing them; returns how many extents
// came back different, per thread.
inline std::vector<int> concurrent_queue_round_trips(NvmeStore& store, uint32_t seed, int threads,
                                                     int extents, uint64_t max_bytes) {
  std::vector<std::thread> workers;
  std::vector<int> failures(static_cast<size_t>(threads), 0);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::mt19937 rng(seed + static_cast<uint32_t>(t));
      auto queue = store.make_queue();
      std::vector<ExtentId> ids;
      std::vector<std::vector<uint8_t>> data;
      for (int i = 0; i < extents; ++i) {
        const uint64_t size = 1 + rng() % max_bytes;
        ids.push_back(store.allocate(size));
        data.push_back(random_bytes(rng, size));
        queue->async_write(ids.back(), data.back().data());
      }
      queue->wait();
      std::vector<std::vector<uint8_t>> back(static_cast<size_t>(extents));
      for (size_t i = 0; i < back.size(); ++i) {
        back[i].resize(data[i].size());
        queue->async_read(ids[i], back[i].data());
      }
      queue->wait();
      for (size_t i = 0; i < back.size(); ++i) {
        failures[static_cast<size_t>(t)] += back[i] != data[i] ? 1 : 0;
        store.free(ids[i]);
      }
    });
  }
  for (auto& w : workers) {
    w.join();
  }
  return failures;
}

}  // namespace zinf::offload::testing
