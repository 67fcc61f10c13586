// Tests of engine/data: byte-level text and token files read back, every error path names
// its file (and offset), open_data's suffix rule, the unigram entropy, the default corpus
// (fake fortunes folders, the generated fallback), and the sampler's contract: the global
// batch is the same for any world size, ranks never overlap, each epoch covers every sample
// once and reshuffles, and seek reproduces.
#include "engine/data/data.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/data/internal.h"
#include "tests/common/seed.h"
#include "tests/common/temp_dir.h"

namespace zinf::data {
namespace {

using zinf::testing::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "writing " << path;
}

// Little-endian ids of `width` bytes each.
std::string token_bytes(const std::vector<uint32_t>& ids, int width) {
  std::string bytes;
  for (const uint32_t id : ids) {
    for (int b = 0; b < width; ++b) {
      bytes.push_back(static_cast<char>((id >> (8 * b)) & 0xFF));
    }
  }
  return bytes;
}

std::vector<int64_t> read_all(const TokenSource& source) {
  std::vector<int64_t> tokens(source.size());
  source.read(0, source.size(), tokens.data());
  return tokens;
}

// Whether `text` holds `part`; the failure message shows both.
::testing::AssertionResult contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// The DataError text `call` throws (a failure when it throws nothing).
template <typename Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const DataError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no DataError thrown";
  return {};
}

// ---- Sources ------------------------------------------------------------------------------

TEST(ByteText, ReadsEveryByteAsAToken) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 random(seed);
  TempDir dir;
  std::string bytes(4099, '\0');
  for (char& c : bytes) {
    c = static_cast<char>(random() & 0xFF);
  }
  const std::string path = dir.file("text.txt");
  write_file(path, bytes);

  const auto source = open_byte_text(path);
  ASSERT_EQ(source->size(), bytes.size());
  EXPECT_EQ(source->vocab_size(), 256U);
  EXPECT_EQ(source->description(), "byte-level text " + path + " (4099 tokens)");
  const std::vector<int64_t> tokens = read_all(*source);
  for (size_t i = 0; i < bytes.size(); ++i) {
    ASSERT_EQ(tokens[i], static_cast<uint8_t>(bytes[i])) << "token " << i;
  }
  // An odd window in the middle.
  std::vector<int64_t> window(13);
  source->read(1001, 13, window.data());
  for (size_t i = 0; i < window.size(); ++i) {
    EXPECT_EQ(window[i], static_cast<uint8_t>(bytes[1001 + i]));
  }
  // The last token is readable; one past it is not.
  source->read(4098, 1, window.data());
  EXPECT_TRUE(contains(error_of([&] { source->read(4098, 2, window.data()); }), path));
  EXPECT_TRUE(contains(error_of([&] { source->read(UINT64_MAX, 2, window.data()); }), path));
}

TEST(TokenFile, ReadsLittleEndianIdsOfBothWidths) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  std::mt19937_64 random(seed);
  TempDir dir;
  for (const int width : {2, 4}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const uint32_t id_limit = width == 2 ? 50000 : 3000000;
    std::vector<uint32_t> ids(1023);
    for (uint32_t& id : ids) {
      id = static_cast<uint32_t>(random() % id_limit);
    }
    const uint32_t largest = *std::max_element(ids.begin(), ids.end());
    const std::string path = dir.file("tokens" + std::to_string(width));
    write_file(path, token_bytes(ids, width));

    const auto inferred = open_token_file(path, width);
    ASSERT_EQ(inferred->size(), ids.size());
    EXPECT_EQ(inferred->vocab_size(), largest + 1);
    const std::vector<int64_t> tokens = read_all(*inferred);
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(tokens[i], ids[i]) << "token " << i;
    }
    EXPECT_TRUE(contains(inferred->description(), path));
    EXPECT_TRUE(contains(inferred->description(), width == 2 ? "uint16" : "uint32"));

    const auto given = open_token_file(path, width, id_limit);
    EXPECT_EQ(given->vocab_size(), id_limit);
    EXPECT_EQ(read_all(*given), tokens);
  }
  // Byte order: 0x1234 stored as 34 12, 0x12345678 as 78 56 34 12.
  write_file(dir.file("le16"), std::string("\x34\x12", 2));
  EXPECT_EQ(read_all(*open_token_file(dir.file("le16"), 2)), std::vector<int64_t>{0x1234});
  write_file(dir.file("le32"), std::string("\x78\x56\x34\x12", 4));
  EXPECT_EQ(read_all(*open_token_file(dir.file("le32"), 4)), std::vector<int64_t>{0x12345678});
}

