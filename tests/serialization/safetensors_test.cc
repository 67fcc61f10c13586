// safetensors: round trips of every dtype with odd shapes and chunking, files built by hand in
// Python read by zinf and zinf's files parsed by hand in Python, the sharded form and its
// index, and malformed headers (every truncation, lying sizes, overlaps, gaps, huge lengths,
// negative and overflowing values, bad indexes) ending in SerializationError.
#include "serialization/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"
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

struct Tensor {
  TensorSpec spec;
  std::vector<uint8_t> bytes;
};

std::vector<Tensor> random_tensors(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::pair<Dtype, std::vector<uint64_t>>> shapes = {
      {Dtype::kF64, {3, 5}}, {Dtype::kF32, {7}},    {Dtype::kF16, {2, 3, 5}}, {Dtype::kBF16, {1}},
      {Dtype::kI64, {}},     {Dtype::kI32, {4, 0}}, {Dtype::kI16, {9}},       {Dtype::kI8, {13, 1}},
      {Dtype::kU8, {1000}},  {Dtype::kBool, {3}},   {Dtype::kF32, {257, 33}},
  };
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t;
    t.spec = {"layer." + std::to_string(i) + ".w", shapes[i].first, shapes[i].second};
    t.bytes.resize(tensor_bytes("", t.spec.name, t.spec.dtype, t.spec.shape));
    for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
    if (t.spec.dtype == Dtype::kBool) {
      for (uint8_t& b : t.bytes) b &= 1;
    }
    tensors.push_back(std::move(t));
  }
  return tensors;
}

std::vector<TensorSpec> specs_of(const std::vector<Tensor>& tensors) {
  std::vector<TensorSpec> specs;
  for (const Tensor& t : tensors) specs.push_back(t.spec);
  return specs;
}

void expect_tensor(std::span<const uint8_t> got, const TensorInfo* info, const Tensor& t) {
  ASSERT_NE(info, nullptr) << t.spec.name;
  EXPECT_EQ(info->dtype, t.spec.dtype) << t.spec.name;
  EXPECT_EQ(info->shape, t.spec.shape) << t.spec.name;
  ASSERT_EQ(got.size(), t.bytes.size()) << t.spec.name;
  EXPECT_TRUE(std::equal(got.begin(), got.end(), t.bytes.begin())) << t.spec.name;
}

TEST(Safetensors, RoundTripEveryDtypeInChunks) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<Tensor> tensors = random_tensors(seed);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  const std::string path = dir.file("m.safetensors");
  {
    SafetensorsWriter writer(path, specs_of(tensors), metadata);
    std::vector<uint8_t> all;
    for (const Tensor& t : tensors) all.insert(all.end(), t.bytes.begin(), t.bytes.end());
    std::mt19937_64 rng(seed + 1);
    size_t at = 0;
    while (at < all.size()) {  // chunks that cross tensor boundaries
      const size_t n = std::min<size_t>(all.size() - at, 1 + rng() % 5000);
      writer.write(std::span<const uint8_t>(all).subspan(at, n));
      at += n;
    }
    EXPECT_FALSE(std::filesystem::exists(path));  // not before finish
    writer.finish();
  }
  const SafetensorsReader reader = SafetensorsReader::open(path);
  EXPECT_EQ(reader.metadata(), metadata);
  EXPECT_EQ(reader.data_offset() % 8, 0u);
  ASSERT_EQ(reader.tensors().size(), tensors.size());
  for (const Tensor& t : tensors) {
    expect_tensor(reader.read(t.spec.name), reader.find(t.spec.name), t);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

// A file built by hand in Python (struct + json, no safetensors package), tensors listed out
// of data order, metadata, header padded with spaces.
TEST(Safetensors, ReadsAFilePythonBuilt) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("py.safetensors");
  const testing::PythonResult made = run_python(dir.path(), "make.py", R"(
import json, struct, sys
w = struct.pack("<6f", *[0.5 * i for i in range(6)])
b = struct.pack("<3q", -1, 2**40, 7)
h = struct.pack("<4H", 0x3f80, 0xc000, 0x0000, 0x7f80)  # bf16 1, -2, 0, inf
header = {"b": {"dtype": "I64", "shape": [3], "data_offsets": [len(w), len(w) + len(b)]},
          "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, len(w)]},
          "__metadata__": {"format": "pt"},
          "h": {"dtype": "BF16", "shape": [2, 2],
                "data_offsets": [len(w) + len(b), len(w) + len(b) + len(h)]}}
text = json.dumps(header).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + w + b + h)
)",
                                                {path});
  ASSERT_EQ(made.status, 0) << made.output;
  const SafetensorsReader reader = SafetensorsReader::open(path);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  ASSERT_EQ(reader.tensors().size(), 3u);
  EXPECT_EQ(reader.tensors()[0].name, "w");  // data order
  float w[6];
  std::memcpy(w, reader.read("w").data(), sizeof(w));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(w[i], 0.5f * static_cast<float>(i));
  int64_t b[3];
  std::memcpy(b, reader.read("b").data(), sizeof(b));
  EXPECT_EQ(b[0], -1);
  EXPECT_EQ(b[1], int64_t{1} << 40);
  EXPECT_EQ(b[2], 7);
  const TensorInfo* h = reader.find("h");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->dtype, Dtype::kBF16);
  EXPECT_EQ(h->shape, (std::vector<uint64_t>{2, 2}));
  uint16_t bits[4];
  std::memcpy(bits, reader.data(*h).data(), sizeof(bits));
  EXPECT_EQ(bits[0], 0x3f80);
  EXPECT_EQ(bits[3], 0x7f80);
}

