#include "tests/common/fault_injection_file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace zinf::testing {
namespace {

namespace fs = std::filesystem;

std::string parent_of(const std::string& path) { return fs::path(path).parent_path().string(); }
std::string name_of(const std::string& path) { return fs::path(path).filename().string(); }

bool under(const std::string& path, const std::string& folder) {
  return path == folder ||
         (path.size() > folder.size() && path.compare(0, folder.size(), folder) == 0 &&
          path[folder.size()] == '/');
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int error) {
  throw std::runtime_error("FaultInjectionFileSystem: " + what + " " + path + ": " +
                           std::strerror(error));
}

// Re-keys the entries of `map` at or under `from` to `to` (values kept).
template <typename Value>
void rekey(std::map<std::string, Value>& map, const std::string& from, const std::string& to) {
  std::vector<std::pair<std::string, Value>> moving;
  for (auto it = map.begin(); it != map.end();) {
    if (under(it->first, from)) {
      moving.emplace_back(to + it->first.substr(from.size()), std::move(it->second));
      it = map.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [k, v] : moving) map.insert_or_assign(std::move(k), std::move(v));
}

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem(std::string graveyard,
                                                   serialization::FileSystem& target)
    : graveyard_(key(graveyard)), target_(target) {
  std::error_code ec;
  fs::create_directories(graveyard_, ec);
  if (ec) fail("cannot create the graveyard", graveyard_, ec.value());
}

// ---- bookkeeping -------------------------------------------------------------------------------

bool FaultInjectionFileSystem::begin_call() {
  if (dead_) return false;
  ++calls_;
  if (kill_at_ > 0 && calls_ >= kill_at_) dead_ = true;
  return !dead_;
}

std::string FaultInjectionFileSystem::key(const std::string& path) {
  std::error_code ec;
  std::string k = fs::absolute(path, ec).lexically_normal().string();
  while (k.size() > 1 && k.back() == '/') k.pop_back();
  return k;
}

uint64_t FaultInjectionFileSystem::dir_id(const std::string& path) {
  auto [it, inserted] = dirs_.try_emplace(path, next_dir_);
  if (inserted) ++next_dir_;
  return it->second;
}

std::string FaultInjectionFileSystem::dir_path(uint64_t id) const {
  for (const auto& [path, known] : dirs_) {
    if (known == id) return path;
  }
  return {};
}

FaultInjectionFileSystem::FileState& FaultInjectionFileSystem::file_state(const std::string& path) {
  auto it = files_.find(path);
  if (it == files_.end()) {
    struct stat st {};
    const uint64_t size = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    it = files_.emplace(path, FileState{size, {}}).first;
  }
  return it->second;
}

void FaultInjectionFileSystem::save_synced(const std::string& path, FileState& state, uint64_t from,
                                           uint64_t to) {
  to = std::min(to, state.synced_size);
  if (from >= to) return;
  Saved saved{from, std::vector<uint8_t>(to - from)};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot read", path, errno);
  const ssize_t n = ::pread(fd, saved.bytes.data(), saved.bytes.size(), static_cast<off_t>(from));
  const int error = errno;
  ::close(fd);
  if (n < 0) fail("cannot read", path, error);
  saved.bytes.resize(static_cast<size_t>(n));  // past the end now: nothing to put back there
  state.overwritten.push_back(std::move(saved));
}

void FaultInjectionFileSystem::moved(const std::string& from, const std::string& to) {
  rekey(files_, from, to);
  rekey(dirs_, from, to);
  for (auto& [fd, path] : fds_) {
    if (under(path, from)) path = to + path.substr(from.size());
  }
}

void FaultInjectionFileSystem::forget(const std::string& path) {
  std::erase_if(files_, [&](const auto& e) { return under(e.first, path); });
  std::erase_if(dirs_, [&](const auto& e) { return under(e.first, path); });
}

std::string FaultInjectionFileSystem::new_grave() {
  return graveyard_ + "/" + std::to_string(next_grave_++);
}

// ---- the calls ---------------------------------------------------------------------------------

int FaultInjectionFileSystem::open(const std::string& path, int flags, mode_t mode) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  const std::string p = key(path);
  struct stat before {};
  const bool existed = ::stat(p.c_str(), &before) == 0;
  const bool writes = (flags & O_ACCMODE) != O_RDONLY;
  if (writes && existed && S_ISREG(before.st_mode) && (flags & O_TRUNC) != 0) {
    FileState& state = file_state(p);
    save_synced(p, state, 0, state.synced_size);
  }
  const int fd = target_.open(path, flags, mode);
  if (fd < 0) return fd;
  fds_[fd] = p;
  struct stat st {};
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    (void)dir_id(p);
  } else if (writes) {
    if (!existed) {
      files_[p] = FileState{};
      changes_.push_back({Change::Kind::kCreate, dir_id(parent_of(p)), name_of(p), {}, {}, 0});
    } else {
      (void)file_state(p);
    }
  }
  return fd;
}

