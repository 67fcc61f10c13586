// IoError: message assembly (see aio/error.h for the layer's error policy).
#include "aio/error.h"

#include <fmt/format.h>

#include <cstring>
#include <utility>

namespace zinf::aio {
namespace {

std::string describe(const std::string& op, const std::string& path, uint64_t offset,
                     uint64_t length, int error, const std::string& detail) {
  std::string text =
      fmt::format("aio: {} failed on '{}' at offset {} (length {})", op, path, offset, length);
  if (error != 0) {
    // strerror_r (GNU flavour) may return a static string or fill `buf`; use what it returns.
    char buf[128];
    const char* reason = strerror_r(error, buf, sizeof(buf));
    text += fmt::format(": {} (errno {})", reason, error);
  }
  if (!detail.empty()) text += fmt::format(": {}", detail);
  return text;
}

}  // namespace

IoError::IoError(std::string op, std::string path, uint64_t offset, uint64_t length, int error,
                 std::string detail)
    : std::runtime_error(describe(op, path, offset, length, error, detail)),
      op_(std::move(op)),
      path_(std::move(path)),
      offset_(offset),
      length_(length),
      error_(error) {}

}  // namespace zinf::aio
