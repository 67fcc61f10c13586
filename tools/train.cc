#include "tools/train.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <string>
#include <string_view>
#include <thread>

#include "engine/checkpoint.h"
#include "engine/config/resolve.h"
#include "engine/csv_monitor.h"
#include "engine/data/data.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model/hf_checkpoint.h"
#include "engine/model/llama.h"
#include "offload/cuda_accelerator.h"
#include "offload/error.h"
#include "tools/byte_size.h"
#include "tools/interrupt.h"
#include "tools/loss_plot.h"
#include "tools/progress.h"
#include "tools/save_folder.h"
#include "tools/train_config.h"
#include "zero/host_collectives.h"

namespace zinf::tools {
namespace {

// Allocations the device's runtime has made so far: on CUDA the cudaMalloc calls (allocate()
// reuses a freed buffer of the same size without one); elsewhere every allocate().
uint64_t runtime_allocations(offload::Accelerator& accelerator) {
  if (const auto* cuda = dynamic_cast<const offload::CudaAccelerator*>(&accelerator)) {
    return cuda->runtime_allocations();
  }
  return accelerator.memory_stats().allocations;
}

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A swap folder made for this run and removed, with everything in it, at the end.
class TempFolder {
 public:
  explicit TempFolder(const std::string& parent) {
    std::string pattern = (fs::path(parent) / "zinf-train-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error(
          fmt::format("cannot create a swap folder in {}: {}", parent, std::strerror(errno)));
    }
    path_ = pattern;
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// /var/tmp is disk-backed by convention, unlike a tmpfs /tmp: swap belongs on a disk.
std::string default_swap_parent() {
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') return t;
  return "/var/tmp";
}

// Compute threads per rank and where the number came from.
std::pair<int, std::string> compute_threads(const TrainArgs& args, const config::RunConfig& c,
                                            const zero::LaunchEnv& launch) {
  if (args.threads) {
    if (*args.threads < 1) {
      throw std::invalid_argument(fmt::format("--threads {} must be >= 1", *args.threads));
    }
    return {*args.threads, "--threads"};
  }
  if (c.zinf.threads > 0) return {c.zinf.threads, "zinf.threads"};
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp != nullptr && *omp != '\0') {
    return {at::get_num_threads(),
            fmt::format("OMP_NUM_THREADS={}{}; --threads N to change", omp,
                        launch.launcher == "torchrun" ? ", set by torchrun" : "")};
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int local = std::max(1, launch.local_world_size);
  return {std::max(1, cores / local),
          fmt::format("{} cores / {} rank(s) on this node", cores, local)};
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  to = std::min(to, v.size());
  if (from >= to) return 0.0;
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from),
                         v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

volatile std::sig_atomic_t g_launcher_signal = 0;

extern "C" void record_launcher_signal(int signal_number) { g_launcher_signal = signal_number; }

// Under a launcher a Ctrl-C reaches each rank twice: from the terminal (the whole process
// group) and again from the launcher, which forwards it (and kills the workers itself if
// they do not end). InterruptScope's second-signal-kills rule would end a rank between step
// boundaries, leaving its swap folder and failing its peers; while this lives, every SIGINT
// and SIGTERM only records itself.
class LauncherSignals {
 public:
  LauncherSignals() {
    struct sigaction action {};
    action.sa_handler = record_launcher_signal;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGINT, &action, &old_int_) != 0 ||
        sigaction(SIGTERM, &action, &old_term_) != 0) {
      throw std::runtime_error(fmt::format("sigaction: {}", std::strerror(errno)));
    }
  }
  ~LauncherSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  LauncherSignals(const LauncherSignals&) = delete;
  LauncherSignals& operator=(const LauncherSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

int stop_signal() noexcept {
  const int sig = interrupt_signal();
  return sig != 0 ? sig : static_cast<int>(g_launcher_signal);
}

// The second SIGINT / SIGTERM (not under a launcher, where each Ctrl-C arrives twice): the
// step in progress is abandoned at the next micro-batch boundary. Every rank agrees.
bool agreed_abandon(engine::Engine& eng) {
  int64_t abandon = interrupt_count() >= 2 ? 1 : 0;
  if (eng.world_size() > 1) {
    zero::host_all_reduce(eng.comm(), eng.accelerator(), &abandon, 1, zero::DType::kInt64,
                          zero::ReduceOp::kMax);
  }
  return abandon != 0;
}

// Says at once what a SIGINT / SIGTERM will do, from a thread of its own (the training thread
// may be inside a long micro-batch): the first finishes the step and saves, the second
// abandons the step, the third ends the process.
class SignalWatcher {
 public:
  SignalWatcher(Progress& progress, std::string save, bool launcher)
      : progress_(progress),
        save_(std::move(save)),
        launcher_(launcher),
        thread_([this] { run(); }) {}
  ~SignalWatcher() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  void run() {
    int seen = 0;
    std::unique_lock lock(mutex_);
    while (!stop_) {
      wake_.wait_for(lock, std::chrono::milliseconds(100));
      const int count = launcher_ ? (g_launcher_signal != 0 ? 1 : 0) : interrupt_count();
      const int sig = stop_signal();
      if (count <= seen || sig == 0) continue;
      seen = count;
      const std::string name = signal_name(sig);
      if (count == 1) {
        progress_.print(fmt::format(
            "{} received at {}: finishing this step, {}then stopping (swap files removed){}", name,
            progress_.position(),
            save_.empty() ? std::string() : fmt::format("saving a checkpoint in {}, ", save_),
            launcher_ ? std::string()
                      : fmt::format("; {} again abandons the step at its next micro-batch",
                                    name == "SIGINT" ? std::string("Ctrl-C") : name)));
      } else if (count == 2) {
        progress_.print(fmt::format(
            "{} again at {}: abandoning this step at its next micro-batch (its gradients are "
            "dropped), {}; a third ends the process at once, leaving the swap files",
            name, progress_.position(),
            save_.empty() ? std::string("then stopping")
                          : fmt::format("then saving the last finished step in {}", save_)));
      }
    }
  }

  Progress& progress_;
  const std::string save_;
  const bool launcher_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mutex_
  std::thread thread_;
};

// Every rank stops at the same step: the largest signal any rank saw wins.
int agreed_signal(engine::Engine& eng) {
  int64_t sig = stop_signal();
  if (eng.world_size() > 1) {
    zero::host_all_reduce(eng.comm(), eng.accelerator(), &sig, 1, zero::DType::kInt64,
                          zero::ReduceOp::kMax);
  }
  return static_cast<int>(sig);
}

}  // namespace

std::string default_train_config(uint64_t memory_budget_bytes, uint64_t buffer_numel,
                                 uint64_t live_numel, int64_t steps) {
  // A cosine schedule after a short warm-up; DeepSpeed warms up for at least 2 steps, and the
  // cosine phase needs one more, so a run of 1 or 2 steps keeps a warm-up only.
  const std::string scheduler =
      steps >= 3 ? fmt::format(R"({{"type": "WarmupCosineLR",
                 "params": {{"warmup_num_steps": {}, "total_num_steps": "auto",
                             "cos_min_ratio": 0.1}}}})",
                               std::min<int64_t>(10, steps - 1))
                 : std::string(R"({"type": "WarmupLR", "params": {"warmup_num_steps": 2,
                 "warmup_max_lr": 3e-3, "warmup_type": "linear"}})");
  // Params and optimizer states on NVMe (max_in_cpu 0: no parameter slice stays in memory),
  // `live_numel` elements gathered at once, bucket sizes following the hidden size ("auto"),
  // the CPU accelerator under `memory_budget_bytes`.
  return fmt::format(R"({{
  "train_micro_batch_size_per_gpu": {},
  "gradient_accumulation_steps": {},
  "optimizer": {{"type": "AdamW",
                 "params": {{"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8,
                             "weight_decay": 0.0}}}},
  "scheduler": {},
  "gradient_clipping": 1.0,
  "zero_optimization": {{
    "stage": 3,
    "offload_param": {{"device": "nvme", "buffer_count": 4, "buffer_size": {},
                       "max_in_cpu": 0}},
    "offload_optimizer": {{"device": "nvme", "buffer_count": 4}},
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": {}
  }},
  "steps_per_print": 10,
  "zinf": {{"accelerator": {{"type": "cpu", "memory_budget": {}}}}}
}})",
                     kDefaultMicroBatch, kDefaultGradAccum, scheduler, buffer_numel, live_numel,
                     memory_budget_bytes);
}

