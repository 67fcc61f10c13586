// Checkpoints of an Engine in DeepSpeed's layout (../shared/reference/checkpoint-format.md):
// Engine::save_checkpoint / prepare_checkpoint / load_checkpoint (engine/checkpoint.cc) check
// the step boundary and call the engine's checkpoint::Checkpointer (engine/checkpoint/
// checkpointer.h, which maps the files that hold the save, the load and their pieces); this
// header holds what they exchange with the caller and the file names they use.
//
//   <dir>/latest                         the tag of the newest complete checkpoint (no newline)
//   <dir>/<tag>/mp_rank_00_model_states.pt                          stage 0-2 (rank 0 writes)
//   <dir>/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt         stage 3 (every rank)
//   <dir>/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt  stage 1-3 (every rank)
//   <dir>/<tag>/pytorch_model.bin        the 16-bit weights, when the config's
//                                        stage3_gather_16bit_weights_on_model_save is set
//
// Partitions. Stage 3 writes DeepSpeed's `fp32_flat_groups`: one fp32 tensor per sub-group of
// the rank's flat partition, padding included, with the Adam moments of the same sub-group
// in the torch optimizer state (state[i] for sub-group i). Stages 1 and 2 write one param
// group per trainable parameter: group g of rank r is r's slice of parameter g (zinf's
// partition layout, zero/partition.h) with the padding sliced off the view (the storage
// keeps it), so DeepSpeed's consolidation rule — concatenate the ranks' group g, walk
// param_shapes[g] — gives the parameter back, and no rank needs another rank's elements.
// Stage 0 keeps the same dict as stages 1/2 under the model-states file's `optimizer` key
// (every rank holds everything; rank 0 writes). States on NVMe are streamed sub-group by
// sub-group, in both directions; nothing holds a whole partition in memory. A save prepared
// before its step (Engine::prepare_checkpoint) has that step write the optimizer file's
// partition records as it updates the sub-groups, in sub-group order; the save adds the
// pickle. Loads check every partition record's CRC-32.
//
// Loading finds each trainable parameter's slice by its name in param_shapes, so a checkpoint
// whose parameters are in another order (zinf's Llama before it took transformers' order) or
// whose stage-3 sub-groups are cut elsewhere (another sub_group_size) loads all the same. A
// stage-3 checkpoint DeepSpeed wrote loads too: it has no `zinf` record, so the stage comes
// from its optimizer file's ZeroStageEnum, the optimizer from ds_config, the applied steps
// are global_steps - skipped_steps, and the RNG is left as it is (DeepSpeed saves none).
// DeepSpeed's stages 0-2 cut partitions from the flattened groups, not per parameter: refused.
//
// Crash safety: a save writes into `<dir>/.<tag>.partial` (every file written under a
// temporary name, fsynced and renamed by serialization's AtomicFile), the ranks meet at a
// barrier, then rank 0 fsyncs the folder, puts it in place of `<dir>/<tag>` (an atomic
// exchange when one exists, so an older checkpoint of that tag survives until the new one
// is complete), fsyncs `<dir>` and at last replaces `latest` atomically. A save killed at any
// point leaves `latest` naming a complete checkpoint. So does a power loss, which takes back
// what was not fsynced: every change a save makes to the disk goes through
// serialization::FileSystem (serialization/file_system.h; tests put a power-loss fake
// there), and `<dir>`'s parent is fsynced too, so a `<dir>` made by the save, or just before
// it, survives with the checkpoint once the save returned.
//
// Errors: EngineError for a checkpoint that does not fit the run (world size, stage, params
// and shapes, optimizer), naming the file and what differs; serialization::SerializationError
// (naming the file) for a file that is malformed or truncated.
//
// Thread safety: save and load are collective calls of the Engine's driving thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace zinf::engine {

namespace checkpoint {
class Checkpointer;  // engine/checkpoint/checkpointer.h
}  // namespace checkpoint

// Caller values saved in the model-states file beside DeepSpeed's keys (DeepSpeed's
// client_state), and given back by load_checkpoint.
using ClientValue = std::variant<int64_t, double, std::string>;
using ClientState = std::map<std::string, ClientValue>;

struct CheckpointReport {
  std::string path;  // <dir>/<tag>
  std::string tag;
  uint64_t bytes = 0;        // all ranks' files together
  double seconds = 0.0;      // wall time of the call on this rank
  ClientState client_state;  // load: what the checkpoint carried
  // save: bytes of this rank's partition that the step before the save wrote into the
  // checkpoint (Engine::prepare_checkpoint), not counted in `seconds`; 0 when streamed.
  uint64_t step_written_bytes = 0;
  [[nodiscard]] double gb_per_second() const noexcept {
    return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0;
  }
};

// File names inside a tag folder.
[[nodiscard]] std::string model_states_file(int stage, int rank);
[[nodiscard]] std::string optim_states_file(int rank, bool bf16);
// Whether `name` is one of the files a save writes into a tag folder (the two above, for any
// rank and precision, and pytorch_model.bin). A save replaces an existing tag folder only
// when it holds nothing else, and a replaced folder loses only these files.
[[nodiscard]] bool is_checkpoint_file(const std::string& name);
// The entries of `folder` that are not checkpoint files (sorted; empty when it is missing).
[[nodiscard]] std::vector<std::string> foreign_checkpoint_entries(const std::string& folder);

// Test seam: when this variable holds k > 0, the k-th crash point a save passes (after each
// storage record, each finished file, each rename, and `latest`) kills the process with
// SIGKILL, so tests can end a save at a chosen point.
inline constexpr const char* kCheckpointKillAtVariable = "ZINF_TEST_CHECKPOINT_KILL_AT";
// Test seam: when this variable holds k > 0, the k-th record a step writes for a prepared
// save (Engine::prepare_checkpoint) fails as an I/O error would.
inline constexpr const char* kCheckpointFailEarlyWriteVariable =
    "ZINF_TEST_CHECKPOINT_FAIL_EARLY_WRITE";
// Crash points passed by saves in this process so far.
[[nodiscard]] int64_t checkpoint_crash_points_passed() noexcept;

}  // namespace zinf::engine
