#include "offload/mount_info.h"

#include <sys/statfs.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace zinf::offload {

std::string unescape_mount_field(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](size_t at) { return field[at] >= '0' && field[at] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

std::string describe_filesystem(const std::string& path, int fd) {
  std::string resolved = path;
  if (char* real = ::realpath(path.c_str(), nullptr)) {
    resolved = real;
    std::free(real);  // NOLINT(cppcoreguidelines-no-malloc): realpath's contract
  }
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line;
  std::string best_point;
  std::string best_type;
  while (std::getline(mountinfo, line)) {
    // id parent major:minor root mount-point options [optional...] - type source super
    std::istringstream fields(line);
    std::string field;
    std::string point;
    for (int i = 0; i < 5 && fields >> field; ++i) {
      point = field;
    }
    while (fields >> field && field != "-") {
    }
    std::string type;
    if (!(fields >> type)) {
      continue;
    }
    point = unescape_mount_field(point);
    const bool contains = point == "/" || resolved == point ||
                          (resolved.compare(0, point.size(), point) == 0 &&
                           resolved.size() > point.size() && resolved[point.size()] == '/');
    if (contains && point.size() >= best_point.size()) {
      best_point = point;
      best_type = type;
    }
  }
  if (!best_type.empty()) {
    return best_type + " at " + best_point;
  }
  struct statfs fs {};
  if (::fstatfs(fd, &fs) == 0) {
    char magic[32];
    std::snprintf(magic, sizeof(magic), "0x%llx",
                  static_cast<unsigned long long>(fs.f_type));  // NOLINT(google-runtime-int)
    return std::string("file system type ") + magic;
  }
  return "unknown file system";
}

}  // namespace zinf::offload
