#include "zero/comm/nccl_communicator.h"

#include <string>

#include "zero/comm/comm_util.h"

#ifdef ZINF_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zero/comm/store_rendezvous.h"
#endif

namespace zinf::zero {

#ifndef ZINF_HAVE_NCCL

namespace {
constexpr const char* kNotBuilt =
    "zinf was built without NCCL (the CUDA toolkit or nccl.h/libnccl was not found when it "
    "was configured, or ZINF_WITH_NCCL=OFF)";
}  // namespace

int nccl_device_count() noexcept { return 0; }
std::string nccl_unavailable_reason() { return kNotBuilt; }

class NcclCommunicator::State {};

NcclCommunicator::NcclCommunicator(const LaunchEnv& env, const CommOptions& /*options*/) {
  throw CommError("make_communicator", env.rank, std::string("backend \"nccl\": ") + kNotBuilt);
}
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::rank() const noexcept { return 0; }
int NcclCommunicator::world_size() const noexcept { return 0; }
int NcclCommunicator::device() const noexcept { return -1; }
std::chrono::milliseconds NcclCommunicator::timeout() const noexcept {
  return std::chrono::milliseconds(0);
}
WorkPtr NcclCommunicator::all_gather(const void*, void*, size_t, DType) {
  throw CommError("all_gather", -1, kNotBuilt);
}
WorkPtr NcclCommunicator::reduce_scatter(const void*, void*, size_t, DType, ReduceOp) {
  throw CommError("reduce_scatter", -1, kNotBuilt);
}
WorkPtr NcclCommunicator::all_reduce(void*, size_t, DType, ReduceOp) {
  throw CommError("all_reduce", -1, kNotBuilt);
}
WorkPtr NcclCommunicator::broadcast(void*, size_t, DType, int) {
  throw CommError("broadcast", -1, kNotBuilt);
}
WorkPtr NcclCommunicator::barrier() { throw CommError("barrier", -1, kNotBuilt); }

#else  // ZINF_HAVE_NCCL

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Communicators made by this process so far: all ranks make theirs in the same order, so the
// n-th one of every rank shares the key prefix "zinf/nccl<n>/" in the store.
std::atomic<int> g_communicator_count{0};

using detail::ms_since;

std::string cuda_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

std::string nccl_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return text;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;  // unreachable: dtypes are checked before a collective is issued
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

// Between polls of an event or of NCCL's state: yield at first, then sleep up to 1 ms.
void backoff(int polls) {
  if (polls < 64) {
    std::this_thread::yield();
  } else if (polls < 1024) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  } else {
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// A CUDA event recorded after one collective; shared by its Work and the in-flight list.
class Event {
 public:
  explicit Event(int device) : device_(device) {}
  ~Event() {
    if (event_ != nullptr) {
      cudaSetDevice(device_);
      cudaEventDestroy(event_);
    }
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaError_t create() { return cudaEventCreateWithFlags(&event_, cudaEventDisableTiming); }
  cudaEvent_t get() const { return event_; }

 private:
  const int device_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

int nccl_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    return 0;
  }
  return count;
}

std::string nccl_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    return "no usable CUDA device: cudaGetDeviceCount failed: " + cuda_text(status);
  }
  if (count == 0) {
    return "no CUDA device (cudaGetDeviceCount returned 0)";
  }
  return {};
}

class NcclCommunicator::State : public std::enable_shared_from_this<NcclCommunicator::State> {
 public:
  State(const LaunchEnv& env, const CommOptions& options)
      : rank_(env.rank),
        world_(env.world_size),
        device_(options.cuda_device >= 0 ? options.cuda_device : env.local_rank),
        timeout_(options.timeout),
        env_(env) {}
  ~State();
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Device check, rendezvous and NCCL initialisation; on a throw the destructor cleans up.
  void init();

  // Issues `call` on the stream (under the mutex); an error breaks the communicator.
  WorkPtr issue(const std::string& name, const std::string& what,
                const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call);

