// The `--save` folder of `zinf train`, checked at start-up, before any training, so that a
// run never learns at its first save (minutes or hours in) that it cannot write there, and
// never writes over checkpoints that belong to another run.
//
// The rules (README, "Checkpoints"):
// - The folder is created if missing (each new level made durable: its parent fsynced) and
//   must accept a new file: a probe file is created, written, fsynced and removed.
// - A folder that already holds checkpoints (a `latest` file, or a sub-folder holding a
//   `*model_states.pt`) is written to only by a run that resumes from it (`--load` names the
//   same folder) or when the user says so (`--overwrite`). Otherwise the run is refused
//   before it starts, naming the folder, its latest checkpoint and the ways forward.
//
// Errors: std::invalid_argument (a usage error: exit code 2) with one line naming the folder
// and the reason. LibTorch-free. Thread safety: none needed (start-up only; reads and
// writes only the folder given).
#pragma once

#include <string>
#include <vector>

namespace zinf::tools {

struct SaveFolderState {
  bool created = false;            // the folder did not exist and was made
  std::string latest;              // the tag in its `latest` file ("" if none)
  std::vector<std::string> tags;   // sub-folders holding checkpoints, sorted
  bool resumes_from_it = false;    // --load names this folder
  bool overwrite_allowed = false;  // --overwrite was given
};

// Checks (and creates) `save`; `load` is the run's --load folder ("" if none) and
// `overwrite` its --overwrite flag. Returns what was found; throws std::invalid_argument
// when the folder cannot be created or written, or holds another run's checkpoints without
// --overwrite.
SaveFolderState check_save_folder(const std::string& save, const std::string& load, bool overwrite);

// The checkpoint tags in `folder`: its sub-folders that hold a `*model_states.pt` file
// (hidden ones, such as a save's staging folder, left out), sorted. Empty when the folder is
// missing or unreadable.
[[nodiscard]] std::vector<std::string> checkpoint_tags(const std::string& folder);

}  // namespace zinf::tools
