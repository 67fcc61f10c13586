#include "offload/swap_folder.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "offload/error.h"

namespace zinf::offload {
namespace {

std::string errno_text(int error) { return std::string(std::strerror(error)); }

std::string swap_root(const SwapFolder& folder) { return folder.nvme_path + "/zinf_swap"; }

// Creates `path` (a directory) unless it exists. Returns 0 or the errno of the failure.
int try_make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) {
    return 0;
  }
  const int error = errno;
  struct stat st {};
  if (error == EEXIST) {
    if (::stat(path.c_str(), &st) == 0) {
      return S_ISDIR(st.st_mode) ? 0 : EEXIST;
    }
    if (errno == ENOENT) {
      return ENOENT;  // another store removed it between the mkdir and the stat: again
    }
  }
  return error;
}

// One attempt at making the folders and locking the lock file in them. Returns false when a
// folder vanished meanwhile (ENOENT) and `may_retry`, or when the file we locked is no longer
// the one at lock_path; sets folder.lock_fd and returns true once the lock is ours.
bool try_lock(SwapFolder& folder, bool may_retry) {
  const std::string& lock_path = folder.lock_path;
  // The folders, then the lock file in them (which keeps rank<r>/ from being removed as
  // empty); a folder removed meanwhile by another store's exit shows as ENOENT: again.
  for (const std::string& dir : {swap_root(folder), folder.directory}) {
    const int error = try_make_directory(dir);
    if (error == ENOENT && may_retry) {
      break;
    }
    if (error != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "cannot create swap directory " + dir + ": " + errno_text(error));
    }
  }
  aio::UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) {
    const int error = errno;
    if (error == ENOENT && may_retry) {
      return false;
    }
    throw OffloadError(ErrorKind::kIo,
                       "cannot open swap lock file " + lock_path + ": " + errno_text(error));
  }
  int rc = 0;
  do {
    rc = ::flock(fd.get(), LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int error = errno;
    throw OffloadError(ErrorKind::kIo, "swap file " + folder.path +
                                           " is in use by another live process (lock " + lock_path +
                                           ": " + errno_text(error) +
                                           "); give each run its own nvme_path or rank");
  }
  // The lock is ours only if the file we locked is still the one at lock_path: its
  // previous owner unlinks it at exit, possibly between our open and our flock.
  struct stat locked {};
  struct stat current {};
  if (::fstat(fd.get(), &locked) != 0) {
    throw OffloadError(ErrorKind::kIo,
                       "fstat of swap lock file " + lock_path + " failed: " + errno_text(errno));
  }
  if (::stat(lock_path.c_str(), &current) == 0 && current.st_dev == locked.st_dev &&
      current.st_ino == locked.st_ino) {
    folder.lock_fd = std::move(fd);
    return true;
  }
  return false;
}

}  // namespace

void name_swap_folder(SwapFolder& folder, int rank, const std::string& name) {
  folder.directory = swap_root(folder) + "/rank" + std::to_string(rank);
  folder.path = folder.directory + "/" + name + ".swp";
  folder.lock_path = folder.directory + "/" + name + ".lock";
}

bool take_swap_folder(SwapFolder& folder) {
  const std::string& path = folder.path;
  int attempt = 1;
  while (!try_lock(folder, /*may_retry=*/attempt < kFolderRaceRetries)) {
    ++attempt;
  }
  bool replaced_stale = false;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    replaced_stale = true;
    spdlog::warn(
        "zinf offload: {} ({} bytes) is left over from a run that did not exit cleanly; "
        "replacing it",
        path, static_cast<uint64_t>(st.st_size));
    if (::unlink(path.c_str()) != 0) {
      throw OffloadError(ErrorKind::kIo,
                         "cannot remove stale swap file " + path + ": " + errno_text(errno));
    }
  }
  folder.file_fd =
      aio::UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!folder.file_fd) {
    throw OffloadError(ErrorKind::kIo,
                       "cannot create swap file " + path + ": " + errno_text(errno));
  }
  return replaced_stale;
}

void remove_swap_folder(SwapFolder& folder) noexcept {
  folder.file_fd.reset();
  if (folder.lock_fd) {
    ::unlink(folder.path.c_str());
    // Unlinked while still locked: a process that opened the old lock file meanwhile finds
    // it unlinked once it gets the lock, and retries (take_swap_folder).
    ::unlink(folder.lock_path.c_str());
    folder.lock_fd.reset();
  }
  // Removed only when empty: other stores (of this process or another) may live there. When
  // the lock is not ours (another live process holds it, or it was never taken), only folders
  // we made and left empty go.
  ::rmdir(folder.directory.c_str());
  ::rmdir(swap_root(folder).c_str());
}

}  // namespace zinf::offload