  // Waits for the issued collectives, then finalises the NCCL communicator (or aborts it).
  void shutdown() noexcept;

  // Work::wait's one poll: true when done; throws CommError (and breaks the communicator)
  // on an error or when `deadline` has passed.
  bool poll(const std::string& name, const std::string& what, uint64_t seq,
            Clock::time_point issued, const Event& event);
  // Work::completed: whether poll() would return true or throw at once.
  bool ready(uint64_t seq, Clock::time_point issued, const Event& event);

  float* barrier_buffer() const { return barrier_; }

  const int rank_;
  const int world_;
  const int device_;
  const milliseconds timeout_;

 private:
  void check_device();
  ncclUniqueId rendezvous(Clock::time_point start, Clock::time_point deadline);
  // Polls ncclCommGetAsyncError while it answers ncclInProgress, up to `deadline`.
  ncclResult_t settle_locked(Clock::time_point deadline);
  // Moves the completed front of inflight_ into completed_through_.
  void drain_locked();
  // Aborts the NCCL communicator, marks the communicator broken and returns the error.
  CommError fail_locked(const std::string& name, const std::string& what, uint64_t seq,
                        Clock::time_point issued, const std::string& reason);
  void abort_locked() noexcept;

  LaunchEnv env_;
  c10::intrusive_ptr<c10d::Store> store_;  // kept for the communicator's lifetime

  std::mutex mutex_;  // guards everything below and every call on comm_
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* barrier_ = nullptr;        // one device element for barrier()
  uint64_t issued_ = 0;             // collectives issued so far (the last one's sequence number)
  uint64_t completed_through_ = 0;  // every collective up to this one is known complete
  std::deque<std::pair<uint64_t, std::shared_ptr<Event> > > inflight_;
  std::string broken_;  // the first failure; empty while healthy
};

namespace {

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> state, std::string name, std::string what,
           uint64_t seq, Clock::time_point issued, std::shared_ptr<Event> event)
      : state_(std::move(state)),
        name_(std::move(name)),
        what_(std::move(what)),
        seq_(seq),
        issued_(issued),
        event_(std::move(event)) {}

  void wait() override {
    if (!done_) {
      try {
        for (int polls = 0; !state_->poll(name_, what_, seq_, issued_, *event_); ++polls) {
          backoff(polls);
        }
      } catch (...) {
        error_ = std::current_exception();
      }
      done_ = true;
    }
    if (error_) {
      std::rethrow_exception(error_);
    }
  }

  bool completed() override { return done_ || state_->ready(seq_, issued_, *event_); }

 private:
  std::shared_ptr<NcclCommunicator::State> state_;
  const std::string name_;
  const std::string what_;
  const uint64_t seq_;
  const Clock::time_point issued_;
  const std::shared_ptr<Event> event_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Set-up and tear-down

void NcclCommunicator::State::check_device() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    throw CommError(
        "make_communicator", rank_,
        "backend \"nccl\" needs a CUDA device: cudaGetDeviceCount failed: " + cuda_text(status));
  }
  if (count == 0) {
    throw CommError("make_communicator", rank_,
                    "backend \"nccl\" needs a CUDA device: cudaGetDeviceCount returned 0");
  }
  if (device_ < 0 || device_ >= count) {
    throw CommError("make_communicator", rank_,
                    "CUDA device " + std::to_string(device_) + " does not exist (" +
                        std::to_string(count) + " device" + (count == 1 ? "" : "s") +
                        "; the device is CommOptions::cuda_device, else the local rank)");
  }
}

