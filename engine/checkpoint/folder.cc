// The folders of a checkpoint on disk (folder.h): the crash seam, the staging folder,
// publishing, `latest`, and the file names of a tag folder (engine/checkpoint.h).

#include "engine/checkpoint/folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/engine_error.h"
#include "serialization/atomic_file.h"

namespace zinf::engine {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;
namespace ser = zinf::serialization;

std::atomic<int64_t> g_crash_points{0};

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (const int rc = file_system().rename(from.string(), to.string()); rc != 0) {
    throw EngineError(fmt::format("checkpoint: rename {} -> {}: {}", from.string(), to.string(),
                                  std::strerror(-rc)));
  }
}

// Removes a replaced checkpoint folder: its checkpoint files, then the folder if nothing else
// is left in it. Returns what was left (files that appeared since the save checked).
std::vector<std::string> remove_checkpoint_folder(const fs::path& folder) {
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (ec) return {};
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && is_checkpoint_file(name)) {
      // A file that stays keeps the folder, which the next save removes as a leftover.
      (void)file_system().unlink(e.path().string());
    }
  }
  std::vector<std::string> left = foreign_checkpoint_entries(folder);
  if (left.empty()) (void)file_system().rmdir(folder.string());
  return left;
}

// The N of a "global_step<N>" tag, or -1.
int64_t tag_step(const std::string& tag) {
  static const std::regex kStep(R"(global_step(\d{1,18}))");
  std::smatch m;
  return std::regex_match(tag, m, kStep) ? std::stoll(m[1]) : -1;
}

}  // namespace

// Every change a save makes to the disk goes through the serialization layer's FileSystem
// (the system calls, or a test's power-loss fake).
ser::FileSystem& file_system() { return ser::default_file_system(); }

void crash_point() {
  static const long kill_at = [] {
    const char* v = std::getenv(kCheckpointKillAtVariable);
    return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
  }();
  const int64_t passed = ++g_crash_points;
  if (kill_at > 0 && passed == kill_at) {
    std::raise(SIGKILL);
  }
}

void fsync_dir(const fs::path& dir) {
  if (const int rc = ser::sync_directory(file_system(), dir.string()); rc != 0) {
    throw EngineError(fmt::format("checkpoint: fsync {}: {}", dir.string(), std::strerror(-rc)));
  }
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag.front() == '.' ||
      tag.find('/') != std::string::npos || tag.find('\0') != std::string::npos) {
    throw EngineError(fmt::format(
        "checkpoint tag \"{}\" is not a plain folder name (no '/', not starting with '.')", tag));
  }
}

std::string step_tag(int64_t step) { return fmt::format("global_step{}", step); }

fs::path staging_folder(const fs::path& root, const std::string& tag) {
  return root / ("." + tag + ".partial");
}

fs::path aside_folder(const fs::path& root, const std::string& tag) {
  return root / ("." + tag + ".old");
}

// An existing `target` is exchanged with `staging` atomically (renameat2 RENAME_EXCHANGE) and
// removed only afterwards; where the filesystem cannot exchange, it is moved aside to `aside`
// first. Of the replaced checkpoint, only the files a save writes are removed; a folder still
// holding anything else is kept.
std::string publish(const fs::path& root, const fs::path& staging, const fs::path& target,
                    const fs::path& aside) {
  fsync_dir(staging);
  crash_point();
  std::error_code ec;
  fs::path replaced;
  if (!fs::exists(target, ec)) {
    rename_or_throw(staging, target);
  } else if (const int rc = file_system().exchange(staging.string(), target.string()); rc == 0) {
    fsync_dir(root);
    crash_point();
    replaced = staging;  // the previous checkpoint of this tag
  } else if (rc == -EINVAL || rc == -ENOSYS || rc == -ENOTSUP) {
    (void)remove_checkpoint_folder(aside);
    rename_or_throw(target, aside);
    crash_point();
    rename_or_throw(staging, target);
    fsync_dir(root);
    replaced = aside;
  } else {
    throw EngineError(fmt::format("checkpoint: exchange {} and {}: {}", staging.string(),
                                  target.string(), std::strerror(-rc)));
  }
  std::string kept;
  if (!replaced.empty()) {
    const std::vector<std::string> left = remove_checkpoint_folder(replaced);
    if (!left.empty()) {
      // Out of the staging name, which the next save empties.
      fs::path keep = target.string() + ".kept";
      for (int i = 2; fs::exists(keep, ec); ++i)
        keep = fmt::format("{}.kept{}", target.string(), i);
      rename_or_throw(replaced, keep);
      kept = fmt::format(
          "checkpoint {}: the replaced checkpoint's folder is kept as {}: it "
          "holds {} that zinf did not write ({})",
          target.string(), keep.string(), left.size(), fmt::join(left, ", "));
    }
  }
  fsync_dir(root);
  crash_point();
  return kept;
}

