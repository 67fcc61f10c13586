// ZipReader and ZipWriter: round trips with odd sizes and chunking, the archive checked by
// independent readers (libzip, Python's zipfile), archives written by Python's zipfile and
// torch.save read back, ZIP64 beyond 4 GiB through a sparse file, the atomic temp-file
// protocol, and malformed archives (every truncation, flipped bytes, lying sizes, overlaps,
// huge counts and offsets) ending in SerializationError.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <zip.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"
#include "serialization/zip_writer.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"
#include "tests/serialization/serialization_test_util.h"

namespace zinf::serialization {
namespace {

using testing::error_of;
using testing::expect_error;
using testing::read_bytes;
using testing::run_python;
using testing::write_bytes;
using zinf::testing::TempDir;

using Records = std::map<std::string, std::vector<uint8_t>>;

Records random_records(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Records records;
  const std::vector<size_t> sizes = {0, 1, 63, 64, 65, 1000, 4097, (1u << 20) + 13};
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> data(sizes[i]);
    for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
    records["archive/data/" + std::to_string(i)] = std::move(data);
  }
  records["archive/version"] = {'3', '\n'};
  return records;
}

// How write_archive hands chunks to the writer.
enum class ChunkCrc {
  kComputed,  // write(chunk): the writer computes the CRC-32
  kGiven,     // write(chunk, crc): the caller computed it
  kMixed,     // either, chosen at random per chunk
};

// Writes `records`, each in random-sized chunks.
void write_archive(const std::string& path, const Records& records, ZipWriter::Options options,
                   uint64_t seed, ChunkCrc chunk_crc = ChunkCrc::kComputed) {
  std::mt19937_64 rng(seed);
  ZipWriter writer(path, options);
  for (const auto& [name, data] : records) {
    writer.begin_record(name, data.size());
    size_t at = 0;
    while (at < data.size()) {
      const size_t chunk = std::min<size_t>(data.size() - at, 1 + rng() % 300000);
      const std::span<const uint8_t> bytes = std::span<const uint8_t>(data).subspan(at, chunk);
      const bool given =
          chunk_crc == ChunkCrc::kGiven || (chunk_crc == ChunkCrc::kMixed && rng() % 2);
      if (given) {
        writer.write(bytes, crc32_update(0, bytes));
      } else {
        writer.write(bytes);
      }
      at += chunk;
    }
  }
  writer.finish();
}

void expect_records(const ZipReader& reader, const Records& records) {
  ASSERT_EQ(reader.entries().size(), records.size());
  for (const auto& [name, data] : records) {
    const ZipEntry* entry = reader.find(name);
    ASSERT_NE(entry, nullptr) << name;
    EXPECT_EQ(entry->data_offset % 64, 0u) << name;
    const std::span<const uint8_t> got = reader.read(name);
    ASSERT_EQ(got.size(), data.size()) << name;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin())) << name;
  }
}

// Every record read through libzip, compared with `records`.
void expect_libzip_reads(const std::string& path, const Records& records) {
  int error = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &error);
  ASSERT_NE(archive, nullptr) << "libzip error " << error;
  ASSERT_EQ(zip_get_num_entries(archive, 0), static_cast<zip_int64_t>(records.size()));
  for (const auto& [name, data] : records) {
    zip_stat_t st;
    ASSERT_EQ(zip_stat(archive, name.c_str(), 0, &st), 0) << name;
    EXPECT_EQ(st.size, data.size()) << name;
    EXPECT_EQ(st.comp_method, ZIP_CM_STORE) << name;
    zip_file_t* file = zip_fopen(archive, name.c_str(), 0);
    ASSERT_NE(file, nullptr) << name << ": " << zip_strerror(archive);
    std::vector<uint8_t> got(data.size() + 1);
    const zip_int64_t n = zip_fread(file, got.data(), got.size());
    EXPECT_EQ(zip_fclose(file), 0) << name;  // 0: the CRC matched
    ASSERT_EQ(n, static_cast<zip_int64_t>(data.size())) << name;
    got.resize(data.size());
    EXPECT_EQ(got, data) << name;
  }
  zip_discard(archive);
}

