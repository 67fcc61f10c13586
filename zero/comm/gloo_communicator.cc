// GlooCommunicator's implementation (zero/comm/gloo_communicator.h). One file over 800 lines
// because it is one object: the worker thread that runs the collectives, the heartbeat that
// watches the peers, and the diagnosis that names a dead or silent rank share the Impl's
// state (the store, the collectives' sequence numbers, the deadlines).
#include "zero/comm/gloo_communicator.h"

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/api/include/torch/version.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <utility>
#include <vector>

#include "zero/comm/comm_util.h"
#include "zero/comm/store_rendezvous.h"
#include "zero/comm/torch_dtype.h"

namespace zinf::zero {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Communicators made by this process so far: all ranks make theirs in the same order, so the
// n-th one of every rank shares the key prefix "zinf/comm<n>/" in the store.
std::atomic<int> g_communicator_count{0};

using detail::error_text;
using detail::join_ranks;
using detail::ms_since;
using detail::scalar_type;
using detail::store_description;
using detail::time_left;

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// c10d's Gloo moves bf16 nowhere ("Invalid scalar type"): collectives that only move bytes
// (all_gather, broadcast) see bf16 as fp16, the same width; nothing is converted.
DType moved_as(DType dtype) { return dtype == DType::kBFloat16 ? DType::kFloat16 : dtype; }

at::Tensor host_tensor(const void* data, size_t count, DType dtype) {
  // c10d only reads an input tensor; the const_cast is for from_blob's signature.
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(scalar_type(dtype)).device(at::kCPU));
}

// `bytes` bytes at `data` as a uint8 tensor (what the ring's point-to-point steps move).
at::Tensor byte_tensor(const void* data, size_t bytes) {
  return at::from_blob(const_cast<void*>(data), {static_cast<int64_t>(bytes)},
                       at::TensorOptions().dtype(at::kByte).device(at::kCPU));
}

// out[i] = a[i] op b[i]; `out` may alias `a` or `b` (element by element).
template <typename T>
void combine_exact(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < n; ++i) {
      o[i] = x[i] + y[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      o[i] = x[i] < y[i] ? y[i] : x[i];
    }
  }
}

// 16-bit floats: computed in fp32, rounded back to T (round to nearest even).
template <typename T>
void combine_widened(void* out, const void* a, const void* b, size_t n, ReduceOp op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    const float fx = static_cast<float>(x[i]);
    const float fy = static_cast<float>(y[i]);
    o[i] = static_cast<T>(op == ReduceOp::kSum ? fx + fy : (fx < fy ? fy : fx));
  }
}

void combine(void* out, const void* a, const void* b, size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32:
      return combine_exact<float>(out, a, b, n, op);
    case DType::kFloat64:
      return combine_exact<double>(out, a, b, n, op);
    case DType::kInt64:
      return combine_exact<int64_t>(out, a, b, n, op);
    case DType::kBFloat16:
      return combine_widened<c10::BFloat16>(out, a, b, n, op);
    case DType::kFloat16:
      return combine_widened<c10::Half>(out, a, b, n, op);
  }
}

// Element ranges of a flat buffer owned by each rank in a ring collective.
struct Chunks {
  std::vector<size_t> offset;  // elements
  std::vector<size_t> length;  // elements
  size_t max_length = 0;
};

// `count` elements for each of `world` ranks, back to back.
Chunks equal_chunks(size_t count, int world) {
  Chunks c;
  for (int i = 0; i < world; ++i) {
    c.offset.push_back(static_cast<size_t>(i) * count);
    c.length.push_back(count);
  }
  c.max_length = count;
  return c;
}

// `total` elements cut into `world` near-equal ranges (the first total % world one longer).
Chunks split_chunks(size_t total, int world) {
  Chunks c;
  const size_t w = static_cast<size_t>(world);
  size_t offset = 0;
  for (size_t i = 0; i < w; ++i) {
    const size_t length = total / w + (i < total % w ? 1 : 0);
    c.offset.push_back(offset);
    c.length.push_back(length);
    c.max_length = std::max(c.max_length, length);
    offset += length;
  }
  return c;
}

int ring_index(int64_t i, int world) { return static_cast<int>(((i % world) + world) % world); }

