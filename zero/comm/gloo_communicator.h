// GlooCommunicator: the Communicator of several processes on host memory, through LibTorch's
// c10d::ProcessGroupGloo, plus ring collectives of our own on its point-to-point send and
// recv for what this Gloo lacks or does slowly. Buffers are the caller's host memory (also
// the CPU accelerator's device memory); c10d sees them as at::from_blob tensors, never as
// copies.
//
// Rendezvous: a c10d::TCPStore at env.master_addr:env.master_port. Rank 0 serves it, unless
// the launcher's agent already does (env.agent_store, torchrun's static rendezvous): then
// every rank connects as a client under env.store_prefix. Every rank announces itself in the
// store and waits for the others; after options.timeout the constructor throws CommError
// ("rendezvous") naming the ranks that did not join, or, when the store itself cannot be
// reached, its address and the rank meant to serve it. Several communicators per process
// are fine (each one's keys carry its own sequence number; rank 0's store server is shared).
//
// Collectives, and how each is made (world size W, count elements per rank):
//   all_reduce (sum, max)  c10d allreduce on a from_blob tensor over `data`, in place. bf16
//                          (which this c10d does not reduce) goes through the ring below
//                          (ring reduce-scatter + ring all-gather, uneven chunks allowed).
//   broadcast, barrier     c10d broadcast / barrier.
//   all_gather             options.gloo_all_gather: kC10d is c10d allgather into W narrow()
//                          views of `recv` (c10d stages one flat copy of the result); kRing is a
//                          ring on c10d send/recv that moves bytes straight into
//                          `recv` (W-1 steps, nothing staged). kAuto = kRing (figures below).
//                          c10d's Gloo moves no bf16: bf16 goes through c10d as fp16 bits.
//   reduce_scatter         options.gloo_reduce_scatter: kRing is a ring reduce-scatter on
//                          c10d send/recv, (W-1)/W of the data sent per rank, two chunk-sized
//                          staging buffers; kAllReduce copies `send`, c10d-all_reduces the copy
//                          and keeps this rank's slice (twice the traffic, W*count staged).
//                          kAuto = kRing for both, from the figures below.
//
// Measured (median ms per call, fp32, count elements per rank, loopback, every rank on one
// 2-core machine under a load average of about 8; two runs, 5 and 9 reps; counts of 4K-64K
// are noise-dominated and flip between runs, so only the larger ones are listed):
// clang-format off
//   W  count  reduce_scatter: ring | all_reduce+slice    all_gather: ring | c10d
//   2  1M                  6.6, 9.6 | 15.4, 15.7                  6.1, 6.0 | 5.7, 10.9
//   2  4M                47.9, 63.5 | 158.2, 176.8              35.6, 54.3 | 81.0, 127.7
//   3  1M               22.5, 27.8 | 35.0, 36.3               12.5, 14.6 | 18.2, 22.1
//   3  4M               79.9, 87.9 | 261.6, 282.5             58.3, 60.4 | 217.4, 266.0
// clang-format on
// Those two runs were of the ring on a Gloo context of its own. On c10d's send/recv (one
// run, 5 reps, load average about 4, Debian's LibTorch 1.13), ring | c10d-based: W=2 1M
// reduce_scatter 12.6 | 21.6, all_gather 6.7 | 9.4; 4M 38.6 | 119.0, 27.2 | 86.5; W=3 1M
// 25.5 | 46.6, 16.3 | 32.1; 4M 81.4 | 303.9, 73.9 | 202.8: about the same, and still the
// faster of each pair.
// The ring reduce-scatter sends half the bytes of all_reduce+slice and stages two chunks
// instead of a full copy; the ring all_gather skips c10d's staged flat copy. Reproduce:
//   comm_gloo_test --gtest_also_run_disabled_tests --gtest_filter='GlooBench.*'
// (ZINF_BENCH_REPS=n sets the repetitions).
//
// Reductions of bf16 and fp16 on the ring are done per element in fp32 and rounded back
// once per ring step (W-1 roundings); c10d reduces fp16 in fp16. fp32, fp64 and int64 are
// exact as their own type's arithmetic.
//
// Asynchrony: every collective is queued to one worker thread per communicator, which runs
// them one at a time in issue order (so c10d and ring collectives can never interleave
// differently on different ranks) and completes each Work. Nothing runs on the caller's
// thread except argument checks (detail::check_*), which throw CommError at once and leave
// the communicator usable.
//
// No hang: each collective has options.timeout from the moment it starts running (c10d's
// group timeout and our ring's per-step waits both get the time left; the c10d group's Gloo
// contexts are given the whole timeout once connected, since LibTorch 1.13's Gloo collectives
// wait on the context's timeout and ignore the per-call one). Every rank also runs a heartbeat
// thread that writes "<beat> <collectives started>" to the store every heartbeat_interval.
// When a collective fails, the failing rank names in its CommError: the ranks whose heartbeat
// stopped (dead, hung, or cut off from the network), the ranks that had not reached this
// collective, the ranks that reported a failure of their own, or the store being unreachable
// (then the rank serving it is named: "has failed" when its connection closed, "has stopped,
// or the network between this rank and it is down" when it did not answer). After a wait to
// the deadline the heartbeats seen during the wait already name a peer silent for 2.5
// intervals, so the error comes at the timeout itself (measured on 10.213.0.x veths in network
// namespaces, a rank's link taken down mid-all_reduce, timeout 4 s: the others' CommError
// 3.98-3.99 s after the link went down; tests/comm/netns_fault_test.cc). Otherwise (a peer's
// socket closed early) it watches the heartbeats for about four more intervals first. The
// message also carries the collective ("all_reduce of 1000 fp32 elements (sum)"), its
// sequence number, the elapsed time and Gloo's own text. The failing rank reports its failure
// in the store for the others, unless the store is what it lost. After a CommError the
// communicator is broken: queued and later collectives fail at once with the first error.
//
// Thread safety: every public method may be called from any thread (collectives are
// matched by issue order; see communicator.h). The destructor waits for queued collectives
// to finish or fail, then stops the threads; it must not race with other calls.
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "zero/comm/comm_options.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launch_env.h"

namespace zinf::zero {

class GlooCommunicator final : public Communicator {
 public:
  // Performs the rendezvous (see above); throws CommError on failure or timeout.
  GlooCommunicator(const LaunchEnv& env, const CommOptions& options);
  ~GlooCommunicator() override;

  [[nodiscard]] int rank() const noexcept override;
  [[nodiscard]] int world_size() const noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "gloo"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override;

  [[nodiscard]] WorkPtr all_gather(const void* send, void* recv, size_t count,
                                   DType dtype) override;
  [[nodiscard]] WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                       ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr all_reduce(void* data, size_t count, DType dtype,
                                   ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override;
  [[nodiscard]] WorkPtr barrier() override;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf::zero
