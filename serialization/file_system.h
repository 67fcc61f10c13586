// FileSystem: the system calls with which zinf makes files durable — creating and writing a
// file, fsync, renames, directories — as one abstract class, so that a test can put a fake
// under the checkpoint writers and simulate a power loss (tests/common/fault_injection_file_
// system.h, after LevelDB's FaultInjectionTestEnv). Every write of a checkpoint goes through
// it: AtomicFile (and so the zip, torch-archive and safetensors writers) and the engine's
// staging folder, renames, `latest` and removals (engine/checkpoint/folder.cc).
//
// Only what changes the disk is here. Reads (mmap, stat, directory listings) go to the
// system directly: a process reads the page cache, which holds what it wrote whether or not
// it was synced; a fake simulates the loss by changing the files, so later reads see it.
//
// posix_file_system() forwards each call to the system call of the same name (one virtual
// call per system call; writes are of 4 KiB to 16 MiB). default_file_system() is what the
// writers use: the Posix one unless a test installed another with set_default_file_system().
// AtomicFile takes it once, at construction, and uses it for the whole file.
//
// Errors: every call returns its result (>= 0) or -errno, as liburing does; none throws or
// leaves its error in errno. EINTR is retried inside (but not for close(), which Linux
// completes anyway). Callers add the context (path, offset) when they report it.
//
// Thread safety: every method may be called from several threads at once. set_default_file_
// system() is atomic, but a test installs its fake before a save starts and removes it after
// the save returned, so that one save's files all see the same file system.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace zinf::serialization {

class FileSystem {
 public:
  FileSystem() = default;
  virtual ~FileSystem() = default;
  FileSystem(const FileSystem&) = delete;
  FileSystem& operator=(const FileSystem&) = delete;

  // open(2). Returns a descriptor, or -errno. A directory opened (O_RDONLY | O_DIRECTORY)
  // for fsync() is opened here too. The caller closes the descriptor with close() below.
  virtual int open(const std::string& path, int flags, mode_t mode) = 0;
  // pwrite(2), once: the bytes written (fewer than `length` on a short write; callers
  // continue), or -errno. O_DIRECT descriptors need aligned memory, length and offset.
  virtual int64_t pwrite(int fd, const void* bytes, size_t length, uint64_t offset) = 0;
  // ftruncate(2): 0 or -errno.
  virtual int ftruncate(int fd, uint64_t size_bytes) = 0;
  // fsync(2) of a file or a directory: on 0, the file's bytes and size (a directory's
  // entries: the names created, renamed and removed in it) survive a power loss.
  virtual int fsync(int fd) = 0;
  // close(2): 0 or -errno; the descriptor is released either way.
  virtual int close(int fd) = 0;
  // rename(2): `to` is replaced atomically. Durable once the directory is fsynced.
  virtual int rename(const std::string& from, const std::string& to) = 0;
  // renameat2(2) with RENAME_EXCHANGE: `a` and `b`, both existing, trade places atomically.
  // -EINVAL, -ENOSYS or -EOPNOTSUPP where the filesystem or kernel cannot exchange.
  virtual int exchange(const std::string& a, const std::string& b) = 0;
  // mkdir(2), unlink(2), rmdir(2): 0 or -errno; durable once the parent is fsynced.
  virtual int mkdir(const std::string& path, mode_t mode) = 0;
  virtual int unlink(const std::string& path) = 0;
  virtual int rmdir(const std::string& path) = 0;
};

// The file system of the system calls themselves (a process-wide object, never destroyed).
[[nodiscard]] FileSystem& posix_file_system() noexcept;
// What the writers use: posix_file_system() unless a test installed another.
[[nodiscard]] FileSystem& default_file_system() noexcept;
// For tests: makes `fs` (nullptr: the Posix one) what default_file_system() returns and
// returns the previous one. The caller keeps `fs` alive until it is replaced.
FileSystem* set_default_file_system(FileSystem* fs) noexcept;

// ---- helpers built on the calls above --------------------------------------------------------

// Opens the directory, fsyncs it and closes it: its entries become durable. 0 or -errno.
[[nodiscard]] int sync_directory(FileSystem& fs, const std::string& path);
// mkdir -p: creates what is missing of `path` and fsyncs the parent of every folder it
// created, so the whole path survives a power loss. 0 (also when all of it
// existed) or -errno; `failed` (when given) gets the path the error concerns.
[[nodiscard]] int create_directories(FileSystem& fs, const std::string& path,
                                     std::string* failed = nullptr);
// rm -r: removes `path` and what is under it (symbolic links are removed, not followed).
// 0 when nothing is left (also when nothing was there) or the first -errno, with `failed`
// (when given) naming the entry. Nothing is fsynced: the caller syncs the parent if the
// removal must survive a power loss.
[[nodiscard]] int remove_all(FileSystem& fs, const std::string& path,
                             std::string* failed = nullptr);

}  // namespace zinf::serialization