// Python's zipfile: testzip() reads every record and checks its CRC; prints names and sizes.
constexpr const char* kPythonListZip = R"(
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    bad = z.testzip()
    if bad is not None:
        print("bad CRC", bad); sys.exit(1)
    for info in z.infolist():
        print(info.filename, info.file_size, info.compress_type)
)";

std::string expected_listing(const Records& records) {
  std::string text;
  for (const auto& [name, data] : records) {
    text += name + " " + std::to_string(data.size()) + " 0\n";
  }
  return text;
}

std::string zip64_name(const ::testing::TestParamInfo<bool>& param) {
  return param.param ? "Forced" : "WhenNeeded";
}

class ZipRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(ZipRoundTrip, IndependentReadersAgree) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const Records records = random_records(seed);
  const std::string path = dir.file("a.zip");
  ZipWriter::Options options;
  options.force_zip64 = GetParam();
  write_archive(path, records, options, seed + 1);

  expect_records(ZipReader::open(path, {.verify_crc = true}), records);
  expect_libzip_reads(path, records);
  const testing::PythonResult listed = run_python(dir.path(), "list.py", kPythonListZip, {path});
  EXPECT_EQ(listed.status, 0) << listed.output;
  // zipfile lists in central-directory order, which is the order written (sorted map).
  EXPECT_EQ(listed.output, expected_listing(records));
  // Only the archive is left: the temp file was renamed.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 2);
}

// Chunks whose CRC-32 the caller computed (all of them, or mixed with chunks the writer
// computes) give the same bytes as the writer computing every CRC, and those CRCs check.
TEST_P(ZipRoundTrip, GivenChunkCrcsGiveTheSameArchive) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const Records records = random_records(seed);
  ZipWriter::Options options;
  options.force_zip64 = GetParam();
  const std::string computed = dir.file("computed.zip");
  write_archive(computed, records, options, seed + 1, ChunkCrc::kComputed);
  for (const ChunkCrc mode : {ChunkCrc::kGiven, ChunkCrc::kMixed}) {
    SCOPED_TRACE(mode == ChunkCrc::kGiven ? "given" : "mixed");
    const std::string path = dir.file("given.zip");
    // Other chunk sizes than `computed` used: the CRCs are combined across chunk boundaries.
    write_archive(path, records, options, seed + 2, mode);
    EXPECT_EQ(read_bytes(path), read_bytes(computed));
    expect_records(ZipReader::open(path, {.verify_crc = true}), records);
    expect_libzip_reads(path, records);
  }
}

// crc32_update (libdeflate's where the build found it, else zlib's) gives zlib's values,
// continued across pieces of any size and alignment.
TEST(Crc32, MatchesZlibInPiecesOfAnySize) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> data((3u << 20) + 77);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  for (int trial = 0; trial < 20; ++trial) {
    const size_t begin = rng() % 4096;
    const size_t end = begin + rng() % (data.size() - begin);
    uLong want = ::crc32_z(0, data.data() + begin, end - begin);
    uint32_t got = 0;
    for (size_t at = begin; at < end;) {
      const size_t piece = std::min<size_t>(end - at, rng() % 3 == 0 ? rng() % 64 : rng() % 700000);
      got = crc32_update(got, std::span<const uint8_t>(data).subspan(at, piece));
      at += piece;
    }
    EXPECT_EQ(got, static_cast<uint32_t>(want)) << "bytes " << begin << ".." << end;
  }
}

// A wrong CRC given with a chunk is recorded as given (the writer does not recompute it), so
// a reader that verifies CRCs refuses the record.
TEST(ZipWriter, GivenChunkCrcIsTrusted) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("wrong.zip");
  const std::vector<uint8_t> data = {1, 2, 3, 4, 5};
  {
    ZipWriter writer(path);
    writer.begin_record("r", data.size());
    writer.write(data, crc32_update(0, data) ^ 1);
    writer.finish();
  }
  (void)ZipReader::open(path);
  expect_error([&] { (void)ZipReader::open(path, {.verify_crc = true}); },
               "CRC-32 mismatch in 'r'");
}

