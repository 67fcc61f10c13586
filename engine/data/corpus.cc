// The default corpus: the fortunes files' text, or a generated corpus when they are absent.
#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

#include "engine/data/data.h"
#include "engine/data/internal.h"
#include "engine/data/mapped_file.h"

namespace zinf::data {
namespace {

namespace fs = std::filesystem;

// Size of the generated corpus: large enough that a small model cannot memorise it in a
// bare run's steps, small enough to build in a few milliseconds.
constexpr uint64_t kGeneratedCorpusBytes = uint64_t{320} * 1024;

std::string kib(uint64_t bytes) { return std::to_string((bytes + 512) / 1024) + " KiB"; }

// The fortune text files directly under `dir`, sorted by path: regular files (not links,
// so the `.u8` aliases Debian installs are not read twice), without the `.dat` indexes;
// subfolders such as `off/` (the offensive fortunes) are not entered. On failure returns
// nothing and sets `reason`.
std::vector<fs::path> fortune_files(const std::string& dir, std::string* reason) {
  std::vector<fs::path> files;
  std::error_code error;
  fs::directory_iterator it(dir, error);
  if (error) {
    *reason = dir + ": " + error.message();
    return files;
  }
  for (const fs::directory_entry& entry : it) {
    std::error_code entry_error;
    if (entry.is_symlink(entry_error) || !entry.is_regular_file(entry_error)) {
      continue;
    }
    const fs::path& path = entry.path();
    if (path.extension() == ".dat" || path.extension() == ".u8" ||
        entry.file_size(entry_error) == 0 || entry_error) {
      continue;
    }
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    *reason = "no fortune text files in " + dir;
  }
  return files;
}

// ---- The generated corpus ---------------------------------------------------------------
// Sentences from a small grammar: subject-verb agreement, fixed phrase shapes, counting and
// sums. Character frequencies are English-like (unigram entropy near 3 nats), while the
// next character is mostly fixed by the word and the phrase it is in.

constexpr std::array<std::string_view, 16> kNouns = {
    "cat",   "dog",  "bird",   "farmer", "child", "river", "garden", "teacher",
    "horse", "tree", "sailor", "robot",  "baker", "storm", "lamp",   "king"};
constexpr std::array<std::string_view, 12> kAdjectives = {"old",   "small", "quiet",  "bright",
                                                          "green", "tired", "happy",  "strange",
                                                          "cold",  "brave", "little", "wise"};
constexpr std::array<std::string_view, 12> kVerbs = {  // base forms; +s / +es for singular
    "see",  "follow", "watch", "help", "find", "carry",
    "like", "call",   "push",  "wash", "fix",  "teach"};
constexpr std::array<std::string_view, 8> kPlaces = {"the house", "the market", "the hill",
                                                     "the sea",   "the bridge", "the forest",
                                                     "the town",  "the field"};
constexpr std::array<std::string_view, 6> kPrepositions = {"near", "behind", "under",
                                                           "over", "beside", "in"};
constexpr std::array<std::string_view, 10> kNumbers = {"zero", "one", "two",   "three", "four",
                                                       "five", "six", "seven", "eight", "nine"};

class SentenceWriter {
 public:
  explicit SentenceWriter(uint64_t seed) : random_(seed) {}

  template <size_t N>
  std::string_view pick(const std::array<std::string_view, N>& words) {
    return words[random_.below(N)];
  }
  bool coin() { return random_.below(2) == 0; }

  // "the old cat" or "the dogs": the noun phrase and whether it is plural.
  std::string noun_phrase(bool* plural) {
    std::string phrase = "the ";
    if (coin()) {
      phrase.append(pick(kAdjectives)).push_back(' ');
    }
    phrase.append(pick(kNouns));
    *plural = random_.below(3) == 0;
    if (*plural) {
      phrase.push_back('s');
    }
    return phrase;
  }

  static std::string verb(std::string_view base, bool plural) {
    std::string verb(base);
    if (!plural) {
      const char last = verb.back();
      if (verb == "carry") {
        verb = "carries";
      } else if (last == 'h' || last == 'x' || last == 's') {
        verb.append("es");
      } else {
        verb.push_back('s');
      }
    }
    return verb;
  }

