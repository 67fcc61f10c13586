// Communicator: the collectives the ZeRO stages need, on flat buffers (pointer, element
// count, dtype), each asynchronous and returning a Work handle to wait on.
//
// Layouts (world size W, rank r):
//   all_gather(send[count], recv[W * count])   recv[i * count ...] = rank i's send.
//   reduce_scatter(send[W * count], recv[count]) recv = op over ranks of their send[r * count ...].
//   all_reduce(data[count])                      in place.
//   broadcast(data[count], root)                 in place; root's values everywhere.
// `send` and `recv` must not overlap, except that all_gather may be called with `send` equal
// to `recv + rank * count` (in place). Buffers must stay valid and untouched until the Work
// completes. Sums of 16-bit types are computed by the implementation in its own precision
// (see each implementation's header); callers that need fp32 accumulation pass fp32.
//
// Memory: each implementation states where buffers live. The Gloo communicator works on
// host memory (which is also the CPU accelerator's device memory); the NCCL one on CUDA
// device memory.
//
// Ordering: collectives are matched across ranks by the order in which they are issued.
// Every rank must issue the same sequence of collectives (same kinds, counts and dtypes).
// Calls may come from any thread, but the caller must make that sequence deterministic (in
// practice: issue from one thread).
//
// Failures: a peer that died, a connection that broke, or a collective that did not finish
// within the communicator's timeout (`zinf.comm_timeout_s`) throws CommError from wait()
// (or from the issuing call when it fails at once), naming the operation, the rank(s)
// involved when known, and the elapsed time. After a CommError the communicator is broken:
// later calls fail at once with the first error. Nothing here aborts the process.
//
// Thread safety: every method may be called from any thread (see Ordering). A Work may be
// waited for from any one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zinf::zero {

// Element type of a collective's buffers.
enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kFloat64, kInt64 };

[[nodiscard]] std::string_view to_string(DType dtype) noexcept;  // "fp32", "bf16", ...
[[nodiscard]] size_t dtype_size(DType dtype) noexcept;

enum class ReduceOp : uint8_t { kSum, kMax };

[[nodiscard]] std::string_view to_string(ReduceOp op) noexcept;  // "sum", "max"

// A failed or timed-out collective, or a rendezvous that could not complete.
class CommError : public std::runtime_error {
 public:
  CommError(std::string op, int rank, const std::string& message);

  // The collective or step that failed ("all_gather", "rendezvous", ...).
  [[nodiscard]] const std::string& op() const noexcept { return op_; }
  // This process's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }

 private:
  std::string op_;
  int rank_;
};

// One issued collective.
class Work {
 public:
  virtual ~Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the collective has completed (its buffers may then be reused), or throws
  // CommError. Calling it again after success returns at once.
  virtual void wait() = 0;
  // True once wait() would return without blocking (or throw at once).
  [[nodiscard]] virtual bool completed() = 0;

 protected:
  Work() = default;
};

using WorkPtr = std::unique_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  [[nodiscard]] virtual int rank() const noexcept = 0;
  [[nodiscard]] virtual int world_size() const noexcept = 0;
  // "single", "gloo" or "nccl".
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
  // The deadline each collective gets.
  [[nodiscard]] virtual std::chrono::milliseconds timeout() const noexcept = 0;

  [[nodiscard]] virtual WorkPtr all_gather(const void* send, void* recv, size_t count,
                                           DType dtype) = 0;
  [[nodiscard]] virtual WorkPtr reduce_scatter(const void* send, void* recv, size_t count,
                                               DType dtype, ReduceOp op = ReduceOp::kSum) = 0;
  [[nodiscard]] virtual WorkPtr all_reduce(void* data, size_t count, DType dtype,
                                           ReduceOp op = ReduceOp::kSum) = 0;
  [[nodiscard]] virtual WorkPtr broadcast(void* data, size_t count, DType dtype, int root) = 0;
  [[nodiscard]] virtual WorkPtr barrier() = 0;

 protected:
  Communicator() = default;
};

}  // namespace zinf::zero