// Which Gloo this code may look into. Debian's LibTorch 1.13 runs on Debian's libgloo, whose
// headers are the ones compiled here. A pip torch 2.x carries a Gloo of its own inside
// libtorch_cpu.so, of another version: its gloo::Context has no virtual destructor, so every
// member sits 8 bytes from where Debian's headers put it. Against torch 2.x this file touches
// no Gloo object directly (no member access, no inline Gloo code): every byte moves through
// c10d's virtual interface, which torch's own code implements, and the ring below runs on
// c10d's point-to-point calls rather than on a Gloo context of its own.
#if TORCH_VERSION_MAJOR >= 2
// torch 2.x's Gloo collectives and point-to-point waits take the per-call timeout, so the
// group is used as c10d made it, through its base class.
using GlooGroup = c10d::Backend;
#else
// ProcessGroupGloo whose Gloo contexts' timeout can be set once it is connected. Its
// constructor gives the contexts the time the rendezvous has left, and LibTorch 1.13's
// collectives wait on the context's timeout (they ignore the per-call options.timeout), so
// without set_timeout every c10d collective would get options.timeout minus however long the
// rendezvous took (seen: 2.0 s of a 4 s timeout) instead of the whole of it.
class GlooGroup final : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;

  // Call before the first collective (the contexts are not synchronized).
  void set_timeout(milliseconds timeout) {
    for (const std::shared_ptr<gloo::Context>& context : contexts_) {
      context->setTimeout(timeout);
    }
  }
};
#endif

// One issued collective: what the worker runs and how the caller learns the outcome.
struct Task {
  std::string name;  // "all_reduce"
  std::string what;  // "all_reduce of 1000 fp32 elements (sum)"
  std::function<void(Clock::time_point deadline, uint64_t seq)> run;

  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;         // guarded by mutex
  std::exception_ptr error;  // guarded by mutex

  void finish(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      error = std::move(e);
      done = true;
    }
    done_cv.notify_all();
  }
};

class GlooWork final : public Work {
 public:
  explicit GlooWork(std::shared_ptr<Task> task) : task_(std::move(task)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(task_->mutex);
    task_->done_cv.wait(lock, [this] { return task_->done; });
    if (task_->error) {
      std::rethrow_exception(task_->error);
    }
  }

  bool completed() override {
    std::lock_guard<std::mutex> lock(task_->mutex);
    return task_->done;
  }

 private:
  std::shared_ptr<Task> task_;
};

}  // namespace

class GlooCommunicator::Impl {
 public:
  Impl(const LaunchEnv& env, const CommOptions& options);
  ~Impl();

  [[nodiscard]] WorkPtr enqueue(std::string name, std::string what,
                                std::function<void(Clock::time_point, uint64_t)> run);

  // Collective bodies, run on the worker thread.
  void run_all_gather(const void* send, void* recv, size_t count, DType dtype,
                      Clock::time_point deadline, uint64_t seq);
  void run_reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          Clock::time_point deadline, uint64_t seq);
  void run_all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                      Clock::time_point deadline, uint64_t seq);
  void run_broadcast(void* data, size_t count, DType dtype, int root, Clock::time_point deadline);
  void run_barrier(Clock::time_point deadline);

  const int rank_;
  const int world_;
  const milliseconds timeout_;
  const milliseconds heartbeat_interval_;
  const GlooReduceScatter reduce_scatter_algo_;
  const GlooAllGather all_gather_algo_;

 private:
  struct Peer {
    int64_t beat = -1;
    uint64_t started = 0;       // collectives the peer had started
    Clock::time_point changed;  // when `beat` last changed
  };

  void connect(const LaunchEnv& env, const CommOptions& options);
  void worker_loop();
  void heartbeat_loop();
  void heartbeat_round(uint64_t beat);
  void linger_while_peers_need_store();
  std::string diagnose(uint64_t seq, bool timed_out, bool* store_lost);
  std::string verdict(uint64_t seq);  // with heartbeat_mutex_ held
  void wait_c10d(const c10::intrusive_ptr<c10d::Work>& work, Clock::time_point deadline);
  void ring_reduce_scatter(const void* src, void* dst, const Chunks& chunks, DType dtype,
                           ReduceOp op, Clock::time_point deadline, uint64_t seq);
  void ring_all_gather(const void* send, void* recv, const Chunks& chunks, DType dtype,
                       Clock::time_point deadline, uint64_t seq);
  // One ring step: receive `recv_bytes` from the left neighbour into `recv` while sending
  // `send_bytes` from `send` to the right one (either may be empty), and wait for both.
  void ring_step(void* recv, size_t recv_bytes, const void* send, size_t send_bytes,
                 Clock::time_point deadline, uint64_t seq);

  LaunchEnv env_;
  std::string prefix_;                               // "zinf/comm<n>/"
  c10::intrusive_ptr<c10d::Store> store_;            // worker thread only (after construction)
  c10::intrusive_ptr<c10d::Store> heartbeat_store_;  // heartbeat thread only
  c10::intrusive_ptr<GlooGroup> group_;

  std::atomic<uint64_t> started_{0};  // collectives the worker has started

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Task>> queue_;  // guarded by queue_mutex_
  bool stopping_ = false;                    // guarded by queue_mutex_
  std::string broken_;                       // first failure; guarded by queue_mutex_

  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_cv_;
  std::vector<Peer> peers_;       // guarded by heartbeat_mutex_
  uint64_t rounds_ = 0;           // guarded by heartbeat_mutex_
  Clock::time_point last_round_;  // when the last round ended; guarded by heartbeat_mutex_
  std::string store_error_;       // guarded by heartbeat_mutex_
  // The failing round took the heartbeat connection's whole timeout: the store did not answer
  // (rather than closing the connection). Guarded by heartbeat_mutex_.
  bool store_timed_out_ = false;
  milliseconds heartbeat_store_timeout_{0};  // the heartbeat connection's; set in connect()
  int64_t failures_seen_ = 0;                // guarded by heartbeat_mutex_
  std::vector<std::string> reports_;         // per rank; guarded by heartbeat_mutex_
  bool heartbeat_stop_ = false;              // guarded by heartbeat_mutex_

  std::thread worker_;
  std::thread heartbeat_;
};

