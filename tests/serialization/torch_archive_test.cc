// TorchArchive against torch.save files made by /usr/bin/python3 (torch 1.13), and
// TorchArchiveWriter's files loaded by torch.load, with weights_only=True where torch 1.13's
// restricted unpickler allows the values (see pickle_writer.h).
#include "serialization/torch_archive.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "serialization/pickle_reader.h"
#include "serialization/pickle_writer.h"
#include "serialization/serialization_error.h"
#include "tests/common/temp_dir.h"
#include "tests/serialization/pickle_test_util.h"

namespace zinf::serialization {
namespace {

using Json = nlohmann::json;
using Kind = PickleValue::Kind;

using test_util::hex;
using test_util::kPython;
using test_util::read_json;
using test_util::run;
const std::string kScript = test_util::fixture_script();
// The torch.save cases of pickle_fixtures.py, and those torch 1.13's weights_only loads.
const std::vector<std::string> kCases = {"tensors", "nested", "model_states", "optim_states",
                                         "weights_only"};

// Every tensor under `value`, depth first.
void tensors_of(const PickleValue& value, std::vector<const TensorRef*>& out) {
  if (value.is(Kind::kTensor)) {
    out.push_back(&value.tensor());
  } else if (value.is(Kind::kDict) || value.is(Kind::kOrderedDict)) {
    for (const PickleEntry& e : value.entries()) tensors_of(*e.value, out);
  } else if (value.is(Kind::kList) || value.is(Kind::kTuple)) {
    for (const PickleValue* item : value.items()) tensors_of(*item, out);
  }
}

class TorchArchiveTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!test_util::python_has_torch()) return;
    dir_ = new testing::TempDir();
    made_ = run(std::string(kPython) + " " + kScript + " make " + dir_->path()) == 0;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << kPython << " has no torch";
    ASSERT_TRUE(made_) << "fixture script failed: " << kScript;
  }
  static std::string path(const std::string& name) { return dir_->file(name); }

  static inline testing::TempDir* dir_ = nullptr;
  static inline bool made_ = false;
};

TEST_F(TorchArchiveTest, ReadsTorchSaveFilesAndTheirStorages) {
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const TorchArchive archive = TorchArchive::open(path(name + ".pt"));
    EXPECT_EQ(archive.prefix(), name + "/");
    // The same tree as the bare data.pkl gives (pickle_test compares that one with Python).
    std::ifstream in(path(name + ".pkl"), std::ios::binary);
    const std::vector<uint8_t> pkl{std::istreambuf_iterator<char>(in), {}};
    EXPECT_EQ(write_pickle(archive.root()), write_pickle(read_pickle(pkl, "pkl").root()));
    const Json storages = read_json(path(name + ".storages.json"));
    std::vector<const TensorRef*> tensors;
    tensors_of(archive.root(), tensors);
    ASSERT_FALSE(tensors.empty());
    for (const TensorRef* t : tensors) {
      EXPECT_EQ(hex(archive.storage_bytes(t->storage)), storages.at(t->storage.key))
          << t->storage.key;
      if (t->is_contiguous()) {
        const std::span<const uint8_t> bytes = archive.tensor_bytes(*t);
        EXPECT_EQ(bytes.size(),
                  static_cast<size_t>(t->numel()) * dtype_size_bytes(t->storage.dtype));
      } else {
        EXPECT_THROW((void)archive.tensor_bytes(*t), SerializationError);
      }
    }
  }
}

TEST_F(TorchArchiveTest, TorchLoadReadsWhatZinfWrote) {
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const TorchArchive source = TorchArchive::open(path(name + ".pt"));
    const std::string out = path(name + ".zinf.pt");
    {
      TorchArchiveWriter writer(out);
      writer.write_pickle(source.root());
      std::vector<const TensorRef*> tensors;
      tensors_of(source.root(), tensors);
      std::vector<std::string> done;
      for (const TensorRef* t : tensors) {
        if (std::find(done.begin(), done.end(), t->storage.key) != done.end()) continue;
        done.push_back(t->storage.key);
        writer.add_storage(t->storage.key, source.storage_bytes(t->storage));
      }
      writer.finish();
    }
    const std::string flags = name == "weights_only" ? " --weights-only" : "";
    const std::string json = out + ".json";
    ASSERT_EQ(run(std::string(kPython) + " " + kScript + " load --archive" + flags + " " + out +
                  " " + json),
              0);
    EXPECT_SAME_JSON(read_json(json), read_json(path(name + ".json")));
    EXPECT_SAME_JSON(read_json(json + ".storages.json"), read_json(path(name + ".storages.json")));
  }
}

TEST_F(TorchArchiveTest, WriterRefusesMissingOrShortStorages) {
  const TorchArchive source = TorchArchive::open(path("weights_only.pt"));
  {
    TorchArchiveWriter writer(path("missing.pt"));
    writer.write_pickle(source.root());
    EXPECT_THROW(writer.finish(), SerializationError);
  }
  std::vector<const TensorRef*> tensors;
  tensors_of(source.root(), tensors);
  TorchArchiveWriter writer(path("short.pt"));
  writer.write_pickle(source.root());
  const std::vector<uint8_t> one_byte = {0};
  writer.add_storage(tensors[0]->storage.key, one_byte);
  EXPECT_THROW(writer.finish(), SerializationError);
  EXPECT_FALSE(std::ifstream(path("short.pt")).good());  // nothing renamed into place
}

TEST_F(TorchArchiveTest, ReaderRefusesMissingPickleAndShortStorages) {
  {
    ZipWriter zip(path("no_pickle.pt"));
    const std::vector<uint8_t> version = {'3', '\n'};
    zip.add_record("archive/version", version);
    zip.finish();
  }
  EXPECT_THROW((void)TorchArchive::open(path("no_pickle.pt")), SerializationError);

  const TorchArchive source = TorchArchive::open(path("weights_only.pt"));
  std::vector<const TensorRef*> tensors;
  tensors_of(source.root(), tensors);
  {
    // data.pkl as torch wrote it, but the first storage's record one byte short.
    ZipWriter zip(path("short_record.pt"));
    zip.add_record("archive/data.pkl", write_pickle(source.root()));
    const std::span<const uint8_t> bytes = source.storage_bytes(tensors[0]->storage);
    zip.add_record("archive/data/" + tensors[0]->storage.key, bytes.first(bytes.size() - 1));
    zip.finish();
  }
  const TorchArchive archive = TorchArchive::open(path("short_record.pt"));
  try {
    (void)archive.storage_bytes(tensors[0]->storage);
    ADD_FAILURE() << "a short storage record was accepted";
  } catch (const SerializationError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes; its"), std::string::npos) << e.what();
  }
  // A storage with no record at all.
  EXPECT_THROW((void)archive.storage_bytes(tensors.back()->storage), SerializationError);
}

}  // namespace
}  // namespace zinf::serialization