TEST(DataErrors, NameTheFileAndWhatWasWrong) {
  TempDir dir;
  const std::string missing = dir.file("missing.txt");
  for (const std::string& text : {error_of([&] { (void)open_byte_text(missing); }),
                                  error_of([&] { (void)open_token_file(missing, 2); }),
                                  error_of([&] { (void)open_data(missing); })}) {
    EXPECT_TRUE(contains(text, missing));
    EXPECT_TRUE(contains(text, "No such file or directory"));
  }

  const std::string empty = dir.file("empty.u32");
  write_file(empty, "");
  EXPECT_TRUE(
      contains(error_of([&] { (void)open_byte_text(empty); }), empty + ": the file is empty"));
  EXPECT_TRUE(contains(error_of([&] { (void)open_data(empty); }), empty + ": the file is empty"));

  EXPECT_TRUE(contains(error_of([&] { (void)open_byte_text(dir.path()); }),
                       dir.path() + ": not a regular file"));

  const std::string odd = dir.file("odd.u32");
  write_file(odd, std::string(7, 'x'));
  std::string text = error_of([&] { (void)open_data(odd); });
  EXPECT_TRUE(contains(text, odd + ": size 7 bytes is not a multiple of the token width 4"));
  text = error_of([&] { (void)open_token_file(odd, 2); });
  EXPECT_TRUE(contains(text, odd + ": size 7 bytes is not a multiple of the token width 2"));

  // The first id not below the vocab is token 3, byte offset 6 (uint16) / 12 (uint32).
  const std::vector<uint32_t> ids = {1, 2, 9, 10, 11, 3};
  const std::string u16 = dir.file("ids.u16");
  write_file(u16, token_bytes(ids, 2));
  EXPECT_TRUE(contains(error_of([&] { (void)open_token_file(u16, 2, 10); }),
                       u16 + ": token id 10 at byte offset 6 (token 3)"));
  const std::string u32 = dir.file("ids.u32");
  write_file(u32, token_bytes(ids, 4));
  EXPECT_TRUE(contains(error_of([&] { (void)open_token_file(u32, 4, 10); }),
                       u32 + ": token id 10 at byte offset 12 (token 3)"));
  EXPECT_EQ(open_token_file(u32, 4, 12)->vocab_size(), 12U);  // every id below 12

  EXPECT_TRUE(contains(error_of([&] { (void)open_token_file(u32, 3); }),
                       u32 + ": token width 3 is not supported"));
}

TEST(OpenData, ChoosesTheReaderBySuffix) {
  TempDir dir;
  const std::string bytes = token_bytes({1, 2, 3, 4}, 4);  // 16 bytes
  const std::map<std::string, std::pair<uint64_t, uint32_t>> expected = {
      // name -> (tokens, vocab)
      {"a.u16", {8, 5}},    {"a.bin16", {8, 5}}, {"a.u32", {4, 5}},        {"a.bin32", {4, 5}},
      {"a.txt", {16, 256}}, {"a", {16, 256}},    {"a.u16.txt", {16, 256}}, {"a.bin", {16, 256}}};
  for (const auto& [name, shape] : expected) {
    SCOPED_TRACE(name);
    write_file(dir.file(name), bytes);
    const auto source = open_data(dir.file(name));
    EXPECT_EQ(source->size(), shape.first);
    EXPECT_EQ(source->vocab_size(), shape.second);
    EXPECT_TRUE(contains(source->description(), dir.file(name)));
  }
}