// zinf's file parsed by hand in Python: the length prefix, the JSON, contiguous offsets from
// 0, each tensor's bytes (compared through a hex digest printed by both sides).
TEST(Safetensors, PythonParsesWhatZinfWrote) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<Tensor> tensors = random_tensors(seed);
  const std::string path = dir.file("z.safetensors");
  {
    SafetensorsWriter writer(path, specs_of(tensors), {{"k", "v"}});
    for (const Tensor& t : tensors) writer.write_tensor(t.spec.name, t.bytes);
    writer.finish();
  }
  const testing::PythonResult parsed = run_python(dir.path(), "parse.py", R"(
import json, struct, sys, zlib
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
assert (8 + n) % 8 == 0
header = json.loads(data[8:8 + n].decode("utf-8"))
assert header.pop("__metadata__") == {"k": "v"}
buf = data[8 + n:]
sizes = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
         "BOOL": 1}
end = 0
for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
    b, e = info["data_offsets"]
    assert b == end, (name, b, end)
    numel = 1
    for d in info["shape"]:
        numel *= d
    assert e - b == numel * sizes[info["dtype"]], name
    end = e
assert end == len(buf)
for name in sorted(header):
    b, e = header[name]["data_offsets"]
    print(name, header[name]["dtype"], header[name]["shape"], zlib.crc32(buf[b:e]))
)",
                                                  {path});
  ASSERT_EQ(parsed.status, 0) << parsed.output;
  std::map<std::string, const Tensor*> by_name;
  for (const Tensor& t : tensors) by_name[t.spec.name] = &t;
  std::string expected;
  for (const auto& [name, t] : by_name) {
    std::string shape = "[";
    for (size_t i = 0; i < t->spec.shape.size(); ++i) {
      shape += (i ? ", " : "") + std::to_string(t->spec.shape[i]);
    }
    expected += name + " " + std::string(dtype_name(t->spec.dtype)) + " " + shape + "] " +
                std::to_string(crc32_update(0, t->bytes)) + "\n";
  }
  EXPECT_EQ(parsed.output, expected);
}

// ---------------------------------------------------------------------------------------------
// Sharded form.

