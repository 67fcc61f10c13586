// A save prepared before the step it follows: PreparedSave (prepared_save.h), and
// Checkpointer::prepare, prepared_observer and prepared_step_done, which give it to the step.

#include "engine/checkpoint/prepared_save.h"

#include <fmt/format.h>

#include <cstdlib>
#include <span>
#include <stdexcept>

#include "engine/checkpoint.h"
#include "engine/checkpoint/checkpointer.h"
#include "engine/checkpoint/folder.h"
#include "serialization/file_system.h"
#include "serialization/serialization_error.h"
#include "serialization/zip_reader.h"

namespace zinf::engine::checkpoint {
namespace {

namespace fs = std::filesystem;
namespace ser = zinf::serialization;
using offload::OptimizerState;

// The test seam kCheckpointFailEarlyWriteVariable: the record to fail at (0: none).
long fail_early_write_at() {
  const char* v = std::getenv(kCheckpointFailEarlyWriteVariable);
  return v != nullptr ? std::strtol(v, nullptr, 10) : 0L;
}

}  // namespace

PreparedSave::PreparedSave(fs::path root_in, std::string tag_in, fs::path staging_in,
                           const std::string& name, std::vector<StateName> states_in, size_t units)
    : root(std::move(root_in)),
      tag(std::move(tag_in)),
      staging(std::move(staging_in)),
      file((staging / name).string()),
      states(std::move(states_in)),
      keys(partition_keys(units, states.size())),
      writer(std::make_unique<ser::TorchArchiveWriter>(file)),
      fail_at(fail_early_write_at()),
      thread([this] { run(); }) {}

PreparedSave::~PreparedSave() {
  stop();
  writer.reset();                    // removes its temporary file unless finished
  if (owns_staging && !published) {  // rank 0, and no save took it: leave no folder behind
    (void)ser::remove_all(file_system(), staging.string());  // the next save retries it
  }
}

void PreparedSave::updated(size_t sub_group, uint64_t numel, const OptimizerState* kinds,
                           const void* const* arrays, size_t count) noexcept {
  Job job{sub_group, numel, std::vector<const float*>(1 + states.size(), nullptr)};
  for (size_t k = 0; k < count; ++k) {
    if (kinds[k] == OptimizerState::kParams) job.arrays[0] = static_cast<const float*>(arrays[k]);
    for (size_t a = 0; a < states.size(); ++a) {
      if (kinds[k] == states[a].state) job.arrays[1 + a] = static_cast<const float*>(arrays[k]);
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  jobs.push_back(std::move(job));
  changed.notify_all();
}

void PreparedSave::release(size_t sub_group) noexcept {
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [&] { return jobs.empty() || jobs.front().sub_group > sub_group; });
}

void PreparedSave::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex);
    stopping = true;
    changed.notify_all();
  }
  if (thread.joinable()) thread.join();
}

bool PreparedSave::failed() {
  std::lock_guard<std::mutex> lock(mutex);
  return !error.empty();
}

std::string PreparedSave::unusable(const fs::path& root_in, const std::string& tag_in,
                                   int64_t applied_steps, size_t sub_groups) {
  if (root_in != root || tag_in != tag) {
    return fmt::format("it was prepared for {}", (root / tag).string());
  }
  std::lock_guard<std::mutex> lock(mutex);
  if (!error.empty()) return "writing it during the step failed: " + error;
  if (!step_applied) return "no optimizer step ran after it was prepared";
  if (step_count != applied_steps) return "another optimizer step ran after it";
  if (written != sub_groups) {
    return fmt::format("the step wrote {} of {} sub-groups", written, sub_groups);
  }
  return {};
}

uint64_t PreparedSave::write(const Job& job) {
  uint64_t done = 0;
  for (size_t a = 0; a < job.arrays.size(); ++a) {
    if (job.arrays[a] == nullptr) {
      throw std::logic_error(fmt::format("sub-group {} was shown without its {}", job.sub_group,
                                         a == 0 ? "params" : states[a - 1].name));
    }
    const std::span<const uint8_t> data(reinterpret_cast<const uint8_t*>(job.arrays[a]),
                                        static_cast<size_t>(job.numel * sizeof(float)));
    if (fail_at > 0 && ++records_seen == fail_at) {
      throw ser::SerializationError(
          file, ser::kNoOffset,
          std::string("write failed: injected by ") + kCheckpointFailEarlyWriteVariable);
    }
    const uint32_t crc = ser::crc32_update(0, data);
    writer->begin_storage(keys[a][job.sub_group], data.size(), 4096);
    writer->write_stable(data, crc);
    done += data.size();
    crash_point();
  }
  writer->sync();  // the writes no longer read the step's buffers
  return done;
}

void PreparedSave::run() noexcept {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(lock, [&] { return !jobs.empty() || stopping; });
      if (jobs.empty()) return;
      job = jobs.front();  // stays queued (unreleased) until written
    }
    std::string failure;
    uint64_t done = 0;
    if (error_seen.load(std::memory_order_relaxed) == false) {
      try {
        done = write(job);
      } catch (const std::exception& e) {
        failure = e.what();
        error_seen.store(true, std::memory_order_relaxed);
        // The file is of no use now; dropping it waits for a write that may still read the
        // step's buffers, before they are released.
        writer.reset();
      }
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (!failure.empty() && error.empty()) error = failure;
    if (failure.empty() && error.empty()) {
      ++written;
      bytes += done;
    }
    jobs.pop_front();
    changed.notify_all();
  }
}

// ---- Checkpointer: preparing a save -----------------------------------------------------------

bool Checkpointer::prepare(const std::string& dir, const std::string& tag_in) {
  prepared_.reset();  // an earlier one that no save took
  const PartitionView view(e_.model, e_.optimizer.state_arrays());
  if (e_.model.stage() != 3 || view.swapper.config().device != offload::OffloadDevice::kNvme) {
    return false;
  }
  const std::string tag = tag_in.empty() ? step_tag(e_.counters.global_steps + 1) : tag_in;
  check_tag(tag);
  const fs::path root(dir);
  const fs::path staging = staging_folder(root, tag);
  if (e_.comm.rank() == 0) make_staging(root, staging);
  e_.comm.barrier()->wait();
  const bool bf16 = e_.options.zero.precision == zero::Precision::kBFloat16;
  prepared_ = std::make_unique<PreparedSave>(
      root, tag, staging, optim_states_file(e_.comm.rank(), bf16), view.states, view.units.size());
  prepared_->owns_staging = e_.comm.rank() == 0;
  if (view.units.size() != view.layout.sub_groups().size()) {
    prepared_.reset();
    throw std::logic_error("prepare_checkpoint: stage 3 units are not the sub-groups");
  }
  return true;
}

offload::StepObserver* Checkpointer::prepared_observer() noexcept {
  if (!prepared_ || prepared_->observed) return nullptr;
  prepared_->observed = true;
  return prepared_.get();
}

bool Checkpointer::save_prepared() const noexcept { return prepared_ && !prepared_->observed; }

void Checkpointer::prepared_step_done(bool applied) noexcept {
  if (!prepared_) return;
  prepared_->step_applied = applied;
  prepared_->step_count = e_.counters.applied_steps;
}

}  // namespace zinf::engine::checkpoint
