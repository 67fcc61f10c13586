#include "tools/save_folder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "serialization/file_system.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Makes `folder` (and its parents), each new level made durable (its parent fsynced), so a
// power loss after the first checkpoint cannot take the folder with it; throws naming the
// level that could not be made.
bool create_folder(const fs::path& folder, const std::string& flag) {
  std::error_code ec;
  if (fs::is_directory(folder, ec)) return false;
  if (fs::exists(folder, ec)) {
    throw std::invalid_argument(
        fmt::format("{} {}: exists and is not a folder", flag, folder.string()));
  }
  std::string failed;
  const int rc = serialization::create_directories(serialization::default_file_system(),
                                                   fs::absolute(folder, ec).string(), &failed);
  if (rc != 0) {
    const fs::path at(failed.empty() ? folder.string() : failed);
    throw std::invalid_argument(fmt::format("{} {}: cannot create {} in {}: {}", flag,
                                            folder.string(), at.string(), at.parent_path().string(),
                                            std::strerror(-rc)));
  }
  return true;
}

// Creates, writes, fsyncs and removes a probe file in `folder`.
void probe_writable(const fs::path& folder, const std::string& flag) {
  std::string name = (folder / ".zinf-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(name.data());
  if (fd < 0) {
    const int err = errno;
    throw std::invalid_argument(fmt::format("{} {}: cannot create a file in it: {}", flag,
                                            folder.string(), std::strerror(err)));
  }
  const char byte = 0;
  ssize_t n = 0;
  do {
    n = ::write(fd, &byte, 1);
  } while (n < 0 && errno == EINTR);
  const int write_err = n == 1 ? 0 : (n < 0 ? errno : ENOSPC);
  const int sync_err = write_err == 0 && ::fsync(fd) != 0 ? errno : 0;
  ::close(fd);
  ::unlink(name.c_str());
  if (write_err != 0 || sync_err != 0) {
    throw std::invalid_argument(fmt::format("{} {}: cannot write a file in it: {}", flag,
                                            folder.string(),
                                            std::strerror(write_err != 0 ? write_err : sync_err)));
  }
}

std::string read_latest_tag(const fs::path& folder) {
  std::ifstream in(folder / "latest");
  if (!in) return {};
  std::string tag;
  std::getline(in, tag);
  while (!tag.empty() && (tag.back() == '\r' || tag.back() == ' ' || tag.back() == '\n')) {
    tag.pop_back();
  }
  return tag;
}

bool same_folder(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  const bool eq = fs::equivalent(a, b, ec);
  return !ec && eq;
}

}  // namespace

std::vector<std::string> checkpoint_tags(const std::string& folder) {
  std::vector<std::string> tags;
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (ec) return tags;
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.front() == '.' || !entry.is_directory(ec)) continue;
    fs::directory_iterator files(entry.path(), ec);
    if (ec) continue;
    for (const fs::directory_entry& file : files) {
      if (ends_with(file.path().filename().string(), "model_states.pt")) {
        tags.push_back(name);
        break;
      }
    }
  }
  std::sort(tags.begin(), tags.end());
  return tags;
}

SaveFolderState check_save_folder(const std::string& save, const std::string& load,
                                  bool overwrite) {
  SaveFolderState s;
  s.overwrite_allowed = overwrite;
  s.created = create_folder(save, "--save");
  probe_writable(save, "--save");
  if (s.created) return s;
  s.latest = read_latest_tag(save);
  s.tags = checkpoint_tags(save);
  s.resumes_from_it = same_folder(save, load);
  if ((s.latest.empty() && s.tags.empty()) || s.resumes_from_it || overwrite) return s;
  std::string held;
  if (!s.latest.empty()) held = fmt::format("latest {}", s.latest);
  if (!s.tags.empty()) {
    held += fmt::format("{}{} checkpoint folder{} ({}{})", held.empty() ? "" : ", ", s.tags.size(),
                        s.tags.size() == 1 ? "" : "s", s.tags.front(),
                        s.tags.size() > 1 ? fmt::format(" ... {}", s.tags.back()) : "");
  }
  throw std::invalid_argument(fmt::format(
      "--save {}: holds another run's checkpoints ({}); this run did not --load from it, so "
      "it would replace them. Resume it with --load {}, save into another folder, or give "
      "--overwrite to replace its checkpoints tag by tag (other files are never touched)",
      save, held, save));
}

}  // namespace zinf::tools