TEST(ShardedSafetensors, SplitsByMaxShardSizeAndReadsBackThroughTheIndex) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::mt19937_64 rng(seed);
  // 400 + 400 | 600 | 3000 (larger than the limit: its own shard) | 200 + 0 bytes
  std::vector<Tensor> tensors;
  const std::vector<uint64_t> floats = {100, 100, 150, 750, 50, 0};
  for (size_t i = 0; i < floats.size(); ++i) {
    Tensor t;
    t.spec = {"t" + std::to_string(i), Dtype::kF32, {floats[i]}};
    t.bytes.resize(floats[i] * 4);
    for (uint8_t& b : t.bytes) b = static_cast<uint8_t>(rng());
    tensors.push_back(std::move(t));
  }
  {
    ShardedSafetensorsWriter writer(dir.path(), specs_of(tensors), 1000, "model",
                                    {{"format", "pt"}});
    EXPECT_EQ(writer.shard_names(),
              (std::vector<std::string>{
                  "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                  "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}));
    for (const Tensor& t : tensors) writer.write_tensor(t.spec.name, t.bytes);
    writer.finish();
  }
  const std::string index_path = dir.file("model.safetensors.index.json");
  // The index as Hugging Face writes it: sorted keys, indent 2, final newline.
  const std::vector<uint8_t> index_bytes = read_bytes(index_path);
  const std::string index_text(index_bytes.begin(), index_bytes.end());
  const nlohmann::json index = nlohmann::json::parse(index_text);
  EXPECT_EQ(index_text, index.dump(2) + "\n");
  EXPECT_EQ(index["metadata"]["total_size"], 4600);
  EXPECT_EQ(index["weight_map"]["t3"], "model-00003-of-00004.safetensors");
  EXPECT_EQ(index["weight_map"]["t5"], "model-00004-of-00004.safetensors");

  const ShardedSafetensorsReader reader = ShardedSafetensorsReader::open(index_path);
  EXPECT_EQ(reader.shards().size(), 4u);
  for (const Tensor& t : tensors) {
    const auto [shard, info] = reader.find(t.spec.name);
    ASSERT_NE(shard, nullptr);
    EXPECT_EQ(shard->metadata().at("format"), "pt");
    expect_tensor(reader.read(t.spec.name), info, t);
  }
  EXPECT_EQ(reader.find("absent").second, nullptr);
}

TEST(ShardedSafetensors, OneShardIsAPlainFileWithoutIndex) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::vector<uint8_t> bytes(40, 3);
  // Streamed in chunks that end mid-tensor.
  ShardedSafetensorsWriter writer(dir.path(), {{"a", Dtype::kU8, {20}}, {"b", Dtype::kI16, {10}}},
                                  uint64_t{5} * 1000 * 1000 * 1000);
  writer.write(std::span(bytes).first(7));
  writer.write(std::span(bytes).subspan(7));
  writer.finish();
  EXPECT_EQ(writer.shard_names(), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(std::filesystem::exists(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(SafetensorsReader::open(dir.file("model.safetensors")).read("b").size(), 20u);
}

TEST(ShardedSafetensors, RefusesBadIndexes) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  {
    ShardedSafetensorsWriter writer(dir.path(), {{"a", Dtype::kU8, {8}}, {"b", Dtype::kU8, {8}}},
                                    8);
    writer.write_tensor("a", std::vector<uint8_t>(8, 1));
    writer.write_tensor("b", std::vector<uint8_t>(8, 2));
    writer.finish();
  }
  const std::string index_path = dir.file("model.safetensors.index.json");
  const std::vector<uint8_t> good = read_bytes(index_path);
  auto with = [&](const std::string& text) {
    write_bytes(index_path, std::vector<uint8_t>(text.begin(), text.end()));
  };
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  with(R"({"metadata": {"total_size": 16}, "weight_map": {"a": "../)" + shard1 + R"(", "b": ")" +
       shard2 + R"("}})");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); }, "not a plain file name");
  with(R"({"metadata": {"total_size": 17}, "weight_map": {"a": ")" + shard1 + R"(", "b": ")" +
       shard2 + R"("}})");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); }, "total_size 17 differs");
  with(R"({"metadata": {"total_size": -1}, "weight_map": {}})");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); }, "total_size");
  with(R"({"metadata": {"total_size": 16}, "weight_map": {"a": ")" + shard2 + R"(", "b": ")" +
       shard2 + R"("}})");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); },
               "tensor 'a' is not in its shard");
  with(R"({"metadata": {"total_size": 8}, "weight_map": {"a": ")" + shard1 + R"("}})");
  (void)ShardedSafetensorsReader::open(index_path);  // a shard's tensors all listed: fine
  with(R"({"metadata": {"total_size": 16}, "weight_map": {"a": ")" + shard1 + R"(", "b": ")" +
       shard1 + R"("}})");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); }, "tensor 'b' is not");
  with(R"({"metadata": )");
  expect_error([&] { (void)ShardedSafetensorsReader::open(index_path); }, "parse error");
  write_bytes(index_path, good);
  EXPECT_EQ(ShardedSafetensorsReader::open(index_path).read("b")[0], 2);
}

