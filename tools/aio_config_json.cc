#include "tools/aio_config_json.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/config/run_config.h"

namespace zinf::tools {
namespace {

using Json = nlohmann::ordered_json;

std::invalid_argument key_error(std::string_view key, const Json& value, std::string_view why) {
  return std::invalid_argument(
      fmt::format("config key aio.{}: {} (got {})", key, why, value.dump()));
}

int64_t whole_number(std::string_view key, const Json& value, int64_t min, int64_t max) {
  double d = 0;
  if (value.is_number_integer() || value.is_number_unsigned()) {
    d = value.get<double>();
  } else if (value.is_number_float()) {
    d = value.get<double>();
    if (d != std::floor(d)) throw key_error(key, value, "must be a whole number");
  } else {
    throw key_error(key, value, "must be a number");
  }
  if (d < static_cast<double>(min) || d > static_cast<double>(max)) {
    throw key_error(key, value, fmt::format("must be in [{}, {}]", min, max));
  }
  return static_cast<int64_t>(d);
}

bool boolean(std::string_view key, const Json& value) {
  if (!value.is_boolean()) throw key_error(key, value, "must be true or false");
  return value.get<bool>();
}

}  // namespace

aio::AioConfig aio_config_from_json(const Json& root) {
  aio::AioConfig config;
  if (!root.is_object()) throw std::invalid_argument("config: the top level must be a JSON object");
  auto it = root.find("aio");
  if (it == root.end() || it->is_null()) return config;
  const Json& block = *it;
  if (!block.is_object()) throw std::invalid_argument("config key aio: must be an object");

  std::optional<int64_t> parallelism;
  for (const auto& [key, value] : block.items()) {
    if (key == "block_size") {
      config.block_size = static_cast<uint64_t>(whole_number(key, value, 4096, int64_t{1} << 34));
    } else if (key == "queue_depth") {
      config.queue_depth = static_cast<int>(whole_number(key, value, 1, 4096));
    } else if (key == "intra_op_parallelism" || key == "thread_count") {
      int64_t n = whole_number(key, value, 1, 256);
      if (parallelism && *parallelism != n) {
        throw key_error(key, value,
                        fmt::format("conflicts with the other spelling of the same key, which "
                                    "says {} (intra_op_parallelism and thread_count are aliases)",
                                    *parallelism));
      }
      parallelism = n;
    } else if (key == "single_submit") {
      config.single_submit = boolean(key, value);
    } else if (key == "overlap_events") {
      config.overlap_events = boolean(key, value);
    } else if (key == "use_gds") {
      if (boolean(key, value)) {
        throw key_error(key, value,
                        "GPUDirect Storage is not supported by zinf; set it to false (NVMe "
                        "traffic goes through pinned host buffers)");
      }
    } else if (key == "backend") {
      if (!value.is_string()) throw key_error(key, value, "must be a string");
      auto kind = aio::parse_backend(value.get<std::string>());
      if (!kind) throw key_error(key, value, "must be one of \"io_uring\", \"libaio\", \"psync\"");
      config.backend = *kind;
    } else {
      throw key_error(key, value,
                      "unknown key; known keys: block_size, queue_depth, intra_op_parallelism "
                      "(alias thread_count), single_submit, overlap_events, use_gds, backend");
    }
  }
  if (parallelism) config.intra_op_parallelism = static_cast<int>(*parallelism);
  try {
    config.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("config block aio: {}", e.what()));
  }
  return config;
}

Json aio_config_to_json(const aio::AioConfig& config) {
  Json block = Json::object();
  block["block_size"] = config.block_size;
  block["queue_depth"] = config.queue_depth;
  block["intra_op_parallelism"] = config.intra_op_parallelism;
  block["single_submit"] = config.single_submit;
  block["overlap_events"] = config.overlap_events;
  block["use_gds"] = false;
  block["backend"] = std::string(aio::to_string(config.backend));
  return block;
}