// A record placed at 4 KiB in the file and written with write_stable() from page-aligned
// memory reads back with its CRC; so does the next one; an alignment over 4096 is refused.
TEST(ZipWriter, RecordAlignedTo4KiBWrittenFromStableMemory) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("aligned.zip");
  const size_t big = (2u << 20) + 12;
  std::unique_ptr<uint8_t, decltype(&std::free)> memory(
      static_cast<uint8_t*>(std::aligned_alloc(4096, big + 4096 - big % 4096)), &std::free);
  ASSERT_NE(memory, nullptr);
  for (size_t i = 0; i < big; ++i) memory.get()[i] = static_cast<uint8_t>(i * 31 + 7);
  const std::span<const uint8_t> bytes(memory.get(), big);
  const std::vector<uint8_t> small = {1, 2, 3, 4, 5};
  {
    ZipWriter writer(path);
    writer.add_record("a", small);
    writer.begin_record("big", big, 4096);
    writer.write_stable(bytes.first(1 << 20), crc32_update(0, bytes.first(1 << 20)));
    writer.write_stable(bytes.subspan(1 << 20), crc32_update(0, bytes.subspan(1 << 20)));
    writer.begin_record("c", small.size(), 4096);
    writer.write(small);
    expect_error([&] { writer.begin_record("d", 1, 8192); }, "at most 4096");
  }
  {
    ZipWriter writer(path);
    writer.add_record("a", small);
    writer.begin_record("big", big, 4096);
    writer.write_stable(bytes, crc32_update(0, bytes));
    writer.begin_record("c", small.size(), 4096);
    writer.write(small);
    writer.finish();
  }
  const ZipReader reader = ZipReader::open(path, {.verify_crc = true});
  EXPECT_EQ(reader.find("big")->data_offset % 4096, 0u);
  EXPECT_EQ(reader.find("c")->data_offset % 4096, 0u);
  const std::span<const uint8_t> got = reader.read("big");
  ASSERT_EQ(got.size(), big);
  EXPECT_EQ(std::memcmp(got.data(), memory.get(), big), 0);
  const std::span<const uint8_t> c = reader.read("c");
  EXPECT_EQ(std::vector<uint8_t>(c.begin(), c.end()), small);
}

INSTANTIATE_TEST_SUITE_P(Zip64, ZipRoundTrip, ::testing::Bool(), zip64_name);

TEST(ZipReader, ReadsArchivesPythonWrote) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("py.zip");
  // Stored records, one with ZIP64 extra fields forced, one with a comment on the archive.
  const testing::PythonResult made = run_python(dir.path(), "make.py", R"(
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_STORED) as z:
    z.writestr("top/a", b"hello")
    with z.open("top/b", "w", force_zip64=True) as f:
        f.write(bytes(range(256)) * 3)
    z.writestr("top/empty", b"")
    z.comment = b"made by python"
)",
                                                {path});
  ASSERT_EQ(made.status, 0) << made.output;
  const ZipReader reader = ZipReader::open(path, {.verify_crc = true});
  ASSERT_EQ(reader.entries().size(), 3u);
  const std::span<const uint8_t> a = reader.read("top/a");
  EXPECT_EQ(std::string(a.begin(), a.end()), "hello");
  const std::span<const uint8_t> b = reader.read("top/b");
  ASSERT_EQ(b.size(), 768u);
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], i % 256) << i;
  EXPECT_TRUE(reader.read("top/empty").empty());
  expect_error([&] { (void)reader.read("top/missing"); }, "no record named 'top/missing'");
}

TEST(ZipReader, ReadsTorchSaveArchives) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("t.pt");
  const testing::PythonResult made = run_python(dir.path(), "save.py", R"(
import sys
try:
    import torch
except ImportError:
    sys.exit(77)
torch.save({"w": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, dtype=torch.int64)},
           sys.argv[1])
)",
                                                {path});
  if (made.status == 77) GTEST_SKIP() << "python3-torch is not installed";
  ASSERT_EQ(made.status, 0) << made.output;
  const ZipReader reader = ZipReader::open(path, {.verify_crc = true});
  bool found_pickle = false;
  int storages = 0;
  for (const ZipEntry& entry : reader.entries()) {
    found_pickle |= entry.name == "t/data.pkl";
    if (entry.name.starts_with("t/data/")) {
      ++storages;
      EXPECT_EQ(entry.data_offset % 64, 0u) << entry.name;  // torch aligns storages
    }
  }
  EXPECT_TRUE(found_pickle);
  ASSERT_EQ(storages, 2);
  // One storage holds 0..9 as float32, the other three int64 ones.
  bool found_arange = false;
  for (const char* key : {"t/data/0", "t/data/1"}) {
    const std::span<const uint8_t> bytes = reader.read(key);
    if (bytes.size() == 40) {
      float values[10];
      std::memcpy(values, bytes.data(), sizeof(values));
      for (int i = 0; i < 10; ++i) EXPECT_EQ(values[i], static_cast<float>(i));
      found_arange = true;
    }
  }
  EXPECT_TRUE(found_arange);
}