// ---------------------------------------------------------------------------------------------
// Writer misuse and malformed files.

TEST(SafetensorsWriter, RefusesMisuseAndLeavesNoFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("x.safetensors");
  const std::vector<TensorSpec> specs = {{"a", Dtype::kF32, {2}}, {"b", Dtype::kI8, {3}}};
  {
    SafetensorsWriter writer(path, specs);
    expect_error([&] { writer.write_tensor("b", std::vector<uint8_t>(3)); },
                 "'b' is not the next declared tensor");
  }
  {
    SafetensorsWriter writer(path, specs);
    expect_error([&] { writer.write_tensor("a", std::vector<uint8_t>(7)); },
                 "declared 8 bytes; given 7");
  }
  {
    SafetensorsWriter writer(path, specs);
    writer.write(std::vector<uint8_t>(10));
    expect_error([&] { writer.write(std::vector<uint8_t>(2)); }, "exceeds the declared 11");
  }
  {
    SafetensorsWriter writer(path, specs);
    writer.write(std::vector<uint8_t>(10));
    expect_error([&] { writer.finish(); }, "finish after 10 of 11");
  }
  expect_error(
      [&] {
        SafetensorsWriter(path, {{"a", Dtype::kU8, {1}}, {"a", Dtype::kU8, {1}}});
      },
      "given twice");
  expect_error([&] { SafetensorsWriter(path, {{"__metadata__", Dtype::kU8, {1}}}); }, "reserved");
  expect_error([&] { SafetensorsWriter(path, {{"a\xff", Dtype::kU8, {1}}}); }, "header JSON");
  expect_error([&] { SafetensorsWriter(path, {}, {{"k", "\xc3"}}); }, "header JSON");
  expect_error(
      [&] {
        SafetensorsWriter(path, {{"a", Dtype::kF64, {uint64_t{1} << 32, uint64_t{1} << 30}}});
      },
      "overflows");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

// A file from a header text and a buffer, with the length prefix.
std::vector<uint8_t> file_of(const std::string& header, size_t buffer_bytes) {
  std::vector<uint8_t> bytes;
  bytes.reserve(8 + header.size() + buffer_bytes);
  for (int i = 0; i < 8; ++i)
    bytes.push_back(static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), buffer_bytes, 0x5A);
  return bytes;
}

void expect_parse_error(const std::vector<uint8_t>& bytes, const std::string& part) {
  expect_error([&] { (void)SafetensorsReader::from_bytes(bytes, "bad.safetensors"); }, part);
}

TEST(SafetensorsReader, EveryTruncationIsAnError) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("s.safetensors");
  {
    SafetensorsWriter writer(path, {{"a", Dtype::kF32, {3}}, {"b", Dtype::kU8, {5}}}, {{"m", "x"}});
    writer.write(std::vector<uint8_t>(17, 1));
    writer.finish();
  }
  const std::vector<uint8_t> valid = read_bytes(path);
  (void)SafetensorsReader::from_bytes(valid, "ok");
  for (size_t length = 0; length < valid.size(); ++length) {
    const std::vector<uint8_t> cut(valid.begin(), valid.begin() + length);
    const auto e = error_of([&] { (void)SafetensorsReader::from_bytes(cut, "cut"); });
    ASSERT_TRUE(e.has_value()) << "truncated to " << length;
    EXPECT_EQ(e->file(), "cut");
  }
  // Flipping any byte never crashes; the result is an error or a file that still validates.
  for (size_t at = 0; at < valid.size(); ++at) {
    std::vector<uint8_t> bytes = valid;
    bytes[at] ^= 0x41;
    try {
      const SafetensorsReader reader = SafetensorsReader::from_bytes(bytes, "flipped");
      for (const TensorInfo& t : reader.tensors()) {
        EXPECT_LE(reader.data_offset() + t.end, bytes.size());
      }
    } catch (const SerializationError&) {
    }
  }
}

