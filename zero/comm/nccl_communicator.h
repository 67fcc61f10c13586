// NcclCommunicator: the Communicator of several processes on CUDA device memory, through
// NCCL's C API (the Debian LibTorch is a CPU build, so NCCL does not go through LibTorch).
// Built into zinf_comm when the CUDA toolkit and NCCL are found (ZINF_HAVE_NCCL); this header
// is always usable: without NCCL the constructor throws CommError and nccl_device_count()
// answers 0.
//
// Device: options.cuda_device, or env.local_rank when that is -1; the constructor checks it
// exists before anything else (no device: CommError naming the CUDA error text). Every call
// sets that device on the calling thread first.
//
// Rendezvous: rank 0 makes the ncclUniqueId (ncclGetUniqueId) and shares it through a
// c10d::TCPStore at env.master_addr:env.master_port, opened as the Gloo communicator opens
// its store (rank 0 serves it, or every rank connects to the launcher's agent store under
// env.store_prefix; the server is shared with other communicators of the process). Every
// rank announces itself and waits for the others; after options.timeout the constructor
// throws CommError ("rendezvous") naming the ranks that did not join. The store stays open
// for the communicator's lifetime. A world of one needs no store. The NCCL communicator is
// then made non-blocking (ncclConfig_t::blocking = 0) and its initialisation is polled with
// the time left; on timeout or error it is aborted (ncclCommAbort) and CommError thrown.
//
// Collectives (world size W, count elements per rank): all_gather = ncclAllGather,
// reduce_scatter = ncclReduceScatter, all_reduce = ncclAllReduce (sum, max), broadcast =
// ncclBroadcast (in place), barrier = an all_reduce (sum) of one fp32 element in a device
// buffer of the communicator. Dtypes map to ncclFloat32, ncclBfloat16, ncclFloat16,
// ncclFloat64 and ncclInt64; NCCL reduces 16-bit types in its own kernels (fp32
// accumulation within a step, rounded to the type between steps). Each collective is
// enqueued, in issue order, on one CUDA stream of the communicator (non-blocking w.r.t. the
// legacy default stream), and an event is recorded after it. The caller must make its data
// ready before issuing (e.g. synchronize the stream that wrote it): the communicator's
// stream does not wait for other streams. Zero-element collectives complete at once.
//
// Work::wait() polls the collective's event and ncclCommGetAsyncError (yielding, then
// sleeping up to 1 ms between polls) until the event completes, NCCL reports an error, or
// options.timeout has passed since the collective was issued. On error or timeout it calls
// ncclCommAbort (which also ends every other collective in flight) and throws CommError
// naming the collective, this rank, the world size, the device, the elapsed time and NCCL's
// error text; the communicator is then broken: pending and later collectives fail at once
// with the first error. NCCL does not say which peer failed; a peer that died or never
// issued the collective shows as a timeout (or as NCCL's remote error when its transport
// notices).
//
// Thread safety: every public method may be called from any thread (issue calls are
// serialised by a mutex; collectives are matched by issue order, see communicator.h). A Work
// may be waited for from any one thread, and may outlive the communicator. The destructor
// waits (up to options.timeout) for the issued collectives, then finalises and destroys the
// NCCL communicator, or aborts it when they fail or time out; it never throws and must not
// race with other calls.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "zero/comm/comm_options.h"
#include "zero/comm/communicator.h"
#include "zero/comm/launch_env.h"

namespace zinf::zero {

// CUDA devices usable by the NCCL communicator; 0 when there is none, the CUDA runtime fails
// to start, or zinf was built without NCCL. Never throws.
[[nodiscard]] int nccl_device_count() noexcept;

// Why the NCCL communicator cannot run here (for test skips and errors): "zinf was built
// without NCCL", the CUDA runtime's error text, or "no CUDA device"; empty when it can.
[[nodiscard]] std::string nccl_unavailable_reason();

class NcclCommunicator final : public Communicator {
 public:
  // Checks the device, then performs the rendezvous (see above); throws CommError on
  // failure or timeout, and always when zinf was built without NCCL.
  NcclCommunicator(const LaunchEnv& env, const CommOptions& options);
  ~NcclCommunicator() override;

  [[nodiscard]] int rank() const noexcept override;
  [[nodiscard]] int world_size() const noexcept override;
  [[nodiscard]] std::string_view backend() const noexcept override { return "nccl"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept override;
  // The CUDA device this communicator runs on.
  [[nodiscard]] int device() const noexcept;

  [[nodiscard]] WorkPtr all_gather(const void* send, void* recv, size_t count,
                                   DType dtype) override;
  [[nodiscard]] WorkPtr reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                       ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr all_reduce(void* data, size_t count, DType dtype,
                                   ReduceOp op = ReduceOp::kSum) override;
  [[nodiscard]] WorkPtr broadcast(void* data, size_t count, DType dtype, int root) override;
  [[nodiscard]] WorkPtr barrier() override;

  class State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace zinf::zero
