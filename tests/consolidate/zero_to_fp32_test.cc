// `zinf zero-to-fp32`: every DeepSpeed-layout fixture of make_ds_checkpoints.py (stages 0-3,
// world sizes 1-3, padding, bf16, frozen and tied params, buffers, sub-groups) consolidates
// to the tensors the script computed with torch, bit for bit, as .bin and safetensors,
// sharded or not, in fp32, bf16 and fp16, with and without frozen params; torch.load
// (weights_only=True) reads the .bin output; malformed checkpoints end in one message naming
// the file (missing optimizer files by their own names), as does a flipped byte (CRC-32); an
// earlier export in the output folder is refused, or replaced with --overwrite.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "consolidate/checkpoint_plan.h"
#include "consolidate/consolidate_writer.h"
#include "serialization/safetensors.h"
#include "serialization/serialization_error.h"
#include "serialization/torch_archive.h"
#include "serialization/zip_reader.h"
#include "serialization/zip_writer.h"
#include "tests/common/temp_dir.h"
#include "tests/serialization/serialization_test_util.h"
#include "tests/tools/test_system.h"

namespace zinf::consolidate {
namespace {

namespace fs = std::filesystem;
using serialization::SerializationError;

using serialization::testing::kPython;
using serialization::testing::run_python;

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

const std::vector<std::string> kFixtures = {"s0_ws1_fp32",
                                            "s1_ws1_fp16",
                                            "s1_ws2_fp16_frozen",
                                            "s1_ws3_bf16",
                                            "s2_ws1_fp16",
                                            "s2_ws2_fp16_frozen_tied",
                                            "s2_ws3_bf16_frozen",
                                            "s3_ws1_fp16",
                                            "s3_ws2_fp16_frozen_tied",
                                            "s3_ws3_bf16_frozen_tied"};

// A tensor as read back from any of the files: dtype name, shape and bytes.
struct Tensor {
  std::string dtype;  // "float32", "bfloat16", "float16"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::string file;     // the file name it was read from
  std::string storage;  // .bin: file + storage key (aliases share it)
  bool operator==(const Tensor& other) const {
    return dtype == other.dtype && shape == other.shape && bytes == other.bytes;
  }
};

struct StateDict {
  std::vector<std::string> names;  // in file order
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // safetensors __metadata__ (first shard)
  void add(const std::string& name, Tensor tensor) {
    names.push_back(name);
    tensors[name] = std::move(tensor);
  }
};

std::string safetensors_dtype_name(serialization::Dtype dtype) {
  switch (dtype) {
    case serialization::Dtype::kF32:
      return "float32";
    case serialization::Dtype::kBF16:
      return "bfloat16";
    case serialization::Dtype::kF16:
      return "float16";
    default:
      return std::string(serialization::dtype_name(dtype));
  }
}

void read_safetensors(const std::string& path, StateDict& out) {
  const serialization::SafetensorsReader reader = serialization::SafetensorsReader::open(path);
  if (out.metadata.empty()) out.metadata = reader.metadata();
  for (const serialization::TensorInfo& info : reader.tensors()) {
    const std::span<const uint8_t> bytes = reader.data(info);
    out.add(info.name, Tensor{safetensors_dtype_name(info.dtype),
                              std::vector<int64_t>(info.shape.begin(), info.shape.end()),
                              std::vector<uint8_t>(bytes.begin(), bytes.end()),
                              fs::path(path).filename().string(),
                              {}});
  }
}

// The workers compute the zip records' CRC-32s chunk by chunk and the writer combines them:
// the archive must be byte for byte what a ZipWriter computing every CRC itself writes from
// the same records (rewritten here in 1000-byte chunks), and every CRC must check.
void expect_same_as_rewritten(const std::string& path) {
  const serialization::ZipReader reader =
      serialization::ZipReader::open(path, {.verify_crc = true});
  const std::string copy = path + ".rewritten";
  {
    serialization::ZipWriter writer(copy);
    for (const serialization::ZipEntry& entry : reader.entries()) {
      const std::span<const uint8_t> data = reader.data(entry);
      writer.begin_record(entry.name, data.size());
      for (size_t at = 0; at < data.size(); at += 1000) {
        writer.write(data.subspan(at, std::min<size_t>(1000, data.size() - at)));
      }
    }
    writer.finish();
  }
  EXPECT_TRUE(serialization::testing::read_bytes(copy) == serialization::testing::read_bytes(path))
      << path << " differs from its records rewritten by a ZipWriter";
  fs::remove(copy);
}

void read_bin(const std::string& path, StateDict& out) {
  expect_same_as_rewritten(path);
  const serialization::TorchArchive archive = serialization::TorchArchive::open(path);
  for (const serialization::PickleEntry& entry : archive.root().entries()) {
    const serialization::TensorRef& ref = entry.value->tensor();
    const std::span<const uint8_t> bytes = archive.tensor_bytes(ref);
    out.add(entry.key->as_string(),
            Tensor{std::string(serialization::dtype_name(ref.storage.dtype)), ref.shape,
                   std::vector<uint8_t>(bytes.begin(), bytes.end()),
                   fs::path(path).filename().string(), path + ":" + ref.storage.key});
  }
}

// Reads the output folder: one file, or the shards the index names (in file-name order).
StateDict read_output(const std::string& dir, bool safetensors) {
  StateDict out;
  const std::string single = dir + (safetensors ? "/model.safetensors" : "/pytorch_model.bin");
  const std::string index =
      dir + (safetensors ? "/model.safetensors.index.json" : "/pytorch_model.bin.index.json");
  std::vector<std::string> files;
  if (fs::exists(single)) {
    EXPECT_FALSE(fs::exists(index));
    files.push_back(single);
  } else {
    std::ifstream in(index);
    EXPECT_TRUE(in.good()) << "neither " << single << " nor " << index;
    const nlohmann::json json = nlohmann::json::parse(in);
    std::set<std::string> shard_files;
    for (const auto& [name, file] : json.at("weight_map").items()) {
      shard_files.insert(file.get<std::string>());
    }
    for (const std::string& file : shard_files) files.push_back(dir + "/" + file);
    uint64_t total = 0;
    std::set<std::string> storages;
    for (const std::string& file : files) {
      if (safetensors) {
        read_safetensors(file, out);
      } else {
        read_bin(file, out);
      }
    }
    EXPECT_EQ(json.at("weight_map").size(), out.names.size());
    for (const auto& [name, tensor] : out.tensors) {
      if (safetensors || storages.insert(tensor.storage).second) total += tensor.bytes.size();
      EXPECT_EQ(json["weight_map"].value(name, ""), tensor.file) << name;
    }
    EXPECT_EQ(json["metadata"]["total_size"].get<uint64_t>(), total);
    return out;
  }
  if (safetensors) {
    read_safetensors(files[0], out);
  } else {
    read_bin(files[0], out);
  }
  return out;
}

class ZeroToFp32Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kPython)) {
      skip_reason_ = new std::string(std::string(kPython) + " is missing");
      return;
    }
    fixtures_ = new testing::TempDir();
    const serialization::testing::PythonResult probe =
        run_python(fixtures_->path(), "probe.py", "import torch\n", {});
    if (probe.status != 0) {
      skip_reason_ =
          new std::string("torch is missing for " + std::string(kPython) + ": " + probe.output);
      return;
    }
    const serialization::testing::PythonResult made =
        run_python(fixtures_->path(), "make_ds_checkpoints.py", file_text(ZINF_DS_FIXTURE_SCRIPT),
                   {fixtures_->path()});
    ASSERT_EQ(made.status, 0) << made.output;
  }
  static void TearDownTestSuite() {
    delete fixtures_;
    fixtures_ = nullptr;
    delete skip_reason_;
    skip_reason_ = nullptr;
  }
  void SetUp() override {
    if (skip_reason_ != nullptr) GTEST_SKIP() << *skip_reason_;
  }

  static std::string checkpoint(const std::string& fixture) {
    return fixtures_->path() + "/" + fixture + "/ckpt";
  }
  static StateDict expected(const std::string& fixture, const std::string& dtype) {
    StateDict out;
    read_safetensors(fixtures_->path() + "/" + fixture + "/expected_" + dtype + ".safetensors",
                     out);
    return out;
  }
  std::string output(const std::string& name) { return out_.path() + "/" + name; }

  // Consolidates `fixture` and checks every tensor against the expected ones.
  void check(const std::string& fixture, const WriteOptions& options, const std::string& dtype,
             bool exclude_frozen) {
    SCOPED_TRACE(fixture + " " + dtype + (exclude_frozen ? " without frozen" : "") +
                 (options.format == OutputFormat::kSafetensors ? " safetensors" : " bin") +
                 " max shard " + std::to_string(options.max_shard_bytes));
    PlanOptions plan_options;
    plan_options.exclude_frozen = exclude_frozen;
    const CheckpointPlan plan = read_checkpoint_plan(checkpoint(fixture), plan_options);
    const std::string dir = output(fixture + "_" + std::to_string(++runs_));
    write_consolidated(plan, dir, options);
    const bool safetensors = options.format == OutputFormat::kSafetensors;
    const StateDict got = read_output(dir, safetensors);
    const StateDict want = expected(fixture, dtype);

    const nlohmann::json frozen = nlohmann::json::parse(want.metadata.at("frozen"));
    const nlohmann::json aliases = nlohmann::json::parse(want.metadata.at("aliases"));
    std::vector<std::string> names;  // expected order, less what this run leaves out
    for (const std::string& name : want.names) {
      const bool is_frozen = std::find(frozen.begin(), frozen.end(), name) != frozen.end();
      const bool is_alias = aliases.contains(name);
      const bool alias_of_frozen =
          is_alias && std::find(frozen.begin(), frozen.end(), aliases[name]) != frozen.end();
      if (exclude_frozen && (is_frozen || alias_of_frozen)) continue;
      if (safetensors && is_alias) continue;
      names.push_back(name);
    }
    if (options.max_shard_bytes >= 1'000'000) {
      EXPECT_EQ(got.names, names);  // one file: the order is the output order
    } else {
      std::vector<std::string> sorted_got = got.names;
      std::vector<std::string> sorted_want = names;
      std::sort(sorted_got.begin(), sorted_got.end());
      std::sort(sorted_want.begin(), sorted_want.end());
      EXPECT_EQ(sorted_got, sorted_want);
    }
    for (const std::string& name : names) {
      ASSERT_EQ(got.tensors.count(name), 1U) << name;
      EXPECT_TRUE(got.tensors.at(name) == want.tensors.at(name)) << name;
    }
    for (const auto& [alias, target] : aliases.items()) {
      if (exclude_frozen && std::find(frozen.begin(), frozen.end(), target) != frozen.end()) {
        continue;
      }
      if (safetensors) {
        ASSERT_EQ(got.metadata.count("aliases"), 1U);
        EXPECT_EQ(nlohmann::json::parse(got.metadata.at("aliases"))[alias], target);
      } else {
        EXPECT_EQ(got.tensors.at(alias).storage, got.tensors.at(target.get<std::string>()).storage)
            << alias << " must share its target's storage";
      }
    }
  }

  static WriteOptions options(OutputFormat format, OutputDType dtype, uint64_t max_shard_bytes) {
    WriteOptions options;
    options.format = format;
    options.dtype = dtype;
    options.max_shard_bytes = max_shard_bytes;
    options.threads = 3;
    return options;
  }

  static std::string* skip_reason_;
  static testing::TempDir* fixtures_;
  testing::TempDir out_;
  int runs_ = 0;
};

