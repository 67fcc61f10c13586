// Checkpointer::save: one save, in its steps — agree on the prepared save across ranks,
// refuse a tag folder holding entries zinf did not write, make the staging folder, write the
// model states, the optimizer states and the 16-bit weights into it, publish it and point
// `latest` at it (engine/checkpoint.h: the files and the crash-safety protocol).
//
// Collectives, in this order on every rank: host_all_reduce (prepared save usable; world > 1),
// host_all_reduce (foreign entries; world > 1), barrier, gather_master (16-bit weights at
// stage 3), host_all_reduce (bytes; world > 1), barrier, barrier.

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <vector>

#include "engine/checkpoint/checkpointer.h"
#include "engine/checkpoint/deepspeed_layout.h"
#include "engine/checkpoint/file_builder.h"
#include "engine/checkpoint/folder.h"
#include "engine/checkpoint/partition_stream.h"
#include "engine/checkpoint/prepared_save.h"
#include "serialization/torch_archive.h"
#include "zero/comm/torch_dtype.h"
#include "zero/host_collectives.h"

namespace zinf::engine::checkpoint {

namespace fs = std::filesystem;
namespace ser = zinf::serialization;
using ser::PickleValue;
using Clock = std::chrono::steady_clock;

// One save in progress: its folders, the run as its files record it, and the prepared save it
// took (nullptr when it streams the partition).
class Checkpointer::Save {
 public:
  // Takes the prepared save (every save consumes it, whatever happens to the save) after
  // flushing the last step's writes: a failure in them fails this save before anything is
  // written, rather than a later step.
  Save(Checkpointer& c, const std::string& dir, std::string tag)
      : c_(c),
        e_(c.e_),
        tag_(std::move(tag)),
        root_(dir),
        target_(root_ / tag_),
        staging_(staging_folder(root_, tag_)),
        run_(e_),
        record_{e_.options,
                e_.scaler,
                run_.view,
                e_.model.params(),
                e_.module,
                zero::detail::scalar_type(e_.model.compute_dtype()),
                e_.device,
                run_.stage,
                run_.rank,
                run_.world,
                e_.last_step.lr > 0 ? e_.last_step.lr : e_.options.optimizer.lr,
                e_.counters.global_steps,
                e_.counters.global_samples,
                e_.counters.skipped_steps,
                e_.counters.applied_steps} {
    e_.model.flush_io();
    prepared_ = std::move(c.prepared_);
  }

  // Every rank's prepared save must be usable, or every rank streams.
  void agree_on_prepared();
  // A tag folder holding files a save does not write is not replaced (zinf never deletes a
  // file it did not write): every rank fails before anything is written.
  void refuse_foreign_entries();
  // Rank 0 makes the staging folder (a prepared save made it already); all meet.
  void open_staging();
  void write_model_states(const ClientState& client_state);
  void write_optimizer_states();
  void write_16bit_weights();
  // Once every rank's files are complete and durable: rank 0 publishes the folder and points
  // `latest` at it. Returns the bytes of all ranks' files.
  uint64_t publish_all();

  [[nodiscard]] const fs::path& target() const noexcept { return target_; }
  // Bytes of the partition the prepared save's step wrote (0 when streamed).
  [[nodiscard]] uint64_t step_written() const noexcept { return step_written_; }

 private:
  // The partition's arrays into `writer`, sub-group by sub-group, under keys_.
  void stream_partition(ser::TorchArchiveWriter& writer);