namespace {

// Reads the whole file; nullopt when it does not exist. Throws for other errors.
std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A minimal scanner of valid JSON text (nlohmann has parsed it first), to find where the
// top-level "aio" value starts and ends so that only those bytes change.
class TopLevelScanner {
 public:
  explicit TopLevelScanner(const std::string& text) : text_(text) {}

  struct Result {
    size_t key_begin = std::string::npos;    // the opening quote of "aio"
    size_t value_begin = std::string::npos;  // the value's first byte
    size_t value_end = std::string::npos;    // one past its last byte
    size_t close = std::string::npos;        // the top-level object's '}'
    int aio_keys = 0;
  };

  Result scan() {
    Result r;
    at_ = 0;
    skip_space();
    expect('{');
    skip_space();
    if (peek() == '}') {
      r.close = at_;
      return r;
    }
    while (true) {
      skip_space();
      const size_t key_begin = at_;
      const std::string_view key = string_token();
      skip_space();
      expect(':');
      skip_space();
      const size_t value_begin = at_;
      skip_value();
      if (key == "aio") {
        ++r.aio_keys;
        r.key_begin = key_begin;
        r.value_begin = value_begin;
        r.value_end = at_;
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      expect('}');
      r.close = at_ - 1;
      return r;
    }
  }

 private:
  char peek() const {
    if (at_ >= text_.size()) throw std::runtime_error("unexpected end of the JSON text");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) throw std::runtime_error(fmt::format("expected '{}' at byte {}", c, at_));
    ++at_;
  }
  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\n' || text_[at_] == '\r')) {
      ++at_;
    }
  }
  // A string token; returns its raw text between the quotes (escapes not decoded).
  std::string_view string_token() {
    expect('"');
    const size_t begin = at_;
    while (peek() != '"') at_ += peek() == '\\' ? 2 : 1;
    std::string_view raw(text_.data() + begin, at_ - begin);
    ++at_;
    return raw;
  }
  void skip_value() {
    const char c = peek();
    if (c == '"') {
      (void)string_token();
    } else if (c == '{' || c == '[') {
      int depth = 0;
      do {
        const char d = peek();
        if (d == '"') {
          (void)string_token();
          continue;
        }
        if (d == '{' || d == '[') ++depth;
        if (d == '}' || d == ']') --depth;
        ++at_;
      } while (depth > 0);
    } else {
      while (at_ < text_.size() &&
             std::string_view(",}] \t\r\n").find(text_[at_]) == std::string_view::npos) {
        ++at_;
      }
    }
  }

  const std::string& text_;
  size_t at_ = 0;
};

// The block's text, indented to sit at `indent` (multi-line) or on one line.
std::string block_text(const Json& block, const std::string& indent, bool multi_line) {
  if (!multi_line) return block.dump();
  std::string text = block.dump(2);
  std::string out;
  for (char c : text) {
    out += c;
    if (c == '\n') out += indent;
  }
  return out;
}

// `text` with its top-level aio value replaced by (or extended with) `block`.
std::string splice_aio_block(const std::string& path, const std::string& text, const Json& block) {
  TopLevelScanner::Result r;
  try {
    r = TopLevelScanner(text).scan();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(
        fmt::format("{}: cannot find the top-level object: {}", path, e.what()));
  }
  if (r.aio_keys > 1) {
    throw std::runtime_error(fmt::format("{}: the key \"aio\" appears {} times", path, r.aio_keys));
  }
  const bool multi_line = text.find('\n') != std::string::npos &&
                          text.find('\n') < (r.close == std::string::npos ? 0 : r.close);
  if (r.aio_keys == 1) {
    const size_t line = text.rfind('\n', r.key_begin);
    const size_t line_begin = line == std::string::npos ? 0 : line + 1;
    std::string indent = text.substr(line_begin, r.key_begin - line_begin);
    if (indent.find_first_not_of(" \t") != std::string::npos) indent = "  ";
    return text.substr(0, r.value_begin) + block_text(block, indent, multi_line) +
           text.substr(r.value_end);
  }
  // No aio block yet: add it as the last member.
  size_t last = text.find_last_not_of(" \t\r\n", r.close - 1);
  const bool empty = text[last] == '{';
  std::string member =
      multi_line ? fmt::format("{}\n  \"aio\": {}", empty ? "" : ",", block_text(block, "  ", true))
                 : fmt::format("{}\"aio\": {}", empty ? "" : ", ", block.dump());
  std::string rest = text.substr(last + 1);
  if (multi_line && rest.find('\n') == std::string::npos) rest = "\n" + rest;
  return text.substr(0, last + 1) + member + rest;
}