ncclUniqueId NcclCommunicator::State::rendezvous(Clock::time_point start,
                                                 Clock::time_point deadline) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) {
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      throw CommError("rendezvous", rank_,
                      std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(result));
    }
  }
  if (world_ == 1) {
    return id;
  }
  const std::string prefix = "zinf/nccl" + std::to_string(g_communicator_count.fetch_add(1)) + "/";
  store_ = detail::connect_store(env_, timeout_, start);
  std::vector<std::string> keys;
  for (int i = 0; i < world_; ++i) {
    keys.push_back(prefix + "arrived/" + std::to_string(i));
  }
  try {
    if (rank_ == 0) {
      // The id is in the store before rank 0's arrival mark, so it can be read once every
      // rank has arrived.
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store_->set(prefix + "id", std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    }
    store_->set(keys[static_cast<size_t>(rank_)], std::vector<uint8_t>{'1'});
  } catch (const std::exception& e) {
    throw detail::store_call_failed(env_, "announcing this rank in", start, e);
  }
  detail::wait_for_ranks(*store_, keys, prefix, env_, start, deadline);
  if (rank_ != 0) {
    std::vector<uint8_t> value;
    try {
      value = store_->get(prefix + "id");
    } catch (const std::exception& e) {
      throw detail::store_call_failed(env_, "reading rank 0's ncclUniqueId from", start, e);
    }
    if (value.size() != sizeof(id)) {
      throw CommError("rendezvous", rank_,
                      "rank 0's ncclUniqueId in the store has " + std::to_string(value.size()) +
                          " bytes, expected " + std::to_string(sizeof(id)) +
                          " (a different NCCL version?)");
    }
    std::memcpy(&id, value.data(), sizeof(id));
  }
  return id;
}

void NcclCommunicator::State::init() {
  detail::check_rendezvous_args(env_, timeout_);
  check_device();
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout_;
  const ncclUniqueId id = rendezvous(start, deadline);

  auto cuda_check = [&](cudaError_t status, const char* call) {
    if (status != cudaSuccess) {
      throw CommError("rendezvous", rank_,
                      std::string(call) + " on device " + std::to_string(device_) +
                          " failed: " + cuda_text(status));
    }
  };
  cuda_check(cudaSetDevice(device_), "cudaSetDevice");
  cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  void* buffer = nullptr;
  cuda_check(cudaMalloc(&buffer, sizeof(float)), "cudaMalloc");
  barrier_ = static_cast<float*>(buffer);
  cuda_check(cudaMemset(barrier_, 0, sizeof(float)), "cudaMemset");

  std::lock_guard<std::mutex> lock(mutex_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with our deadline
  ncclResult_t result = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
  if (result == ncclInProgress || (result == ncclSuccess && comm_ != nullptr)) {
    result = settle_locked(deadline);
  }
  if (result != ncclSuccess) {
    std::string text = result == ncclInProgress
                           ? "did not complete within the timeout (a rank died or hung)"
                           : "failed: " + nccl_text(result, comm_);
    abort_locked();
    throw CommError("rendezvous", rank_,
                    "ncclCommInitRankConfig (world size " + std::to_string(world_) + ", device " +
                        std::to_string(device_) + ") " + text + " after " +
                        std::to_string(ms_since(start)) + " ms (timeout " +
                        std::to_string(timeout_.count()) + " ms)");
  }
}

NcclCommunicator::State::~State() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_locked();  // only when shutdown() did not run or init() failed
    inflight_.clear();
  }
  if (stream_ != nullptr || barrier_ != nullptr) {
    cudaSetDevice(device_);
  }
  if (stream_ != nullptr) {
    cudaStreamDestroy(stream_);
  }
  if (barrier_ != nullptr) {
    cudaFree(barrier_);
  }
}

void NcclCommunicator::State::shutdown() noexcept {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout_;
  for (int polls = 0;; ++polls) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (comm_ == nullptr) {
        return;  // broken (already aborted) or never made
      }
      cudaSetDevice(device_);
      const cudaError_t status = cudaStreamQuery(stream_);
      if (status == cudaSuccess) {
        break;
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess) {
        async = ncclInternalError;
      }
      if (status != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress) ||
          Clock::now() >= deadline) {
        drain_locked();
        abort_locked();
        broken_ = "the communicator was destroyed while collectives were still running or failed";
        return;
      }
    }
    backoff(polls);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  completed_through_ = issued_;
  inflight_.clear();
  ncclResult_t result = ncclCommFinalize(comm_);
  if (result == ncclInProgress || result == ncclSuccess) {
    result = settle_locked(deadline);
  }
  if (result == ncclSuccess) {
    ncclCommDestroy(comm_);
    comm_ = nullptr;
  } else {
    abort_locked();
  }
  broken_ = "the communicator was destroyed";
}

