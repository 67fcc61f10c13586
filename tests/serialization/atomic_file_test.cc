// AtomicFile's O_DIRECT path against its buffered path and against the bytes the operations
// describe: random appends of odd sizes (around the 4 KiB block and the 16 MiB stage), holes,
// patches of bytes already written, staged and in flight, and a tail that fills no block.
#include "serialization/atomic_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "serialization/serialization_error.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"

namespace zinf::serialization {
namespace {

using zinf::testing::TempDir;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// One operation of a script, applied to a file and to the expected bytes alike.
struct Op {
  enum Kind { kAppend, kSkip, kPatch, kAppendStable } kind;
  uint64_t offset = 0;  // kPatch
  std::vector<uint8_t> bytes;
  uint64_t count = 0;  // kSkip
  // kAppendStable: the bytes are stable[start, start + bytes.size()), placed so that the
  // first whole block of the file they reach starts at a 4096-aligned address.
  std::vector<uint8_t> stable;
  size_t start = 0;
};

// `bytes` copied where append_stable() at file offset `offset` can write them in place.
void place_stable(Op& op, uint64_t offset) {
  op.stable.resize(op.bytes.size() + 8192);
  const uint64_t head = (4096 - offset % 4096) % 4096;
  const auto base = reinterpret_cast<uintptr_t>(op.stable.data());
  op.start = static_cast<size_t>((4096 - (base + head) % 4096) % 4096);
  std::copy(op.bytes.begin(), op.bytes.end(), op.stable.begin() + static_cast<long>(op.start));
}

void apply(const std::vector<Op>& ops, AtomicFile& file) {
  for (const Op& op : ops) {
    switch (op.kind) {
      case Op::kAppend:
        file.append(op.bytes);
        break;
      case Op::kAppendStable:
        file.append_stable({op.stable.data() + op.start, op.bytes.size()});
        break;
      case Op::kSkip:
        file.skip(op.count);
        break;
      case Op::kPatch:
        file.patch(op.offset, op.bytes);
        break;
    }
  }
  file.commit();
}

// A random script; `expected` gets the bytes it describes.
std::vector<Op> random_script(std::mt19937_64& rng, std::vector<uint8_t>& expected) {
  const uint64_t sizes[] = {1,
                            3,
                            511,
                            4095,
                            4096,
                            4097,
                            8191,
                            8193,
                            1u << 20,
                            (16u << 20) - 5,
                            (16u << 20) + 3,
                            (32u << 20) + 1};
  std::vector<Op> ops;
  auto random_bytes = [&](uint64_t n) {
    std::vector<uint8_t> b(n);
    for (uint64_t i = 0; i < n; i += 8) {
      const uint64_t word = rng();
      std::memcpy(b.data() + i, &word, std::min<uint64_t>(8, n - i));
    }
    return b;
  };
  for (int i = 0; i < 20; ++i) {
    const uint64_t pick = rng() % 10;
    if (pick < 6 || expected.empty()) {
      Op op{Op::kAppend, 0, random_bytes(sizes[rng() % std::size(sizes)]), 0, {}, 0};
      if (rng() % 2 == 0) {
        op.kind = Op::kAppendStable;
        place_stable(op, expected.size());
      }
      expected.insert(expected.end(), op.bytes.begin(), op.bytes.end());
      ops.push_back(std::move(op));
    } else if (pick < 8) {
      const uint64_t count = rng() % 2 ? rng() % 100 : 4096 * (rng() % 1000) + rng() % 5000;
      expected.resize(expected.size() + count, 0);
      ops.push_back({Op::kSkip, 0, {}, count, {}, 0});
    } else {
      // Near the end (staged), mid-file (written) or across both.
      const uint64_t length = 1 + rng() % 9000;
      const uint64_t span = std::min<uint64_t>(expected.size(), length);
      const uint64_t offset =
          rng() % 2 ? expected.size() - span : rng() % (expected.size() - span + 1);
      Op op{Op::kPatch, offset, random_bytes(span), 0, {}, 0};
      std::copy(op.bytes.begin(), op.bytes.end(), expected.begin() + static_cast<long>(offset));
      ops.push_back(std::move(op));
    }
  }
  // A tail that fills no block.
  Op tail{Op::kAppend, 0, random_bytes(1 + rng() % 4000), 0, {}, 0};
  expected.insert(expected.end(), tail.bytes.begin(), tail.bytes.end());
  ops.push_back(std::move(tail));
  return ops;
}

TEST(AtomicFile, DirectAndBufferedWriteTheSameBytes) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::mt19937_64 rng(seed);
  uint64_t in_place = 0;
  for (int script = 0; script < 3; ++script) {
    std::vector<uint8_t> expected;
    const std::vector<Op> ops = random_script(rng, expected);
    AtomicFile direct(dir.file("direct"), AtomicFile::Mode::kDirect);
    AtomicFile buffered(dir.file("buffered"), AtomicFile::Mode::kBuffered);
    // The test directory's filesystem takes O_DIRECT (ext4, xfs); tmpfs would not.
    ASSERT_TRUE(direct.direct()) << dir.path() << " refuses O_DIRECT";
    ASSERT_FALSE(buffered.direct());
    apply(ops, direct);
    apply(ops, buffered);
    EXPECT_EQ(direct.offset(), expected.size());
    const std::vector<uint8_t> a = read_all(dir.file("direct"));
    const std::vector<uint8_t> b = read_all(dir.file("buffered"));
    ASSERT_EQ(a.size(), expected.size());
    ASSERT_EQ(b.size(), expected.size());
    EXPECT_TRUE(a == expected) << "O_DIRECT file differs, script " << script;
    EXPECT_TRUE(b == expected) << "buffered file differs, script " << script;
    EXPECT_EQ(buffered.in_place_bytes(), 0u);
    in_place += direct.in_place_bytes();
  }
  EXPECT_GT(in_place, 0u) << "no append_stable() run was written in place";
}

// A run appended with append_stable() at a 4 KiB file offset from page-aligned memory is
// written from that memory; a patch inside it afterwards lands; misaligned memory is copied.
TEST(AtomicFile, StableRunsAreWrittenInPlace) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::vector<uint8_t> expected(100, 0x11);
  Op run{Op::kAppendStable, 0, std::vector<uint8_t>(3 << 20), 0, {}, 0};
  for (size_t i = 0; i < run.bytes.size(); ++i) run.bytes[i] = static_cast<uint8_t>(i * 13 + 1);
  place_stable(run, expected.size());
  AtomicFile file(dir.file("f"));
  ASSERT_TRUE(file.direct());
  file.append({expected.data(), expected.size()});
  file.append_stable({run.stable.data() + run.start, run.bytes.size()});
  expected.insert(expected.end(), run.bytes.begin(), run.bytes.end());
  const uint64_t head = 4096 - 100;
  EXPECT_EQ(file.in_place_bytes(), (run.bytes.size() - head) / 4096 * 4096);
  const std::vector<uint8_t> patch(10, 0xEE);
  file.patch(5000, patch);
  std::copy(patch.begin(), patch.end(), expected.begin() + 5000);
  // Misaligned memory: copied, not written in place.
  std::vector<uint8_t> odd(run.stable.begin() + static_cast<long>(run.start) + 1,
                           run.stable.begin() + static_cast<long>(run.start) + (2 << 20));
  const uint64_t before = file.in_place_bytes();
  file.append_stable({run.stable.data() + run.start + 1, odd.size()});
  EXPECT_EQ(file.in_place_bytes(), before);
  expected.insert(expected.end(), odd.begin(), odd.end());
  file.commit();
  EXPECT_TRUE(read_all(dir.file("f")) == expected);
}

