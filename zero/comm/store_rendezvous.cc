#include "zero/comm/store_rendezvous.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace zinf::zero::detail {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

int64_t ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

milliseconds time_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
  return std::max(left, milliseconds(1));
}

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string text(ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) {
      text.append(", ");
    }
    text.append(std::to_string(ranks[i]));
  }
  return text;
}

void check_rendezvous_args(const LaunchEnv& env, milliseconds timeout) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    throw CommError("rendezvous", env.rank,
                    "rank " + std::to_string(env.rank) + " of world size " +
                        std::to_string(env.world_size) + " is not a valid rank");
  }
  if (timeout.count() <= 0) {
    throw CommError("rendezvous", env.rank,
                    "timeout must be positive, got " + std::to_string(timeout.count()) + " ms");
  }
}

std::string store_description(const LaunchEnv& env) {
  std::string text = env.master_addr + ":" + std::to_string(env.master_port);
  text += env.agent_store ? " (served by the launcher's agent, prefix " + env.store_prefix + ")"
                          : " (served by rank 0)";
  return text;
}

c10::intrusive_ptr<c10d::Store> open_store(const LaunchEnv& env, bool server,
                                           milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(env.master_port);
  o.isServer = server;
  o.waitWorkers = false;
  o.timeout = timeout;
  o.multiTenant = server;  // a later communicator of this process shares rank 0's server
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  if (env.agent_store && !env.store_prefix.empty()) {
    store = c10::make_intrusive<c10d::PrefixStore>(env.store_prefix, store);
  }
  return store;
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, milliseconds timeout,
                                              Clock::time_point start) {
  const bool server = !env.agent_store && env.rank == 0;
  try {
    return open_store(env, server, timeout);
  } catch (const std::exception& e) {
    const std::string who =
        server ? "could not serve the store at " : "could not reach the store at ";
    const std::string missing = server || env.agent_store ? "" : ": rank 0 has not started it";
    throw CommError("rendezvous", env.rank,
                    who + store_description(env) + " within " + std::to_string(ms_since(start)) +
                        " ms" + missing + " (c10d: " + error_text(e) + ")");
  }
}

CommError store_call_failed(const LaunchEnv& env, const std::string& doing, Clock::time_point start,
                            const std::exception& e) {
  return CommError("rendezvous", env.rank,
                   doing + " the store at " + store_description(env) + " failed after " +
                       std::to_string(ms_since(start)) + " ms (c10d: " + error_text(e) + ")");
}

void wait_for_ranks(c10d::Store& store, const std::vector<std::string>& arrival_keys,
                    const LaunchEnv& env, Clock::time_point start, Clock::time_point deadline) {
  try {
    store.wait(arrival_keys, time_left(deadline));
    return;
  } catch (const std::exception& e) {
    // Name the ranks that did not arrive; the store may itself have gone (rank 0 died).
    std::vector<int> missing;
    try {
      for (size_t i = 0; i < arrival_keys.size(); ++i) {
        if (!store.check({arrival_keys[i]})) {
          missing.push_back(static_cast<int>(i));
        }
      }
    } catch (const std::exception& inner) {
      throw CommError("rendezvous", env.rank,
                      "the store at " + store_description(env) + " stopped answering after " +
                          std::to_string(ms_since(start)) + " ms (c10d: " + error_text(inner) +
                          ")");
    }
    if (missing.empty()) {
      throw CommError("rendezvous", env.rank,
                      "waiting for the other ranks failed after " +
                          std::to_string(ms_since(start)) + " ms (c10d: " + error_text(e) + ")");
    }
    throw CommError("rendezvous", env.rank,
                    join_ranks(missing) + " of " + std::to_string(arrival_keys.size()) +
                        " did not join within " + std::to_string(ms_since(start)) + " ms (store " +
                        store_description(env) + ")");
  }
}

}  // namespace zinf::zero::detail