int64_t FaultInjectionFileSystem::pwrite(int fd, const void* bytes, size_t length,
                                         uint64_t offset) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  if (auto it = fds_.find(fd); it != fds_.end()) {
    save_synced(it->second, file_state(it->second), offset, offset + length);
  }
  return target_.pwrite(fd, bytes, length, offset);
}

int FaultInjectionFileSystem::ftruncate(int fd, uint64_t size_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  if (auto it = fds_.find(fd); it != fds_.end()) {
    FileState& state = file_state(it->second);
    save_synced(it->second, state, size_bytes, state.synced_size);
  }
  return target_.ftruncate(fd, size_bytes);
}

int FaultInjectionFileSystem::fsync(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  // The fake keeps what is durable itself: the disk is not asked to (a simulated power loss
  // needs no real durability, and fsyncs on a loaded machine would make the suites slow).
  struct stat st {};
  if (::fstat(fd, &st) != 0) return -errno;
  const auto it = fds_.find(fd);
  if (it == fds_.end()) return 0;
  const std::string& path = it->second;
  if (S_ISDIR(st.st_mode)) {
    // The folder's entries are durable: removed files are gone for good.
    const uint64_t id = dir_id(path);
    std::erase_if(changes_, [&](const Change& c) {
      if (c.dir != id) return false;
      if (!c.grave.empty()) {
        (void)target_.unlink(c.grave);
        forget(c.grave);
      }
      return true;
    });
  } else {
    files_[path] = FileState{static_cast<uint64_t>(st.st_size), {}};
  }
  return 0;
}

int FaultInjectionFileSystem::close(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  fds_.erase(fd);
  return target_.close(fd);
}

int FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  const std::string f = key(from);
  const std::string t = key(to);
  if (f == t) return target_.rename(from, to);
  if (parent_of(f) != parent_of(t)) return -EXDEV;
  struct stat st {};
  if (::lstat(f.c_str(), &st) != 0) return -errno;
  Change change{Change::Kind::kRename, dir_id(parent_of(t)), name_of(t), name_of(f), {}, 0};
  struct stat replaced {};
  if (::lstat(t.c_str(), &replaced) == 0) {
    if (S_ISDIR(replaced.st_mode)) {
      change.folder = dir_id(t);  // an empty folder; gone if the rename succeeds
    } else {
      change.grave = new_grave();
      if (const int rc = target_.rename(t, change.grave); rc != 0) return rc;
      moved(t, change.grave);
    }
  }
  if (const int rc = target_.rename(f, t); rc != 0) {
    if (!change.grave.empty() && target_.rename(change.grave, t) == 0) moved(change.grave, t);
    return rc;
  }
  if (change.folder != 0) forget(t);
  moved(f, t);
  changes_.push_back(std::move(change));
  return 0;
}

int FaultInjectionFileSystem::exchange(const std::string& a, const std::string& b) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  if (refuse_exchange_) return -EINVAL;
  const std::string ka = key(a);
  const std::string kb = key(b);
  if (parent_of(ka) != parent_of(kb)) return -EXDEV;
  if (const int rc = target_.exchange(a, b); rc != 0) return rc;
  const std::string swap = graveyard_ + "/exchanging";
  moved(ka, swap);
  moved(kb, ka);
  moved(swap, kb);
  changes_.push_back(
      {Change::Kind::kExchange, dir_id(parent_of(ka)), name_of(ka), name_of(kb), {}, 0});
  return 0;
}

int FaultInjectionFileSystem::mkdir(const std::string& path, mode_t mode) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  if (const int rc = target_.mkdir(path, mode); rc != 0) return rc;
  const std::string p = key(path);
  forget(p);
  const uint64_t id = dir_id(p);
  changes_.push_back({Change::Kind::kMkdir, dir_id(parent_of(p)), name_of(p), {}, {}, id});
  return 0;
}

int FaultInjectionFileSystem::unlink(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  const std::string p = key(path);
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0) return -errno;
  if (S_ISDIR(st.st_mode)) return -EISDIR;
  Change change{Change::Kind::kUnlink, dir_id(parent_of(p)), name_of(p), {}, new_grave(), 0};
  if (const int rc = target_.rename(p, change.grave); rc != 0) return rc;
  moved(p, change.grave);
  changes_.push_back(std::move(change));
  return 0;
}