TEST(ZipReader, RefusesCompressedRecordsByName) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("deflated.zip");
  const testing::PythonResult made = run_python(dir.path(), "make.py", R"(
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("plain", b"x")
    z.writestr("squeezed", b"y" * 1000, compress_type=zipfile.ZIP_DEFLATED)
)",
                                                {path});
  ASSERT_EQ(made.status, 0) << made.output;
  expect_error([&] { (void)ZipReader::open(path); }, "record 'squeezed' is compressed");
}

TEST(ZipWriter, DestroyedWithoutFinishLeavesTargetUntouched) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("x.zip");
  write_bytes(path, {'o', 'l', 'd'});
  std::string temp;
  {
    ZipWriter writer(path);
    temp = writer.temp_path();
    writer.add_record("a", std::vector<uint8_t>(100, 7));
    EXPECT_TRUE(std::filesystem::exists(temp));
  }
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_EQ(read_bytes(path), (std::vector<uint8_t>{'o', 'l', 'd'}));
  {
    ZipWriter writer(path);
    writer.add_record("a", std::vector<uint8_t>(100, 7));
    writer.finish();
  }
  EXPECT_EQ(ZipReader::open(path).read("a").size(), 100u);
}

// The archive gets the mode any new file gets (0666 less the umask), not a temporary file's
// 0600.
TEST(ZipWriter, ArchiveHasTheUmaskMode) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const mode_t old_mask = ::umask(022);
  {
    ZipWriter writer(dir.file("m.zip"));
    writer.add_record("a", std::vector<uint8_t>{1});
    writer.finish();
  }
  ::umask(old_mask);
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("m.zip").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST(ZipWriter, RefusesMisuse) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<uint8_t> four = {1, 2, 3, 4};
  {
    ZipWriter writer(dir.file("a.zip"));
    writer.begin_record("r", 3);
    expect_error([&] { writer.write(four); }, "declared 3 bytes");
    expect_error([&] { writer.finish(); }, "failed earlier");
  }
  {
    ZipWriter writer(dir.file("b.zip"));
    writer.begin_record("r", 5);
    writer.write(four);
    expect_error([&] { writer.finish(); }, "declared 5 bytes but 4 were written");
  }
  {
    ZipWriter writer(dir.file("c.zip"));
    writer.add_record("r", four);
    expect_error([&] { writer.add_record("r", four); }, "duplicate record name 'r'");
  }
  {
    ZipWriter writer(dir.file("d.zip"));
    expect_error([&] { writer.write(four); }, "no record open");
  }
  expect_error([&] { ZipWriter(dir.file("e.zip"), {.alignment = 48}); }, "power of two");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