TEST(UnigramEntropy, MatchesHandComputedValues) {
  TempDir dir;
  // "aab": p = 2/3, 1/3 -> H = ln 3 - (2/3) ln 2.
  write_file(dir.file("aab.txt"), "aab");
  EXPECT_NEAR(unigram_entropy_nats(*open_byte_text(dir.file("aab.txt"))),
              std::log(3.0) - 2.0 / 3.0 * std::log(2.0), 1e-12);
  // One repeated token: 0.
  write_file(dir.file("zzzz.txt"), "zzzz");
  EXPECT_EQ(unigram_entropy_nats(*open_byte_text(dir.file("zzzz.txt"))), 0.0);
  // Four equally frequent uint16 ids: ln 4.
  write_file(dir.file("four.u16"), token_bytes({0, 7, 3, 9, 9, 3, 7, 0}, 2));
  EXPECT_NEAR(unigram_entropy_nats(*open_data(dir.file("four.u16"))), std::log(4.0), 1e-12);
  // A vocab past the dense-count range: p = 1/2, 1/4, 1/4 -> H = 1.5 ln 2.
  write_file(dir.file("sparse.u32"), token_bytes({40000000, 5, 40000000, 0}, 4));
  EXPECT_NEAR(unigram_entropy_nats(*open_data(dir.file("sparse.u32"))), 1.5 * std::log(2.0), 1e-12);
  // More tokens than the counting chunk (65536): 70000 tokens, 10% 'b'.
  std::string text(70000, 'a');
  for (size_t i = 0; i < text.size(); i += 10) {
    text[i] = 'b';
  }
  write_file(dir.file("long.txt"), text);
  EXPECT_NEAR(unigram_entropy_nats(*open_byte_text(dir.file("long.txt"))),
              -(0.1 * std::log(0.1) + 0.9 * std::log(0.9)), 1e-12);
}

// ---- The default corpus -------------------------------------------------------------------

TEST(DefaultCorpus, ConcatenatesTheFortuneTextFilesInPathOrder) {
  TempDir dir;
  write_file(dir.file("zen"), "Be here.\n%\nBe now.\n");
  write_file(dir.file("art"), "A fortune without a final newline");
  write_file(dir.file("art.dat"), std::string("\x00\x00\x00\x02\x01", 5));  // index: skipped
  write_file(dir.file("empty"), "");
  ASSERT_EQ(::symlink("art", dir.file("art.u8").c_str()), 0);  // Debian's alias: skipped
  std::filesystem::create_directory(dir.file("off"));
  write_file(dir.file("off/rude"), "offensive\n");  // the offensive folder: skipped

  std::string note;
  const auto corpus = default_corpus(&note, dir.path());
  const std::string expected = "A fortune without a final newline\nBe here.\n%\nBe now.\n";
  ASSERT_EQ(corpus->size(), expected.size());
  EXPECT_EQ(corpus->vocab_size(), 256U);
  const std::vector<int64_t> tokens = read_all(*corpus);
  EXPECT_EQ(std::string(tokens.begin(), tokens.end()), expected);
  EXPECT_EQ(note, "fortunes: 0 KiB of text from 2 files in " + dir.path());
  EXPECT_TRUE(contains(corpus->description(), "fortunes"));
  EXPECT_TRUE(contains(corpus->description(), std::to_string(expected.size()) + " tokens"));
  // A null note is allowed.
  EXPECT_EQ(default_corpus(nullptr, dir.path())->size(), expected.size());
}

