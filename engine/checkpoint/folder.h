// The folders of a checkpoint on disk: tag names, the staging folder `<dir>/.<tag>.partial` a
// save writes into, publishing it in place of `<dir>/<tag>`, the `latest` file, and the crash
// seam (kCheckpointKillAtVariable). engine/checkpoint.h describes the crash-safety protocol
// these steps make up; the file names inside a tag folder (model_states_file, ...) are
// declared there and defined in folder.cc.
//
// Every change these functions make to the disk goes through serialization's FileSystem
// (file_system() below), so a test's power-loss fake sees all of them. Errors: EngineError
// naming the path and the errno text.
//
// Thread safety: crash_point() may be called from any thread; the rest from the save's or
// load's thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "serialization/file_system.h"

namespace zinf::engine::checkpoint {

// The FileSystem every change of a save goes through (the system calls, or a test's fake).
[[nodiscard]] serialization::FileSystem& file_system();

// One crash point of a save passed: counted, and the process is killed with SIGKILL when it
// is the k-th and kCheckpointKillAtVariable holds k.
void crash_point();

// fsync of a folder; throws EngineError naming it.
void fsync_dir(const std::filesystem::path& dir);

// Throws EngineError unless `tag` is a plain folder name (no '/', not starting with '.').
void check_tag(const std::string& tag);
// The default tag of a save after `step` optimizer steps: "global_step<step>".
[[nodiscard]] std::string step_tag(int64_t step);
// `<root>/.<tag>.partial`: where a save of `tag` writes its files before it publishes them.
[[nodiscard]] std::filesystem::path staging_folder(const std::filesystem::path& root,
                                                   const std::string& tag);
// `<root>/.<tag>.old`: where a replaced `<root>/<tag>` waits when the filesystem cannot
// exchange two folders (a load falls back to it when a crash left `<root>/<tag>` missing).
[[nodiscard]] std::filesystem::path aside_folder(const std::filesystem::path& root,
                                                 const std::string& tag);

// Rank 0: an empty `staging` folder under `root` (what an interrupted save left is removed).
// `root` is made where missing, and its parent synced.
void make_staging(const std::filesystem::path& root, const std::filesystem::path& staging);

// Puts the complete `staging` folder at `target` (atomically exchanged with an existing one,
// or through `aside` where the filesystem cannot exchange) and removes the checkpoint files of
// the replaced one. Returns a line for the log when the replaced folder held files zinf did
// not write and is kept (as `<target>.kept`), else "".
[[nodiscard]] std::string publish(const std::filesystem::path& root,
                                  const std::filesystem::path& staging,
                                  const std::filesystem::path& target,
                                  const std::filesystem::path& aside);

// The tag `<root>/latest` names; throws EngineError when it is missing or empty.
[[nodiscard]] std::string read_latest(const std::filesystem::path& root);
// A line for the log when pointing `<root>/latest` at `tag` moves it back to an older
// global_step, else "".
[[nodiscard]] std::string latest_moves_back(const std::filesystem::path& root,
                                            const std::string& tag);
// Replaces `<root>/latest` atomically with `tag`, then passes a crash point.
void write_latest(const std::filesystem::path& root, const std::string& tag);

}  // namespace zinf::engine::checkpoint