int FaultInjectionFileSystem::rmdir(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!begin_call()) return -EIO;
  const std::string p = key(path);
  const uint64_t id = dir_id(p);
  if (const int rc = target_.rmdir(path); rc != 0) return rc;
  forget(p);
  changes_.push_back({Change::Kind::kRmdir, dir_id(parent_of(p)), name_of(p), {}, {}, id});
  return 0;
}

// ---- faults ------------------------------------------------------------------------------------

void FaultInjectionFileSystem::kill_at(int64_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  kill_at_ = k > 0 ? calls_ + k : 0;
}

int64_t FaultInjectionFileSystem::calls() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return calls_;
}

bool FaultInjectionFileSystem::dead() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dead_;
}

void FaultInjectionFileSystem::refuse_exchange(bool refuse) {
  std::lock_guard<std::mutex> lock(mutex_);
  refuse_exchange_ = refuse;
}

void FaultInjectionFileSystem::undo(const Change& c, Loss& loss) {
  ++loss.entries;
  const std::string dir = dir_path(c.dir);
  if (dir.empty()) {
    // The folder itself is gone for good: its entries went with it.
    if (!c.grave.empty()) {
      (void)target_.unlink(c.grave);
      forget(c.grave);
    }
    return;
  }
  const std::string entry = dir + "/" + c.name;
  switch (c.kind) {
    case Change::Kind::kCreate:
      if (const int rc = target_.unlink(entry); rc != 0) fail("cannot remove", entry, -rc);
      forget(entry);
      break;
    case Change::Kind::kMkdir: {
      std::string at;
      if (const int rc = serialization::remove_all(target_, entry, &at); rc != 0) {
        fail("cannot remove", at, -rc);
      }
      forget(entry);
      break;
    }
    case Change::Kind::kRename: {
      const std::string old = dir + "/" + c.other;
      if (const int rc = target_.rename(entry, old); rc != 0) fail("cannot rename", entry, -rc);
      moved(entry, old);
      if (!c.grave.empty()) {
        if (const int rc = target_.rename(c.grave, entry); rc != 0) {
          fail("cannot restore", entry, -rc);
        }
        moved(c.grave, entry);
      } else if (c.folder != 0) {
        if (const int rc = target_.mkdir(entry, 0777); rc != 0) fail("cannot restore", entry, -rc);
        dirs_[entry] = c.folder;
      }
      break;
    }
    case Change::Kind::kExchange: {
      const std::string other = dir + "/" + c.other;
      if (const int rc = target_.exchange(entry, other); rc != 0) {
        fail("cannot exchange back", entry, -rc);
      }
      const std::string swap = graveyard_ + "/exchanging";
      moved(entry, swap);
      moved(other, entry);
      moved(swap, other);
      break;
    }
    case Change::Kind::kUnlink:
      if (const int rc = target_.rename(c.grave, entry); rc != 0) {
        fail("cannot restore", entry, -rc);
      }
      moved(c.grave, entry);
      break;
    case Change::Kind::kRmdir:
      if (const int rc = target_.mkdir(entry, 0777); rc != 0) fail("cannot restore", entry, -rc);
      dirs_[entry] = c.folder;
      break;
  }
}

FaultInjectionFileSystem::Loss FaultInjectionFileSystem::drop_unsynced() {
  std::lock_guard<std::mutex> lock(mutex_);
  Loss loss;
  for (auto it = changes_.rbegin(); it != changes_.rend(); ++it) undo(*it, loss);
  changes_.clear();
  for (auto& [path, state] : files_) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size == state.synced_size && state.overwritten.empty()) continue;
    const int fd = target_.open(path, O_WRONLY | O_CLOEXEC, 0);
    if (fd < 0) fail("cannot open", path, -fd);
    for (auto it = state.overwritten.rbegin(); it != state.overwritten.rend(); ++it) {
      for (size_t done = 0; done < it->bytes.size();) {
        const int64_t n =
            target_.pwrite(fd, it->bytes.data() + done, it->bytes.size() - done, it->offset + done);
        if (n <= 0) fail("cannot restore the synced bytes of", path, n < 0 ? -n : EIO);
        done += static_cast<size_t>(n);
      }
      loss.bytes += static_cast<int64_t>(it->bytes.size());
    }
    if (const int rc = target_.ftruncate(fd, state.synced_size); rc != 0) {
      fail("cannot truncate", path, -rc);
    }
    (void)target_.close(fd);
    if (size > state.synced_size) loss.bytes += static_cast<int64_t>(size - state.synced_size);
    state.overwritten.clear();
  }
  dead_ = false;
  kill_at_ = 0;
  return loss;
}

}  // namespace zinf::testing