TEST(SafetensorsReader, RefusesLyingHeaders) {
  const std::string a = R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  (void)SafetensorsReader::from_bytes(file_of("{" + a + "}", 8), "good");
  struct Case {
    std::string header;
    size_t buffer_bytes;
    std::string error;
  };
  std::string ones = "1";  // a shape of 1025 ones
  for (int i = 1; i < 1025; ++i) ones += ",1";
  const std::vector<Case> cases = {
      {"{" + a + "}", 9, "cover 8 bytes of a data buffer of 9"},
      {"{" + a + "}", 7, "past the buffer's 7 bytes"},
      {R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8,
       "span 8 bytes but shape x dtype needs 12"},
      {"{" + a + R"(, "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}})", 12,
       "overlapping the tensor before it"},
      {"{" + a + R"(, "b": {"dtype": "U8", "shape": [4], "data_offsets": [9, 13]}})", 13,
       "leaving a gap after offset 8"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 8, "is after end"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})", 8,
       "data_offsets entry -8 is not a non-negative integer"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 18446744073709551616]}})", 8,
       "data_offsets entry 18446744073709551616 is not"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 8]}})", 8,
       "more than two entries"},
      {R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", 8,
       "does not have two entries"},
      {R"({"a": {"dtype": "F32", "shape": [[2]], "data_offsets": [0, 8]}})", 8,
       "shape entry an array is not"},
      {R"({"a": {"dtype": "F32", "shape": [2], "shape": [2], "data_offsets": [0, 8]}})", 8,
       "field 'shape' appears twice"},
      {"{" + a + ", " + a + "}", 8, "key 'a' appears twice"},
      {R"({"__metadata__": {"k": "1", "k": "2"}})", 0, "__metadata__ key 'k' appears twice"},
      {R"({"a": {"dtype": "U8", "shape": [)" + ones + R"(], "data_offsets": [0, 1]}})", 1,
       "shape has more than 1024 dimensions"},
      {R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8,
       "is not a non-negative integer"},
      {R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})", 8,
       "overflows"},
      {R"({"a": {"dtype": "F8", "shape": [2], "data_offsets": [0, 2]}})", 2, "unknown dtype"},
      {R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "x": 1}})", 2,
       "unknown field 'x'"},
      {R"({"a": {"dtype": "U8", "shape": [2]}})", 2, "needs dtype, shape and data_offsets"},
      {R"({"a": [1, 2]})", 0, "entry is not an object"},
      {R"({"__metadata__": {"k": 1}})", 0, "value of 'k' is not a string"},
      {R"({"__metadata__": []})", 0, "__metadata__ is not an object"},
      {R"([1, 2])", 0, "not a JSON object"},
      {R"({"a": )", 0, "header JSON"},
      {"{\"a\xff\": 1}", 0, "header JSON"},  // not UTF-8
      {std::string(1000, '['), 0, "not a JSON object"},
      {"{" + std::string(100000, '[') + "}", 0, "header JSON"},  // deep nesting, unbalanced
      {R"({"a": )" + std::string(100000, '[') + std::string(100000, ']') + "}", 0,
       "entry is not an object"},  // deep nesting, balanced: refused at the first level
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header.substr(0, 200));
    expect_parse_error(file_of(c.header, c.buffer_bytes), c.error);
  }
  // Header lengths that lie.
  std::vector<uint8_t> bytes = file_of("{" + a + "}", 8);
  uint64_t n = 100'000'001;
  std::memcpy(bytes.data(), &n, 8);
  expect_parse_error(bytes, "exceeds the limit");
  n = bytes.size() - 7;
  std::memcpy(bytes.data(), &n, 8);
  expect_parse_error(bytes, "runs past the end of the file");
  n = ~uint64_t{0};
  std::memcpy(bytes.data(), &n, 8);
  expect_parse_error(bytes, "exceeds the limit");
}

TEST(SafetensorsReader, OpenNamesTheFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.file("none.safetensors");
  const auto e = error_of([&] { (void)SafetensorsReader::open(path); });
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->file(), path);
  EXPECT_EQ(e->offset(), kNoOffset);
  EXPECT_EQ(std::string(e->what()), path + ": open failed: No such file or directory");
  write_bytes(path, {1, 0, 0, 0, 0, 0, 0, 0, '{'});
  const auto e2 = error_of([&] { (void)SafetensorsReader::open(path); });
  ASSERT_TRUE(e2.has_value());
  EXPECT_EQ(e2->offset(), 8u);
  EXPECT_EQ(std::string(e2->what()).rfind(path + ": offset 8: ", 0), 0u) << e2->what();
}

}  // namespace
}  // namespace zinf::serialization