// ---------------------------------------------------------------------------------------------
// Rendezvous

namespace {

milliseconds pick_heartbeat(const CommOptions& options) {
  if (options.heartbeat_interval.count() > 0) {
    return options.heartbeat_interval;
  }
  return std::clamp(options.timeout / 20, milliseconds(50), milliseconds(1000));
}

std::shared_ptr<gloo::transport::Device> make_device(const LaunchEnv& env,
                                                     const CommOptions& options) {
  if (!options.gloo_interface.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface);
  }
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (is_loopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

std::string key(const std::string& prefix, const char* what, int rank) {
  return prefix + what + std::to_string(rank);
}

}  // namespace

GlooCommunicator::Impl::Impl(const LaunchEnv& env, const CommOptions& options)
    : rank_(env.rank),
      world_(env.world_size),
      timeout_(options.timeout),
      heartbeat_interval_(pick_heartbeat(options)),
      reduce_scatter_algo_(options.gloo_reduce_scatter == GlooReduceScatter::kAuto
                               ? GlooReduceScatter::kRing
                               : options.gloo_reduce_scatter),
      all_gather_algo_(options.gloo_all_gather == GlooAllGather::kAuto ? GlooAllGather::kRing
                                                                       : options.gloo_all_gather),
      env_(env),
      prefix_("zinf/comm" + std::to_string(g_communicator_count.fetch_add(1)) + "/"),
      peers_(static_cast<size_t>(env.world_size)),
      reports_(static_cast<size_t>(env.world_size)) {
  detail::check_rendezvous_args(env, timeout_);
  connect(env, options);
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  try {
    worker_ = std::thread([this] { worker_loop(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(heartbeat_mutex_);
      heartbeat_stop_ = true;
    }
    heartbeat_cv_.notify_all();
    heartbeat_.join();
    throw;
  }
}

void GlooCommunicator::Impl::connect(const LaunchEnv& env, const CommOptions& options) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout_;
  store_ = detail::connect_store(env, timeout_, start);
  try {
    // The heartbeat key exists before the arrival mark, so once every rank has arrived every
    // heartbeat can be read.
    store_->set(key(prefix_, "hb/", rank_), std::vector<uint8_t>{'0', ' ', '0'});
    store_->set(key(prefix_, "arrived/", rank_), std::vector<uint8_t>{'1'});
    // The heartbeat thread's own connection: it never waits behind the worker's store calls.
    heartbeat_store_timeout_ = std::clamp(heartbeat_interval_ * 4, milliseconds(1000), timeout_);
    heartbeat_store_ = detail::open_store(env, false, heartbeat_store_timeout_);
  } catch (const std::exception& e) {
    throw detail::store_call_failed(env, "announcing this rank in", start, e);
  }
  std::vector<std::string> arrival_keys;
  for (int i = 0; i < world_; ++i) {
    arrival_keys.push_back(key(prefix_, "arrived/", i));
  }
  detail::wait_for_ranks(*store_, arrival_keys, prefix_, env, start, deadline);

  try {
    std::shared_ptr<gloo::transport::Device> device = make_device(env, options);
    auto group_options = c10d::ProcessGroupGloo::Options::create(time_left(deadline));
    group_options->devices.push_back(device);
    group_options->threads = 1;  // the worker issues one collective at a time
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix_ + "c10d", store_);
#if TORCH_VERSION_MAJOR >= 2
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank_, world_, group_options);
#else
    group_ = c10::make_intrusive<GlooGroup>(prefixed, rank_, world_, group_options);
    group_->set_timeout(timeout_);
#endif
  } catch (const std::exception& e) {
    throw CommError("rendezvous", rank_,
                    "connecting the Gloo groups failed after " + std::to_string(ms_since(start)) +
                        " ms (store " + store_description(env_) + "; gloo: " + error_text(e) + ")");
  }
}

