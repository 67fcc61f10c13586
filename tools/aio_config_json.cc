#include "tools/aio_config_json.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

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

void write_aio_block(const std::string& path, const aio::AioConfig& config) {
  Json root = Json::object();
  {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      try {
        root = Json::parse(text.str());
      } catch (const Json::parse_error& e) {
        throw std::runtime_error(
            fmt::format("{}: not valid JSON, left unchanged: {}", path, e.what()));
      }
      if (!root.is_object()) {
        throw std::runtime_error(
            fmt::format("{}: the top level is not a JSON object, left unchanged", path));
      }
    } else if (errno != ENOENT) {
      throw std::runtime_error(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    }
  }
  root["aio"] = aio_config_to_json(config);
  std::string text = root.dump(2) + "\n";

  std::string temp = path + ".zinf-tmp";
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(fmt::format("{}: cannot create: {}", temp, std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(temp.c_str());
      throw std::runtime_error(fmt::format("{}: write failed: {}", temp, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(temp.c_str());
    throw std::runtime_error(fmt::format("{}: fsync failed: {}", temp, std::strerror(err)));
  }
  ::close(fd);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    throw std::runtime_error(
        fmt::format("{}: rename to {} failed: {}", temp, path, std::strerror(err)));
  }
}

}  // namespace zinf::tools