TEST(DefaultCorpus, FallsBackToAGeneratedCorpusWithANote) {
  TempDir dir;
  const std::string missing = dir.file("no-fortunes");
  std::string note;
  const auto generated = default_corpus(&note, missing);
  EXPECT_TRUE(contains(note, "the fortunes package is not installed (" + missing +
                                 ": No such file or directory); using a generated corpus of "));
  EXPECT_EQ(generated->vocab_size(), 256U);
  // "A few hundred KiB", and the note states its size.
  EXPECT_GE(generated->size(), 200U * 1024);
  EXPECT_LE(generated->size(), 600U * 1024);
  EXPECT_TRUE(contains(note, std::to_string((generated->size() + 512) / 1024) + " KiB"));
  EXPECT_TRUE(contains(generated->description(), "generated corpus"));

  // A folder without fortune text files falls back too, naming the folder; the text is the
  // same every time.
  std::filesystem::create_directory(dir.file("only-dat"));
  write_file(dir.file("only-dat/x.dat"), "index");
  const auto again = default_corpus(&note, dir.file("only-dat"));
  EXPECT_TRUE(contains(note, "(no fortune text files in " + dir.file("only-dat") + ")"));
  EXPECT_EQ(read_all(*again), read_all(*generated));
}

// Entropy of the next byte given the `context` bytes before it, from the corpus's own counts.
double conditional_entropy_nats(const std::vector<int64_t>& tokens, size_t context) {
  std::map<std::string, std::map<int64_t, uint64_t>> counts;
  for (size_t i = context; i < tokens.size(); ++i) {
    std::string key(tokens.begin() + static_cast<std::ptrdiff_t>(i - context),
                    tokens.begin() + static_cast<std::ptrdiff_t>(i));
    ++counts[key][tokens[i]];
  }
  const auto total = static_cast<double>(tokens.size() - context);
  double entropy = 0.0;
  for (const auto& [key, next] : counts) {
    uint64_t key_total = 0;
    for (const auto& [token, count] : next) {
      key_total += count;
    }
    for (const auto& [token, count] : next) {
      const double joint = static_cast<double>(count) / total;
      entropy -= joint * std::log(static_cast<double>(count) / static_cast<double>(key_total));
    }
  }
  return entropy;
}

TEST(DefaultCorpus, GeneratedCorpusIsLearnable) {
  std::string note;
  TempDir dir;
  const auto generated = default_corpus(&note, dir.file("absent"));
  const double unigram = unigram_entropy_nats(*generated);
  // English-like letter frequencies: well above a handful of symbols, well below uniform
  // bytes (ln 256 = 5.55).
  EXPECT_GT(unigram, 2.3);
  EXPECT_LT(unigram, 3.5);
  // A model that sees the previous four bytes can do far better than the unigram entropy:
  // the line a trained model must beat is clearly reachable.
  const std::vector<int64_t> tokens = read_all(*generated);
  const double with_context = conditional_entropy_nats(tokens, 4);
  EXPECT_LT(with_context, 0.4 * unigram) << "unigram " << unigram;
}

TEST(DefaultCorpus, ReadsTheInstalledFortunes) {
  const std::string standard = "/usr/share/games/fortunes";
  if (!std::filesystem::exists(standard + "/fortunes")) {
    GTEST_SKIP() << "the fortunes package is not installed here";
  }
  std::string note;
  const auto corpus = default_corpus(&note);
  EXPECT_TRUE(contains(note, "fortunes: "));
  EXPECT_TRUE(contains(note, " in " + standard));
  EXPECT_GT(corpus->size(), 100U * 1024);
}

// ---- The sampler --------------------------------------------------------------------------

// A uint32 token file whose token t is t: sample i starts with token i * (seq_len + 1).
std::unique_ptr<TokenSource> counting_source(const TempDir& dir, uint32_t tokens) {
  std::vector<uint32_t> ids(tokens);
  for (uint32_t t = 0; t < tokens; ++t) {
    ids[t] = t;
  }
  const std::string path = dir.file("count" + std::to_string(tokens) + ".u32");
  write_file(path, token_bytes(ids, 4));
  return open_data(path);
}