std::string* ZeroToFp32Test::skip_reason_ = nullptr;
testing::TempDir* ZeroToFp32Test::fixtures_ = nullptr;

TEST_F(ZeroToFp32Test, EveryFixtureConsolidatesBitExactToBin) {
  for (const std::string& fixture : kFixtures) {
    check(fixture, options(OutputFormat::kTorchBin, OutputDType::kFloat32, 5'000'000'000), "fp32",
          false);
  }
}

TEST_F(ZeroToFp32Test, EveryFixtureConsolidatesBitExactToSafetensors) {
  for (const std::string& fixture : kFixtures) {
    check(fixture, options(OutputFormat::kSafetensors, OutputDType::kFloat32, 5'000'000'000),
          "fp32", false);
  }
}

TEST_F(ZeroToFp32Test, ShardedOutputsHoldEveryTensorAndAConsistentIndex) {
  for (const std::string& fixture : kFixtures) {
    for (const uint64_t shard : {uint64_t{200}, uint64_t{500}}) {
      check(fixture, options(OutputFormat::kTorchBin, OutputDType::kFloat32, shard), "fp32", false);
      check(fixture, options(OutputFormat::kSafetensors, OutputDType::kFloat32, shard), "fp32",
            false);
    }
  }
}

TEST_F(ZeroToFp32Test, Bf16AndFp16OutputsMatchTorchsConversion) {
  for (const std::string& fixture : kFixtures) {
    check(fixture, options(OutputFormat::kSafetensors, OutputDType::kBFloat16, 5'000'000'000),
          "bf16", false);
    check(fixture, options(OutputFormat::kTorchBin, OutputDType::kFloat16, 300), "fp16", false);
  }
}

TEST_F(ZeroToFp32Test, ExcludeFrozenParametersLeavesThemAndTheirAliasesOut) {
  for (const std::string& fixture : kFixtures) {
    check(fixture, options(OutputFormat::kTorchBin, OutputDType::kFloat32, 5'000'000'000), "fp32",
          true);
    check(fixture, options(OutputFormat::kSafetensors, OutputDType::kBFloat16, 5'000'000'000),
          "bf16", true);
  }
}

// Chunks of 16 bytes through one and through many workers: every chunk boundary falls inside
// a tensor or a piece somewhere, and the ring wraps hundreds of times.
TEST_F(ZeroToFp32Test, TinyChunksAndManyThreadsGiveTheSameBytes) {
  for (const int threads : {1, 7}) {
    for (const std::string& fixture :
         {std::string("s3_ws3_bf16_frozen_tied"), std::string("s2_ws3_bf16_frozen")}) {
      WriteOptions opts = options(OutputFormat::kTorchBin, OutputDType::kFloat32, 700);
      opts.threads = threads;
      opts.chunk_bytes = 16;
      uint64_t last = 0;
      uint64_t calls = 0;
      opts.progress = [&](uint64_t done, uint64_t total) {
        EXPECT_GT(done, last);
        EXPECT_LE(done, total);
        last = done;
        ++calls;
      };
      check(fixture, opts, "fp32", false);
      EXPECT_GT(calls, 50U);
    }
  }
}

// torch.load(weights_only=True) reads every .bin output (one file and shards through the
// index) and finds the values torch computed, with aliases sharing storage.
TEST_F(ZeroToFp32Test, TorchLoadsTheBinOutput) {
  std::vector<std::string> dirs;
  for (const std::string& fixture : kFixtures) {
    for (const uint64_t shard : {uint64_t{5'000'000'000}, uint64_t{300}}) {
      const CheckpointPlan plan = read_checkpoint_plan(checkpoint(fixture), {});
      const std::string dir = output(fixture + "_torch_" + std::to_string(shard));
      write_consolidated(plan, dir, options(OutputFormat::kTorchBin, OutputDType::kFloat32, shard));
      dirs.push_back(fixtures_->path() + "/" + fixture + "=" + dir);
    }
  }
  const std::string script = R"(
import json, os, struct, sys, torch
def expected(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__")
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        raw = bytearray(data[b:e])
        t = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.zeros(0)
        out[name] = t.reshape(info["shape"])
    return out, json.loads(meta["aliases"])
for arg in sys.argv[1:]:
    fixture, out_dir = arg.split("=")
    want, aliases = expected(fixture + "/expected_fp32.safetensors")
    single = os.path.join(out_dir, "pytorch_model.bin")
    if os.path.exists(single):
        got = torch.load(single, weights_only=True)
    else:
        index = json.load(open(os.path.join(out_dir, "pytorch_model.bin.index.json")))
        got = {}
        for shard in sorted(set(index["weight_map"].values())):
            got.update(torch.load(os.path.join(out_dir, shard), weights_only=True))
    assert sorted(got) == sorted(want), (out_dir, sorted(got), sorted(want))
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), (out_dir, name)
    for alias, target in aliases.items():
        assert got[alias].data_ptr() == got[target].data_ptr(), (out_dir, alias)
print("checked", len(sys.argv) - 1)
)";
  const serialization::testing::PythonResult result =
      run_python(out_.path(), "load.py", script, dirs);
  EXPECT_EQ(result.status, 0) << result.output;
  EXPECT_NE(result.output.find("checked " + std::to_string(dirs.size())), std::string::npos)
      << result.output;
}

// ---- Errors: one message naming the file and what is wrong ----

std::string plan_error(const std::string& dir, const PlanOptions& options = {}) {
  try {
    const CheckpointPlan plan = read_checkpoint_plan(dir, options);
  } catch (const SerializationError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(ZeroToFp32Test, MalformedCheckpointsNameTheFileAndTheProblem) {
  const std::string base = fixtures_->path();
  struct Case {
    std::string dir;
    std::string file;  // a part of the message: the file
    std::string what;  // and what is wrong
  };
  const std::vector<Case> cases = {
      {base + "/broken_s3_rank_sizes/ckpt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
       "fp32_flat_groups hold 157 elements; rank 0's hold 158"},
      {base + "/broken_s2_param_shapes/ckpt", "mp_rank_00_model_states.pt", "needs elements up to"},
      {base + "/broken_s1_partition_count/ckpt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
       "partition_count says 3 ranks but 2 optimizer files were found"},
      {base + "/broken_s3_huge_shape/ckpt", "zero_pp_rank_0_mp_rank_00_model_states.pt",
       "has more than 2^60 elements"},
      {base + "/no_such_dir", "no_such_dir", "no such checkpoint folder"},
  };
  for (const Case& c : cases) {
    const std::string message = plan_error(c.dir);
    EXPECT_NE(message.find(c.file), std::string::npos) << message;
    EXPECT_NE(message.find(c.what), std::string::npos) << message;
  }
}

TEST_F(ZeroToFp32Test, MissingLatestTagFolderRankFileOrTruncatedFileIsNamed) {
  const std::string copy = out_.path() + "/copy";
  fs::copy(checkpoint("s3_ws3_bf16_frozen_tied"), copy, fs::copy_options::recursive);
  const std::string tag_dir = copy + "/global_step100";

  PlanOptions wrong_tag;
  wrong_tag.tag = "global_step7";
  std::string message = plan_error(copy, wrong_tag);
  EXPECT_NE(message.find(copy + "/global_step7"), std::string::npos) << message;

  const std::string optim1 = tag_dir + "/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt";
  std::vector<uint8_t> bytes(fs::file_size(optim1));
  {
    std::ifstream in(optim1, std::ios::binary);
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  // Truncated: the zip's central directory is gone.
  fs::resize_file(optim1, bytes.size() / 2);
  message = plan_error(copy);
  EXPECT_NE(message.find(optim1), std::string::npos) << message;

  // A rank's optimizer file missing (the others still say there are 3 ranks).
  fs::remove(optim1);
  message = plan_error(copy);
  EXPECT_NE(message.find(optim1), std::string::npos) << message;
  EXPECT_NE(message.find("missing"), std::string::npos) << message;
  {
    std::ofstream out(optim1, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_EQ(plan_error(copy), "(no error)");

  // A rank's model-states file missing (stage 3 needs every rank's frozen fragments).
  const std::string model2 = tag_dir + "/zero_pp_rank_2_mp_rank_00_model_states.pt";
  fs::rename(model2, model2 + ".away");
  message = plan_error(copy);
  EXPECT_NE(message.find(model2), std::string::npos) << message;
  fs::rename(model2 + ".away", model2);

  fs::remove(copy + "/latest");
  message = plan_error(copy);
  EXPECT_NE(message.find(copy + "/latest"), std::string::npos) << message;
}

// The CLI: success prints the summary and writes the files; a failure is exit code 1 and one
// line on stderr naming the file.
TEST_F(ZeroToFp32Test, CommandLineWritesShardsAndReportsErrors) {
  const std::string dir = output("cli");
  zinf::testing::ZinfRun run = zinf::testing::run_zinf(
      {"zero-to-fp32", checkpoint("s3_ws2_fp16_frozen_tied"), dir, "--safe-serialization",
       "--max-shard-size", "0.5KB", "--dtype", "bf16", "--threads", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("ZeRO stage 3, world size 2"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("peak RSS"), std::string::npos) << run.out;
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir + "/model-00001-of-00002.safetensors"));

  run = zinf::testing::run_zinf(
      {"zero-to-fp32", checkpoint("broken_s3_rank_sizes"), output("cli_broken"), "-q"});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.err.find("zero_pp_rank_1_mp_rank_00_optim_states.pt: fp32_flat_groups"),
            std::string::npos)
      << run.err;
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_EQ(run.out, "");
  EXPECT_FALSE(fs::exists(output("cli_broken") + "/pytorch_model.bin"));

  run = zinf::testing::run_zinf(
      {"zero-to-fp32", checkpoint("s1_ws1_fp16"), output("cli_dtype"), "--dtype", "fp64"});
  EXPECT_EQ(run.exit_code, 2);  // a usage error
  EXPECT_NE(run.err.find("--dtype"), std::string::npos) << run.err;

  run = zinf::testing::run_zinf(
      {"zero-to-fp32", checkpoint("s1_ws1_fp16"), output("cli_chunk"), "--chunk-size", "100"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_NE(run.err.find("--chunk-size"), std::string::npos) << run.err;
}

// ---- The output folder and the checkpoint's integrity ----

// The names in `dir`.
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Flips the bits of the byte of `path` at `offset`.
void flip_byte(const std::string& path, uint64_t offset) {
  std::vector<uint8_t> bytes = serialization::testing::read_bytes(path);
  ASSERT_LT(offset, bytes.size()) << path;
  bytes[offset] ^= 0xFF;
  serialization::testing::write_bytes(path, bytes);
}

size_t lines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// An earlier export in the output folder is refused (exit 2, one line naming it) and stays as
// it was; with --overwrite the new export replaces it, and each of its files that the new one
// does not replace is removed and named. Files of other names are never touched.
TEST_F(ZeroToFp32Test, AnEarlierExportIsRefusedOrReplacedAndNothingElseIsTouched) {
  const std::string ckpt = checkpoint("s3_ws2_fp16_frozen_tied");
  const std::string dir = output("reexport");
  zinf::testing::ZinfRun run =
      zinf::testing::run_zinf({"zero-to-fp32", ckpt, dir, "--safe-serialization", "-q"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::vector<uint8_t> earlier =
      serialization::testing::read_bytes(dir + "/model.safetensors");
  std::ofstream(dir + "/notes.txt") << "mine";
  std::ofstream(dir + "/model.safetensors.bak") << "mine too";

  std::vector<std::string> sharded = {
      "zero-to-fp32",     ckpt,    dir,       "--safe-serialization",
      "--max-shard-size", "0.5KB", "--dtype", "bf16"};
  run = zinf::testing::run_zinf(sharded);
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_NE(run.err.find(dir + "/model.safetensors: an earlier export"), std::string::npos)
      << run.err;
  EXPECT_NE(run.err.find("--overwrite"), std::string::npos) << run.err;
  EXPECT_EQ(lines(run.err), 1U) << run.err;
  EXPECT_EQ(listing(dir),
            (std::set<std::string>{"model.safetensors", "model.safetensors.bak", "notes.txt"}));
  EXPECT_TRUE(serialization::testing::read_bytes(dir + "/model.safetensors") == earlier);

  sharded.push_back("--overwrite");
  run = zinf::testing::run_zinf(sharded);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("removed " + dir + "/model.safetensors "), std::string::npos) << run.out;
  EXPECT_EQ(listing(dir),
            (std::set<std::string>{
                "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                "model.safetensors.index.json", "model.safetensors.bak", "notes.txt"}));
  EXPECT_EQ(file_text(dir + "/notes.txt"), "mine");
  EXPECT_EQ(file_text(dir + "/model.safetensors.bak"), "mine too");
  EXPECT_FALSE(read_output(dir, true).names.empty());

  // Back to one .bin: the shards and their index go, each named on a line of its own.
  run = zinf::testing::run_zinf({"zero-to-fp32", ckpt, dir, "-q", "--overwrite"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  for (const char* name : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"}) {
    EXPECT_NE(run.out.find("removed " + dir + "/" + name + " "), std::string::npos) << run.out;
  }
  EXPECT_EQ(lines(run.out), 3U) << run.out;
  EXPECT_EQ(listing(dir),
            (std::set<std::string>{"pytorch_model.bin", "model.safetensors.bak", "notes.txt"}));
  EXPECT_EQ(read_output(dir, false).names, expected("s3_ws2_fp16_frozen_tied", "fp32").names);

  // The same export again replaces its one file, and says so.
  run = zinf::testing::run_zinf({"zero-to-fp32", ckpt, dir, "-q", "--overwrite"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ(run.out,
            "replaced " + dir + "/pytorch_model.bin (an earlier export's file, --overwrite)\n");
}

// Every record the export reads is checked against the CRC-32 its zip recorded: one flipped
// byte in a partition (or in a pickle, where it renames a tensor without breaking the pickle)
// fails the export with one line naming the file, the record and its offset, whatever the
// output format, and leaves the output folder as it was (an earlier export included, with
// --overwrite). --no-verify exports the bytes as they are.
TEST_F(ZeroToFp32Test, AFlippedByteFailsTheExportNamingTheFileRecordAndOffset) {
  const std::string copy = out_.path() + "/flipped";
  fs::copy(checkpoint("s3_ws2_fp16_frozen_tied"), copy, fs::copy_options::recursive);
  const std::string tag_dir = copy + "/" + read_latest_tag(copy);
  const std::string optim = tag_dir + "/zero_pp_rank_1_mp_rank_00_optim_states.pt";
  uint64_t data_offset = 0;
  std::string record;
  {
    const serialization::TorchArchive archive = serialization::TorchArchive::open(optim);
    const serialization::TensorRef& group =
        archive.root().at("optimizer_state_dict").at("fp32_flat_groups").items()[1]->tensor();
    const serialization::TorchArchive::StorageRecord r = archive.storage_record(group.storage);
    data_offset = r.data_offset;
    record = r.name;
  }
  flip_byte(optim, data_offset + 5);

  const std::string dir = output("crc");
  zinf::testing::ZinfRun run =
      zinf::testing::run_zinf({"zero-to-fp32", checkpoint("s3_ws2_fp16_frozen_tied"), dir, "-q"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::vector<uint8_t> earlier =
      serialization::testing::read_bytes(dir + "/pytorch_model.bin");
  for (const bool safetensors : {false, true}) {
    std::vector<std::string> args = {"zero-to-fp32",     copy, dir, "-q", "--overwrite",
                                     "--max-shard-size", "1KB"};
    if (safetensors) args.push_back("--safe-serialization");
    run = zinf::testing::run_zinf(args);
    EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
    EXPECT_NE(run.err.find(optim + ": offset " + std::to_string(data_offset) + ": record " +
                           record + " fails its CRC-32"),
              std::string::npos)
        << run.err;
    EXPECT_EQ(lines(run.err), 1U) << run.err;
    EXPECT_EQ(run.out, "");
    EXPECT_EQ(listing(dir), std::set<std::string>{"pytorch_model.bin"});
    EXPECT_TRUE(serialization::testing::read_bytes(dir + "/pytorch_model.bin") == earlier);
  }
  // Into a folder of its own: the folder is not left behind either.
  run = zinf::testing::run_zinf({"zero-to-fp32", copy, output("crc_new"), "-q"});
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_FALSE(fs::exists(output("crc_new")));
  run = zinf::testing::run_zinf({"zero-to-fp32", copy, output("crc_unchecked"), "--no-verify"});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("CRC-32s not checked (--no-verify)"), std::string::npos) << run.out;
  flip_byte(optim, data_offset + 5);  // whole again
  run = zinf::testing::run_zinf({"zero-to-fp32", copy, output("crc_whole")});
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("checkpoint records checked"), std::string::npos) << run.out;

  // A tensor name in a model-states pickle: "layers.0.attn.weight" becomes "layers.0.attn.Weight".
  const std::string model = tag_dir + "/zero_pp_rank_0_mp_rank_00_model_states.pt";
  const std::vector<uint8_t> bytes = serialization::testing::read_bytes(model);
  const std::string name = "layers.0.attn.weight";
  const auto at = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(at, bytes.end());
  std::vector<uint8_t> renamed = bytes;
  renamed[static_cast<size_t>(at - bytes.begin()) + name.size() - 6] ^= 0x20;
  serialization::testing::write_bytes(model, renamed);
  run = zinf::testing::run_zinf({"zero-to-fp32", copy, output("crc_pickle"), "-q"});
  EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
  EXPECT_NE(run.err.find(model + ": offset "), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("data.pkl fails its CRC-32"), std::string::npos) << run.err;
  EXPECT_FALSE(fs::exists(output("crc_pickle") + "/pytorch_model.bin"));
}

// With the optimizer files deleted (all, or the last ranks'), the error names the missing
// optimizer files, not the model-states file that is there: stage 3 and stage 2 (whose
// model states hold only 16-bit weights, so an export from them alone would not be fp32).
TEST_F(ZeroToFp32Test, MissingOptimizerFilesAreNamed) {
  for (const std::string& fixture :
       {std::string("s3_ws2_fp16_frozen_tied"), std::string("s2_ws2_fp16_frozen_tied")}) {
    SCOPED_TRACE(fixture);
    const std::string copy = out_.path() + "/no_optim_" + fixture;
    fs::copy(checkpoint(fixture), copy, fs::copy_options::recursive);
    const std::string tag_dir = copy + "/" + read_latest_tag(copy);
    const std::string rank0 = tag_dir + "/zero_pp_rank_0_mp_rank_00_optim_states.pt";
    const std::string rank1 = tag_dir + "/zero_pp_rank_1_mp_rank_00_optim_states.pt";
    fs::remove(rank1);
    std::string message = plan_error(copy);
    EXPECT_NE(message.find(rank1 + ": missing"), std::string::npos) << message;
    EXPECT_EQ(message.find("model_states"), std::string::npos) << message;
    fs::remove(rank0);
    message = plan_error(copy);
    EXPECT_NE(message.find(rank0 + ": missing"), std::string::npos) << message;
    EXPECT_NE(message.find("zero_pp_rank_1_mp_rank_00_optim_states.pt"), std::string::npos)
        << message;
    EXPECT_EQ(message.find("model_states"), std::string::npos) << message;

    const zinf::testing::ZinfRun run =
        zinf::testing::run_zinf({"zero-to-fp32", copy, output("no_optim_" + fixture), "-q"});
    EXPECT_EQ(run.exit_code, 1) << run.out << run.err;
    EXPECT_NE(run.err.find(rank0 + ": missing"), std::string::npos) << run.err;
  }
}

// Streaming: a 256 MB checkpoint consolidates with a peak RSS far below its size (the ring of
// chunks, the parsed pickles and the binary), because consumed input pages are dropped and no
// tensor is held whole.
TEST_F(ZeroToFp32Test, PeakMemoryStaysFarBelowTheCheckpointSize) {
  const std::string big = out_.path() + "/big";
  const serialization::testing::PythonResult made =
      run_python(out_.path(), "make_ds_checkpoints.py", file_text(ZINF_DS_FIXTURE_SCRIPT),
                 {big, "--big", "0.256", "--world-size", "2", "--tensor-mb", "16"});
  ASSERT_EQ(made.status, 0) << made.output;
  const zinf::testing::ZinfRun run = zinf::testing::run_zinf(
      {"zero-to-fp32", big, output("big_out"), "--threads", "2", "--chunk-size", "1MiB"});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const auto peak_rss_mib = [](const zinf::testing::ZinfRun& r) {
    const size_t at = r.out.find("peak RSS ");
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? 0.0 : std::stod(r.out.substr(at + 9));
  };
  // The binary's own footprint (LibTorch's libraries alone take ~160 MiB when the CLI is
  // built with it): the peak of consolidating a tiny fixture with the same options.
  const zinf::testing::ZinfRun small =
      zinf::testing::run_zinf({"zero-to-fp32", checkpoint("s1_ws1_fp16"), output("small_out"),
                               "--threads", "2", "--chunk-size", "1MiB"});
  ASSERT_EQ(small.exit_code, 0) << small.out << small.err;
  const double output_mib =
      static_cast<double>(fs::file_size(output("big_out") + "/pytorch_model.bin")) / (1 << 20);
  EXPECT_GT(output_mib, 240.0);
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // A sanitizer's shadow of every touched page (the mapped inputs too) counts in the RSS of
  // the instrumented zinf (about 1 GiB under ThreadSanitizer here): the bound holds for
  // normal builds only.
  (void)peak_rss_mib;
#else
  EXPECT_LT(peak_rss_mib(run) - peak_rss_mib(small), 100.0) << run.out << small.out;
#endif
}

// The peak RSS printed is zinf's own: not the resident size of the process that started it
// (getrusage's ru_maxrss keeps the parent's across fork and exec: a 512 MiB parent made a
// tiny export report 410 MiB and more).
TEST_F(ZeroToFp32Test, PeakRssIsTheProgramsOwnNotItsParents) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "a sanitizer's shadow memory counts in the instrumented zinf's RSS";
#else
  std::vector<char> ballast(512u << 20);
  for (size_t i = 0; i < ballast.size(); i += 4096) ballast[i] = 1;  // resident
  const zinf::testing::ZinfRun run =
      zinf::testing::run_zinf({"zero-to-fp32", checkpoint("s1_ws1_fp16"), output("rss_out")});
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const size_t at = run.out.find("peak RSS ");
  ASSERT_NE(at, std::string::npos) << run.out;
  EXPECT_LT(std::stod(run.out.substr(at + 9)), 400.0) << run.out;
  EXPECT_EQ(ballast[4096], 1);
#endif
}

}  // namespace
}  // namespace zinf::consolidate