GlooCommunicator::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) {
    worker_.join();
  }
  if (store_) {
    linger_while_peers_need_store();
  }
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex_);
    heartbeat_stop_ = true;
  }
  heartbeat_cv_.notify_all();
  if (heartbeat_.joinable()) {
    heartbeat_.join();
  }
}

void GlooCommunicator::Impl::linger_while_peers_need_store() {
  // Every rank marks its close; the rank serving the store keeps serving until each peer has
  // closed, reported its own failure or stopped beating. Without this the host's exit after a
  // failure takes the store away while the others are still diagnosing theirs, and they would
  // blame rank 0 rather than the rank that died.
  try {
    store_->set(key(prefix_, "closed/", rank_), std::vector<uint8_t>{'1'});
  } catch (const std::exception&) {
    return;  // the store is gone already
  }
  if (env_.agent_store || rank_ != 0 || world_ == 1) {
    return;
  }
  const Clock::time_point limit = Clock::now() + heartbeat_interval_ * 6 + milliseconds(1000);
  std::vector<bool> done(static_cast<size_t>(world_), false);
  done[static_cast<size_t>(rank_)] = true;
  try {
    while (Clock::now() < limit) {
      bool all = true;
      for (int i = 0; i < world_; ++i) {
        if (done[static_cast<size_t>(i)]) {
          continue;
        }
        bool silent;
        {
          std::lock_guard<std::mutex> lock(heartbeat_mutex_);
          silent =
              Clock::now() - peers_[static_cast<size_t>(i)].changed >= heartbeat_interval_ * 5 / 2;
        }
        done[static_cast<size_t>(i)] = silent || store_->check({key(prefix_, "closed/", i)}) ||
                                       store_->check({key(prefix_, "failed/", i)});
        all = all && done[static_cast<size_t>(i)];
      }
      if (all) {
        return;
      }
      std::this_thread::sleep_for(std::min(heartbeat_interval_ / 4, milliseconds(50)));
    }
  } catch (const std::exception&) {
    // Best effort: closing must not throw.
  }
}

// ---------------------------------------------------------------------------------------------
// Worker and failure diagnosis

WorkPtr GlooCommunicator::Impl::enqueue(std::string name, std::string what,
                                        std::function<void(Clock::time_point, uint64_t)> run) {
  auto task = std::make_shared<Task>();
  task->name = std::move(name);
  task->what = std::move(what);
  task->run = std::move(run);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    if (!broken_.empty()) {
      throw CommError(task->name, rank_,
                      task->what + " refused: the communicator is broken by an earlier failure (" +
                          broken_ + ")");
    }
    queue_.push_back(task);
  }
  queue_cv_.notify_one();
  return std::make_unique<GlooWork>(std::move(task));
}

void GlooCommunicator::Impl::worker_loop() {
  for (;;) {
    std::shared_ptr<Task> task;
    std::string broken;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;  // stopping, and everything queued has run
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_;
    }
    if (!broken.empty()) {
      task->finish(std::make_exception_ptr(
          CommError(task->name, rank_,
                    task->what + " not run: the communicator is broken by an earlier failure (" +
                        broken + ")")));
      continue;
    }
    const uint64_t seq = started_.fetch_add(1) + 1;
    const Clock::time_point start = Clock::now();
    try {
      task->run(start + timeout_, seq);
      task->finish(nullptr);
    } catch (const std::exception& e) {
      const int64_t elapsed = ms_since(start);
      // Gloo gave up at the deadline (rather than on a closed connection). Its waits end within
      // a few ms of the time left they were given; half an interval covers that.
      const bool timed_out = Clock::now() >= start + timeout_ - heartbeat_interval_ / 2;
      bool store_lost = false;
      const std::string diagnosis = diagnose(seq, timed_out, &store_lost);
      std::string message = task->what + " (collective #" + std::to_string(seq) +
                            ") failed after " + std::to_string(elapsed) + " ms (timeout " +
                            std::to_string(timeout_.count()) + " ms): " + diagnosis +
                            "; gloo: " + error_text(e);
      {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        broken_ = task->name + " on rank " + std::to_string(rank_) + ": " + message;
      }
      // Tell the other ranks (best effort), unless the store is known to be gone: a call to a
      // store that does not answer would hold this rank's error back for up to the timeout.
      if (!store_lost) {
        try {
          std::string text = "a failed " + task->what + " (" + diagnosis.substr(0, 200) + ")";
          store_->set(key(prefix_, "failed/", rank_),
                      std::vector<uint8_t>(text.begin(), text.end()));
          store_->add(prefix_ + "failures", 1);
        } catch (const std::exception&) {
        }
      }
      task->finish(std::make_exception_ptr(CommError(task->name, rank_, message)));
    }
  }
}