// ---------------------------------------------------------------------------------------------
// Failure handling

ncclResult_t NcclCommunicator::State::settle_locked(Clock::time_point deadline) {
  for (int polls = 0;; ++polls) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &async);
    if (result != ncclSuccess) {
      return result;
    }
    if (async != ncclInProgress || Clock::now() >= deadline) {
      return async;
    }
    backoff(polls);
  }
}

void NcclCommunicator::State::drain_locked() {
  while (!inflight_.empty()) {
    if (cudaEventQuery(inflight_.front().second->get()) != cudaSuccess) {
      return;
    }
    completed_through_ = inflight_.front().first;
    inflight_.pop_front();
  }
}

void NcclCommunicator::State::abort_locked() noexcept {
  if (comm_ != nullptr) {
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

CommError NcclCommunicator::State::fail_locked(const std::string& name, const std::string& what,
                                               uint64_t seq, Clock::time_point issued,
                                               const std::string& reason) {
  drain_locked();
  abort_locked();
  const std::string message = what + " (collective #" + std::to_string(seq) + ") failed after " +
                              std::to_string(ms_since(issued)) + " ms (timeout " +
                              std::to_string(timeout_.count()) + " ms; world size " +
                              std::to_string(world_) + ", CUDA device " + std::to_string(device_) +
                              "): " + reason + "; the NCCL communicator was aborted";
  broken_ = name + " on rank " + std::to_string(rank_) + ": " + message;
  return CommError(name, rank_, message);
}

// ---------------------------------------------------------------------------------------------
// Issue and wait

WorkPtr NcclCommunicator::State::issue(
    const std::string& name, const std::string& what,
    const std::function<ncclResult_t(ncclComm_t, cudaStream_t)>& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) {
    throw CommError(
        name, rank_,
        what + " refused: the communicator is broken by an earlier failure (" + broken_ + ")");
  }
  const uint64_t seq = ++issued_;
  const Clock::time_point issued = Clock::now();
  cudaError_t status = cudaSetDevice(device_);
  if (status != cudaSuccess) {
    throw fail_locked(name, what, seq, issued, "cudaSetDevice: " + cuda_text(status));
  }
  ncclResult_t result = call(comm_, stream_);
  if (result == ncclInProgress) {
    result = settle_locked(issued + timeout_);
  }
  if (result != ncclSuccess) {
    throw fail_locked(name, what, seq, issued,
                      result == ncclInProgress
                          ? std::string("NCCL did not finish enqueueing it within the timeout")
                          : "nccl: " + nccl_text(result, comm_));
  }
  auto event = std::make_shared<Event>(device_);
  status = event->create();
  if (status == cudaSuccess) {
    status = cudaEventRecord(event->get(), stream_);
  }
  if (status != cudaSuccess) {
    throw fail_locked(name, what, seq, issued, "recording its CUDA event: " + cuda_text(status));
  }
  drain_locked();
  inflight_.emplace_back(seq, event);
  return std::make_unique<NcclWork>(shared_from_this(), name, what, seq, issued, std::move(event));
}

bool NcclCommunicator::State::poll(const std::string& name, const std::string& what, uint64_t seq,
                                   Clock::time_point issued, const Event& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) {
    // The stream's later events are meaningless once the communicator was aborted.
    if (seq <= completed_through_) {
      return true;
    }
    throw CommError(name, rank_,
                    what + " did not complete: the communicator is broken by an earlier failure (" +
                        broken_ + ")");
  }
  cudaSetDevice(device_);
  const cudaError_t status = cudaEventQuery(event.get());
  if (status == cudaSuccess) {
    return true;
  }
  if (status != cudaErrorNotReady) {
    throw fail_locked(name, what, seq, issued, "cudaEventQuery: " + cuda_text(status));
  }
  ncclResult_t async = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &async);
  if (result != ncclSuccess) {
    async = result;
  }
  if (async != ncclSuccess && async != ncclInProgress) {
    throw fail_locked(name, what, seq, issued, "NCCL reported " + nccl_text(async, comm_));
  }
  if (Clock::now() >= issued + timeout_) {
    throw fail_locked(name, what, seq, issued,
                      "it did not complete within the timeout (a peer died, hung, or has not "
                      "issued the same collective)");
  }
  return false;
}