// Takes one micro-batch and returns its samples' indices, checking that every row is a whole
// sample of the counting source and the targets are the inputs shifted by one.
std::vector<int64_t> next_samples(SampleLoader& loader, int64_t micro_batch, int64_t seq_len) {
  std::vector<int64_t> inputs;
  std::vector<int64_t> targets;
  loader.next(micro_batch, inputs, targets);
  EXPECT_EQ(inputs.size(), static_cast<size_t>(micro_batch * seq_len));
  EXPECT_EQ(targets.size(), inputs.size());
  std::vector<int64_t> samples;
  for (int64_t row = 0; row < micro_batch; ++row) {
    const int64_t first = inputs[static_cast<size_t>(row * seq_len)];
    EXPECT_EQ(first % (seq_len + 1), 0) << "row " << row << " is not a sample boundary";
    for (int64_t k = 0; k < seq_len; ++k) {
      const auto at = static_cast<size_t>(row * seq_len + k);
      EXPECT_EQ(inputs[at], first + k);
      EXPECT_EQ(targets[at], first + k + 1);
    }
    samples.push_back(first / (seq_len + 1));
  }
  return samples;
}

std::vector<SampleLoader> loaders(const TokenSource& source, LoaderOptions options,
                                  int world_size) {
  std::vector<SampleLoader> result;
  for (int rank = 0; rank < world_size; ++rank) {
    options.rank = rank;
    options.world_size = world_size;
    result.emplace_back(source, options);
  }
  return result;
}

TEST(SampleLoader, GlobalBatchIsTheSameForAnyWorldSize) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const int64_t seq_len = 7;
  const auto source = counting_source(dir, 24 * 8 + 5);  // 24 samples and a partial one
  LoaderOptions options;
  options.seq_len = seq_len;
  options.seed = seed;
  constexpr int kGlobalBatch = 4;
  constexpr int kSteps = 15;  // 60 samples: two and a half epochs

  // global_samples[W][step][global position in the batch]
  std::map<int, std::vector<std::vector<int64_t>>> global_samples;
  for (const int world_size : {1, 2, 4}) {
    std::vector<SampleLoader> ranks = loaders(*source, options, world_size);
    const int64_t micro_batch = kGlobalBatch / world_size;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int64_t> batch(kGlobalBatch, -1);
      for (int rank = 0; rank < world_size; ++rank) {
        const std::vector<int64_t> samples = next_samples(ranks[rank], micro_batch, seq_len);
        // Rank r's row b is global position r + b * W of the batch.
        for (int64_t b = 0; b < micro_batch; ++b) {
          batch[static_cast<size_t>(rank + b * world_size)] = samples[static_cast<size_t>(b)];
        }
        EXPECT_EQ(ranks[rank].global_position(), (step + 1) * kGlobalBatch);
        EXPECT_EQ(ranks[rank].epoch(), (step + 1) * kGlobalBatch / 24);
      }
      global_samples[world_size].push_back(batch);
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_EQ(global_samples[2][step], global_samples[1][step]);
    EXPECT_EQ(global_samples[4][step], global_samples[1][step]);
  }
}