  std::string sentence() {
    bool plural = false;
    std::string text;
    switch (random_.below(5)) {
      case 0:
      case 1: {  // the old cat sees the dogs near the house.
        text = noun_phrase(&plural);
        text.append(" ").append(verb(pick(kVerbs), plural)).append(" ");
        bool object_plural = false;
        text.append(noun_phrase(&object_plural));
        if (coin()) {
          text.append(" ").append(pick(kPrepositions)).append(" ").append(pick(kPlaces));
        }
        text.push_back('.');
        break;
      }
      case 2: {  // does the cat see the dog? yes, the cat sees the dog.
        const std::string subject = noun_phrase(&plural);
        bool object_plural = false;
        const std::string object = noun_phrase(&object_plural);
        const std::string_view base = pick(kVerbs);
        text.append(plural ? "do " : "does ").append(subject).append(" ");
        text.append(base).append(" ").append(object).append("? ");
        if (coin()) {
          text.append("Yes, ").append(subject).append(" ").append(verb(base, plural));
        } else {
          text.append("No, ").append(subject).append(plural ? " do not " : " does not ");
          text.append(base);
        }
        text.append(" ").append(object).append(".");
        break;
      }
      case 3: {  // two and five make seven.
        const uint64_t a = random_.below(kNumbers.size());
        const uint64_t b = random_.below(kNumbers.size() - a);
        text.append(kNumbers[a]).append(" and ").append(kNumbers[b]).append(" make ");
        text.append(kNumbers[a + b]).append(".");
        break;
      }
      default: {  // count from three to six: three, four, five, six.
        const uint64_t from = random_.below(kNumbers.size() - 1);
        const uint64_t to = from + 1 + random_.below(std::min<uint64_t>(4, 9 - from));
        text.append("count from ").append(kNumbers[from]).append(" to ");
        text.append(kNumbers[to]).append(":");
        for (uint64_t n = from; n <= to; ++n) {
          text.append(" ").append(kNumbers[n]).append(n == to ? "." : ",");
        }
        break;
      }
    }
    text[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(text[0])));
    return text;
  }

 private:
  detail::SplitMix64 random_;
};

}  // namespace

namespace detail {

std::string generated_corpus_text(uint64_t min_bytes) {
  SentenceWriter writer(/*seed=*/20240611);
  std::string text;
  text.reserve(min_bytes + 256);
  int in_paragraph = 0;
  while (text.size() < min_bytes) {
    text.append(writer.sentence());
    // Paragraphs of four sentences.
    if (++in_paragraph == 4) {
      text.push_back('\n');
      in_paragraph = 0;
    } else {
      text.push_back(' ');
    }
  }
  return text;
}

}  // namespace detail

std::unique_ptr<TokenSource> default_corpus(std::string* note, const std::string& fortunes_dir) {
  std::string reason;
  const std::vector<fs::path> files = fortune_files(fortunes_dir, &reason);
  if (!files.empty()) {
    std::string text;
    for (const fs::path& path : files) {
      const serialization::MappedFile file = detail::map_file(path.string());
      text.append(reinterpret_cast<const char*>(file.data()), file.size());
      if (text.back() != '\n') {
        text.push_back('\n');
      }
    }
    const std::string where = kib(text.size()) + " of text from " + std::to_string(files.size()) +
                              " files in " + fortunes_dir;
    if (note != nullptr) {
      *note = "fortunes: " + where;
    }
    const uint64_t tokens = text.size();
    return detail::make_memory_text(std::move(text), "byte-level text: fortunes, " + where + " (" +
                                                         std::to_string(tokens) + " tokens)");
  }
  std::string text = detail::generated_corpus_text(kGeneratedCorpusBytes);
  if (note != nullptr) {
    *note = "the fortunes package is not installed (" + reason + "); using a generated corpus of " +
            kib(text.size());
  }
  const uint64_t tokens = text.size();
  return detail::make_memory_text(
      std::move(text), "byte-level text: generated corpus (" + std::to_string(tokens) + " tokens)");
}

}  // namespace zinf::data