bool NcclCommunicator::State::ready(uint64_t seq, Clock::time_point issued, const Event& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty() || seq <= completed_through_ || Clock::now() >= issued + timeout_) {
    return true;
  }
  cudaSetDevice(device_);
  if (cudaEventQuery(event.get()) != cudaErrorNotReady) {
    return true;
  }
  ncclResult_t async = ncclSuccess;
  return ncclCommGetAsyncError(comm_, &async) != ncclSuccess ||
         (async != ncclSuccess && async != ncclInProgress);
}

// ---------------------------------------------------------------------------------------------
// Public interface

NcclCommunicator::NcclCommunicator(const LaunchEnv& env, const CommOptions& options)
    : state_(std::make_shared<State>(env, options)) {
  state_->init();
}

NcclCommunicator::~NcclCommunicator() { state_->shutdown(); }

int NcclCommunicator::rank() const noexcept { return state_->rank_; }
int NcclCommunicator::world_size() const noexcept { return state_->world_; }
int NcclCommunicator::device() const noexcept { return state_->device_; }
std::chrono::milliseconds NcclCommunicator::timeout() const noexcept { return state_->timeout_; }

WorkPtr NcclCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  detail::check_all_gather(send, recv, count, dtype, state_->rank_, state_->world_);
  if (count == 0) {
    return detail::completed_work();
  }
  return state_->issue("all_gather", detail::describe("all_gather", count, dtype),
                       [=](ncclComm_t comm, cudaStream_t stream) {
                         return ncclAllGather(send, recv, count, nccl_type(dtype), comm, stream);
                       });
}

WorkPtr NcclCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op) {
  detail::check_reduce_scatter(send, recv, count, dtype, op, state_->rank_, state_->world_);
  if (count == 0) {
    return detail::completed_work();
  }
  return state_->issue(
      "reduce_scatter", detail::describe("reduce_scatter", count, dtype, to_string(op)),
      [=](ncclComm_t comm, cudaStream_t stream) {
        return ncclReduceScatter(send, recv, count, nccl_type(dtype), nccl_op(op), comm, stream);
      });
}

WorkPtr NcclCommunicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  detail::check_all_reduce(data, count, dtype, op, state_->rank_);
  if (count == 0) {
    return detail::completed_work();
  }
  return state_->issue("all_reduce", detail::describe("all_reduce", count, dtype, to_string(op)),
                       [=](ncclComm_t comm, cudaStream_t stream) {
                         return ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op),
                                              comm, stream);
                       });
}

WorkPtr NcclCommunicator::broadcast(void* data, size_t count, DType dtype, int root) {
  detail::check_broadcast(data, count, dtype, root, state_->rank_, state_->world_);
  if (count == 0) {
    return detail::completed_work();
  }
  return state_->issue(
      "broadcast",
      detail::describe("broadcast", count, dtype) + " from rank " + std::to_string(root),
      [=](ncclComm_t comm, cudaStream_t stream) {
        return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm, stream);
      });
}

WorkPtr NcclCommunicator::barrier() {
  float* buffer = state_->barrier_buffer();
  return state_->issue("barrier", "barrier", [buffer](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, comm, stream);
  });
}

#endif  // ZINF_HAVE_NCCL

}  // namespace zinf::zero