TEST(SampleLoader, RanksSplitEachEpochWithoutOverlapAndReshuffle) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const int64_t seq_len = 5;
  const auto source = counting_source(dir, 30 * 6);  // 30 samples
  LoaderOptions options;
  options.seq_len = seq_len;
  options.seed = seed;
  constexpr int kWorld = 3;
  std::vector<SampleLoader> ranks = loaders(*source, options, kWorld);
  ASSERT_EQ(ranks[0].samples_per_epoch(), 30);

  std::vector<std::vector<int64_t>> epoch_orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> order;  // the epoch's global order
    std::vector<std::set<int64_t>> per_rank(kWorld);
    for (int step = 0; step < 5; ++step) {  // 5 steps x micro-batch 2 x 3 ranks = 30
      std::vector<std::vector<int64_t>> taken;
      for (int rank = 0; rank < kWorld; ++rank) {
        EXPECT_EQ(ranks[rank].epoch(), epoch);
        taken.push_back(next_samples(ranks[rank], 2, seq_len));
        per_rank[rank].insert(taken.back().begin(), taken.back().end());
      }
      for (int b = 0; b < 2; ++b) {
        for (int rank = 0; rank < kWorld; ++rank) {
          order.push_back(taken[rank][b]);
        }
      }
    }
    // Each rank took 10 distinct samples; together every sample exactly once.
    std::multiset<int64_t> all;
    for (const auto& mine : per_rank) {
      EXPECT_EQ(mine.size(), 10U);
      all.insert(mine.begin(), mine.end());
    }
    std::vector<int64_t> sorted(order);
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> every(30);
    std::iota(every.begin(), every.end(), 0);
    EXPECT_EQ(sorted, every) << "epoch " << epoch;
    EXPECT_EQ(all.size(), 30U);
    epoch_orders.push_back(order);
  }
  // A new order each epoch (30! orders: equal by chance with probability ~4e-33), and a
  // shuffled one (not the file order).
  EXPECT_NE(epoch_orders[0], epoch_orders[1]);
  EXPECT_NE(epoch_orders[1], epoch_orders[2]);
  std::vector<int64_t> file_order(30);
  std::iota(file_order.begin(), file_order.end(), 0);
  EXPECT_NE(epoch_orders[0], file_order);
}

TEST(SampleLoader, DropsTheTailThatDoesNotSplitEvenly) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const auto source = counting_source(dir, 25 * 4);  // 25 samples of 4 tokens
  LoaderOptions options;
  options.seq_len = 3;
  options.seed = seed;
  std::vector<SampleLoader> ranks = loaders(*source, options, 2);
  ASSERT_EQ(ranks[0].samples_per_epoch(), 24);
  std::set<int64_t> seen;
  for (int step = 0; step < 4; ++step) {  // 4 x 3 x 2 = 24: one epoch
    for (auto& rank : ranks) {
      for (const int64_t sample : next_samples(rank, 3, 3)) {
        EXPECT_TRUE(seen.insert(sample).second) << "sample " << sample << " twice";
        EXPECT_LT(sample, 25);
      }
    }
  }
  EXPECT_EQ(seen.size(), 24U);
  EXPECT_EQ(ranks[0].epoch(), 1);
  EXPECT_EQ(ranks[1].global_position(), 24);
}

TEST(SampleLoader, WithoutShuffleRanksTakeInterleavedSamplesInFileOrder) {
  TempDir dir;
  const auto source = counting_source(dir, 12 * 3);
  LoaderOptions options;
  options.seq_len = 2;
  options.shuffle = false;
  std::vector<SampleLoader> ranks = loaders(*source, options, 2);
  EXPECT_EQ(next_samples(ranks[0], 3, 2), (std::vector<int64_t>{0, 2, 4}));
  EXPECT_EQ(next_samples(ranks[1], 3, 2), (std::vector<int64_t>{1, 3, 5}));
  EXPECT_EQ(next_samples(ranks[0], 4, 2), (std::vector<int64_t>{6, 8, 10, 0}));
  EXPECT_EQ(ranks[0].epoch(), 1);
}

