#include "zero/comm/launch_env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zero/comm/communicator.h"

namespace zinf::zero {

namespace {

constexpr const char* kOp = "launch environment";

[[noreturn]] void fail(const std::string& message) { throw CommError(kOp, -1, message); }

std::string show(const std::string& name, const std::string& value) {
  return name + "=\"" + value + "\"";
}

// Strict decimal: digits only (no sign, blanks or base prefix), within [min, max].
std::optional<long long> parse_decimal(const std::string& text) {
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return std::nullopt;
  }
  return value;
}

class Reader {
 public:
  explicit Reader(const EnvLookup& lookup) : lookup_(lookup) {}

  [[nodiscard]] std::optional<std::string> raw(const std::string& name) const {
    return lookup_(name);
  }
  [[nodiscard]] bool has(const std::string& name) const { return raw(name).has_value(); }

  // The integer value of `name` in [min, max]; nullopt when not set.
  [[nodiscard]] std::optional<int> integer(const std::string& name, long long min,
                                           long long max) const {
    const std::optional<std::string> text = raw(name);
    if (!text) {
      return std::nullopt;
    }
    if (text->empty()) {
      fail(name + " is set but empty");
    }
    const std::optional<long long> value = parse_decimal(*text);
    if (!value) {
      fail(show(name, *text) + " is not a decimal integer");
    }
    if (*value < min || *value > max) {
      fail(show(name, *text) + " is outside [" + std::to_string(min) + ", " + std::to_string(max) +
           "]");
    }
    return static_cast<int>(*value);
  }

  // Like integer(), but a missing variable is an error that says why it is needed.
  [[nodiscard]] int required(const std::string& name, long long min, long long max,
                             const std::string& why) const {
    const std::optional<int> value = integer(name, min, max);
    if (!value) {
      fail(name + " is not set (" + why + ")");
    }
    return *value;
  }

 private:
  const EnvLookup& lookup_;
};

constexpr long long kMaxRanks = std::numeric_limits<int>::max();

// The first of `names` that is set, or empty.
std::string first_set(const Reader& env, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (env.has(name)) {
      return name;
    }
  }
  return {};
}

// Ranks and sizes, checked against each other.
struct Layout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
};

struct LayoutNames {
  std::string rank;
  std::string world_size;
  std::string local_rank;        // may be empty: not provided by the launcher
  std::string local_world_size;  // may be empty
};

Layout read_layout(const Reader& env, const LayoutNames& names) {
  Layout layout;
  const std::string why = names.rank + " is set";
  if (!env.has(names.rank)) {
    fail(names.world_size + " is set (" + show(names.world_size, *env.raw(names.world_size)) +
         ") but " + names.rank + " is not");
  }
  layout.world_size =
      env.required(names.world_size, 1, kMaxRanks,
                   names.rank + " is set: " + show(names.rank, *env.raw(names.rank)));
  layout.rank = env.required(names.rank, 0, kMaxRanks, why);
  if (layout.rank >= layout.world_size) {
    fail(show(names.rank, std::to_string(layout.rank)) + " is not below " +
         show(names.world_size, std::to_string(layout.world_size)));
  }
  const std::optional<int> local_world = names.local_world_size.empty()
                                             ? std::nullopt
                                             : env.integer(names.local_world_size, 1, kMaxRanks);
  const std::optional<int> local_rank =
      names.local_rank.empty() ? std::nullopt : env.integer(names.local_rank, 0, kMaxRanks);
  layout.local_world_size = local_world.value_or(layout.world_size);
  layout.local_rank = local_rank.value_or(layout.rank);
  if (layout.local_world_size > layout.world_size) {
    fail(show(names.local_world_size, std::to_string(layout.local_world_size)) +
         " is larger than " + show(names.world_size, std::to_string(layout.world_size)));
  }
  if (layout.local_rank >= layout.local_world_size) {
    const std::string local_world_name =
        local_world ? names.local_world_size
                    : names.world_size + " (" + names.local_world_size + " not set)";
    fail(show(local_rank ? names.local_rank : names.rank, std::to_string(layout.local_rank)) +
         " is not below the local world size " + std::to_string(layout.local_world_size) +
         " from " + local_world_name);
  }
  return layout;
}

// SLURM's tasks-per-node list: "2(x3),1" -> {2, 2, 2, 1}.
std::vector<int> parse_tasks_per_node(const std::string& name, const std::string& text) {
  std::vector<int> counts;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const size_t paren = item.find("(x");
    const std::string count_text = item.substr(0, paren);
    std::optional<long long> count = parse_decimal(count_text);
    std::optional<long long> repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') {
        repeat = std::nullopt;
      } else {
        repeat = parse_decimal(item.substr(paren + 2, item.size() - paren - 3));
      }
    }
    if (!count || !repeat || *count < 1 || *repeat < 1 || *count > kMaxRanks ||
        *repeat > 1'000'000) {
      fail(show(name, text) + " is not a SLURM task list such as \"2(x3),1\"");
    }
    counts.insert(counts.end(), static_cast<size_t>(*repeat), static_cast<int>(*count));
    start = comma + 1;
  }
  return counts;
}

bool parse_bool(const std::string& name, const std::string& text) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "true" || lower == "1") {
    return true;
  }
  if (lower == "false" || lower == "0" || lower.empty()) {
    return false;
  }
  fail(show(name, text) + " is neither True nor False");
}

