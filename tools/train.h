// `zinf train`: trains the reference Llama model (engine/model/llama.h) with the Engine from a
// DeepSpeed JSON config, on a text or pre-tokenized corpus (engine/data), with a progress bar
// on a terminal (plain lines elsewhere), csv_monitor files when the config asks for them, an
// end-of-run summary (model size, tokens/s, per-tier planned and measured peaks, the loss
// curve against the corpus's unigram entropy, the held-out loss with --eval-data) and a PNG of
// the loss curve (and the held-out loss).
//
// Run bare (no --config) it uses an embedded default (default_train_config()): stage 3 with
// params and optimizer on NVMe in a temporary folder, fp32, the CPU accelerator with a budget
// of 1/4 of the model states, the default corpus (engine/data's default_corpus()).
//
// Ctrl-C (SIGINT) or SIGTERM stops at the next step boundary: the run ends as if --steps had
// been reached there (summary, plot), the swap files are removed, the step is named, and the
// exit code is 128 + the signal. A second Ctrl-C ends the process at once, except under a launcher
// (torchrun forwards the terminal's Ctrl-C, so each rank sees it twice).
//
// Thread safety: run_train owns the process's SIGINT/SIGTERM handlers while it runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zinf::tools {

struct TrainArgs {
  std::string config;                        // DeepSpeed JSON; empty: the embedded default
  std::string model;                         // named size; empty: kBareModel
  std::optional<int64_t> steps;              // optimizer steps; unset: kDefaultSteps
  std::string data;                          // a file (see open_data); empty: default corpus
  std::optional<int64_t> seq_len;            // tokens per sample; unset: kBareSeqLen
  std::optional<int64_t> micro_batch;        // train_micro_batch_size_per_gpu override
  std::optional<int64_t> grad_accum;         // gradient_accumulation_steps override
  std::optional<double> lr;                  // optimizer lr override
  uint64_t seed = 1234;                      // initial weights and data order
  std::string nvme_path;                     // swap folder (replaces the config's)
  std::string plot = "zinf-train-loss.png";  // the loss curve PNG; "" to skip
  std::optional<int> threads;                // compute threads per rank
  std::string memory_budget;  // zinf.accelerator.memory_budget ("2GiB"); "": config's
  std::string init_from;      // Hugging Face Llama folder: model and weights
  // Checkpoints (engine/checkpoint.h). --steps counts from the start of training, so a run
  // resumed at step k with --steps n trains n - k more.
  std::string save;           // save every save_interval steps and at the end; "": none
  int64_t save_interval = 0;  // 0: only at the end (and at Ctrl-C)
  std::string load;           // resume from this folder's `latest` (or `tag`)
  std::string tag;            // the checkpoint --load reads
  bool overwrite = false;     // --save may replace another run's checkpoints (tag by tag)
  // Held-out evaluation: the mean loss (and perplexity) of the first eval_batches
  // micro-batches of eval_data, in file order, computed by the same partitioned model without
  // gradients, before training, every eval_interval steps and at the end. Empty: none.
  std::string eval_data;
  std::optional<int64_t> eval_interval;  // unset: about a tenth of the run (steps / 10, >= 1)
  int64_t eval_batches = 8;              // per rank, each of micro-batch samples
};

inline constexpr const char* kBareModel = "small";
// The largest vocabulary a named model (--model) takes from its data: 2^18 ids, past every
// open model's tokenizer. A token file with a larger id (a corrupt one, or one made for
// another model) is refused naming the id's offset, before any model is planned.
inline constexpr uint32_t kMaxNamedVocab = 262144;

// The named model sizes `--model` takes ("tiny, small, ..."), for the help text.
[[nodiscard]] std::string model_names();
inline constexpr int64_t kDefaultSteps = 60;
// The batch a config leaves wholly to the command line (every batch size "auto", no
// --micro-batch / --grad-accum) gets, as the bare config does: 2 samples per micro-batch, 8
// micro-batches per step.
inline constexpr int64_t kDefaultMicroBatch = 2;
inline constexpr int64_t kDefaultGradAccum = 8;
inline constexpr int64_t kBareSeqLen = 64;

// Runs the training; returns the process exit code: 0, 1 on an error (printed to stderr), 2
// for bad arguments, 128 + signal when interrupted.
int run_train(const TrainArgs& args);

// The embedded default config of a bare run (JSON text): `memory_budget_bytes` is the CPU
// accelerator's budget, `buffer_numel` offload_param.buffer_size (the model's largest
// parameter), `live_numel` stage3_max_live_parameters (one decoder layer), `steps` sizes the
// warm-up. The swap folder is given separately (zinf.nvme_paths) by the caller.
[[nodiscard]] std::string default_train_config(uint64_t memory_budget_bytes, uint64_t buffer_numel,
                                               uint64_t live_numel, int64_t steps);

}  // namespace zinf::tools