  Checkpointer& c_;
  const EngineParts& e_;
  const std::string tag_;
  const fs::path root_;
  const fs::path target_;
  const fs::path staging_;
  const Run run_;
  const SavedRun record_;
  PartitionKeys keys_;  // of the file holding the partition, once its pickle is built
  std::unique_ptr<PreparedSave> prepared_;
  uint64_t step_written_ = 0;
  // Declared before every writer: a writer's destructor waits for its last write, which may
  // still read these buffers when an error unwinds the save.
  AlignedFloats buffers_[2];
  std::vector<std::string> written_;  // file names in staging_
};

void Checkpointer::Save::agree_on_prepared() {
  std::string why = "not prepared";
  if (prepared_) {
    why = prepared_->unusable(root_, tag_, e_.counters.applied_steps,
                              run_.view.layout.sub_groups().size());
    prepared_->stop();
    if (!why.empty()) {
      const std::string line =
          fmt::format("checkpoint {}: streaming the optimizer states: {}", tag_, why);
      if (prepared_->failed()) {
        spdlog::warn("zinf: rank {}: {}", run_.rank, line);  // every rank's, log or not
      } else {
        c_.log(line);
      }
    }
  }
  int64_t unusable = why.empty() ? 0 : 1;
  if (run_.world > 1) {
    zero::host_all_reduce(e_.comm, e_.accelerator, &unusable, 1, zero::DType::kInt64,
                          zero::ReduceOp::kSum);
  }
  if (unusable != 0) {
    prepared_.reset();  // rank 0 removes its folder
  } else {
    step_written_ = prepared_->bytes;
  }
}

void Checkpointer::Save::refuse_foreign_entries() {
  std::vector<std::string> foreign;
  if (run_.rank == 0) foreign = foreign_checkpoint_entries(target_);
  int64_t refused = foreign.empty() ? 0 : 1;
  if (run_.world > 1) {
    zero::host_all_reduce(e_.comm, e_.accelerator, &refused, 1, zero::DType::kInt64,
                          zero::ReduceOp::kMax);
  }
  if (refused != 0) {
    throw EngineError(
        run_.rank == 0 ? fmt::format("checkpoint {}: not replaced: it holds {} that zinf did not "
                                     "write ({}); move {} away or save under another tag",
                                     target_.string(), foreign.size() == 1 ? "an entry" : "entries",
                                     fmt::join(foreign, ", "), foreign.size() == 1 ? "it" : "them")
                       : fmt::format("checkpoint {}: not replaced (rank 0 found files zinf did not "
                                     "write in it)",
                                     target_.string()));
  }
}

void Checkpointer::Save::open_staging() {
  if (run_.rank == 0 && !prepared_) make_staging(root_, staging_);
  e_.comm.barrier()->wait();
}

void Checkpointer::Save::stream_partition(ser::TorchArchiveWriter& writer) {
  const PartitionView& v = run_.view;
  stream_out(v.swapper, offload::OptimizerState::kParams, v.layout, v.units, keys_[0], writer,
             buffers_);
  for (size_t a = 0; a < v.states.size(); ++a) {
    stream_out(v.swapper, v.states[a].state, v.layout, v.units, keys_[1 + a], writer, buffers_);
  }
}

// Stage 3: every rank's own file; below it rank 0's alone (stage 0 with the partition).
void Checkpointer::Save::write_model_states(const ClientState& client_state) {
  if (run_.stage != 3 && run_.rank != 0) return;
  const std::string name = model_states_file(run_.stage, run_.rank);
  FileBuilder b((staging_ / name).string());
  PickleValue* root = model_states_dict(b, record_, client_state, &keys_);
  ser::TorchArchiveWriter writer((staging_ / name).string());
  b.write_head(writer, root);
  if (run_.stage == 0) stream_partition(writer);
  writer.finish();
  crash_point();
  written_.push_back(name);
}

// Stages 1-3: every rank's partition. A prepared save's file holds the records already: the
// pickle, which names them, is added to it.
void Checkpointer::Save::write_optimizer_states() {
  if (run_.stage < 1) return;
  const std::string name = optim_states_file(run_.rank, run_.bf16);
  FileBuilder b((staging_ / name).string());
  PickleValue* root = optim_states_dict(b, record_, &keys_);
  if (prepared_) {
    if (keys_ != prepared_->keys) {
      throw std::logic_error("checkpoint: the prepared records' keys differ from the pickle's");
    }
    b.write_head(*prepared_->writer, root);
    prepared_->writer->finish();
  } else {
    ser::TorchArchiveWriter writer((staging_ / name).string());
    b.write_head(writer, root);
    stream_partition(writer);
    writer.finish();
  }
  crash_point();
  written_.push_back(name);
}

// pytorch_model.bin, when the config asks for it: the whole model's compute-precision weights
// (stage 3: gathered from every rank's fp32 master partition), written by rank 0.
void Checkpointer::Save::write_16bit_weights() {
  if (!e_.options.gather_16bit_weights_on_model_save) return;
  std::vector<at::Tensor> master;
  if (run_.stage == 3) master = e_.model.gather_master();  // collective
  if (run_.rank != 0) return;
  const std::string name = "pytorch_model.bin";
  FileBuilder b((staging_ / name).string());
  PickleValue* sd = b.dict(true);
  const auto& params = record_.params;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    PickleValue* t = b.tensor(run_.stage == 3 && p.trainable ? master[i].to(record_.dtype)
                                                             : p.var.detach().to(at::kCPU));
    b.put(sd, p.name, t);
    for (const std::string& alias : p.aliases) b.put(sd, alias, t);
  }
  for (const auto& item : e_.module.named_buffers())
    b.put(sd, item.key(), b.tensor(item.value().to(at::kCPU)));
  ser::TorchArchiveWriter writer((staging_ / name).string());
  b.write_head(writer, sd);
  writer.finish();
  crash_point();
  written_.push_back(name);
}

uint64_t Checkpointer::Save::publish_all() {
  int64_t bytes = 0;
  for (const std::string& name : written_) {
    bytes += static_cast<int64_t>(fs::file_size(staging_ / name));
  }
  if (run_.world > 1) {
    zero::host_all_reduce(e_.comm, e_.accelerator, &bytes, 1, zero::DType::kInt64,
                          zero::ReduceOp::kSum);
  }
  e_.comm.barrier()->wait();  // every rank's files are complete and durable

  if (prepared_) prepared_->published = true;  // the folder is published next, not removed
  if (run_.rank == 0) {
    const std::string kept = publish(root_, staging_, target_, aside_folder(root_, tag_));
    if (!kept.empty()) c_.log(kept);
    if (const std::string back = latest_moves_back(root_, tag_); !back.empty()) c_.log(back);
    write_latest(root_, tag_);
  }
  e_.comm.barrier()->wait();
  return static_cast<uint64_t>(bytes);
}

CheckpointReport Checkpointer::save(const std::string& dir, const std::string& tag_in,
                                    const ClientState& client_state) {
  check_client_keys(client_state);
  const Clock::time_point start = Clock::now();
  const std::string tag = tag_in.empty() ? step_tag(e_.counters.global_steps) : tag_in;
  check_tag(tag);
  Save save(*this, dir, tag);
  save.agree_on_prepared();
  save.refuse_foreign_entries();
  save.open_staging();
  save.write_model_states(client_state);
  save.write_optimizer_states();
  save.write_16bit_weights();
  const uint64_t bytes = save.publish_all();

  CheckpointReport report;
  report.path = save.target().string();
  report.tag = tag;
  report.bytes = bytes;
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  report.client_state = client_state;
  report.step_written_bytes = save.step_written();
  return report;
}

}  // namespace zinf::engine::checkpoint