// MASTER_ADDR / MASTER_PORT, shared by every launcher.
void read_master(const Reader& env, LaunchEnv& out) {
  const std::optional<std::string> addr = env.raw("MASTER_ADDR");
  if (addr && addr->empty()) {
    fail("MASTER_ADDR is set but empty");
  }
  const std::optional<int> port = env.integer("MASTER_PORT", 1, 65535);
  if (out.world_size == 1) {
    out.master_addr = addr.value_or("");
    out.master_port = port.value_or(0);
    return;
  }
  if (addr) {
    out.master_addr = *addr;
  } else if (out.local_world_size == out.world_size) {
    out.master_addr = "127.0.0.1";
  } else {
    fail("MASTER_ADDR is not set (required: the " + std::to_string(out.world_size) +
         " ranks span several nodes, " + std::to_string(out.local_world_size) +
         " on this one); export the address of the node that runs rank 0");
  }
  if (!port) {
    fail("MASTER_PORT is not set (required when the world size is " +
         std::to_string(out.world_size) + " > 1)");
  }
  out.master_port = *port;
}

void apply(const Layout& layout, LaunchEnv& out) {
  out.rank = layout.rank;
  out.world_size = layout.world_size;
  out.local_rank = layout.local_rank;
  out.local_world_size = layout.local_world_size;
}

LaunchEnv from_torchrun(const Reader& env) {
  LaunchEnv out;
  out.launcher = env.has("TORCHELASTIC_RUN_ID") ? "torchrun" : "env";
  apply(read_layout(env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}), out);
  if (const std::optional<std::string> agent = env.raw("TORCHELASTIC_USE_AGENT_STORE")) {
    out.agent_store = parse_bool("TORCHELASTIC_USE_AGENT_STORE", *agent);
  }
  read_master(env, out);
  if (out.agent_store) {
    if (!env.has("MASTER_ADDR") || !env.has("MASTER_PORT")) {
      fail("TORCHELASTIC_USE_AGENT_STORE=True but " +
           std::string(env.has("MASTER_ADDR") ? "MASTER_PORT" : "MASTER_ADDR") +
           " is not set (the agent's store address)");
    }
    const int attempt = env.required("TORCHELASTIC_RESTART_COUNT", 0, kMaxRanks,
                                     "required when TORCHELASTIC_USE_AGENT_STORE=True");
    out.store_prefix = "/worker/attempt_" + std::to_string(attempt);
  }
  return out;
}

LaunchEnv from_openmpi(const Reader& env) {
  LaunchEnv out;
  out.launcher = "openmpi";
  apply(read_layout(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}),
        out);
  read_master(env, out);
  return out;
}

LaunchEnv from_slurm(const Reader& env) {
  LaunchEnv out;
  out.launcher = "slurm";
  const std::string world_name =
      first_set(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"});
  if (world_name.empty()) {
    fail("SLURM_PROCID is set (" + show("SLURM_PROCID", *env.raw("SLURM_PROCID")) +
         ") but none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS is");
  }
  // The local world size comes from the task list, so read the layout without it first.
  Layout layout = read_layout(env, {"SLURM_PROCID", world_name, "SLURM_LOCALID", ""});
  const std::string list_name =
      first_set(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  if (!list_name.empty()) {
    const std::vector<int> counts = parse_tasks_per_node(list_name, *env.raw(list_name));
    const int node = env.required("SLURM_NODEID", 0, kMaxRanks,
                                  "needed to read this node's entry of " + list_name);
    if (static_cast<size_t>(node) >= counts.size()) {
      fail(show("SLURM_NODEID", std::to_string(node)) + " has no entry in " +
           show(list_name, *env.raw(list_name)));
    }
    layout.local_world_size = counts[static_cast<size_t>(node)];
    if (layout.local_world_size > layout.world_size) {
      fail(show(list_name, *env.raw(list_name)) + " gives " +
           std::to_string(layout.local_world_size) + " tasks on node " + std::to_string(node) +
           ", more than " + show(world_name, std::to_string(layout.world_size)));
    }
    if (layout.local_rank >= layout.local_world_size) {
      fail(show("SLURM_LOCALID", std::to_string(layout.local_rank)) +
           " is not below this node's task count " + std::to_string(layout.local_world_size) +
           " from " + show(list_name, *env.raw(list_name)));
    }
  } else {
    layout.local_world_size = layout.world_size;
  }
  apply(layout, out);
  read_master(env, out);
  return out;
}

}  // namespace

LaunchEnv detect_launch_env(const EnvLookup& lookup) {
  const Reader env(lookup);
  if (env.has("RANK") || env.has("WORLD_SIZE")) {
    return from_torchrun(env);
  }
  if (env.has("OMPI_COMM_WORLD_RANK") || env.has("OMPI_COMM_WORLD_SIZE")) {
    return from_openmpi(env);
  }
  if (env.has("SLURM_PROCID")) {
    return from_slurm(env);
  }
  LaunchEnv out;
  out.launcher = "none";
  return out;
}

LaunchEnv detect_launch_env() {
  return detect_launch_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) {
      return std::nullopt;
    }
    return std::string(value);
  });
}

std::string to_string(const LaunchEnv& env) {
  std::string text = "rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                     " (local " + std::to_string(env.local_rank) + " of " +
                     std::to_string(env.local_world_size) + "), launcher " + env.launcher;
  if (!env.master_addr.empty()) {
    text += ", store " + env.master_addr + ":" + std::to_string(env.master_port);
    if (env.agent_store) {
      text += " (served by the launcher's agent, prefix " + env.store_prefix + ")";
    }
  }
  return text;
}

}  // namespace zinf::zero