void replace_file(const std::string& path, const std::string& text, mode_t mode) {
  std::string temp = path + ".zinf-tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0)
    throw std::runtime_error(fmt::format("{}: cannot create: {}", temp, std::strerror(errno)));
  auto fail = [&](const char* what) {
    int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    return std::runtime_error(fmt::format("{}: {} failed: {}", temp, what, std::strerror(err)));
  };
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw fail("write");
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, mode) != 0) throw fail("fchmod");
  if (::fsync(fd) != 0) throw fail("fsync");
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    throw std::runtime_error(
        fmt::format("{}: rename to {} failed: {}", temp, path, std::strerror(err)));
  }
}

}  // namespace

std::vector<std::string> check_config_for_aio_block(const std::string& path, bool create) {
  std::optional<std::string> text;
  try {
    text = read_text(path);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
  if (!text) {
    if (create) return {};
    throw std::invalid_argument(fmt::format(
        "{}: does not exist; pass --create to create it holding just the aio block", path));
  }
  config::RunConfig parsed;
  try {
    parsed = config::parse_config_string(*text, path);
  } catch (const config::ConfigError& e) {
    throw std::invalid_argument(e.what());
  }
  std::vector<std::string> others;
  const std::string aio_prefix = path + ": aio.";
  for (std::string w : parsed.warnings) {
    if (w.rfind(aio_prefix, 0) != 0) {
      others.push_back(std::move(w));
      continue;
    }
    if (size_t at = w.find("unknown key, ignored"); at != std::string::npos) {
      w.replace(at, std::strlen("unknown key, ignored"), "unknown key");
    }
    throw std::invalid_argument(fmt::format(
        "{}; nvme-tune rewrites the aio block and would drop it: fix or remove it first", w));
  }
  try {
    (void)splice_aio_block(path, *text, aio_config_to_json(aio::AioConfig{}));
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
  return others;
}

void write_aio_block(const std::string& path, const aio::AioConfig& config, bool create) {
  const Json block = aio_config_to_json(config);
  std::optional<std::string> text = read_text(path);
  if (!text) {
    if (!create) {
      throw std::runtime_error(
          fmt::format("{}: does not exist (pass --create to create it)", path));
    }
    Json root = Json::object();
    root["aio"] = block;
    replace_file(path, root.dump(2) + "\n", 0644);
    return;
  }
  Json original;
  try {
    original = Json::parse(*text);
  } catch (const Json::parse_error& e) {
    throw std::runtime_error(fmt::format("{}: not valid JSON, left unchanged: {}", path, e.what()));
  }
  if (!original.is_object()) {
    throw std::runtime_error(
        fmt::format("{}: the top level is not a JSON object, left unchanged", path));
  }
  std::string spliced = splice_aio_block(path, *text, block);
  // The new text must say exactly what the old one said, with the new block.
  Json expected = original;
  expected["aio"] = block;
  Json got;
  try {
    got = Json::parse(spliced);
  } catch (const Json::parse_error&) {
  }
  if (nlohmann::json(got) != nlohmann::json(expected)) {
    throw std::runtime_error(
        fmt::format("{}: could not replace the aio block in place (is the key written with "
                    "escapes?), left unchanged",
                    path));
  }
  struct stat st {};
  mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  replace_file(path, spliced, mode);
}

}  // namespace zinf::tools
