// The c10d TCPStore rendezvous the Gloo and NCCL communicators share: opening the store
// (served by rank 0, or by the launcher's agent under its key prefix), describing it in error
// messages, and waiting for every rank's arrival key with an error that names the ranks that
// did not come. Each communicator keeps its own key layout; only the store handling and the
// texts of its errors live here, so both backends fail a rendezvous the same way.
//
// Internal to zinf_comm: this header includes LibTorch's c10d headers, so only
// gloo_communicator.cc and nccl_communicator.cc include it (the public zinf_comm headers stay
// free of LibTorch).
//
// Errors: every CommError thrown here has op "rendezvous" and the rank env.rank, and its
// message names the store (store_description) and the milliseconds since the rendezvous
// started.
//
// Thread safety: the functions are pure or act only on the store passed in; a c10d::Store
// connection is used by one thread at a time (the callers' rule).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "zero/comm/communicator.h"
#include "zero/comm/launch_env.h"

namespace zinf::zero::detail {

// Milliseconds from `start` until now.
[[nodiscard]] int64_t ms_since(std::chrono::steady_clock::time_point start);

// Time left until `deadline`, at least 1 ms (0 means "no timeout" to c10d and Gloo).
[[nodiscard]] std::chrono::milliseconds time_left(std::chrono::steady_clock::time_point deadline);

// The text of an exception, without c10's backtrace for a c10::Error.
[[nodiscard]] std::string error_text(const std::exception& e);

// "rank 2" or "ranks 0, 2" (in the order given).
[[nodiscard]] std::string join_ranks(const std::vector<int>& ranks);

// Throws CommError unless 0 <= env.rank < env.world_size and `timeout` is positive.
void check_rendezvous_args(const LaunchEnv& env, std::chrono::milliseconds timeout);

// "host:port (served by rank 0)", or "host:port (served by the launcher's agent, prefix P)".
[[nodiscard]] std::string store_description(const LaunchEnv& env);

// A connection to env's store at env.master_addr:env.master_port, waiting up to `timeout`
// for it; with `server` this process serves the store (a later server of this process shares
// it: c10d's multiTenant). Under the launcher's agent the keys are under env.store_prefix.
// Throws what c10d throws.
[[nodiscard]] c10::intrusive_ptr<c10d::Store> open_store(const LaunchEnv& env, bool server,
                                                         std::chrono::milliseconds timeout);

// The rendezvous's connection: rank 0 serves the store unless the launcher's agent does.
// Throws CommError ("could not serve the store at ..." / "could not reach the store at ...",
// naming rank 0 when it has not started the store) with c10d's text.
[[nodiscard]] c10::intrusive_ptr<c10d::Store> connect_store(
    const LaunchEnv& env, std::chrono::milliseconds timeout,
    std::chrono::steady_clock::time_point start);

// The CommError for a store call that failed: "<doing> the store at <store> failed after N ms
// (c10d: ...)", e.g. doing = "announcing this rank in".
[[nodiscard]] CommError store_call_failed(const LaunchEnv& env, const std::string& doing,
                                          std::chrono::steady_clock::time_point start,
                                          const std::exception& e);

// Waits until every key of `arrival_keys` (the one of rank i at index i, one per rank) is
// set in `store`, up to `deadline`, polling. Throws CommError naming the ranks whose key is
// missing ("rank 2 of 3 did not join within N ms"), or the ranks still missing when the store
// stopped answering. The rank serving the store publishes its finding under `prefix` and
// keeps serving for up to 2 s until the ranks that arrived have read it; they throw it too.
void wait_for_ranks(c10d::Store& store, const std::vector<std::string>& arrival_keys,
                    const std::string& prefix, const LaunchEnv& env,
                    std::chrono::steady_clock::time_point start,
                    std::chrono::steady_clock::time_point deadline);

}  // namespace zinf::zero::detail
