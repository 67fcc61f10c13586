// SwapFolder: one folder of NvmeStore's swap files on disk, `<nvme_path>/zinf_swap/rank<r>/`,
// holding the swap file `<name>.swp` and its lock file `<name>.lock`.
//
// take_swap_folder() makes the folders, flock()s the lock file (so two live runs never share
// a swap file) and creates the swap file empty; a swap file whose lock nobody held is left
// over from a crashed run and is replaced (one warning). remove_swap_folder() undoes it at a
// clean exit: the swap file and the lock go, and rank<r>/ and zinf_swap/ too when empty
// (other stores, of this process or another, may still live there).
//
// Races between processes: a store's last step at exit removes the empty folders, so another
// store may find a folder gone between its mkdir and the next step inside it (ENOENT), or lock
// a lock file its previous owner has just unlinked. take_swap_folder() then starts over, up to
// kFolderRaceRetries times.
//
// Thread safety: a SwapFolder is used by one thread at a time (NvmeStore's constructor and
// destructor); any number of processes and stores may take and remove folders under the same
// nvme_path concurrently.
#pragma once

#include <string>

#include "aio/file_cache.h"

namespace zinf::offload {

struct SwapFolder {
  std::string nvme_path;  // the configured folder
  std::string directory;  // <nvme_path>/zinf_swap/rank<r>
  std::string path;       // the swap file: <directory>/<name>.swp
  std::string lock_path;  // <directory>/<name>.lock
  aio::UniqueFd lock_fd;  // flock()ed from take_swap_folder() to remove_swap_folder()
  aio::UniqueFd file_fd;  // the swap file, open read-write (for fallocate)
};

// How many times take_swap_folder() starts over when a folder vanishes under it (ENOENT).
inline constexpr int kFolderRaceRetries = 1000;

// Sets directory, path and lock_path from folder.nvme_path, `rank` and the file stem `name`.
// Touches nothing on disk.
void name_swap_folder(SwapFolder& folder, int rank, const std::string& name);

// Makes zinf_swap/ and rank<r>/ under folder.nvme_path, takes the lock (lock_fd) and creates
// the swap file empty (file_fd). Returns true when a stale swap file was found and replaced
// (one warning names it and its size). Throws OffloadError(kIo) when a folder, the lock file
// or the swap file cannot be made, a stale one cannot be removed, or another live process
// holds the lock. After a throw lock_fd is set only when the lock had been taken (the swap
// file could not be replaced or created), so remove_swap_folder() removes only what is ours.
[[nodiscard]] bool take_swap_folder(SwapFolder& folder);

// Closes file_fd. When the lock is ours (lock_fd set), removes the swap file and the lock file
// and releases the lock; either way rmdir()s rank<r>/ and zinf_swap/, which succeeds only when
// they are empty. Failures are ignored: there is nothing left to do about them.
void remove_swap_folder(SwapFolder& folder) noexcept;

}  // namespace zinf::offload