// A `root` made just before, by this save or by whoever made it without syncing its parent
// (zinf train makes the --save folder at start-up), would otherwise vanish in a power loss with
// every checkpoint in it.
void make_staging(const fs::path& root, const fs::path& staging) {
  ser::FileSystem& files = file_system();
  std::string at;
  if (const int rc = ser::create_directories(files, root.string(), &at); rc != 0) {
    throw EngineError(fmt::format("checkpoint: cannot create {}: {}", at, std::strerror(-rc)));
  }
  std::error_code ec;
  fs::path absolute = fs::absolute(root, ec).lexically_normal();
  if (!absolute.has_filename()) absolute = absolute.parent_path();  // "dir/"
  const fs::path parent = absolute.parent_path();
  // A parent this process may not read cannot be opened to sync: it is left as it is.
  if (const int rc = ser::sync_directory(files, parent.string());
      rc != 0 && rc != -EACCES && rc != -EPERM) {
    throw EngineError(fmt::format("checkpoint: fsync {}: {}", parent.string(), std::strerror(-rc)));
  }
  if (const int rc = ser::remove_all(files, staging.string(), &at); rc != 0) {
    throw EngineError(fmt::format("checkpoint: cannot remove {} (left by an interrupted save): {}",
                                  at, std::strerror(-rc)));
  }
  if (const int rc = files.mkdir(staging.string(), 0777); rc != 0) {
    throw EngineError(
        fmt::format("checkpoint: cannot create {}: {}", staging.string(), std::strerror(-rc)));
  }
}

std::string read_latest(const fs::path& root) {
  const fs::path path = root / "latest";
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    throw EngineError(fmt::format("checkpoint: cannot read {}: {} (no checkpoint saved there?)",
                                  path.string(), std::strerror(errno)));
  }
  std::string tag(256, '\0');
  const size_t n = std::fread(tag.data(), 1, tag.size(), f);
  std::fclose(f);
  tag.resize(n);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == '\r' || tag.back() == ' ')) {
    tag.pop_back();
  }
  if (tag.empty()) {
    throw EngineError(fmt::format("checkpoint: {} is empty", path.string()));
  }
  return tag;
}

std::string latest_moves_back(const fs::path& root, const std::string& tag) {
  std::error_code ec;
  if (!fs::exists(root / "latest", ec)) return {};
  std::string previous;
  try {
    previous = read_latest(root);
  } catch (const EngineError&) {
    previous.clear();  // an unreadable latest is replaced as before
  }
  if (tag_step(previous) > tag_step(tag) && tag_step(tag) >= 0) {
    return fmt::format("checkpoint: {} moves back from {} to {} (this run saved an older step)",
                       (root / "latest").string(), previous, tag);
  }
  return {};
}

void write_latest(const fs::path& root, const std::string& tag) {
  serialization::AtomicFile latest((root / "latest").string());
  latest.append({reinterpret_cast<const uint8_t*>(tag.data()), tag.size()});
  latest.commit();
  crash_point();
}

}  // namespace checkpoint

// ---- engine/checkpoint.h: the files of a tag folder ---------------------------------------------

namespace fs = std::filesystem;

bool is_checkpoint_file(const std::string& name) {
  static const std::regex kNames(
      R"((mp_rank_\d+_model_states\.pt|zero_pp_rank_\d+_mp_rank_\d+_model_states\.pt|)"
      R"((bf16_)?zero_pp_rank_\d+_mp_rank_\d+_optim_states\.pt|pytorch_model\.bin))");
  return std::regex_match(name, kNames);
}

std::vector<std::string> foreign_checkpoint_entries(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  fs::directory_iterator it(folder, ec);
  if (ec) return out;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file(ec) || !is_checkpoint_file(name)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string model_states_file(int stage, int rank) {
  return stage == 3 ? fmt::format("zero_pp_rank_{}_mp_rank_00_model_states.pt", rank)
                    : std::string("mp_rank_00_model_states.pt");
}

std::string optim_states_file(int rank, bool bf16) {
  return fmt::format("{}zero_pp_rank_{}_mp_rank_00_optim_states.pt", bf16 ? "bf16_" : "", rank);
}

int64_t checkpoint_crash_points_passed() noexcept { return checkpoint::g_crash_points; }

}  // namespace zinf::engine
