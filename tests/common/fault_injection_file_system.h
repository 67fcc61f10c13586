// FaultInjectionFileSystem: a serialization::FileSystem for tests that makes every call on the
// real file system and keeps what a power loss would take back; drop_unsynced() takes it
// back. After LevelDB's FaultInjectionTestEnv (util/fault_injection_test.cc), with renames,
// exchanges and removals undone too.
//
// The model (what ext4 and XFS promise; POSIX promises less):
//  - A file's bytes survive once the file is fsynced. Per file the fake keeps its size at the
//    last fsync and the synced bytes overwritten or cut off since; a power loss puts those
//    bytes back and truncates the file to that size. A file the fake first sees already
//    existing counts as synced whole.
//  - A directory entry — a file or folder created, renamed, exchanged or removed in it —
//    survives once that directory is fsynced. Per directory the fake keeps the changes since
//    its last fsync; a power loss undoes them, newest first: a created entry vanishes (a
//    folder with everything in it, synced or not), a renamed one goes back and the file it
//    replaced comes back, a removed one comes back. A removed file waits in the graveyard
//    folder until its removal is durable. Folders are told apart by identity, not name: a
//    folder removed and made again under its name is another folder.
//  - A loss takes back everything unsynced at once: the worst case for a writer relying on
//    fsync, though not every state a crash can leave (a real one may keep part of it).
//
// kill_at(k) picks the moment: the k-th call from then on is when the power fails; that call
// and every later one fail with -EIO and change nothing (close() still releases the
// descriptor). The test then calls drop_unsynced(), which brings the fake back to life.
//
// fsync() records what became durable without syncing the real file (nothing here needs the
// disk to keep it). Limits: a rename between two directories fails with -EXDEV (no writer makes
// one; its durability needs both directories' fsyncs, which the model would have to split). Hard
// and symbolic links are not modelled. Reads go to the real files, as file_system.h says.
//
// Errors: calls return -errno as the real ones do; drop_unsynced() throws std::runtime_error
// naming the path when the real file system refuses to undo something.
//
// Thread safety: every method may be called from any thread; one mutex serializes them (the
// real calls are made under it).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "serialization/file_system.h"

namespace zinf::testing {

class FaultInjectionFileSystem final : public serialization::FileSystem {
 public:
  // `graveyard`: a folder (made when missing) on the same filesystem as the files written
  // through this one, and outside them.
  explicit FaultInjectionFileSystem(std::string graveyard, serialization::FileSystem& target =
                                                               serialization::posix_file_system());
  ~FaultInjectionFileSystem() override = default;
  FaultInjectionFileSystem(const FaultInjectionFileSystem&) = delete;
  FaultInjectionFileSystem& operator=(const FaultInjectionFileSystem&) = delete;

  int open(const std::string& path, int flags, mode_t mode) override;
  int64_t pwrite(int fd, const void* bytes, size_t length, uint64_t offset) override;
  int ftruncate(int fd, uint64_t size_bytes) override;
  int fsync(int fd) override;
  int close(int fd) override;
  int rename(const std::string& from, const std::string& to) override;
  int exchange(const std::string& a, const std::string& b) override;
  int mkdir(const std::string& path, mode_t mode) override;
  int unlink(const std::string& path) override;
  int rmdir(const std::string& path) override;

  // The power fails at the k-th call from now on (1: the next one); k <= 0: never.
  void kill_at(int64_t k);
  // Calls so far (every method above but close(), the one that failed included).
  [[nodiscard]] int64_t calls() const;
  // Whether the power has failed (kill_at's call came).
  [[nodiscard]] bool dead() const;
  // When exchange() should fail as a filesystem without RENAME_EXCHANGE does (-EINVAL).
  void refuse_exchange(bool refuse);

  // What a power loss took back.
  struct Loss {
    int64_t entries = 0;  // directory changes undone
    int64_t bytes = 0;    // file bytes cut off or put back
  };
  // Simulates the power loss now (see the header comment). Afterwards what is on disk counts
  // as durable, and the fake is alive with no kill pending.
  Loss drop_unsynced();

 private:
  struct Saved {
    uint64_t offset;
    std::vector<uint8_t> bytes;
  };
  struct FileState {
    uint64_t synced_size = 0;
    std::vector<Saved> overwritten;  // synced bytes changed since the last fsync, oldest first
  };
  struct Change {
    enum class Kind { kCreate, kMkdir, kRename, kExchange, kUnlink, kRmdir } kind;
    uint64_t dir = 0;     // the folder whose entry changed
    std::string name;     // the entry (kRename: the new name; kExchange: one of the two)
    std::string other;    // kRename: the old name; kExchange: the other entry
    std::string grave;    // kUnlink, kRename over a file: where the removed file waits
    uint64_t folder = 0;  // kMkdir, kRmdir, kRename over an empty folder: that folder's id
  };

  // Counts a call; false when the power has failed (now or before).
  bool begin_call();
  // Absolute and normalized, without a trailing slash: the key of the maps below.
  static std::string key(const std::string& path);
  // The id of the folder at `path` (a new one for a folder not seen before).
  uint64_t dir_id(const std::string& path);
  // The current path of folder `id`; empty when it is gone.
  std::string dir_path(uint64_t id) const;
  // The state of the file at `path` (synced whole when first seen).
  FileState& file_state(const std::string& path);
  // Keeps the synced bytes of `path` in [from, to) before they change.
  void save_synced(const std::string& path, FileState& state, uint64_t from, uint64_t to);
  // `from` (and everything under it) is now at `to`: files_, fds_ and dirs_ follow.
  void moved(const std::string& from, const std::string& to);
  // Forgets everything at or under `path` (gone for good).
  void forget(const std::string& path);
  std::string new_grave();
  void undo(const Change& change, Loss& loss);

  const std::string graveyard_;
  serialization::FileSystem& target_;

  mutable std::mutex mutex_;
  int64_t calls_ = 0;                       // guarded by mutex_
  int64_t kill_at_ = 0;                     // guarded by mutex_; the call that fails first, or 0
  bool dead_ = false;                       // guarded by mutex_
  bool refuse_exchange_ = false;            // guarded by mutex_
  std::map<std::string, FileState> files_;  // guarded by mutex_; by current path
  std::map<int, std::string> fds_;          // guarded by mutex_; open descriptors' paths
  std::map<std::string, uint64_t> dirs_;    // guarded by mutex_; live folders seen: path -> id
  uint64_t next_dir_ = 1;                   // guarded by mutex_
  uint64_t next_grave_ = 0;                 // guarded by mutex_
  std::vector<Change> changes_;             // guarded by mutex_; not yet durable, oldest first
};

// Makes `fs` the default file system (serialization::set_default_file_system) for its
// lifetime, and puts the previous one back.
class ScopedDefaultFileSystem {
 public:
  explicit ScopedDefaultFileSystem(serialization::FileSystem* fs)
      : previous_(serialization::set_default_file_system(fs)) {}
  ~ScopedDefaultFileSystem() { serialization::set_default_file_system(previous_); }
  ScopedDefaultFileSystem(const ScopedDefaultFileSystem&) = delete;
  ScopedDefaultFileSystem& operator=(const ScopedDefaultFileSystem&) = delete;

 private:
  serialization::FileSystem* const previous_;
};

}  // namespace zinf::testing
