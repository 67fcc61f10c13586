// Backends used directly: prep/submit/reap round trips with tags, capacity limits, per-request
// errors as completions, and io_uring's registered files and fixed buffers.
#include "aio/backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <vector>

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

constexpr unsigned kDepth = 4;
constexpr uint32_t kRequest = 64 * 1024;

class BackendTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    AioConfig config;
    config.backend = GetParam();
    config.queue_depth = kDepth;
    backend_ = make_backend(config);
    path_ = dir_.file("backend.bin");
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Reaps until `count` completions arrived; returns them.
  std::vector<Completion> reap_all(size_t count) {
    std::vector<Completion> all;
    std::vector<Completion> batch(kDepth);
    while (all.size() < count) {
      const int n = backend_->reap(batch, 1);
      if (n == -EINTR) continue;
      EXPECT_GE(n, 0);
      if (n < 0) break;
      all.insert(all.end(), batch.begin(), batch.begin() + n);
    }
    return all;
  }

  // Submits everything staged (repeating after -EAGAIN/-EINTR).
  int submit_all(int staged) {
    int taken = 0;
    while (taken < staged) {
      const int rc = backend_->submit();
      if (rc == -EAGAIN || rc == -EINTR) continue;
      if (rc < 0) return rc;
      taken += rc;
    }
    return taken;
  }

  TempDir dir_;
  const uint64_t seed_ = test_seed();
  ::testing::ScopedTrace seed_trace_{__FILE__, __LINE__, zinf::testing::seed_trace_message(seed_)};
  std::unique_ptr<Backend> backend_;
  std::string path_;
  int fd_ = -1;
};

TEST_P(BackendTest, ReportsNameAndCapacity) {
  EXPECT_EQ(backend_->name(), to_string(GetParam()));
  EXPECT_EQ(backend_->capacity(), kDepth);
  EXPECT_EQ(backend_->caps().kernel_async, GetParam() != BackendKind::kPsync);
}

TEST_P(BackendTest, RoundTripWithTags) {
  ShiftedBuffer out(kDepth * kRequest, 0);
  fill_random(out.data(), out.size(), seed_);
  for (unsigned i = 0; i < kDepth; ++i) {
    ASSERT_EQ(backend_->prep(Request{.op = Op::kWrite,
                                     .fd = fd_,
                                     .buffer = out.data() + i * kRequest,
                                     .bytes = kRequest,
                                     .offset = uint64_t{i} * kRequest,
                                     .tag = 100 + i}),
              0);
  }
  // Full: one more is refused until something completes.
  EXPECT_EQ(backend_->prep(Request{
                .op = Op::kWrite, .fd = fd_, .buffer = out.data(), .bytes = kRequest, .tag = 999}),
            -EBUSY);
  ASSERT_EQ(submit_all(kDepth), static_cast<int>(kDepth));
  std::set<uint64_t> tags;
  for (const Completion& c : reap_all(kDepth)) {
    EXPECT_EQ(c.result, kRequest) << "tag " << c.tag;
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags, (std::set<uint64_t>{100, 101, 102, 103}));

  ShiftedBuffer in(kDepth * kRequest, 0);
  for (unsigned i = 0; i < kDepth; ++i) {
    ASSERT_EQ(backend_->prep(Request{.op = Op::kRead,
                                     .fd = fd_,
                                     .buffer = in.data() + i * kRequest,
                                     .bytes = kRequest,
                                     .offset = uint64_t{i} * kRequest,
                                     .tag = i}),
              0);
    // One by one, like single_submit.
    ASSERT_EQ(submit_all(1), 1);
  }
  for (const Completion& c : reap_all(kDepth)) EXPECT_EQ(c.result, kRequest);
  EXPECT_EQ(first_difference(out.data(), in.data(), out.size()), -1);
}

TEST_P(BackendTest, ShortReadAtEndOfFileAndErrorsAreCompletions) {
  ShiftedBuffer buf(kRequest, 0);
  fill_random(buf.data(), buf.size(), seed_);
  ASSERT_EQ(
      backend_->prep(Request{
          .op = Op::kWrite, .fd = fd_, .buffer = buf.data(), .bytes = 8192, .offset = 0, .tag = 1}),
      0);
  ASSERT_EQ(submit_all(1), 1);
  ASSERT_EQ(reap_all(1).at(0).result, 8192);
  // Reading past the end comes back short; a bad descriptor comes back as -EBADF.
  ASSERT_EQ(backend_->prep(Request{.op = Op::kRead,
                                   .fd = fd_,
                                   .buffer = buf.data(),
                                   .bytes = kRequest,
                                   .offset = 0,
                                   .tag = 2}),
            0);
  ASSERT_EQ(backend_->prep(Request{.op = Op::kRead,
                                   .fd = 12345,
                                   .buffer = buf.data(),
                                   .bytes = 4096,
                                   .offset = 0,
                                   .tag = 3}),
            0);
  ASSERT_EQ(submit_all(2), 2);
  for (const Completion& c : reap_all(2)) {
    EXPECT_EQ(c.result, c.tag == 2 ? 8192 : -EBADF) << "tag " << c.tag;
  }
}

TEST(UringBackendTest, RegisteredFilesAndFixedBuffers) {
  const uint64_t seed = test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto backend = make_io_uring_backend(2);
  ASSERT_TRUE(backend->caps().registered_files);
  ASSERT_TRUE(backend->caps().fixed_buffers);
  const std::string path = dir.file("fixed.bin");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ShiftedBuffer out(kRequest, 0);
  ShiftedBuffer in(kRequest, 0);
  fill_random(out.data(), out.size(), seed);
  const int fds[] = {fd};
  ASSERT_EQ(backend->register_files(fds), 0);
  const iovec buffers[] = {{out.data(), out.size()}, {in.data(), in.size()}};
  ASSERT_EQ(backend->register_buffers(buffers), 0);
  std::vector<Completion> done(2);
  ASSERT_EQ(backend->prep(Request{.op = Op::kWrite,
                                  .file_index = 0,
                                  .buffer_index = 0,
                                  .buffer = out.data(),
                                  .bytes = kRequest,
                                  .tag = 7}),
            0);
  ASSERT_EQ(backend->submit(), 1);
  ASSERT_EQ(backend->reap(done, 1), 1);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].result, kRequest);
  ASSERT_EQ(backend->prep(Request{.op = Op::kRead,
                                  .file_index = 0,
                                  .buffer_index = 1,
                                  .buffer = in.data(),
                                  .bytes = kRequest,
                                  .tag = 8}),
            0);
  ASSERT_EQ(backend->submit(), 1);
  ASSERT_EQ(backend->reap(done, 1), 1);
  EXPECT_EQ(done[0].result, kRequest);
  EXPECT_EQ(first_difference(out.data(), in.data(), out.size()), -1);
  EXPECT_EQ(backend->register_buffers({}), 0);
  EXPECT_EQ(backend->register_files({}), 0);
  ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest, ::testing::ValuesIn(all_backends()),
                         backend_param_name);

}  // namespace
}  // namespace zinf::aio
