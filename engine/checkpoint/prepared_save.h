// PreparedSave: the optimizer-states file of a save that the optimizer step before it writes
// (Engine::prepare_checkpoint, Checkpointer::prepare). The OptimizerSwapper shows it each
// sub-group's updated arrays (offload::StepObserver); a thread of its own takes their CRC-32
// and writes them as the sub-group's records (params, then the states), straight from the
// swapper's buffers (AtomicFile writes 4 KiB-aligned records in place), and tells the swapper
// when a sub-group's buffers are free again. The save then adds the pickle and finishes the
// file (save.cc). An error stops the writing and is kept for the save, which then streams
// instead.
//
// Thread safety: updated() and release() are called on the step's thread while the writing
// thread runs; the rest (and the public fields) belong to the engine's driving thread, which
// reads `bytes` and uses `writer` only after stop().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint/partition_stream.h"
#include "offload/optimizer_swapper.h"
#include "serialization/torch_archive.h"

namespace zinf::engine::checkpoint {

class PreparedSave final : public offload::StepObserver {
 public:
  // Starts the file `<staging>/<name>` (a temporary until finished) and the writing thread.
  // `units`: the stage-3 sub-groups the step will show.
  PreparedSave(std::filesystem::path root_in, std::string tag_in, std::filesystem::path staging_in,
               const std::string& name, std::vector<StateName> states_in, size_t units);
  // Stops the thread and drops the file unless a save finished it; rank 0 removes the staging
  // folder unless a save published it.
  ~PreparedSave() override;

  PreparedSave(const PreparedSave&) = delete;
  PreparedSave& operator=(const PreparedSave&) = delete;

  void updated(size_t sub_group, uint64_t numel, const offload::OptimizerState* kinds,
               const void* const* arrays, size_t count) noexcept override;
  void release(size_t sub_group) noexcept override;

  // Ends the writing thread (after the jobs queued so far).
  void stop() noexcept;
  // Whether an early write failed.
  [[nodiscard]] bool failed();
  // Why the save of `tag_in` under `root_in` cannot use this file, for the log ("" when it
  // can): another folder or tag, a failed write, no step or another step since, or a step
  // that did not write every one of the `sub_groups`.
  [[nodiscard]] std::string unusable(const std::filesystem::path& root_in,
                                     const std::string& tag_in, int64_t applied_steps,
                                     size_t sub_groups);

  const std::filesystem::path root;
  const std::string tag;
  const std::filesystem::path staging;
  const std::string file;
  const std::vector<StateName> states;
  const std::vector<std::vector<std::string>> keys;  // [array][unit], as the pickle names them
  std::unique_ptr<serialization::TorchArchiveWriter> writer;
  bool owns_staging = false;  // rank 0 made the staging folder
  bool published = false;     // a save finished the file: the folder is the checkpoint's
  bool observed = false;      // shown to a step (at most one)
  bool step_applied = false;  // that step ran (not skipped)
  int64_t step_count = 0;     // the engine's applied steps after it
  uint64_t bytes = 0;         // record bytes written

 private:
  struct Job {
    size_t sub_group;
    uint64_t numel;
    std::vector<const float*> arrays;  // params, then states; unchanged until released
  };

  void run() noexcept;
  // Writes one sub-group's records; returns their bytes.
  uint64_t write(const Job& job);

  // The test seam: the record to fail at (0: none), and the records begun so far.
  const long fail_at;
  long records_seen = 0;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> jobs;  // shown, not yet written; the front is being written
  size_t written = 0;    // sub-groups whose records are complete
  std::string error;
  std::atomic<bool> error_seen{false};
  bool stopping = false;
  std::thread thread;  // last: starts once the rest exists
};

}  // namespace zinf::engine::checkpoint
