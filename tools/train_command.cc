// `zinf train` and `zinf estimate`: option parsing only; tools/train.cc and tools/estimate.cc
// do the work.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>

#include "tools/estimate.h"
#include "tools/train.h"
#include "tools/train_commands.h"

namespace zinf::tools {

void add_train_commands(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand(
      "train",
      "Train the reference Llama model from a DeepSpeed config (bare: stage 3, params and "
      "optimizer on NVMe in a temporary folder, the default corpus)");
  cmd->add_option("--config", args->config,
                  "DeepSpeed JSON config (default: the embedded bare config)");
  cmd->add_option("--model", args->model,
                  fmt::format("Model size: {} (default {})", model_names(), kBareModel));
  cmd->add_option("--steps", args->steps,
                  fmt::format("Optimizer steps (default {})", kDefaultSteps));
  cmd->add_option("--data", args->data,
                  "Text file (bytes are tokens) or .u16/.u32 token file (default: the fortunes "
                  "corpus)");
  cmd->add_option("--seq-len", args->seq_len,
                  fmt::format("Tokens per sample (default {})", kBareSeqLen));
  cmd->add_option("--micro-batch", args->micro_batch,
                  "Samples per rank per micro-batch (train_micro_batch_size_per_gpu)");
  cmd->add_option("--grad-accum", args->grad_accum,
                  "Micro-batches per optimizer step (gradient_accumulation_steps)");
  cmd->add_option("--lr", args->lr, "Peak learning rate (the optimizer's lr)");
  cmd->add_option("--seed", args->seed, "Seed of the initial weights and the data order")
      ->capture_default_str();
  cmd->add_option("--nvme-path", args->nvme_path,
                  "Swap folder: replaces the config's nvme_path (zinf.nvme_paths); a bare run "
                  "makes its temporary folder here (default $TMPDIR or /var/tmp)");
  cmd->add_option("--plot", args->plot, "PNG of the loss curve (\"\" for none)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads,
                  "Compute threads per rank (default: zinf.threads, else OMP_NUM_THREADS, else "
                  "cores / ranks on this node)");
  cmd->add_option("--memory-budget", args->memory_budget,
                  "The accelerator's memory budget, e.g. 512MiB or 2GB: replaces the config's "
                  "zinf.accelerator.memory_budget (a bare run's default is 1/4 of the model "
                  "states, raised to what one decoder layer needs)");
  cmd->add_option("--init-from", args->init_from,
                  "Hugging Face Llama folder (config.json + model.safetensors or shards with "
                  "model.safetensors.index.json): the model's shape and initial weights")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--save", args->save,
                  "Save checkpoints (DeepSpeed's layout) in this folder: every --save-interval "
                  "steps, at the end and at Ctrl-C");
  cmd->add_option("--save-interval", args->save_interval,
                  "Steps between checkpoints (default 0: only at the end)");
  cmd->add_option("--load", args->load,
                  "Resume from this checkpoint folder's latest (or --tag): weights, optimizer, "
                  "step count, LR schedule and data position");
  cmd->add_option("--tag", args->tag, "The checkpoint --load reads (default: its latest)");
  cmd->add_flag("--overwrite", args->overwrite,
                "Let --save write into a folder holding another run's checkpoints (without "
                "it, only a run that --load's from that folder may); they are replaced tag by "
                "tag, files zinf did not write are never touched");
  cmd->add_option("--eval-data", args->eval_data,
                  "Held-out data (a file as --data takes): its loss and perplexity before "
                  "training, every --eval-interval steps and at the end, in the log, "
                  "csv_monitor (Train_Samples_eval_loss.csv), the plot and the summary");
  cmd->add_option("--eval-interval", args->eval_interval,
                  "Steps between evaluations (default: a tenth of --steps)");
  cmd->add_option("--eval-batches", args->eval_batches,
                  "Micro-batches per rank in one evaluation, in file order (fewer when the "
                  "file holds fewer)")
      ->capture_default_str();
  cmd->callback([args, &exit_code] { exit_code = run_train(*args); });

  auto eargs = std::make_shared<EstimateArgs>();
  auto* est = app.add_subcommand(
      "estimate",
      "Print the memory plan of a config and model without running, and the model-state bytes "
      "per offload choice (zinf's plan and DeepSpeed's estimate_zero3 formula)");
  est->add_option("--config", eargs->config, "DeepSpeed JSON config (default: the bare one)");
  auto* size =
      est->add_option("--model-size", eargs->model_size,
                      "Named size (tiny ... 13b) or a parameter count such as 7e9 or 1.3B");
  auto* folder = est->add_option("--init-from", eargs->init_from,
                                 "A Hugging Face model folder: the exact model its config.json "
                                 "describes (no weights are read)");
  size->excludes(folder);
  est->callback([eargs, &exit_code, size, folder] {
    if (size->count() == 0 && folder->count() == 0) {
      fmt::print(stderr, "zinf estimate: give --model-size or --init-from\n");
      exit_code = 2;
      return;
    }
    exit_code = run_estimate(*eargs);
  });
  est->add_option("--vocab", eargs->vocab_size, "Vocabulary size")->capture_default_str();
  est->add_option("--num-gpus", eargs->gpus_per_node, "GPUs (ranks) per node")
      ->capture_default_str();
  est->add_option("--num-nodes", eargs->nodes, "Nodes")->capture_default_str();
  est->add_option("--seq-len", eargs->seq_len, "Tokens per sample (activations)")
      ->capture_default_str();
  est->add_option("--micro-batch", eargs->micro_batch,
                  "Samples per micro-batch (default: the config's, else 1)");
}

}  // namespace zinf::tools
