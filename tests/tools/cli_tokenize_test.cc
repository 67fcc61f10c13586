// scripts/tokenize-text.py and `zinf train`'s checks of what it writes, run for real: a model
// folder with its own tokenizer (scripts/make-model-with-tokenizer.py: a BPE tokenizer trained
// on Debian's license texts and a tiny Llama sized to it) tokenizes text into .u16 files with
// sidecars; `zinf train --init-from` that folder trains on them, says which tokenizer made the data
// and that it is the folder's own, and reports the held-out loss. A tokenizer whose files differ is
// named in a warning; a sidecar whose vocabulary exceeds the model's, or that describes another
// file, is refused before training. A named model takes its vocabulary from the sidecar.
//
// Skipped, with the reason, where .venv/ (transformers, tokenizers) is absent.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/common/run_logged.h"
#include "tests/common/temp_dir.h"
#include "tests/common/venv.h"
#include "tests/tools/file_bytes.h"
#include "tests/tools/test_system.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;
using zinf::testing::read_file;
using zinf::testing::run_logged;
using zinf::testing::run_zinf;
using zinf::testing::TempDir;
using zinf::testing::ZinfRun;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kTexts =
    "/usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "
    "/usr/share/common-licenses/LGPL-2.1";

TEST(CliTokenize, TextTokenizedByTheModelsOwnTokenizerTrainsAndIsChecked) {
  if (const std::string why =
          ::zinf::testing::venv_missing(ZINF_VENV_PYTHON, "transformers, tokenizers");
      !why.empty()) {
    GTEST_SKIP() << why;
  }
  TempDir dir;
  const std::string python = std::string("'") + ZINF_VENV_PYTHON + "' ";
  const std::string model = dir.file("model");
  ASSERT_TRUE(run_logged(python + ZINF_MAKE_TOKENIZER_MODEL + " '" + model + "' " + kTexts,
                         dir.file("model.log")));
  // The script's last line is the tokenizer's size.
  const std::string made = read_file(dir.file("model.log"));
  const size_t last = made.find_last_of('\n', made.size() - 2);
  const int vocab = std::stoi(made.substr(last == std::string::npos ? 0 : last + 1));
  ASSERT_TRUE(run_logged(python + ZINF_TOKENIZE_SCRIPT + " --model '" + model + "' --out '" +
                             dir.file("train.u16") + "' --eval-out '" + dir.file("eval.u16") +
                             "' --eval-fraction 0.1 --separator '\\n\\n' " + kTexts,
                         dir.file("tokenize.log")));
  const std::string tokenize_log = read_file(dir.file("tokenize.log"));
  EXPECT_TRUE(contains(tokenize_log, "16-bit ids; sidecar " + dir.file("train.u16") + ".json"))
      << tokenize_log;

  // The sidecar describes the file: its tokens, the tokenizer, EOS closing every document.
  nlohmann::json side;
  std::ifstream(dir.file("train.u16.json")) >> side;
  EXPECT_EQ(side["format"], "zinf-tokens/1");
  EXPECT_EQ(side["vocab_size"].get<int>(), vocab);
  const auto tokens = side["tokens"].get<uint64_t>();
  EXPECT_EQ(fs::file_size(dir.file("train.u16")), 2 * tokens);
  std::vector<uint16_t> ids(tokens);
  std::ifstream(dir.file("train.u16"), std::ios::binary)
      .read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(2 * tokens));
  const auto eos = side["eos_id"].get<uint16_t>();
  EXPECT_EQ(ids.back(), eos);
  EXPECT_EQ(static_cast<uint64_t>(std::count(ids.begin(), ids.end(), eos)),
            side["documents"].get<uint64_t>());
  for (uint16_t id : ids) ASSERT_LT(id, vocab);

  // zinf train on them: which tokenizer, the folder's own, the held-out loss.
  const std::vector<std::string> base = {
      "train",     "--init-from", model,    "--data", dir.file("train.u16"), "--steps", "4",
      "--seq-len", "64",          "--plot", "",       "--nvme-path",         dir.path()};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--eval-data", dir.file("eval.u16"), "--eval-batches", "2"});
  ZinfRun run = run_zinf(args, {}, SIGINT, 300);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out, "data: tokenized by ")) << run.out;
  EXPECT_TRUE(contains(
      run.out, "(tokenizer sha256 " + side["tokenizer"]["sha256"].get<std::string>().substr(0, 12) +
                   ", vocab " + std::to_string(vocab) + ", EOS " + std::to_string(eos)))
      << run.out;
  EXPECT_TRUE(contains(run.out, "; the tokenizer of " + model)) << run.out;
  EXPECT_TRUE(std::regex_search(run.out, std::regex("eval loss +[0-9.]+ -> [0-9.]+"))) << run.out;
  EXPECT_FALSE(contains(run.out, "warning")) << run.out;

  // Another tokenizer's files: named in a warning, the run goes on.
  const std::string other = dir.file("other");
  fs::copy(model, other, fs::copy_options::recursive);
  {
    nlohmann::json config;
    std::ifstream(other + "/tokenizer_config.json") >> config;
    config["model_max_length"] = 64;
    std::ofstream(other + "/tokenizer_config.json") << config.dump(2);
  }
  args = base;
  args[2] = other;
  run = run_zinf(args, {}, SIGINT, 300);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_TRUE(contains(run.out, "warning: --data " + dir.file("train.u16") +
                                    " was tokenized by a tokenizer whose files differ from " +
                                    other + "'s"))
      << run.out;

  // A sidecar whose vocabulary is larger than the model's: refused, both numbers named.
  {
    const std::string big = dir.file("big.u16");
    fs::copy_file(dir.file("train.u16"), big);
    nlohmann::json edited = side;
    edited["vocab_size"] = 100000;
    std::ofstream(big + ".json") << edited.dump();
    args = base;
    args[4] = big;
    run = run_zinf(args, {}, SIGINT, 120);
    EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
    EXPECT_TRUE(contains(run.err, "vocabulary of 100000 ids")) << run.err;
    EXPECT_TRUE(contains(run.err, "vocab_size " + std::to_string(vocab))) << run.err;
  }
  // A sidecar beside a file it does not describe (two tokens fewer): refused.
  {
    const std::string cut = dir.file("cut.u16");
    {
      std::ofstream out(cut, std::ios::binary);
      out.write(reinterpret_cast<const char*>(ids.data()),
                static_cast<std::streamsize>(2 * (tokens - 2)));
    }
    fs::copy_file(dir.file("train.u16.json"), cut + ".json");
    args = base;
    args[4] = cut;
    run = run_zinf(args, {}, SIGINT, 120);
    EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
    EXPECT_TRUE(contains(run.err, cut + ".json: \"tokens\" is " + std::to_string(tokens) + " but " +
                                      cut + " holds " + std::to_string(tokens - 2)))
        << run.err;
  }
  // A named model's vocabulary is the tokenizer's (here a sidecar saying 400 beside ids below
  // the tokenizer's real size), not the data's largest id + 1.
  {
    const std::string wide = dir.file("wide.u16");
    fs::copy_file(dir.file("train.u16"), wide);
    nlohmann::json edited = side;
    edited["vocab_size"] = 400;
    std::ofstream(wide + ".json") << edited.dump();
    run = run_zinf({"train", "--model", "tiny", "--data", wide, "--steps", "1", "--seq-len", "64",
                    "--plot", "", "--nvme-path", dir.path()},
                   {}, SIGINT, 300);
    EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
    EXPECT_TRUE(contains(run.out, "vocab 400)")) << run.out;
  }
}

}  // namespace
}  // namespace zinf::tools