// A record of 4 GiB + 100 zero bytes written as a hole, then a small record whose header
// lies beyond 4 GiB: the ZIP64 size and offset fields and end records are needed for real.
TEST(ZipWriter, Zip64BeyondFourGiBInASparseFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("big.zip");
  const uint64_t big = (uint64_t{4} << 30) + 100;
  const std::vector<uint8_t> tail = {9, 8, 7, 6, 5};
  {
    ZipWriter writer(path);
    writer.begin_record("big", big);
    writer.write(std::vector<uint8_t>(37, 0));
    writer.write_zeros(big - 37 - 11);
    writer.write(std::vector<uint8_t>(11, 0));
    writer.add_record("tail", tail);
    writer.finish();
  }
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  ASSERT_GT(static_cast<uint64_t>(st.st_size), big);
  const ZipReader reader = ZipReader::open(path);
  ASSERT_EQ(reader.entries().size(), 2u);
  EXPECT_EQ(reader.find("big")->size, big);
  EXPECT_GT(reader.find("tail")->local_header_offset, uint64_t{0xFFFFFFFF});
  EXPECT_EQ(reader.find("tail")->data_offset % 64, 0u);
  const std::span<const uint8_t> got = reader.read("tail");
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), tail);

  // Python checks the small record's CRC and the big one's recorded size and CRC (the CRC of
  // 4 GiB + 100 zeros, which write_zeros computed without the data).
  const testing::PythonResult checked = run_python(dir.path(), "check.py", R"(
import sys, zipfile, zlib
with zipfile.ZipFile(sys.argv[1]) as z:
    assert z.read("tail") == bytes([9, 8, 7, 6, 5])
    info = z.getinfo("big")
    assert info.file_size == 4 * 2**30 + 100, info.file_size
    crc, block = 0, bytes(2**24)
    left = info.file_size
    while left:
        n = min(left, len(block)); crc = zlib.crc32(block[:n], crc); left -= n
    assert info.CRC == crc, (info.CRC, crc)
    assert z.getinfo("tail").header_offset > 2**32
print("ok")
)",
                                                   {path});
  EXPECT_EQ(checked.status, 0) << checked.output;
  int error = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_RDONLY, &error);
  ASSERT_NE(archive, nullptr) << "libzip error " << error;
  zip_stat_t zst;
  ASSERT_EQ(zip_stat(archive, "big", 0, &zst), 0);
  EXPECT_EQ(zst.size, big);
  zip_discard(archive);
}

// More records than the classic end record can count: the ZIP64 end records carry the count.
TEST(ZipWriter, Zip64ForMoreThan65535Records) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("many.zip");
  const size_t count = 70000;
  {
    ZipWriter writer(path);
    for (size_t i = 0; i < count; ++i) {
      const uint8_t byte = static_cast<uint8_t>(i);
      writer.add_record("r/" + std::to_string(i), std::span<const uint8_t>(&byte, 1));
    }
    writer.finish();
  }
  const ZipReader reader = ZipReader::open(path, {.verify_crc = true});
  ASSERT_EQ(reader.entries().size(), count);
  EXPECT_EQ(reader.read("r/69999")[0], static_cast<uint8_t>(69999));
  const testing::PythonResult listed = run_python(dir.path(), "count.py", R"(
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    print(len(z.infolist()), z.read("r/69999")[0])
)",
                                                  {path});
  EXPECT_EQ(listed.status, 0) << listed.output;
  EXPECT_EQ(listed.output, "70000 " + std::to_string(69999 % 256) + "\n");
}

// ---------------------------------------------------------------------------------------------
// Malformed archives.

std::vector<uint8_t> small_archive(const TempDir& dir, bool force_zip64) {
  const std::string path = dir.file(force_zip64 ? "small64.zip" : "small.zip");
  ZipWriter writer(path, {.force_zip64 = force_zip64});
  writer.add_record("archive/data.pkl", std::vector<uint8_t>{0x80, 0x02, '}', 'q', 0, '.'});
  writer.add_record("archive/data/0", std::vector<uint8_t>(70, 0x11));
  writer.add_record("archive/version", std::vector<uint8_t>{'3'});
  writer.finish();
  return read_bytes(path);
}

ZipReader parse(const std::vector<uint8_t>& bytes, bool verify_crc = false) {
  return ZipReader::from_bytes(bytes, "test.zip", {.verify_crc = verify_crc});
}

// Field offsets of the first central entry and the end records of small_archive() (no
// comments): found from the end, the way a reader does.
struct Layout {
  uint64_t eocd = 0;
  uint64_t directory = 0;
};
Layout layout_of(const std::vector<uint8_t>& bytes) {
  Layout layout;
  layout.eocd = bytes.size() - 22;
  uint32_t directory32;
  std::memcpy(&directory32, &bytes[layout.eocd + 16], 4);
  layout.directory = directory32;
  if (directory32 == 0xFFFFFFFF) {
    uint64_t record;
    std::memcpy(&record, &bytes[layout.eocd - 20 + 8], 8);
    std::memcpy(&layout.directory, &bytes[record + 48], 8);
  }
  return layout;
}
template <typename T>
void poke(std::vector<uint8_t>& bytes, uint64_t at, T value) {
  std::memcpy(&bytes[at], &value, sizeof(T));
}

