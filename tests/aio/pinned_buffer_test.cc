// PinnedBuffer: alignment and sizes, moves, and the accelerator hooks.
#include "aio/pinned_buffer.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

namespace zinf::aio {
namespace {

struct HookLog {
  std::vector<std::pair<void*, size_t>> pinned;
  std::vector<std::pair<void*, size_t>> unpinned;
};

HookLog* g_log = nullptr;  // the test body owns it; hooks run on the test thread

class PinnedBufferTest : public ::testing::Test {
 protected:
  void TearDown() override {
    set_pin_hooks({});
    g_log = nullptr;
  }
};

TEST_F(PinnedBufferTest, AlignedAndRounded) {
  PinnedBuffer buffer(5000);
  ASSERT_NE(buffer.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.data()) % kPinAlignment, 0u);
  EXPECT_EQ(buffer.size(), 5000u);
  EXPECT_EQ(buffer.capacity(), 8192u);
  buffer.data()[8191] = std::byte{1};  // the whole capacity is usable
  EXPECT_EQ(buffer.as<uint32_t>(), reinterpret_cast<uint32_t*>(buffer.data()));
}

TEST_F(PinnedBufferTest, EmptyBuffer) {
  PinnedBuffer empty(0);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_EQ(empty.capacity(), 0u);
  PinnedBuffer defaulted;
  EXPECT_EQ(defaulted.size(), 0u);
}

TEST_F(PinnedBufferTest, MovesTransferOwnership) {
  PinnedBuffer a(4096);
  std::byte* data = a.data();
  PinnedBuffer b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  PinnedBuffer c(100);
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.size(), 4096u);
}

TEST_F(PinnedBufferTest, HooksSeeTheWholeRange) {
  HookLog log;
  g_log = &log;
  set_pin_hooks(
      PinHooks{.on_pin = [](void* p, size_t n) { g_log->pinned.emplace_back(p, n); },
               .on_unpin = [](void* p, size_t n) { g_log->unpinned.emplace_back(p, n); }});
  void* data = nullptr;
  {
    PinnedBuffer buffer(10);
    data = buffer.data();
    ASSERT_EQ(log.pinned.size(), 1u);
    EXPECT_EQ(log.pinned[0], std::make_pair(data, size_t{4096}));
    EXPECT_TRUE(log.unpinned.empty());
    // Buffers keep the hooks they were created with.
    set_pin_hooks({});
  }
  ASSERT_EQ(log.unpinned.size(), 1u);
  EXPECT_EQ(log.unpinned[0], std::make_pair(data, size_t{4096}));
}

TEST_F(PinnedBufferTest, ThrowingPinHookReleasesAndPropagates) {
  HookLog log;
  g_log = &log;
  set_pin_hooks(
      PinHooks{.on_pin = [](void*, size_t) { throw std::runtime_error("register failed"); },
               .on_unpin = [](void* p, size_t n) { g_log->unpinned.emplace_back(p, n); }});
  EXPECT_THROW(PinnedBuffer(4096), std::runtime_error);
  EXPECT_TRUE(log.unpinned.empty());  // never pinned, so never unpinned
}

TEST_F(PinnedBufferTest, LargeBufferStaysUsableWhenLockIsRefused) {
  // The refusal is forced: as root (CAP_IPC_LOCK) or with an unlimited RLIMIT_MEMLOCK a real
  // mlock never fails, so this test could not fail there without it.
  const MemoryLocker previous = set_memory_locker([](void*, size_t) -> int { return EPERM; });
  PinnedBuffer buffer(64u << 20);
  set_memory_locker(previous);
  EXPECT_FALSE(buffer.locked());
  ASSERT_NE(buffer.data(), nullptr);
  buffer.data()[buffer.size() - 1] = std::byte{42};
  EXPECT_EQ(buffer.data()[buffer.size() - 1], std::byte{42});
}

}  // namespace
}  // namespace zinf::aio
