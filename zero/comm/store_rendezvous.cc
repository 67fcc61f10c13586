#include "zero/comm/store_rendezvous.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <future>
#include <memory>
#include <optional>
#include <thread>
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

// How long one store call may go unanswered: a store answers in milliseconds, even while
// ranks are missing, so one that has not in 30 s (or by the rendezvous deadline, if that
// comes first; at least half a second) is not going to.
Clock::time_point answer_deadline(Clock::time_point deadline) {
  const Clock::time_point now = Clock::now();
  return std::max(std::min(deadline, now + std::chrono::seconds(30)), now + milliseconds(500));
}

// The error for a store that accepted the connection and never answered.
CommError silent_store(const LaunchEnv& env, Clock::time_point start) {
  return CommError(
      "rendezvous", env.rank,
      "the store at " + store_description(env) + " accepted this rank but did not answer a " +
          "call (" + std::to_string(ms_since(start)) +
          " ms into the rendezvous): is it served by a launcher of another torch version? " +
          "(torchrun of torch 2.x serves a store that LibTorch 1.13 cannot talk to, and the " +
          "other way round: launch with the torchrun of the LibTorch zinf was built with, or " +
          "give each rank RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)");
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
    // LibTorch 2.x's client pings the store in its constructor and waits for the answer
    // without a limit: made on a thread of its own (left behind when no answer comes), as
    // wait_for_ranks() makes its calls. It may take the whole timeout to connect (rank 0
    // starting late), and then fails on its own: it is given 5 s more than that.
    auto made = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
    std::future<c10::intrusive_ptr<c10d::Store>> result = made->get_future();
    std::thread([made, env, server, timeout]() {
      try {
        made->set_value(open_store(env, server, timeout));
      } catch (...) {
        made->set_exception(std::current_exception());
      }
    }).detach();
    if (result.wait_until(start + timeout + std::chrono::seconds(5)) != std::future_status::ready) {
      throw silent_store(env, start);
    }
    return result.get();
  } catch (const CommError&) {
    throw;
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

namespace {

// Which ranks' arrival keys are missing (one store call per key).
std::vector<int> missing_ranks(c10d::Store& store, const std::vector<std::string>& arrival_keys) {
  std::vector<int> missing;
  for (size_t i = 0; i < arrival_keys.size(); ++i) {
    if (!store.check({arrival_keys[i]})) {
      missing.push_back(static_cast<int>(i));
    }
  }
  return missing;
}

// store.check(keys), waiting for its answer at most until `deadline`; nullopt when none came.
// A store that accepted the connection but never answers blocks a call in recv() for good
// (seen: zinf on Debian's LibTorch 1.13 under the torchrun of PyPI's torch 2.x, whose agent
// serves a store of another protocol). The call runs on a thread of its own, which keeps the
// store alive and is left behind when no answer comes: the caller fails the rendezvous.
std::optional<bool> check_within(c10d::Store& store, const std::vector<std::string>& keys,
                                 Clock::time_point deadline) {
  auto answer = std::make_shared<std::promise<bool>>();
  std::future<bool> result = answer->get_future();
  std::thread([answer, keys,
               owner = c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(&store)]() {
    try {
      answer->set_value(owner->check(keys));
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_until(deadline) != std::future_status::ready) return std::nullopt;
  return result.get();
}

}  // namespace

void wait_for_ranks(c10d::Store& store, const std::vector<std::string>& arrival_keys,
                    const std::string& prefix, const LaunchEnv& env, Clock::time_point start,
                    Clock::time_point deadline) {
  // Polled rather than one store.wait: the ranks that were missing when the store last
  // answered are known if it goes, and a failure found by the store's host reaches the others
  // before the host exits and takes the store with it.
  const bool serves_store = !env.agent_store && env.rank == 0;
  const std::string failure_key = prefix + "rendezvous_failed";
  const std::string ack_key = prefix + "rendezvous_failed_read";
  const size_t world = arrival_keys.size();
  std::vector<int> missing;
  for (size_t i = 0; i < world; ++i) {
    missing.push_back(static_cast<int>(i));
  }
  milliseconds pause(5);
  for (;;) {
    try {
      // The first call of each round is the one a silent store would hang.
      const std::optional<bool> all_arrived =
          check_within(store, arrival_keys, answer_deadline(deadline));
      if (!all_arrived) throw silent_store(env, start);
      if (*all_arrived) {
        return;
      }
      missing = missing_ranks(store, arrival_keys);
      if (missing.empty()) {
        return;
      }
      if (!serves_store && store.check({failure_key})) {
        const std::vector<uint8_t> text = store.get(failure_key);
        store.add(ack_key, 1);
        throw CommError("rendezvous", env.rank,
                        std::string(text.begin(), text.end()) + " (found by rank 0, which serves " +
                            "the store; this rank waited " + std::to_string(ms_since(start)) +
                            " ms)");
      }
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError("rendezvous", env.rank,
                      join_ranks(missing) + " of " + std::to_string(world) +
                          " had not joined when the store at " + store_description(env) +
                          " stopped answering after " + std::to_string(ms_since(start)) +
                          " ms (c10d: " + error_text(e) + ")");
    }
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      break;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, milliseconds(100));
  }
  const std::string message = join_ranks(missing) + " of " + std::to_string(world) +
                              " did not join within " + std::to_string(ms_since(start)) +
                              " ms (store " + store_description(env) + ")";
  if (serves_store) {
    // Publish the finding and keep serving the store until every rank that did arrive has
    // read it (at most 2 s), so they report the missing ranks rather than a lost store.
    try {
      store.set(failure_key, std::vector<uint8_t>(message.begin(), message.end()));
      const int64_t readers = static_cast<int64_t>(world - missing.size()) - 1;
      const Clock::time_point linger = Clock::now() + std::chrono::seconds(2);
      while (store.add(ack_key, 0) < readers && Clock::now() < linger) {
        std::this_thread::sleep_for(milliseconds(10));
      }
    } catch (const std::exception&) {
      // Best effort: the error below is this rank's own finding either way.
    }
  }
  throw CommError("rendezvous", env.rank, message);
}

}  // namespace zinf::zero::detail
