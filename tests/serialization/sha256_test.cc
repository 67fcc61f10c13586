// SHA-256 against FIPS 180-4's examples and against coreutils' sha256sum on inputs of every
// length around the block and padding boundaries, fed whole and in uneven pieces.
#include "serialization/sha256.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "serialization/serialization_error.h"
#include "tests/common/temp_dir.h"

namespace zinf::serialization {
namespace {

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// sha256sum's digest of `path` ("" when it could not run).
std::string coreutils_sha256(const std::string& path) {
  FILE* p = ::popen(("sha256sum '" + path + "'").c_str(), "r");
  if (p == nullptr) return {};
  char out[65] = {};
  const size_t got = std::fread(out, 1, 64, p);
  ::pclose(p);
  return got == 64 ? std::string(out, 64) : std::string();
}

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(sha256_hex(bytes_of("")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(bytes_of("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', in pieces of 1000.
  Sha256 h;
  const std::string piece(1000, 'a');
  for (int i = 0; i < 1000; ++i) h.update(bytes_of(piece));
  const auto digest = h.finish();
  EXPECT_EQ(to_hex(digest), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, EveryLengthAroundTheBoundariesMatchesSha256sum) {
  ::zinf::testing::TempDir dir;
  for (size_t n : {1u, 55u, 56u, 57u, 63u, 64u, 65u, 119u, 120u, 127u, 128u, 129u, 1000u, 70001u}) {
    SCOPED_TRACE(n);
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>((i * 131 + n) & 0xff);
    const std::string path = dir.file("in" + std::to_string(n));
    std::ofstream(path, std::ios::binary) << data;
    const std::string want = coreutils_sha256(path);
    ASSERT_EQ(want.size(), 64u) << "sha256sum did not run";
    EXPECT_EQ(sha256_hex(bytes_of(data)), want);
    EXPECT_EQ(sha256_file_hex(path), want);
    // Fed in uneven pieces (1, 2, 3, ... bytes).
    Sha256 h;
    size_t at = 0;
    for (size_t step = 1; at < n; ++step) {
      const size_t take = std::min(step, n - at);
      h.update(bytes_of(data).subspan(at, take));
      at += take;
    }
    EXPECT_EQ(to_hex(h.finish()), want);
  }
  EXPECT_THROW((void)sha256_file_hex(dir.file("missing")), SerializationError);
}

}  // namespace
}  // namespace zinf::serialization