std::string model_names() { return engine::named_llama_list(); }

int run_train(const TrainArgs& args) {
  // The first signal finishes the step, the second abandons it, the third kills.
  InterruptScope interrupt_scope(3);
  const bool bare = args.config.empty();
  int rank = 0;
  try {
    const zero::LaunchEnv launch = zero::detect_launch_env();
    rank = launch.rank;
    const bool lead = rank == 0;
    std::optional<LauncherSignals> launcher_signals;
    if (launch.launcher != "none") {
      g_launcher_signal = 0;
      launcher_signals.emplace();
    }
    auto say = [&](const std::string& line) {
      if (lead) {
        fmt::print("{}\n", line);
        std::fflush(stdout);  // in order with stderr and the engine's lines when piped
      }
    };

    // ---- the --save folder: writable, and no other run's checkpoints replaced ----------------
    std::optional<SaveFolderState> save_folder;
    if (!args.save.empty()) {
      save_folder = check_save_folder(args.save, args.load, args.overwrite);
    } else if (args.overwrite) {
      throw std::invalid_argument("--overwrite is for --save; no --save folder was given");
    }

    // ---- the --plot path: a run does not learn at its end that the PNG cannot be written ----
    if (!args.plot.empty()) {
      if (const std::string why = plot_path_problem(args.plot); !why.empty()) {
        throw std::invalid_argument(fmt::format("--plot {}: {}", args.plot, why));
      }
    }

    // ---- data: its vocabulary sizes the model -----------------------------------------------
    const int64_t seq_len = args.seq_len.value_or(kBareSeqLen);
    if (seq_len < 1) throw std::invalid_argument(fmt::format("--seq-len {} must be >= 1", seq_len));
    // --init-from: the Hugging Face folder gives the model's shape and its initial weights.
    std::optional<engine::HfCheckpoint> hf;
    if (!args.init_from.empty()) {
      if (!args.model.empty()) {
        throw std::invalid_argument(
            "--model and --init-from both choose the model: the "
            "folder's config.json describes it; leave --model out");
      }
      hf.emplace(engine::HfCheckpoint::open(args.init_from));
    }
    // Token ids are checked against the model's vocabulary as the file is opened (the first
    // id past it is named with its offset); a named model takes its vocabulary from the data,
    // up to kMaxNamedVocab.
    std::string corpus_note;
    std::unique_ptr<data::TokenSource> source;
    if (args.data.empty()) {
      source = data::default_corpus(&corpus_note);
    } else {
      const auto limit = static_cast<uint32_t>(hf ? hf->config().vocab_size : kMaxNamedVocab);
      try {
        source = data::open_data(args.data, hf ? limit : 0, hf ? 0 : limit);
      } catch (const data::DataError& e) {
        throw data::DataError(
            hf ? fmt::format("{} ({}'s vocab_size)", e.what(), args.init_from)
               : fmt::format("{}: the named models (--model) take their vocabulary from the "
                             "data, up to {} ids; for a larger one, --init-from a model whose "
                             "vocab_size covers the data",
                             e.what(), kMaxNamedVocab));
      }
    }

    // What made the tokens (scripts/tokenize-text.py's sidecar), when the file has one.
    const std::optional<data::TokenSidecar> sidecar =
        args.data.empty() ? std::nullopt : data::read_token_sidecar(args.data, *source);

    std::optional<engine::LlamaConfig> model;
    if (hf) {
      model = hf->config();
      if (sidecar && sidecar->vocab_size > static_cast<uint64_t>(model->vocab_size)) {
        throw std::invalid_argument(fmt::format(
            "--data {} was tokenized with a vocabulary of {} ids ({}), more than {}'s "
            "vocab_size {}: the model has no embedding for the ids past it",
            args.data, sidecar->vocab_size, sidecar->path, args.init_from, model->vocab_size));
      }
      if (source->vocab_size() > static_cast<uint64_t>(model->vocab_size)) {
        throw std::invalid_argument(
            fmt::format("the data's token ids go up to {} but {}'s vocab_size is {}",
                        source->vocab_size() - 1, args.init_from, model->vocab_size));
      }
      if (seq_len > model->max_seq_len) {
        throw std::invalid_argument(
            fmt::format("--seq-len {} is longer than {}'s max_position_embeddings {}", seq_len,
                        args.init_from, model->max_seq_len));
      }
    } else {
      const std::string model_name = args.model.empty() ? kBareModel : args.model;
      // The tokenizer's whole vocabulary when a sidecar gives it (ids the data happens not to
      // use still get embeddings), else the data's largest id + 1.
      const uint64_t vocab =
          std::max<uint64_t>(source->vocab_size(), sidecar ? sidecar->vocab_size : 0);
      if (vocab > kMaxNamedVocab) {
        throw std::invalid_argument(fmt::format(
            "--data {} was tokenized with a vocabulary of {} ids ({}), more than the {} a named "
            "model (--model) takes; --init-from a model whose vocab_size covers it",
            args.data, vocab, sidecar->path, kMaxNamedVocab));
      }
      model = engine::named_llama(model_name, static_cast<int64_t>(vocab));
      if (!model) {
        throw std::invalid_argument(
            fmt::format("--model \"{}\" is not one of {}", model_name, engine::named_llama_list()));
      }
      model->max_seq_len = std::max(model->max_seq_len, seq_len);
    }
    // Held-out data: the same kinds of file, its ids checked against the model's vocabulary.
    std::unique_ptr<data::TokenSource> eval_source;
    std::string eval_tokenizer_note;
    if (!args.eval_data.empty()) {
      // The same kind of ids as the training data (checked first: ids of another kind would
      // fail the vocabulary check with a message that hides why).
      const bool train_tokens = !args.data.empty() && data::is_token_file(args.data);
      if (data::is_token_file(args.eval_data) != train_tokens) {
        throw std::invalid_argument(fmt::format(
            "--eval-data {} is {} but the training data{} is {}: the held-out loss would "
            "measure ids that mean other tokens",
            args.eval_data,
            data::is_token_file(args.eval_data) ? "a token file" : "byte-level text",
            args.data.empty() ? std::string(" (the default corpus)") : " " + args.data,
            train_tokens ? "a token file" : "byte-level text"));
      }
      const auto vocab = static_cast<uint32_t>(model->vocab_size);
      try {
        eval_source = data::open_data(args.eval_data, 0, vocab);
      } catch (const data::DataError& e) {
        // An id past the vocabulary: say where the vocabulary came from.
        const bool bad_id = std::string_view(e.what()).find("token id") != std::string_view::npos;
        throw data::DataError(fmt::format(
            "--eval-data: {}{}", e.what(),
            !bad_id   ? std::string()
            : hf      ? fmt::format(" (the vocab_size of {})", args.init_from)
            : sidecar ? fmt::format(" (the model's vocab_size, from {})", sidecar->path)
                      : std::string(" (the model's vocab_size, from the training data)")));
      }
      // Its sidecar is checked as --data's is.
      if (const auto eval_sidecar = data::read_token_sidecar(args.eval_data, *eval_source)) {
        if (eval_sidecar->vocab_size > static_cast<uint64_t>(model->vocab_size)) {
          throw std::invalid_argument(fmt::format(
              "--eval-data {} was tokenized with a vocabulary of {} ids ({}), more than the "
              "model's vocab_size {}",
              args.eval_data, eval_sidecar->vocab_size, eval_sidecar->path, model->vocab_size));
        }
        // Compared with the training data's tokenizer, else with --init-from's own.
        const std::string other = sidecar ? sidecar->tokenizer_sha256
                                  : hf    ? data::tokenizer_fingerprint(args.init_from)
                                          : std::string();
        const std::string other_name =
            sidecar ? "--data " + args.data : "the tokenizer of " + args.init_from;
        if (!other.empty() && !eval_sidecar->tokenizer_sha256.empty() &&
            eval_sidecar->tokenizer_sha256 != other) {
          eval_tokenizer_note = fmt::format(
              "warning: --eval-data {} was made by another tokenizer than {} (sha256 {:.12} "
              "and {:.12}): the held-out loss measures ids that mean other tokens",
              args.eval_data, other_name, eval_sidecar->tokenizer_sha256, other);
        }
      }
      if (args.eval_batches < 1) {
        throw std::invalid_argument(
            fmt::format("--eval-batches {} must be >= 1", args.eval_batches));
      }
      if (args.eval_interval && *args.eval_interval < 1) {
        throw std::invalid_argument(
            fmt::format("--eval-interval {} must be >= 1", *args.eval_interval));
      }
    } else if (args.eval_interval) {
      throw std::invalid_argument(
          "--eval-interval without --eval-data: there is nothing to evaluate");
    }
    const auto params = static_cast<uint64_t>(model->parameter_count());
    const uint64_t states = params * kStateBytesPerParam;
    const int64_t steps = args.steps.value_or(kDefaultSteps);
    if (steps < 1) throw std::invalid_argument(fmt::format("--steps {} must be >= 1", steps));
    if (args.save_interval < 0) {
      throw std::invalid_argument(
          fmt::format("--save-interval {} must be >= 0", args.save_interval));
    }
    // A tag this run will save that holds files zinf did not write would be refused at that
    // save (engine/checkpoint.h): say so now, not after training.
    if (save_folder && !save_folder->created) {
      std::vector<int64_t> saved_steps;
      for (int64_t s = args.save_interval; args.save_interval > 0 && s < steps;
           s += args.save_interval) {
        saved_steps.push_back(s);
      }
      saved_steps.push_back(steps);
      for (const int64_t s : saved_steps) {
        const std::string tag = fmt::format("global_step{}", s);
        const std::vector<std::string> foreign =
            engine::foreign_checkpoint_entries((fs::path(args.save) / tag).string());
        if (!foreign.empty()) {
          throw std::invalid_argument(fmt::format(
              "--save {}: this run saves {}, but {} holds {} that zinf did not write ({}), and "
              "zinf does not delete files it did not write: move them away or save elsewhere",
              args.save, tag, (fs::path(args.save) / tag).string(),
              foreign.size() == 1 ? "an entry" : "entries", fmt::join(foreign, ", ")));
        }
      }
    }

    // ---- config ------------------------------------------------------------------------------
    std::optional<TempFolder> swap;
    ConfigOverrides overrides;
    overrides.micro_batch = args.micro_batch;
    overrides.grad_accum = args.grad_accum;
    overrides.lr = args.lr;
    overrides.steps = steps;
    overrides.world_size = launch.world_size;
    if (!args.memory_budget.empty()) {
      overrides.memory_budget = parse_byte_size(args.memory_budget, "--memory-budget");
    }
    nlohmann::json root;
    std::string source_name;
    if (bare) {
      // Each rank makes its own folder: ranks may share a node, and a swap file is a rank's.
      swap.emplace(args.nvme_path.empty() ? default_swap_parent() : args.nvme_path);
      overrides.nvme_path = swap->path();
      root = bare_config(*model, steps, launch.world_size);
      source_name = "embedded default";
    } else {
      overrides.nvme_path = args.nvme_path;
      root = load_config_json(args.config);
      source_name = args.config;
    }
    std::vector<std::string> override_lines;
    const config::RunConfig cfg =
        resolve_run_config(root, source_name, overrides, *model, &override_lines);

    const auto [threads, threads_why] = compute_threads(args, cfg, launch);
    engine::EngineOptions options = engine_options(cfg, launch, seq_len, threads);
    const at::ScalarType dtype = parameter_dtype(cfg.zero.precision);
    const int64_t micro = options.micro_batch_size;
    options.activations =
        engine::llama_activations(*model, micro, seq_len, dtype == at::kFloat ? 4 : 2);
    const int64_t global_batch = micro * cfg.zero.gradient_accumulation_steps * launch.world_size;
    engine::PlanInputs plan_in = llama_plan_inputs(*model, cfg, launch.world_size, micro, seq_len);
    engine::MemoryPlan plan = engine::plan_memory(plan_in);
    // The bare config's budget, 1/4 of the model states, is below what the smallest models
    // need at once (one decoder layer gathered, the resident embedding and head, activations):
    // it is raised to that, and said so.
    std::string budget_note;
    if (bare && !overrides.memory_budget && plan.device_total() > options.memory_budget) {
      constexpr uint64_t kRound = 64 * 1024;
      const uint64_t raised = (plan.device_total() + kRound - 1) / kRound * kRound;
      budget_note = fmt::format(
          "accelerator budget raised from {} (1/4 of the model states) to {}, what this model "
          "needs at once; --memory-budget sets it",
          engine::format_bytes(options.memory_budget), engine::format_bytes(raised));
      options.memory_budget = raised;
    }
    const int64_t tokens_per_step = global_batch * seq_len;

    // ---- start-up lines ------------------------------------------------------------------------
    say(fmt::format("zinf train: {}; {} compute thread{} per rank ({})", zero::to_string(launch),
                    threads, threads == 1 ? "" : "s", threads_why));
    say(fmt::format("config: {}", source_name));
    for (const auto& w : cfg.warnings) say("warning: " + w);
    for (const auto& line : override_lines) say("  " + line);
    for (const auto& line : config::resolved_lines(cfg)) say("  " + line);
    if (!budget_note.empty()) say("  " + budget_note);
    // "4 heads" or, with grouped-query attention or a head_dim of its own, "32 heads (8
    // key/value), head_dim 128".
    std::string heads = fmt::format("{} heads", model->num_heads);
    if (model->kv_heads() != model->num_heads) {
      heads += fmt::format(" ({} key/value)", model->kv_heads());
    }
    if (model->head_size() * model->num_heads != model->hidden_size) {
      heads += fmt::format(", head_dim {}", model->head_size());
    }
    say(fmt::format(
        "model {}: {:.2f} M parameters ({} layers, hidden {}, {}, vocab {}), "
        "{}; model states {} ({} B/param) = {:.1f}x the {} accelerator budget {}",
        model->name, static_cast<double>(params) / 1e6, model->num_layers, model->hidden_size,
        heads, model->vocab_size, precision_name(cfg.zero.precision), engine::format_bytes(states),
        kStateBytesPerParam,
        static_cast<double>(states) / static_cast<double>(options.memory_budget),
        options.accelerator, engine::format_bytes(options.memory_budget)));
    if (const std::string notes = engine::architecture_notes(*model); !notes.empty()) {
      say("  architecture: " + notes);
    }
    if (cfg.zero.precision == zero::Precision::kFloat16 &&
        cfg.zinf.accelerator == config::AcceleratorType::kCpu) {
      say(fmt::format(
          "fp16 on the CPU accelerator: {} computed in fp32 and rounded to fp16 (LibTorch "
          "1.13 has no CPU fp16 kernels for them); parameters, activations and gradients stay "
          "fp16",
          engine::kCpuFp16InFp32));
    }
    // The note matters for the generated fallback; "fortunes: ..." repeats the description.
    if (!corpus_note.empty() && corpus_note.rfind("fortunes:", 0) != 0) {
      say("data: " + corpus_note);
    }
    const double entropy = data::unigram_entropy_nats(*source);
    say(fmt::format("data: {}; unigram entropy {:.4f} nats/token (the loss to beat)",
                    source->description(), entropy));
    if (sidecar) {
      // Which tokenizer made the ids, and whether it is the model folder's own.
      const std::string folder_hash = hf ? data::tokenizer_fingerprint(args.init_from) : "";
      say(fmt::format(
          "data: tokenized by {} from {} (tokenizer sha256 {:.12}, vocab {}, EOS {}, {} "
          "documents){}",
          sidecar->tokenizer_class.empty() ? "a tokenizer" : sidecar->tokenizer_class,
          sidecar->tokenizer_source.empty() ? "?" : sidecar->tokenizer_source,
          sidecar->tokenizer_sha256, sidecar->vocab_size,
          sidecar->eos_id ? std::to_string(*sidecar->eos_id) : std::string("none"),
          sidecar->documents,
          !hf                   ? std::string()
          : folder_hash.empty() ? fmt::format("; {} holds no tokenizer files to "
                                              "compare",
                                              args.init_from)
          : folder_hash == sidecar->tokenizer_sha256
              ? fmt::format("; the tokenizer of {}", args.init_from)
              : std::string()));
      if (hf && !folder_hash.empty() && !sidecar->tokenizer_sha256.empty() &&
          folder_hash != sidecar->tokenizer_sha256) {
        say(fmt::format(
            "warning: --data {} was tokenized by a tokenizer whose files differ from {}'s "
            "(sha256 {:.12} against {:.12}): its ids may mean other tokens to this model",
            args.data, args.init_from, sidecar->tokenizer_sha256, folder_hash));
      }
    } else if (hf && data::is_token_file(args.data)) {
      say(
          fmt::format("data: {} has no sidecar ({}.json): nothing says which tokenizer made its "
                      "ids (scripts/tokenize-text.py writes one)",
                      args.data, args.data));
    }
    if (!eval_tokenizer_note.empty()) say(eval_tokenizer_note);
    say(
        fmt::format("batch: {} samples x {} tokens = {} tokens per step ({} per rank per "
                    "micro-batch x {} accumulation x {} rank(s)); {} steps",
                    global_batch, seq_len, tokens_per_step, micro,
                    cfg.zero.gradient_accumulation_steps, launch.world_size, steps));
    // Evaluations: whole micro-batches of the file's first samples, each rank its share.
    const int64_t eval_interval = args.eval_interval.value_or(std::max<int64_t>(1, steps / 10));
    int64_t eval_batches = 0;
    if (eval_source) {
      const auto samples =
          static_cast<int64_t>(eval_source->size() / static_cast<uint64_t>(seq_len + 1));
      eval_batches = std::min<int64_t>(args.eval_batches, samples / (micro * launch.world_size));
      if (eval_batches < 1) {
        throw data::DataError(fmt::format(
            "--eval-data {}: {} tokens hold {} samples of {} + 1 tokens, fewer than one "
            "micro-batch on every rank ({} x {} rank(s))",
            args.eval_data, eval_source->size(), samples, seq_len, micro, launch.world_size));
      }
      say(fmt::format(
          "eval: {}; {} micro-batch(es) of {} x {} tokens per rank ({} tokens in all{}) before "
          "training, {} and at the end",
          eval_source->description(), eval_batches, micro, seq_len,
          eval_batches * micro * launch.world_size * seq_len,
          eval_batches < args.eval_batches
              ? fmt::format("; --eval-batches {} asked for more than the file holds",
                            args.eval_batches)
              : std::string(),
          eval_interval == 1 ? std::string("every step")
                             : fmt::format("every {} steps", eval_interval)));
    }
    if (swap) say(fmt::format("swap folder: {} (removed at the end)", swap->path()));
    if (save_folder) {
      const SaveFolderState& f = *save_folder;
      say(fmt::format(
          "checkpoints: {}{}{}", args.save,
          args.save_interval > 0 ? fmt::format(" every {} steps and at the end", args.save_interval)
                                 : std::string(" at the end"),
          f.created           ? " (folder created)"
          : f.resumes_from_it ? " (the folder --load resumes from)"
          : f.overwrite_allowed && (!f.latest.empty() || !f.tags.empty())
              ? fmt::format(" (--overwrite: its {} checkpoint(s) of another run are replaced where "
                            "this run saves the same tag; latest was {})",
                            f.tags.size(), f.latest.empty() ? "-" : f.latest)
              : ""));
    }
    if (hf) {
      say(fmt::format("initial weights: {} ({}{}), each parameter read as it is partitioned",
                      hf->directory(), hf->describe(),
                      hf->torch_dtype().empty() ? "" : ", " + hf->torch_dtype()));
    }

    // ---- the memory plan, before anything is allocated ------------------------------------
    // The Engine checks its plan again once the module exists; this comes first because
    // building the module allocates every parameter in full on the host.
    {
      const uint64_t held = params * (dtype == at::kFloat ? 4 : 2);
      // The defaults that stand back where they do not fit (the Engine checks again).
      engine::FitLimits fit;
      fit.host_available = engine::host_memory_available_bytes();
      fit.ranks_on_node = launch.local_world_size;
      fit.host_held_bytes = held;
      fit.swap_free = engine::swap_free_bytes(cfg.zero);
      fit.device_is_host_memory = options.accelerator != "cuda";
      for (const std::string& line : engine::fit_defaults(plan_in, plan, fit)) say("  " + line);
      options.zero = plan_in.zero;  // (both are the config's ZeroConfig, now fitted)
      engine::PlanLimits limits;
      limits.device_budget = options.memory_budget;
      limits.pinned_limit = cfg.zero.pinned_memory_limit;
      limits.check_host = true;
      limits.host_held_bytes = held;
      limits.ranks_on_node = launch.local_world_size;
      engine::check_memory_plan(plan, limits);
    }

    data::LoaderOptions lo;
    lo.seq_len = seq_len;
    lo.seed = args.seed;
    lo.rank = launch.rank;
    lo.world_size = launch.world_size;
    data::SampleLoader loader(*source, lo);

    Progress progress(steps, stderr, lead ? std::nullopt : std::optional<bool>(false),
                      cfg.steps_per_print);
    std::optional<engine::CsvMonitor> csv;
    if (cfg.csv_monitor.enabled && lead) {
      csv.emplace(cfg.csv_monitor.output_path, cfg.csv_monitor.job_name);
      say(fmt::format("csv_monitor: {}", csv->folder()));
    }
    options.monitor = [&](const engine::MonitorEvent& e) {
      if (csv) csv->write(e.name, e.samples, e.value);
    };
    options.log = [&](const std::string& line) { progress.print(line); };

    // ---- train ---------------------------------------------------------------------------------
    const Clock::time_point start = Clock::now();
    auto module = std::make_shared<engine::LlamaModelImpl>(*model, dtype);
    const uint64_t seed = args.seed;
    engine::Engine eng(
        module, options,
        hf ? hf->initializer() : [seed](const std::string& name, at::Tensor& full) {
          engine::init_parameter(seed, name, full);
        });

    // The loss of the loader's next micro-batch, its ids copied onto the engine's device (the
    // embedding's backward keeps them).
    auto micro_batch_loss = [&](data::SampleLoader& from, std::vector<int64_t>& x_ids,
                                std::vector<int64_t>& y_ids) {
      from.next(micro, x_ids, y_ids);
      const at::TensorOptions ids = at::TensorOptions().dtype(at::kLong).device(eng.device());
      const at::Tensor x = at::from_blob(x_ids.data(), {micro, seq_len}, at::kLong)
                               .to(ids, /*non_blocking=*/false, /*copy=*/true);
      const at::Tensor y = at::from_blob(y_ids.data(), {micro, seq_len}, at::kLong)
                               .to(ids, /*non_blocking=*/false, /*copy=*/true);
      return module->loss(x, y);
    };
    // The held-out loss: the mean over every rank's eval_batches micro-batches of the file's
    // first samples (in file order, the same ones each time), with the partitioned model and
    // no gradients; the training's state (data position, RNG, gradients) is untouched.
    struct EvalPoint {
      int64_t step;
      double loss;
    };
    std::vector<EvalPoint> evals;
    // What the evaluations cost, kept apart from the training's figures in the summary.
    struct EvalCost {
      int passes = 0;
      double seconds = 0.0, param_fetch = 0.0, misses = 0.0, param_swap = 0.0;
      uint64_t allocations_before_first = 0;  // by the device runtime, before step 1 ends
      uint64_t allocations_after_first = 0;   // and after it
      // NVMe bytes: optimizer read, written; params read, written.
      uint64_t io[4] = {0, 0, 0, 0};
    } eval_cost;
    auto evaluate_held_out = [&](int64_t at_step) {
      const Clock::time_point t0 = Clock::now();
      const zero::ZeroModelStats s0 = eng.zero_model().stats();
      const uint64_t allocations0 = runtime_allocations(eng.accelerator());
      data::LoaderOptions eo;
      eo.seq_len = seq_len;
      eo.rank = launch.rank;
      eo.world_size = launch.world_size;
      eo.shuffle = false;
      data::SampleLoader eval_loader(*eval_source, eo);
      std::vector<int64_t> x_ids, y_ids;
      double sum = 0.0;
      for (int64_t b = 0; b < eval_batches; ++b) {
        const at::Tensor loss =
            eng.evaluate([&] { return micro_batch_loss(eval_loader, x_ids, y_ids); });
        sum += loss.item<double>();
      }
      if (eng.world_size() > 1) {
        zero::host_all_reduce(eng.comm(), eng.accelerator(), &sum, 1, zero::DType::kFloat64,
                              zero::ReduceOp::kSum);
      }
      const double mean_loss = sum / static_cast<double>(eval_batches * launch.world_size);
      evals.push_back({at_step, mean_loss});
      const zero::ZeroModelStats s1 = eng.zero_model().stats();
      ++eval_cost.passes;
      eval_cost.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
      eval_cost.param_fetch += s1.params.wait_seconds - s0.params.wait_seconds;
      eval_cost.misses += s1.coordinator.block_wait_seconds - s0.coordinator.block_wait_seconds;
      eval_cost.param_swap += s1.param_swap.io_wait_seconds - s0.param_swap.io_wait_seconds;
      eval_cost.io[0] += s1.optimizer_swap.nvme_bytes_read - s0.optimizer_swap.nvme_bytes_read;
      eval_cost.io[1] +=
          s1.optimizer_swap.nvme_bytes_written - s0.optimizer_swap.nvme_bytes_written;
      eval_cost.io[2] += s1.param_swap.nvme_bytes_read - s0.param_swap.nvme_bytes_read;
      eval_cost.io[3] += s1.param_swap.nvme_bytes_written - s0.param_swap.nvme_bytes_written;
      (at_step >= 1 ? eval_cost.allocations_after_first : eval_cost.allocations_before_first) +=
          runtime_allocations(eng.accelerator()) - allocations0;
      if (csv) csv->write("Train/Samples/eval_loss", eng.global_samples(), mean_loss);
      if (lead) {
        progress.print(fmt::format(
            "eval at step {}: loss {:.4f}, perplexity {:.2f} ({} tokens held out, {:.2f} s)",
            at_step, mean_loss, std::exp(mean_loss),
            eval_batches * micro * launch.world_size * seq_len,
            std::chrono::duration<double>(Clock::now() - t0).count()));
      }
    };

    std::vector<std::pair<double, double>> curve;
    std::vector<double> losses, tokens_per_s;
    std::vector<int64_t> inputs, targets;
    int64_t step = 0;
    if (!args.load.empty()) {
      const engine::CheckpointReport r = eng.load_checkpoint(args.load, args.tag);
      const auto position = r.client_state.find("data_position");
      step = eng.global_steps();
      if (position != r.client_state.end()) {
        loader.seek(std::get<int64_t>(position->second));
      } else {
        // A checkpoint another program wrote (DeepSpeed's engine.save_checkpoint): its
        // global_samples is where the same sample order stands after its steps.
        loader.seek(eng.global_samples());
        say(fmt::format(
            "checkpoint {} holds no data position (zinf train writes one): the data goes on at "
            "sample {}, its global_samples",
            r.path, eng.global_samples()));
      }
      say(fmt::format("checkpoint loaded: {} (step {}; {} in {:.2f} s, {:.2f} GB/s)", r.path, step,
                      engine::format_bytes(r.bytes), r.seconds, r.gb_per_second()));
      if (step >= steps) {
        say(fmt::format(
            "nothing to train: the checkpoint is at step {} and --steps {} counts from the start "
            "of training; give --steps {} or more to train on",
            step, steps, step + 1));
      }
    }
    if (eval_source && step < steps) evaluate_held_out(step);
    int64_t saved_step = -1;
    auto save = [&] {
      const engine::CheckpointReport r =
          eng.save_checkpoint(args.save, {}, {{"data_position", loader.global_position()}});
      saved_step = step;
      if (!lead) return;
      if (r.step_written_bytes > 0) {
        progress.print(fmt::format(
            "checkpoint saved: {} ({} in {:.2f} s after the step, which wrote {} of this rank's "
            "optimizer states into it)",
            r.path, engine::format_bytes(r.bytes), r.seconds,
            engine::format_bytes(r.step_written_bytes)));
      } else {
        progress.print(fmt::format("checkpoint saved: {} ({} in {:.2f} s, {:.2f} GB/s)", r.path,
                                   engine::format_bytes(r.bytes), r.seconds, r.gb_per_second()));
      }
    };
    const double initial_loss_scale = eng.loss_scaler().scale();
    const int accumulation = eng.gradient_accumulation_steps();
    int sig = 0;
    std::optional<int64_t> abandoned;  // the step the second signal abandoned
    SignalWatcher watcher(progress, args.save, launch.launcher != "none");
    uint64_t allocations_after_first = 0;  // the device runtime's, after step 1
    // The swap tiers' bytes from here on: the summary's I/O per step leaves out the start-up
    // (the initial states written, a checkpoint loaded) and the evaluations; saves during the
    // run are counted in it.
    const zero::ZeroModelStats io_start = eng.zero_model().stats();
    const EvalCost eval_before_steps = eval_cost;
    const int64_t first_step = step;
    while (step < steps && (sig = agreed_signal(eng)) == 0) {
      // A save follows this step: the step writes the optimizer states into it as it updates
      // them (stage 3 with the optimizer on NVMe; elsewhere this does nothing).
      if (!args.save.empty() &&
          ((args.save_interval > 0 && (step + 1) % args.save_interval == 0) || step + 1 == steps)) {
        (void)eng.prepare_checkpoint(args.save);
      }
      // The step's micro-batches, shown as they finish; a second signal abandons the step
      // between two of them.
      const int64_t position = loader.global_position();
      if (lead) progress.micro_batch(step + 1, 0, accumulation);
      for (int mb = 0; mb < accumulation; ++mb) {
        if (mb > 0 && launch.launcher == "none" && agreed_abandon(eng)) {
          eng.abandon_step();
          loader.seek(position);  // a resumed run trains this step's samples
          abandoned = step + 1;
          break;
        }
        const at::Tensor loss =
            eng.forward([&] { return micro_batch_loss(loader, inputs, targets); });
        eng.backward(loss);
        (void)eng.step();
        if (lead) progress.micro_batch(step + 1, mb + 1, accumulation);
      }
      if (abandoned) {
        sig = stop_signal();
        break;
      }
      const engine::StepReport& r = eng.report();
      ++step;
      if (step == 1) allocations_after_first = runtime_allocations(eng.accelerator());
      curve.emplace_back(static_cast<double>(step), r.loss);
      losses.push_back(r.loss);
      tokens_per_s.push_back(r.tokens_per_second);
      if (lead) progress.update(step, r.loss, r.tokens_per_second);
      if (!args.save.empty() && args.save_interval > 0 && step % args.save_interval == 0) save();
      if (eval_source && (step % eval_interval == 0 || step == steps)) evaluate_held_out(step);
    }
    if (sig == 0) sig = stop_signal();  // after the last step: report it, finish anyway
    // At the end, and at Ctrl-C (the loop stopped at a step boundary).
    if (!args.save.empty() && saved_step != step) save();
    progress.finish();
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();

    if (sig != 0) {
      say(fmt::format(
          "{} received: stopped at the boundary of step {} of {}; swap files removed{}; {}",
          signal_name(sig), step, steps,
          abandoned ? fmt::format("; step {} abandoned (its micro-batches' gradients were "
                                  "dropped; a resumed run trains it from its first sample)",
                                  *abandoned)
                    : std::string(),
          args.save.empty()    ? std::string("nothing saved (no --save)")
          : saved_step == step ? fmt::format("step {} saved in {}", step, args.save)
                               : fmt::format("step {} NOT saved", step)));
    }
    if (lead && !losses.empty()) {
      const engine::MemoryReport mem = eng.memory_report();
      const size_t window = std::max<size_t>(1, std::min<size_t>(10, losses.size() / 5));
      const double loss_start = mean(losses, 0, window);
      const double loss_end = mean(losses, losses.size() - window, losses.size());
      // Throughput from the steps after the first (which records the trace and warms up).
      const double tps = mean(tokens_per_s, tokens_per_s.size() > 1 ? 1 : 0, tokens_per_s.size());
      fmt::print("\n== zinf train: {} steps of {} in {:.1f} s ==\n", step, model->name, wall);
      fmt::print("model       {:.2f} M parameters; model states {} on a {} {} budget\n",
                 static_cast<double>(params) / 1e6, engine::format_bytes(states),
                 engine::format_bytes(options.memory_budget), options.accelerator);
      fmt::print(
          "throughput  {:.{}f} tokens/s ({:.2f} s/step, {} tokens/step, {} rank(s) x {} "
          "thread(s))\n",
          tps,
          tps < 10    ? 2
          : tps < 100 ? 1
                      : 0,
          tps > 0 ? static_cast<double>(tokens_per_step) / tps : 0.0, tokens_per_step,
          launch.world_size, threads);
      fmt::print("memory      planned and measured peak per tier (rank 0):\n{}", mem.table());
      {
        // The bytes each swap tier moved per step trained (rank 0): start-up and evaluations
        // left out, saves during the run in.
        const zero::ZeroModelStats z = eng.zero_model().stats();
        const auto per_step = [&](uint64_t bytes, uint64_t at_start, int kind) {
          const uint64_t evaluated = eval_cost.io[kind] - eval_before_steps.io[kind];
          const uint64_t trained = bytes - std::min(bytes, at_start + evaluated);
          return engine::format_bytes(
              trained / static_cast<uint64_t>(std::max<int64_t>(1, step - first_step)));
        };
        const zero::ZeroConfig& run_zero = eng.options().zero;  // (after fit_defaults)
        fmt::print(
            "I/O/step   optimizer nvme read {} written {} | params nvme read {} written {}{}\n",
            per_step(z.optimizer_swap.nvme_bytes_read, io_start.optimizer_swap.nvme_bytes_read, 0),
            per_step(z.optimizer_swap.nvme_bytes_written,
                     io_start.optimizer_swap.nvme_bytes_written, 1),
            per_step(z.param_swap.nvme_bytes_read, io_start.param_swap.nvme_bytes_read, 2),
            per_step(z.param_swap.nvme_bytes_written, io_start.param_swap.nvme_bytes_written, 3),
            run_zero.offload_optimizer != zero::OffloadTarget::kNvme ? ""
            : run_zero.host_grads ? " (the optimizer's grads in host memory)"
                                  : " (the optimizer's grads on nvme)");
        if (run_zero.overlap_optimizer) {
          fmt::print(
              "overlap     {} sub-group updates behind the backward: {} kept, {} rolled back; "
              "{:.2f} s waited for them after the backward in {} step(s)\n",
              z.overlap.speculated, z.overlap.committed, z.overlap.rolled_back,
              z.overlap.wait_seconds, z.overlap.steps);
        }
      }
      if (mem.activations.saved > 0) {
        const zero::ActivationOffloadStats& a = mem.activations;
        fmt::print(
            "activations {} block inputs offloaded to {} ({} in all, at most {} at once), {} "
            "back ({} read ahead); waited {:.2f} s on writes, {:.2f} s on reads\n",
            a.saved, cfg.zero.activation_offload == zero::OffloadTarget::kNvme ? "nvme" : "cpu",
            engine::format_bytes(a.saved_bytes), engine::format_bytes(a.largest_saved), a.restored,
            a.prefetched, a.write_wait_seconds, a.read_wait_seconds);
      }
      // Once the first step has made the buffers, later steps reuse them: a device that
      // allocates every step (cudaMalloc synchronizes the GPU) shows here.
      // The evaluations' own are left out of every figure below and shown on their own line.
      const uint64_t allocations =
          runtime_allocations(eng.accelerator()) - eval_cost.allocations_after_first;
      const uint64_t first_step_allocations =
          allocations_after_first - eval_cost.allocations_before_first;
      fmt::print(
          "allocations {} by the {} device's runtime in step 1, {} in the {} step(s) after it{}\n",
          first_step_allocations, options.accelerator, allocations - allocations_after_first,
          step - 1,
          step > 1 ? fmt::format(" ({:.1f} per step)",
                                 static_cast<double>(allocations - allocations_after_first) /
                                     static_cast<double>(step - 1))
                   : std::string());
      const zero::ZeroModelStats zs = eng.zero_model().stats();
      fmt::print(
          "blocked     over {} steps (rank 0): param fetch {:.2f} s (prefetch misses {:.2f} s), "
          "gradient reduction {:.2f} s, optimizer I/O {:.2f} s, param swap I/O {:.2f} s\n",
          step, zs.params.wait_seconds - eval_cost.param_fetch,
          zs.coordinator.block_wait_seconds - eval_cost.misses, zs.reducer.wait_seconds,
          zs.optimizer_swap.io_wait_seconds, zs.param_swap.io_wait_seconds - eval_cost.param_swap);
      if (eval_cost.passes > 0) {
        fmt::print(
            "evaluation  {} pass(es) in {:.2f} s: param fetch {:.2f} s (prefetch misses {:.2f} s), "
            "param swap I/O {:.2f} s, {} device allocations (not in the lines above)\n",
            eval_cost.passes, eval_cost.seconds, eval_cost.param_fetch, eval_cost.misses,
            eval_cost.param_swap,
            eval_cost.allocations_before_first + eval_cost.allocations_after_first);
      }
      fmt::print(
          "loss        {:.4f} -> {:.4f} (mean of the first and last {} steps); unigram "
          "entropy {:.4f}: {}\n",
          loss_start, loss_end, window, entropy,
          loss_end < entropy ? fmt::format("beaten by {:.4f}", entropy - loss_end)
                             : std::string("not beaten"));
      fmt::print("            {}\n", sparkline(losses, 60));
      if (evals.size() > 0) {
        const EvalPoint& first = evals.front();
        const EvalPoint& last = evals.back();
        fmt::print(
            "eval loss   {:.4f} -> {:.4f} (perplexity {:.2f} -> {:.2f}) at steps {} -> {}, on "
            "{} held-out tokens of {}\n",
            first.loss, last.loss, std::exp(first.loss), std::exp(last.loss), first.step, last.step,
            eval_batches * micro * launch.world_size * seq_len, args.eval_data);
      }
      if (cfg.zero.precision == zero::Precision::kFloat16) {
        fmt::print(
            "fp16        loss scale {:g} -> {:g}; {} of {} steps skipped (gradient overflow)\n",
            initial_loss_scale, eng.loss_scaler().scale(), eng.skipped_steps(), step);
      }
      if (!args.plot.empty()) {
        LossCurve lc;
        lc.points = curve;
        for (const EvalPoint& e : evals) {
          lc.eval_points.emplace_back(static_cast<double>(e.step), e.loss);
        }
        lc.baseline = entropy;
        lc.title = fmt::format("zinf train: {} ({:.2f} M params), {}", model->name,
                               static_cast<double>(params) / 1e6, source->description());
        const std::string why = write_loss_png(lc, args.plot);
        if (why.empty()) {
          fmt::print("loss plot   {}\n", args.plot);
        } else {
          fmt::print(stderr, "warning: loss plot not written: {}\n", why);
        }
      }
    }
    std::fflush(stdout);
    return sig != 0 ? 128 + sig : 0;
  } catch (const config::ConfigError& e) {
    fmt::print(stderr, "zinf train: {}\n", e.what());
    return 2;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "zinf train: {}\n", e.what());
    return 2;
  } catch (const data::DataError& e) {
    fmt::print(stderr, "zinf train: {}\n", e.what());
    return 2;
  } catch (const engine::HfCheckpointError& e) {
    fmt::print(stderr, "zinf train: {}\n", e.what());
    return 2;
  } catch (const engine::PlanError& e) {
    fmt::print(stderr, "zinf train: {}\n", e.what());
    return 2;
  } catch (const offload::OffloadError& e) {
    // A config the offload layer refuses (kConfig) is a usage error; I/O is a run-time one.
    fmt::print(stderr, "zinf train{}: {}\n",
               rank != 0 ? fmt::format(" (rank {})", rank) : std::string(), e.what());
    return e.kind() == offload::ErrorKind::kConfig ? 2 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "zinf train{}: {}\n",
               rank != 0 ? fmt::format(" (rank {})", rank) : std::string(), e.what());
    return 1;
  }
}

}  // namespace zinf::tools
