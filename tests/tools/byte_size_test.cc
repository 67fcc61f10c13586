#include "tools/byte_size.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace zinf::tools {
namespace {

TEST(ByteSize, BinarySuffixesAsDsIoReadsThem) {
  EXPECT_EQ(parse_byte_size("4096", "--size"), 4096u);
  EXPECT_EQ(parse_byte_size("512K", "--size"), 512u * 1024);
  EXPECT_EQ(parse_byte_size("1M", "--size"), 1u << 20);
  EXPECT_EQ(parse_byte_size("8MiB", "--size"), 8u << 20);
  EXPECT_EQ(parse_byte_size("2g", "--size"), uint64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("1.5G", "--size"), uint64_t{3} << 29);
  EXPECT_EQ(parse_byte_size("5T", "--size"), uint64_t{5} << 40);
}

TEST(ByteSize, DecimalSuffixesAndExponents) {
  EXPECT_EQ(parse_byte_size("5GB", "--size"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("1e9", "--size"), 1'000'000'000u);
  EXPECT_EQ(parse_byte_size("3e8", "--size"), 300'000'000u);
  EXPECT_EQ(parse_byte_size("0.94e6", "--size"), 940'000u);
  EXPECT_EQ(parse_byte_size("10kb", "--size"), 10'000u);
}

TEST(ByteSize, RejectsWithTheOptionName) {
  for (std::string bad : {"", "-1M", "M", "12Q", "1.5", "0.3K", "8e", "1e30", "1..2M"}) {
    try {
      (void)parse_byte_size(bad, "--block-size");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--block-size"), std::string::npos) << e.what();
    }
  }
}

TEST(ByteSize, Formats) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1 << 20), "1 MiB");
  EXPECT_EQ(format_bytes(uint64_t{3} << 29), "1.50 GiB");
}

// A value that is not exact in the unit is printed in bytes (4095 is not "4.00 KiB"), from
// 1 MiB on after the rounded value.
TEST(ByteSize, FormatsInexactValuesInBytes) {
  EXPECT_EQ(format_bytes(4095), "4095 B");
  EXPECT_EQ(format_bytes(4097), "4097 B");
  EXPECT_EQ(format_bytes(1'000'000'000), "953.67 MiB (1000000000 B)");
  EXPECT_EQ(format_bytes(uint64_t{5} << 40), "5 TiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(0), "0 B");
}

}  // namespace
}  // namespace zinf::tools
