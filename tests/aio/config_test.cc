// AioConfig validation, backend names, and IoError's message.
#include "aio/config.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "aio/error.h"

namespace zinf::aio {
namespace {

TEST(AioConfigTest, DefaultsAreValidAndMatchDeepSpeed) {
  AioConfig config;
  EXPECT_NO_THROW(config.validate());
  EXPECT_EQ(config.block_size, 1u << 20);
  EXPECT_EQ(config.queue_depth, 8);
  EXPECT_EQ(config.intra_op_parallelism, 1);
  EXPECT_FALSE(config.single_submit);
  EXPECT_TRUE(config.overlap_events);
  EXPECT_EQ(config.backend, BackendKind::kIoUring);
  EXPECT_EQ(config.io_timeout_s, 300.0);  // zinf.io_timeout_s's default
}

TEST(AioConfigTest, ValidateNamesTheKey) {
  auto message = [](AioConfig config) -> std::string {
    try {
      config.validate();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  AioConfig c;
  c.block_size = 0;
  EXPECT_NE(message(c).find("block_size"), std::string::npos);
  c = AioConfig{};
  c.block_size = 4097;
  EXPECT_NE(message(c).find("block_size"), std::string::npos);
  c = AioConfig{};
  c.queue_depth = 0;
  EXPECT_NE(message(c).find("queue_depth"), std::string::npos);
  c = AioConfig{};
  c.queue_depth = 4097;
  EXPECT_NE(message(c).find("queue_depth"), std::string::npos);
  c = AioConfig{};
  c.intra_op_parallelism = 257;
  EXPECT_NE(message(c).find("intra_op_parallelism"), std::string::npos);
  // A deadline is mandatory: 0 (no deadline), negative, NaN and infinite are refused.
  for (double seconds : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 2e9}) {
    c = AioConfig{};
    c.io_timeout_s = seconds;
    EXPECT_NE(message(c).find("io_timeout_s"), std::string::npos) << seconds;
  }
  c = AioConfig{};
  c.io_timeout_s = 0.001;
  EXPECT_EQ(message(c), "");
}

TEST(AioConfigTest, BackendNamesRoundTrip) {
  for (BackendKind kind : {BackendKind::kIoUring, BackendKind::kLibaio, BackendKind::kPsync}) {
    EXPECT_EQ(parse_backend(to_string(kind)), kind);
  }
  EXPECT_EQ(parse_backend("IO_URING"), BackendKind::kIoUring);
  EXPECT_EQ(parse_backend("LibAIO"), BackendKind::kLibaio);
  EXPECT_FALSE(parse_backend("gds"));
  EXPECT_FALSE(parse_backend(""));
}

TEST(IoErrorTest, CarriesContextAndErrnoText) {
  const IoError e("write", "/nvme/x.bin", 4294967296ull, 1024, ENOSPC, "while swapping");
  EXPECT_EQ(e.op(), "write");
  EXPECT_EQ(e.path(), "/nvme/x.bin");
  EXPECT_EQ(e.offset(), 4294967296ull);
  EXPECT_EQ(e.length(), 1024u);
  EXPECT_EQ(e.error(), ENOSPC);
  const std::string what = e.what();
  for (const char* part : {"write", "/nvme/x.bin", "4294967296", "1024", "No space left on device",
                           "while swapping"}) {
    EXPECT_NE(what.find(part), std::string::npos) << what;
  }
  const IoError no_errno("read", "/a", 0, 1, 0, "unexpected end of file");
  EXPECT_EQ(std::string(no_errno.what()).find("errno"), std::string::npos);
}

}  // namespace
}  // namespace zinf::aio