// Rewrites a record's size in its central entry (at `central`) and its local header, in the
// 32-bit fields or, for ZIP64 archives, in the ZIP64 extra fields that follow each name.
void set_record_size(std::vector<uint8_t>& bytes, uint64_t central, const ZipEntry& entry,
                     uint64_t size, bool zip64) {
  if (zip64) {
    for (const uint64_t extra :
         {central + 46 + entry.name.size(), entry.local_header_offset + 30 + entry.name.size()}) {
      poke<uint64_t>(bytes, extra + 4, size);
      poke<uint64_t>(bytes, extra + 12, size);
    }
  } else {
    for (const uint64_t field : {central + 20, central + 24, entry.local_header_offset + 18,
                                 entry.local_header_offset + 22}) {
      poke<uint32_t>(bytes, field, static_cast<uint32_t>(size));
    }
  }
}

class ZipMalformed : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    valid_ = small_archive(dir_, GetParam());
    // The unmodified archive is fine, and records are views into the caller's bytes.
    const ZipReader reader = parse(valid_, true);
    for (const ZipEntry& entry : reader.entries()) {
      EXPECT_EQ(reader.data(entry).data(), valid_.data() + entry.data_offset) << entry.name;
    }
  }
  TempDir dir_;
  std::vector<uint8_t> valid_;
};

TEST_P(ZipMalformed, EveryTruncationIsAnError) {
  for (size_t length = 0; length < valid_.size(); ++length) {
    const std::vector<uint8_t> cut(valid_.begin(), valid_.begin() + length);
    const auto e = error_of([&] { (void)parse(cut); });
    ASSERT_TRUE(e.has_value()) << "truncated to " << length;
    EXPECT_EQ(e->file(), "test.zip");
  }
}

TEST_P(ZipMalformed, EveryFlippedByteIsAnErrorOrHarmless) {
  // A flipped byte in record data or padding is harmless without CRC checks; with them, a
  // flip anywhere either fails with SerializationError or leaves the records readable.
  for (size_t at = 0; at < valid_.size(); ++at) {
    std::vector<uint8_t> bytes = valid_;
    bytes[at] ^= 0xA5;
    try {
      const ZipReader reader = parse(bytes, true);
      for (const ZipEntry& entry : reader.entries()) {
        const std::span<const uint8_t> data = reader.data(entry);
        ASSERT_LE(entry.data_offset + data.size(), bytes.size());
      }
    } catch (const SerializationError&) {
    }
  }
}

TEST_P(ZipMalformed, CrcMismatchIsFoundWhenAsked) {
  std::vector<uint8_t> bytes = valid_;
  const ZipEntry entry = *parse(bytes).find("archive/data/0");
  bytes[entry.data_offset + 5] ^= 1;
  (void)parse(bytes, false);
  expect_error([&] { (void)parse(bytes, true); }, "CRC-32 mismatch in 'archive/data/0'");
}

TEST_P(ZipMalformed, LyingSizesAreErrors) {
  const Layout layout = layout_of(valid_);
  {  // the central directory claims more entries than it holds
    std::vector<uint8_t> bytes = valid_;
    if (GetParam()) {
      uint64_t record;
      std::memcpy(&record, &bytes[layout.eocd - 20 + 8], 8);
      poke<uint64_t>(bytes, record + 24, uint64_t{1} << 60);
      poke<uint64_t>(bytes, record + 32, uint64_t{1} << 60);
    } else {
      poke<uint16_t>(bytes, layout.eocd + 8, 0xFFFE);
      poke<uint16_t>(bytes, layout.eocd + 10, 0xFFFE);
    }
    expect_error([&] { (void)parse(bytes); }, "entries cannot fit");
  }
  {  // the central directory is larger than the space before the end records
    std::vector<uint8_t> bytes = valid_;
    if (GetParam()) {
      uint64_t record;
      std::memcpy(&record, &bytes[layout.eocd - 20 + 8], 8);
      poke<uint64_t>(bytes, record + 40, ~uint64_t{0} - 3);
    } else {
      poke<uint32_t>(bytes, layout.eocd + 12, 0xFFFFFFF0);
    }
    expect_error([&] { (void)parse(bytes); }, "does not end before the end records");
  }
  {  // a record's size (central and local agree) runs past the central directory
    std::vector<uint8_t> bytes = valid_;
    const ZipReader reader = parse(valid_);
    const ZipEntry& last = reader.entries().back();
    uint64_t at = layout.directory;
    for (size_t i = 0; i + 1 < reader.entries().size(); ++i) {
      uint16_t n, x, c;
      std::memcpy(&n, &bytes[at + 28], 2);
      std::memcpy(&x, &bytes[at + 30], 2);
      std::memcpy(&c, &bytes[at + 32], 2);
      at += 46 + n + x + c;
    }
    // One more byte than fits before the central directory.
    set_record_size(bytes, at, last, layout.directory, GetParam());
    expect_error([&] { (void)parse(bytes); }, "runs into the central directory");
  }
}