void GlooCommunicator::Impl::heartbeat_loop() {
  uint64_t beat = 0;
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex_);
    const Clock::time_point now = Clock::now();
    for (Peer& peer : peers_) {
      peer.changed = now;
    }
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(heartbeat_mutex_);
      if (heartbeat_stop_ || !store_error_.empty()) {
        // After a store failure the connection is unusable; wait for the destructor.
        heartbeat_cv_.wait(lock, [this] { return heartbeat_stop_; });
        return;
      }
    }
    const Clock::time_point round_start = Clock::now();
    try {
      heartbeat_round(++beat);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(heartbeat_mutex_);
      store_error_ = error_text(e);
      store_timed_out_ = Clock::now() - round_start >= heartbeat_store_timeout_;
    }
    std::unique_lock<std::mutex> lock(heartbeat_mutex_);
    ++rounds_;
    last_round_ = Clock::now();
    heartbeat_cv_.notify_all();
    heartbeat_cv_.wait_for(lock, heartbeat_interval_, [this] { return heartbeat_stop_; });
  }
}

void GlooCommunicator::Impl::heartbeat_round(uint64_t beat) {
  const std::string mine = std::to_string(beat) + " " + std::to_string(started_.load());
  heartbeat_store_->set(key(prefix_, "hb/", rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::pair<int64_t, uint64_t>> seen(static_cast<size_t>(world_), {-1, 0});
  for (int i = 0; i < world_; ++i) {
    if (i == rank_) {
      continue;
    }
    const std::vector<uint8_t> value = heartbeat_store_->get(key(prefix_, "hb/", i));
    const std::string text(value.begin(), value.end());
    int64_t peer_beat = -1;
    unsigned long long peer_started = 0;
    if (std::sscanf(text.c_str(), "%lld %llu", reinterpret_cast<long long*>(&peer_beat),
                    &peer_started) == 2) {
      seen[static_cast<size_t>(i)] = {peer_beat, static_cast<uint64_t>(peer_started)};
    }
  }
  const int64_t failures = heartbeat_store_->add(prefix_ + "failures", 0);
  std::vector<std::pair<int, std::string>> reports;
  if (failures > 0) {
    bool known;
    {
      std::lock_guard<std::mutex> lock(heartbeat_mutex_);
      known = failures == failures_seen_;
    }
    for (int i = 0; !known && i < world_; ++i) {
      const std::string k = key(prefix_, "failed/", i);
      if (i != rank_ && heartbeat_store_->check({k})) {
        const std::vector<uint8_t> value = heartbeat_store_->get(k);
        reports.emplace_back(i, std::string(value.begin(), value.end()));
      }
    }
  }
  std::lock_guard<std::mutex> lock(heartbeat_mutex_);
  const Clock::time_point now = Clock::now();
  for (int i = 0; i < world_; ++i) {
    Peer& peer = peers_[static_cast<size_t>(i)];
    const auto& [peer_beat, peer_started] = seen[static_cast<size_t>(i)];
    if (peer_beat >= 0 && peer_beat != peer.beat) {
      peer.beat = peer_beat;
      peer.changed = now;
    }
    peer.started = peer_started;
  }
  for (auto& [i, text] : reports) {
    reports_[static_cast<size_t>(i)] = std::move(text);
  }
  failures_seen_ = failures;
}

std::string GlooCommunicator::Impl::diagnose(uint64_t seq, bool timed_out, bool* store_lost) {
  const Clock::time_point since = Clock::now();
  std::unique_lock<std::mutex> lock(heartbeat_mutex_);
  // After a wait to the deadline the heartbeats were watched for the whole of it: when a round
  // ended within the last 1.5 intervals and some peer had been silent for 2.5 intervals by
  // then, that peer stopped long before the deadline and the verdict holds now. Watching more
  // rounds would only hold the error back past the timeout (by about 4 intervals).
  if (timed_out && store_error_.empty() && since - last_round_ <= heartbeat_interval_ * 3 / 2) {
    for (int i = 0; i < world_; ++i) {
      if (i != rank_ &&
          last_round_ - peers_[static_cast<size_t>(i)].changed >= heartbeat_interval_ * 5 / 2) {
        return verdict(seq);
      }
    }
  }
  // Otherwise watch the heartbeats for four more rounds. A live peer's beat was seen to change
  // within about one interval of the end; a dead or stopped one's last change (perhaps seen in
  // the first round, if it beat just before it died) is at least about three intervals old.
  const uint64_t target = rounds_ + 4;
  const bool watched = heartbeat_cv_.wait_for(
      lock, heartbeat_interval_ * 5 + milliseconds(200),
      [&] { return rounds_ >= target || !store_error_.empty() || heartbeat_stop_; });
  // A store that does not answer (a dead host or a cut link) cannot be told from this rank's
  // own network being down; a closed connection means the store's process is gone.
  const std::string host =
      env_.agent_store ? std::string("the launcher's agent") : std::string("rank 0");
  if (!store_error_.empty()) {
    *store_lost = true;
    if (store_timed_out_) {
      return "the rendezvous store at " + store_description(env_) + " did not answer within " +
             std::to_string(heartbeat_store_timeout_.count()) + " ms: " + host +
             " has stopped, or the network between this rank and it is down (c10d: " +
             store_error_ + ")";
    }
    return "the rendezvous store at " + store_description(env_) + " is unreachable" +
           (env_.agent_store ? std::string() : std::string(": rank 0 has failed")) +
           " (c10d: " + store_error_ + ")";
  }
  if (!watched) {
    *store_lost = true;
    return "the rendezvous store at " + store_description(env_) + " stopped answering for " +
           std::to_string(ms_since(since)) + " ms: " + host +
           " has stopped, or the network between this rank and it is down";
  }
  return verdict(seq);
}

std::string GlooCommunicator::Impl::verdict(uint64_t seq) {
  // Silence is judged at the last round (a live peer's beat is at most about two intervals
  // old there), and reported up to now.
  const Clock::time_point now = Clock::now();
  std::vector<std::string> parts;
  std::vector<int> stopped;
  int64_t silent_ms = 0;
  for (int i = 0; i < world_; ++i) {
    const Peer& peer = peers_[static_cast<size_t>(i)];
    if (i != rank_ && last_round_ - peer.changed >= heartbeat_interval_ * 5 / 2) {
      stopped.push_back(i);
      silent_ms = std::max<int64_t>(
          silent_ms, std::chrono::duration_cast<milliseconds>(now - peer.changed).count());
    }
  }
  if (!stopped.empty()) {
    parts.push_back(join_ranks(stopped) + " stopped (no heartbeat for " +
                    std::to_string(silent_ms) + " ms: died, hung or cut off)");
  }
  std::vector<int> behind;
  for (int i = 0; i < world_; ++i) {
    const Peer& peer = peers_[static_cast<size_t>(i)];
    if (i != rank_ && peer.started < seq &&
        std::find(stopped.begin(), stopped.end(), i) == stopped.end()) {
      behind.push_back(i);
    }
  }
  if (!behind.empty()) {
    parts.push_back(join_ranks(behind) + " had not reached this collective");
  }
  for (int i = 0; i < world_; ++i) {
    if (!reports_[static_cast<size_t>(i)].empty()) {
      parts.push_back("rank " + std::to_string(i) + " reported " +
                      reports_[static_cast<size_t>(i)]);
    }
  }
  if (parts.empty()) {
    return "every rank is alive and had reached this collective";
  }
  std::string text;
  for (const std::string& part : parts) {
    text += (text.empty() ? "" : "; ") + part;
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// Collective bodies

void GlooCommunicator::Impl::wait_c10d(const c10::intrusive_ptr<c10d::Work>& work,
                                       Clock::time_point deadline) {
  work->wait(time_left(deadline));
}

void GlooCommunicator::Impl::ring_reduce_scatter(const void* src, void* dst, const Chunks& chunks,
                                                 DType dtype, ReduceOp op,
                                                 Clock::time_point deadline, uint64_t seq) {
  // Step s sends chunk (r-s-1) to the right neighbour (rank r's own data at s = 0, else the
  // partial sum received at step s-1) and receives chunk (r-s-2) from the left one, adding
  // this rank's contribution. After W-1 steps chunk r holds every rank's contribution.
  const size_t element = dtype_size(dtype);
  const char* source = static_cast<const char*>(src);
  std::vector<char> stage[2];
  stage[0].resize(chunks.max_length * element);
  stage[1].resize(chunks.max_length * element);
  for (int s = 0; s + 1 < world_; ++s) {
    const int send_chunk = ring_index(rank_ - s - 1, world_);
    const int recv_chunk = ring_index(rank_ - s - 2, world_);
    const size_t send_bytes = chunks.length[static_cast<size_t>(send_chunk)] * element;
    const size_t recv_bytes = chunks.length[static_cast<size_t>(recv_chunk)] * element;
    const void* send_ptr = s == 0
                               ? source + chunks.offset[static_cast<size_t>(send_chunk)] * element
                               : stage[(s + 1) % 2].data();
    void* recv_ptr = stage[s % 2].data();
    ring_step(recv_ptr, recv_bytes, send_ptr, send_bytes, deadline, seq);
    const size_t n = chunks.length[static_cast<size_t>(recv_chunk)];
    const void* own = source + chunks.offset[static_cast<size_t>(recv_chunk)] * element;
    void* result = s + 2 == world_ ? dst : recv_ptr;
    combine(result, recv_ptr, own, n, dtype, op);
  }
  if (world_ == 1) {
    const size_t n = chunks.length[0];
    std::memmove(dst, source + chunks.offset[0] * element, n * element);
  }
}

void GlooCommunicator::Impl::ring_all_gather(const void* send, void* recv, const Chunks& chunks,
                                             DType dtype, Clock::time_point deadline,
                                             uint64_t seq) {
  // Step s passes chunk (r-s) to the right and receives chunk (r-s-1) from the left, straight
  // into its place in `recv`.
  const size_t element = dtype_size(dtype);
  char* base = static_cast<char*>(recv);
  char* own = base + chunks.offset[static_cast<size_t>(rank_)] * element;
  if (send != nullptr && send != own) {
    std::memcpy(own, send, chunks.length[static_cast<size_t>(rank_)] * element);
  }
  for (int s = 0; s + 1 < world_; ++s) {
    const int send_chunk = ring_index(rank_ - s, world_);
    const int recv_chunk = ring_index(rank_ - s - 1, world_);
    const size_t send_bytes = chunks.length[static_cast<size_t>(send_chunk)] * element;
    const size_t recv_bytes = chunks.length[static_cast<size_t>(recv_chunk)] * element;
    ring_step(base + chunks.offset[static_cast<size_t>(recv_chunk)] * element, recv_bytes,
              base + chunks.offset[static_cast<size_t>(send_chunk)] * element, send_bytes, deadline,
              seq);
  }
}

void GlooCommunicator::Impl::ring_step(void* recv, size_t recv_bytes, const void* send,
                                       size_t send_bytes, Clock::time_point deadline,
                                       uint64_t seq) {
  // c10d's point-to-point calls post an unbound buffer on the group's Gloo context, slot =
  // the tag (c10d's own collectives use slots with a prefix in the high byte, so the two never
  // meet). Ranks issue collectives in the same order, so the sequence number is the same
  // on both sides of every step.
  const int tag = static_cast<int>(seq & 0x7fffffffU);
  const int right = (rank_ + 1) % world_;
  const int left = (rank_ + world_ - 1) % world_;
  c10::intrusive_ptr<c10d::Work> in;
  c10::intrusive_ptr<c10d::Work> out;
  std::vector<at::Tensor> in_tensors;
  std::vector<at::Tensor> out_tensors;
  if (recv_bytes > 0) {
    in_tensors.push_back(byte_tensor(recv, recv_bytes));
    in = group_->recv(in_tensors, left, tag);
  }
  if (send_bytes > 0) {
    out_tensors.push_back(byte_tensor(send, send_bytes));
    out = group_->send(out_tensors, right, tag);
  }
  if (in) {
    wait_c10d(in, deadline);
  }
  if (out) {
    wait_c10d(out, deadline);
  }
}

void GlooCommunicator::Impl::run_all_gather(const void* send, void* recv, size_t count, DType dtype,
                                            Clock::time_point deadline, uint64_t seq) {
  if (all_gather_algo_ == GlooAllGather::kRing) {
    ring_all_gather(send, recv, equal_chunks(count, world_), dtype, deadline, seq);
    return;
  }
  at::Tensor flat = host_tensor(recv, count * static_cast<size_t>(world_), moved_as(dtype));
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int i = 0; i < world_; ++i) {
    outputs[0].push_back(
        flat.narrow(0, static_cast<int64_t>(count) * i, static_cast<int64_t>(count)));
  }
  std::vector<at::Tensor> inputs{host_tensor(send, count, moved_as(dtype))};
  wait_c10d(group_->allgather(outputs, inputs), deadline);
}

void GlooCommunicator::Impl::run_reduce_scatter(const void* send, void* recv, size_t count,
                                                DType dtype, ReduceOp op,
                                                Clock::time_point deadline, uint64_t seq) {
  if (reduce_scatter_algo_ == GlooReduceScatter::kRing) {
    ring_reduce_scatter(send, recv, equal_chunks(count, world_), dtype, op, deadline, seq);
    return;
  }
  const size_t element = dtype_size(dtype);
  const size_t total = count * static_cast<size_t>(world_);
  std::vector<char> copy(static_cast<const char*>(send),
                         static_cast<const char*>(send) + total * element);
  run_all_reduce(copy.data(), total, dtype, op, deadline, seq);
  std::memcpy(recv, copy.data() + static_cast<size_t>(rank_) * count * element, count * element);
}

void GlooCommunicator::Impl::run_all_reduce(void* data, size_t count, DType dtype, ReduceOp op,
                                            Clock::time_point deadline, uint64_t seq) {
  if (dtype == DType::kBFloat16) {
    // This c10d's Gloo has no bf16 reduction: ring reduce-scatter + ring all-gather, in place.
    const Chunks chunks = split_chunks(count, world_);
    const size_t element = dtype_size(dtype);
    void* own = static_cast<char*>(data) + chunks.offset[static_cast<size_t>(rank_)] * element;
    ring_reduce_scatter(data, own, chunks, dtype, op, deadline, seq);
    ring_all_gather(nullptr, data, chunks, dtype, deadline, seq);
    return;
  }
  std::vector<at::Tensor> tensors{host_tensor(data, count, dtype)};
  c10d::AllreduceOptions o;
  o.reduceOp = op == ReduceOp::kSum ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  o.timeout = time_left(deadline);
  wait_c10d(group_->allreduce(tensors, o), deadline);
}

void GlooCommunicator::Impl::run_broadcast(void* data, size_t count, DType dtype, int root,
                                           Clock::time_point deadline) {
  std::vector<at::Tensor> tensors{host_tensor(data, count, moved_as(dtype))};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = time_left(deadline);
  wait_c10d(group_->broadcast(tensors, o), deadline);
}

void GlooCommunicator::Impl::run_barrier(Clock::time_point deadline) {
  c10d::BarrierOptions o;
  o.timeout = time_left(deadline);
  wait_c10d(group_->barrier(o), deadline);
}

// ---------------------------------------------------------------------------------------------
// Public interface

GlooCommunicator::GlooCommunicator(const LaunchEnv& env, const CommOptions& options)
    : impl_(std::make_unique<Impl>(env, options)) {}

GlooCommunicator::~GlooCommunicator() = default;

int GlooCommunicator::rank() const noexcept { return impl_->rank_; }
int GlooCommunicator::world_size() const noexcept { return impl_->world_; }
std::chrono::milliseconds GlooCommunicator::timeout() const noexcept { return impl_->timeout_; }

WorkPtr GlooCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  detail::check_all_gather(send, recv, count, dtype, impl_->rank_, impl_->world_);
  return impl_->enqueue("all_gather", detail::describe("all_gather", count, dtype),
                        [this, send, recv, count, dtype](Clock::time_point deadline, uint64_t seq) {
                          if (count > 0) {
                            impl_->run_all_gather(send, recv, count, dtype, deadline, seq);
                          }
                        });
}

WorkPtr GlooCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                         ReduceOp op) {
  detail::check_reduce_scatter(send, recv, count, dtype, op, impl_->rank_, impl_->world_);
  return impl_->enqueue(
      "reduce_scatter", detail::describe("reduce_scatter", count, dtype, to_string(op)),
      [this, send, recv, count, dtype, op](Clock::time_point deadline, uint64_t seq) {
        if (count > 0) {
          impl_->run_reduce_scatter(send, recv, count, dtype, op, deadline, seq);
        }
      });
}

WorkPtr GlooCommunicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  detail::check_all_reduce(data, count, dtype, op, impl_->rank_);
  return impl_->enqueue("all_reduce", detail::describe("all_reduce", count, dtype, to_string(op)),
                        [this, data, count, dtype, op](Clock::time_point deadline, uint64_t seq) {
                          if (count > 0) {
                            impl_->run_all_reduce(data, count, dtype, op, deadline, seq);
                          }
                        });
}

WorkPtr GlooCommunicator::broadcast(void* data, size_t count, DType dtype, int root) {
  detail::check_broadcast(data, count, dtype, root, impl_->rank_, impl_->world_);
  return impl_->enqueue(
      "broadcast",
      detail::describe("broadcast", count, dtype) + " from rank " + std::to_string(root),
      [this, data, count, dtype, root](Clock::time_point deadline, uint64_t) {
        if (count > 0) {
          impl_->run_broadcast(data, count, dtype, root, deadline);
        }
      });
}

WorkPtr GlooCommunicator::barrier() {
  return impl_->enqueue("barrier", "barrier", [this](Clock::time_point deadline, uint64_t) {
    impl_->run_barrier(deadline);
  });
}

}  // namespace zinf::zero