TEST(SampleLoader, SeekReproducesTheSequence) {
  const uint64_t seed = zinf::testing::test_seed();
  ZINF_TRACE_SEED(seed);
  TempDir dir;
  const auto source = counting_source(dir, 20 * 9 + 3);  // 20 samples of 9 tokens
  LoaderOptions options;
  options.seq_len = 8;
  options.seed = seed;
  options.world_size = 2;
  options.rank = 1;
  // Micro-batch 2 on 2 ranks: 4 positions a step. Resume at the start, inside epoch 0,
  // exactly at its end (20), inside epoch 1 and inside epoch 3.
  for (const int skip_steps : {0, 3, 5, 7, 16}) {
    SCOPED_TRACE("skip " + std::to_string(skip_steps));
    SampleLoader first(*source, options);
    for (int step = 0; step < skip_steps; ++step) {
      (void)next_samples(first, 2, 8);
    }
    const int64_t position = first.global_position();
    EXPECT_EQ(position, skip_steps * 2 * 2);
    EXPECT_EQ(first.epoch(), position / 20);
    std::vector<std::vector<int64_t>> expected;
    expected.reserve(6);
    for (int step = 0; step < 6; ++step) {
      expected.push_back(next_samples(first, 3, 8));
    }

    SampleLoader resumed(*source, options);
    (void)next_samples(resumed, 5, 8);  // wherever it was, seek replaces it
    resumed.seek(position);
    EXPECT_EQ(resumed.global_position(), position);
    EXPECT_EQ(resumed.epoch(), position / 20);
    for (int step = 0; step < 6; ++step) {
      EXPECT_EQ(next_samples(resumed, 3, 8), expected[static_cast<size_t>(step)]);
    }
  }
}

TEST(SampleLoader, SameSeedSameOrderOtherSeedOtherOrder) {
  TempDir dir;
  const auto source = counting_source(dir, 40 * 4);
  LoaderOptions options;
  options.seq_len = 3;
  options.seed = 77;
  SampleLoader a(*source, options);
  SampleLoader b(*source, options);
  options.seed = 78;
  SampleLoader c(*source, options);
  const std::vector<int64_t> from_a = next_samples(a, 40, 3);
  EXPECT_EQ(next_samples(b, 40, 3), from_a);
  // Epoch e uses seed + e: seed 77's second epoch is seed 78's first.
  const std::vector<int64_t> from_c = next_samples(c, 40, 3);
  EXPECT_NE(from_c, from_a);
  EXPECT_EQ(next_samples(a, 40, 3), from_c);
}

TEST(SampleLoader, ErrorsNameTheSource) {
  TempDir dir;
  const auto source = counting_source(dir, 10);  // 2 samples of 5 tokens
  LoaderOptions options;
  options.seq_len = 4;
  options.world_size = 3;
  std::string text = error_of([&] { SampleLoader loader(*source, options); });
  EXPECT_TRUE(contains(text, dir.file("count10.u32")));
  EXPECT_TRUE(contains(text, "too short"));
  options.world_size = 1;
  options.seq_len = 10;
  EXPECT_TRUE(contains(error_of([&] { SampleLoader loader(*source, options); }), "too short"));
  options.seq_len = 0;
  EXPECT_TRUE(contains(error_of([&] { SampleLoader loader(*source, options); }), "seq_len 0"));
  options.seq_len = 4;
  options.world_size = 2;
  options.rank = 2;
  EXPECT_TRUE(
      contains(error_of([&] { SampleLoader loader(*source, options); }), "rank 2 of world size 2"));
  options.rank = 0;
  SampleLoader loader(*source, options);
  std::vector<int64_t> inputs;
  std::vector<int64_t> targets;
  EXPECT_TRUE(contains(error_of([&] { loader.next(0, inputs, targets); }), "micro-batch 0"));
  EXPECT_TRUE(contains(error_of([&] { loader.seek(-1); }), "global position -1"));
  EXPECT_TRUE(contains(error_of([&] { loader.seek(3); }),
                       "global position 3: not a multiple of the world size 2"));
}

TEST(SplitMix64, MatchesTheReferenceOutput) {
  // The reference implementation (Vigna's splitmix64.c) seeded with 0 starts with these.
  detail::SplitMix64 random(0);
  EXPECT_EQ(random.next(), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(random.next(), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(random.next(), 0x06C45D188009454FULL);
}

}  // namespace
}  // namespace zinf::data