TEST_P(ZipMalformed, LocalHeaderMustAgree) {
  std::vector<uint8_t> bytes = valid_;
  const ZipEntry entry = *parse(bytes).find("archive/data/0");
  bytes[entry.local_header_offset + 30 + 3] ^= 0x20;  // "archive" -> "arcHive"
  expect_error([&] { (void)parse(bytes); }, "local header name differs");
  bytes = valid_;
  bytes[entry.local_header_offset + 14] ^= 1;  // CRC
  expect_error([&] { (void)parse(bytes); }, "disagrees with the central directory");
}

TEST_P(ZipMalformed, OverlappingRecordsAreErrors) {
  std::vector<uint8_t> bytes = valid_;
  const ZipReader reader = parse(valid_);
  const ZipEntry& first = reader.entries()[0];
  const ZipEntry& second = reader.entries()[1];
  // Grow the first record (central and local sizes, CRC not checked) over the second's header.
  const uint64_t grown = second.local_header_offset + 1 - first.data_offset;
  const Layout layout = layout_of(valid_);
  set_record_size(bytes, layout.directory, first, grown, GetParam());
  expect_error([&] { (void)parse(bytes); }, "overlaps record '" + first.name + "'");
}

TEST_P(ZipMalformed, OverflowingOffsetsAreErrors) {
  const Layout layout = layout_of(valid_);
  std::vector<uint8_t> bytes = valid_;
  if (GetParam()) {
    // The locator points past the file; then the directory offset wraps around.
    poke<uint64_t>(bytes, layout.eocd - 20 + 8, ~uint64_t{0} - 10);
    expect_error([&] { (void)parse(bytes); }, "does not leave room");
    bytes = valid_;
    uint64_t record;
    std::memcpy(&record, &bytes[layout.eocd - 20 + 8], 8);
    poke<uint64_t>(bytes, record + 48, ~uint64_t{0} - 2);
    expect_error([&] { (void)parse(bytes); }, "does not end before the end records");
    bytes = valid_;
    const uint64_t extra = layout.directory + 46 + parse(valid_).entries()[0].name.size();
    poke<uint64_t>(bytes, extra + 20, ~uint64_t{0} - 5);  // local header offset
    expect_error([&] { (void)parse(bytes); }, "is not before the central directory");
  } else {
    poke<uint32_t>(bytes, layout.eocd + 16, 0xFFFFFFF0);
    expect_error([&] { (void)parse(bytes); }, "does not end before the end records");
    bytes = valid_;
    poke<uint32_t>(bytes, layout.directory + 42, 0xFFFFFF00);
    expect_error([&] { (void)parse(bytes); }, "is not before the central directory");
  }
}

INSTANTIATE_TEST_SUITE_P(Zip64, ZipMalformed, ::testing::Bool(), zip64_name);

TEST(ZipReader, OpenNamesMissingFileAndNonZip) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string missing = dir.file("missing.zip");
  const auto e = error_of([&] { (void)ZipReader::open(missing); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->file(), missing);
  EXPECT_NE(std::string(e->what()).find("No such file"), std::string::npos) << e->what();
  const std::string text = dir.file("text.zip");
  write_bytes(text, std::vector<uint8_t>(100, 'a'));
  expect_error([&] { (void)ZipReader::open(text); }, "no zip end-of-central-directory record");
  expect_error([&] { (void)ZipReader::open(dir.path()); }, "not a regular file");
  const std::string empty = dir.file("empty.zip");
  write_bytes(empty, {});
  expect_error([&] { (void)ZipReader::open(empty); }, "file of 0 bytes is too small");
}

}  // namespace
}  // namespace zinf::serialization
