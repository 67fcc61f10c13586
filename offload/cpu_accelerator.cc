#include "offload/cpu_accelerator.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "offload/error.h"

namespace zinf::offload {
namespace {

constexpr size_t kDeviceAlignment = 64;

// Completion state of a CpuEvent, shared with the stream work that records or waits for
// it, so an event destroyed while such work is queued leaves nothing dangling.
struct EventState {
  std::mutex mutex;
  std::condition_variable reached;
  uint64_t recorded = 0;   // guarded by mutex: number of record_event calls
  uint64_t completed = 0;  // guarded by mutex: highest record reached by its stream

  void complete(uint64_t generation) {
    {
      std::lock_guard lock(mutex);
      completed = std::max(completed, generation);
    }
    reached.notify_all();
  }
  void wait_for(uint64_t generation) {
    std::unique_lock lock(mutex);
    reached.wait(lock, [&] { return completed >= generation; });
  }
};

class CpuEvent final : public Event {
 public:
  CpuEvent() : state_(std::make_shared<EventState>()) {}

  bool query() override {
    std::lock_guard lock(state_->mutex);
    return state_->completed >= state_->recorded;
  }
  void synchronize() override {
    uint64_t target = 0;
    {
      std::lock_guard lock(state_->mutex);
      target = state_->recorded;
    }
    state_->wait_for(target);
  }

  // Registers a new record and returns its generation.
  uint64_t next_generation() {
    std::lock_guard lock(state_->mutex);
    return ++state_->recorded;
  }
  uint64_t current_generation() {
    std::lock_guard lock(state_->mutex);
    return state_->recorded;
  }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

class CpuStream final : public Stream {
 public:
  CpuStream() : worker_([this] { run(); }) {}

  ~CpuStream() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    worker_.join();  // the worker drains the queue before it exits
  }

  void enqueue(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    work_ready_.notify_one();
  }

  void synchronize() override {
    std::exception_ptr error;
    {
      std::unique_lock lock(mutex_);
      const uint64_t target = enqueued_;
      drained_.wait(lock, [&] { return done_ >= target; });
      error = std::exchange(first_error_, nullptr);
    }
    if (error) rethrow_host_function_error(error, "cpu stream");
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) {
        return;  // stopping and drained
      }
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        work();
      } catch (...) {
        error = std::current_exception();
      }
      work = nullptr;  // destroy captured state outside the lock
      lock.lock();
      if (error && !first_error_) {
        first_error_ = error;
      }
      ++done_;
      drained_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  uint64_t enqueued_ = 0;                    // guarded by mutex_
  uint64_t done_ = 0;                        // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::exception_ptr first_error_;           // guarded by mutex_
  std::thread worker_;                       // last: starts after the state above exists
};

CpuStream& as_cpu(Stream& stream) { return downcast_or_throw<CpuStream>(stream, "cpu", "stream"); }

CpuEvent& as_cpu(Event& event) { return downcast_or_throw<CpuEvent>(event, "cpu", "event"); }

}  // namespace

CpuAccelerator::CpuAccelerator(uint64_t memory_budget_bytes)
    : Accelerator(memory_budget_bytes),
      registered_bytes_(std::make_shared<std::atomic<uint64_t>>(0)) {}

CpuAccelerator::~CpuAccelerator() = default;

std::unique_ptr<Stream> CpuAccelerator::create_stream() { return std::make_unique<CpuStream>(); }

std::unique_ptr<Event> CpuAccelerator::create_event() { return std::make_unique<CpuEvent>(); }

void CpuAccelerator::copy_to_device(void* device_dst, const void* host_src, size_t bytes,
                                    Stream& stream) {
  as_cpu(stream).enqueue([=] { std::memcpy(device_dst, host_src, bytes); });
}

void CpuAccelerator::copy_to_host(void* host_dst, const void* device_src, size_t bytes,
                                  Stream& stream) {
  as_cpu(stream).enqueue([=] { std::memcpy(host_dst, device_src, bytes); });
}

void CpuAccelerator::copy_on_device(void* device_dst, const void* device_src, size_t bytes,
                                    Stream& stream) {
  as_cpu(stream).enqueue([=] { std::memmove(device_dst, device_src, bytes); });
}

void CpuAccelerator::fill_zero(void* device_dst, size_t bytes, Stream& stream) {
  as_cpu(stream).enqueue([=] { std::memset(device_dst, 0, bytes); });
}

ComputeView CpuAccelerator::compute_view(void* device_ptr, size_t /*bytes*/) {
  return {device_ptr, ComputeDevice::kCpu, -1};
}

void CpuAccelerator::launch_host_func(Stream& stream, std::function<void()> fn) {
  as_cpu(stream).enqueue(std::move(fn));
}

void CpuAccelerator::record_event(Event& event, Stream& stream) {
  CpuStream& cpu_stream = as_cpu(stream);
  CpuEvent& cpu_event = as_cpu(event);
  const uint64_t generation = cpu_event.next_generation();
  cpu_stream.enqueue([state = cpu_event.state(), generation] { state->complete(generation); });
}

void CpuAccelerator::wait_event(Stream& stream, Event& event) {
  CpuStream& cpu_stream = as_cpu(stream);
  CpuEvent& cpu_event = as_cpu(event);
  // The point waited for is the record current now, which is already enqueued on its
  // stream: a stream can therefore never wait for work queued after its own wait.
  const uint64_t generation = cpu_event.current_generation();
  if (generation == 0) {
    return;  // never recorded: complete
  }
  cpu_stream.enqueue([state = cpu_event.state(), generation] { state->wait_for(generation); });
}

void CpuAccelerator::register_host(void* /*ptr*/, size_t bytes) {
  registered_bytes_->fetch_add(bytes, std::memory_order_relaxed);
}

void CpuAccelerator::unregister_host(void* /*ptr*/, size_t bytes) noexcept {
  registered_bytes_->fetch_sub(bytes, std::memory_order_relaxed);
}

uint64_t CpuAccelerator::registered_host_bytes() const noexcept {
  return registered_bytes_->load(std::memory_order_relaxed);
}

aio::PinHooks CpuAccelerator::pin_hooks() {
  aio::PinHooks hooks;
  hooks.on_pin = [counter = registered_bytes_](void*, size_t bytes) {
    counter->fetch_add(bytes, std::memory_order_relaxed);
  };
  hooks.on_unpin = [counter = registered_bytes_](void*, size_t bytes) {
    counter->fetch_sub(bytes, std::memory_order_relaxed);
  };
  return hooks;
}

void* CpuAccelerator::device_malloc(size_t bytes, std::string_view /*what*/) {
  const size_t rounded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  void* data = std::aligned_alloc(kDeviceAlignment, rounded);
  if (data == nullptr) {
    throw std::bad_alloc();
  }
  return data;
}

void CpuAccelerator::device_free(void* ptr, size_t /*bytes*/) noexcept { std::free(ptr); }

}  // namespace zinf::offload
