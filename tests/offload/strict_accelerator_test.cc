// The strict device: device memory the host cannot touch, reached only through the
// accelerator's copies and compute views, and a fault that names the allocation.
#include "offload/strict_accelerator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "offload/error.h"

namespace zinf::offload {
namespace {

constexpr uint64_t kBudget = uint64_t{64} << 20;

TEST(StrictAccelerator, CopiesRoundTripThroughTheAlias) {
  StrictAccelerator acc(kBudget);
  auto stream = acc.create_stream();
  DeviceBuffer a = acc.allocate(1000 * sizeof(float), "round trip a");
  DeviceBuffer b = acc.allocate(1000 * sizeof(float), "round trip b");
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), 1.0f);
  acc.copy_to_device(a.data(), host.data(), a.size(), *stream);
  acc.copy_on_device(b.data(), a.data(), a.size(), *stream);
  acc.fill_zero(static_cast<std::byte*>(b.data()) + 400 * sizeof(float), 100 * sizeof(float),
                *stream);
  std::vector<float> back(1000, -1.0f);
  acc.copy_to_host(back.data(), b.data(), b.size(), *stream);
  stream->synchronize();
  for (size_t i = 0; i < back.size(); ++i) {
    const float want = i >= 400 && i < 500 ? 0.0f : static_cast<float>(i + 1);
    ASSERT_EQ(back[i], want) << i;
  }
  // The compute view is the same memory, readable and writable.
  const ComputeView view = acc.compute_view(a.data(), a.size());
  EXPECT_EQ(view.device, ComputeDevice::kCpu);
  EXPECT_NE(view.data, a.data());
  EXPECT_EQ(static_cast<float*>(view.data)[999], 1000.0f);
  static_cast<float*>(view.data)[0] = 42.0f;
  acc.copy_to_host(back.data(), a.data(), sizeof(float), *stream);
  stream->synchronize();
  EXPECT_EQ(back[0], 42.0f);
  EXPECT_FALSE(acc.host_reads_device_memory());
  EXPECT_EQ(acc.name(), "strict");
}

TEST(StrictAccelerator, CopiesRefuseHostMemoryWhereDeviceMemoryBelongsAndTheOtherWayRound) {
  StrictAccelerator acc(kBudget);
  auto stream = acc.create_stream();
  DeviceBuffer a = acc.allocate(4096, "the buffer");
  std::vector<std::byte> host(8192);
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const OffloadError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      return e.what();
    }
    return "(no error)";
  };
  // Host memory where device memory belongs.
  EXPECT_NE(message([&] {
              acc.copy_to_device(host.data(), host.data() + 4096, 16, *stream);
            }).find("copy_to_device: the destination"),
            std::string::npos);
  EXPECT_NE(message([&] {
              acc.copy_to_host(host.data(), host.data() + 16, 16, *stream);
            }).find("is not device memory (host memory"),
            std::string::npos);
  // Device memory where host memory belongs, naming the allocation.
  const std::string as_host = message(
      [&] { acc.copy_to_device(a.data(), static_cast<std::byte*>(a.data()) + 64, 16, *stream); });
  EXPECT_NE(as_host.find("is device memory (allocation #"), std::string::npos) << as_host;
  EXPECT_NE(as_host.find("\"the buffer\" (4096 bytes), byte 64"), std::string::npos) << as_host;
  // A compute view is not host memory either.
  void* view = acc.compute_view(a.data(), a.size()).data;
  EXPECT_NE(message([&] {
              acc.copy_to_device(a.data(), view, 16, *stream);
            }).find("is a compute view of device memory"),
            std::string::npos);
  // Past the end of the allocation's pages.
  EXPECT_NE(message([&] {
              acc.fill_zero(static_cast<std::byte*>(a.data()) + 4000, 200, *stream);
            }).find("runs past the end of allocation #"),
            std::string::npos);
  EXPECT_NE(message([&] { (void)acc.compute_view(host.data(), 16); }).find("compute_view"),
            std::string::npos);
  stream->synchronize();
}

TEST(StrictAccelerator, PointersAreKnownOnlyWhileTheirAllocationLives) {
  StrictAccelerator acc(kBudget);
  void* handed = nullptr;
  {
    DeviceBuffer a = acc.allocate(100, "short-lived");
    handed = a.data();
    ASSERT_NE(strict_alias(handed, 100), nullptr);
    EXPECT_NE(strict_alias(static_cast<std::byte*>(handed) + 50, 50), nullptr);
    EXPECT_EQ(strict_alias(handed, 1 << 20), nullptr);  // past its pages
    EXPECT_NE(describe_strict_pointer(static_cast<std::byte*>(handed) + 7).find("byte 7"),
              std::string::npos);
  }
  EXPECT_EQ(strict_alias(handed, 1), nullptr);
  std::vector<int> host(4);
  EXPECT_EQ(strict_alias(host.data(), sizeof(int)), nullptr);
  EXPECT_EQ(describe_strict_pointer(host.data()), "");
  EXPECT_EQ(acc.memory_stats().in_use_bytes, 0u);
}

TEST(StrictAccelerator, BudgetCountsRequestedBytes) {
  StrictAccelerator acc(10000);
  DeviceBuffer a = acc.allocate(6000, "a");
  EXPECT_THROW((void)acc.allocate(6000, "b"), OffloadError);
  EXPECT_EQ(acc.memory_stats().in_use_bytes, 6000u);
}

// The trap: host code reading device memory dies with one line naming the allocation and the
// offset.
TEST(StrictAcceleratorDeathTest, AHostReadOfDeviceMemoryFaultsNamingTheAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        StrictAccelerator acc(kBudget);
        DeviceBuffer a = acc.allocate(3 * 4096, "gathered parameter");
        const volatile float* p = static_cast<const float*>(a.data());
        const float v = p[2048];  // byte 8192
        std::fprintf(stderr, "read %f\n", static_cast<double>(v));
      },
      "zinf strict device: host code touched device memory at 0x[0-9a-f]+: allocation #[0-9]+ "
      "\"gathered parameter\" \\(12288 bytes\\), byte 8192\\.");
}

TEST(StrictAcceleratorDeathTest, AHostWriteOfDeviceMemoryFaultsToo) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        StrictAccelerator acc(kBudget);
        DeviceBuffer a = acc.allocate(64, "bucket");
        std::memset(a.data(), 0, 64);
      },
      "allocation #[0-9]+ \"bucket\" \\(64 bytes\\), byte 0\\.");
}

}  // namespace
}  // namespace zinf::offload