TEST(AtomicFile, SmallFilesAndTrailingHoles) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  for (const uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{4096}, uint64_t{4097}}) {
    for (const AtomicFile::Mode mode : {AtomicFile::Mode::kDirect, AtomicFile::Mode::kBuffered}) {
      const std::string path = dir.file(std::to_string(size) + ".bin");
      std::vector<uint8_t> bytes(size, 0x5A);
      AtomicFile file(path, mode);
      file.append(bytes);
      file.skip(3 * 4096 + 7);  // nothing written after it: the size still counts it
      file.commit();
      bytes.resize(size + 3 * 4096 + 7, 0);
      EXPECT_TRUE(read_all(path) == bytes) << "size " << size;
      struct stat st {};
      ASSERT_EQ(::stat(path.c_str(), &st), 0);
      EXPECT_EQ(static_cast<uint64_t>(st.st_mode & 0777) & 0600u, 0600u);
    }
  }
}

// tmpfs refused O_DIRECT before Linux 6.6 (the buffered fallback); it takes it since. Either
// way the bytes are right.
TEST(AtomicFile, WritesOnTmpfs) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm (tmpfs) here";
  TempDir dir("/dev/shm");
  ASSERT_TRUE(dir.ok());
  std::vector<uint8_t> bytes(3 * 4096 + 123);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  AtomicFile file(dir.file("f"));
  file.append(bytes);
  const std::vector<uint8_t> patch = {1, 2, 3};
  file.patch(5, patch);
  file.commit();
  std::copy(patch.begin(), patch.end(), bytes.begin() + 5);
  EXPECT_TRUE(read_all(dir.file("f")) == bytes);
}

TEST(AtomicFile, UncommittedFileIsRemoved) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string temp;
  {
    AtomicFile file(dir.file("f"));
    std::vector<uint8_t> bytes((16u << 20) + 5, 1);
    file.append(bytes);  // a write is in flight when the file is destroyed
    temp = file.temp_path();
    EXPECT_TRUE(std::filesystem::exists(temp));
  }
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_FALSE(std::filesystem::exists(dir.file("f")));
}

}  // namespace
}  // namespace zinf::serialization
