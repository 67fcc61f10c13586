#include "offload/accelerator.h"

#include <algorithm>
#include <string>
#include <utility>

#include "offload/error.h"

namespace zinf::offload {

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() noexcept {
  if (owner_ != nullptr) {
    owner_->release(data_, size_);
  }
  owner_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

DeviceBuffer Accelerator::allocate(size_t bytes, std::string_view what) {
  if (bytes == 0) {
    return DeviceBuffer();
  }
  {
    std::lock_guard lock(mutex_);
    if (bytes > budget_bytes_ || in_use_bytes_ > budget_bytes_ - bytes) {
      throw OffloadError(ErrorKind::kBudget,
                         std::string(name()) + " accelerator: allocating " + std::to_string(bytes) +
                             " bytes" +
                             (what.empty() ? std::string() : " for " + std::string(what)) +
                             " would exceed the memory budget (" + std::to_string(in_use_bytes_) +
                             " bytes in use, budget " + std::to_string(budget_bytes_) + " bytes)");
    }
    in_use_bytes_ += bytes;  // reserved before the allocation, so concurrent calls see it
    peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
  }
  void* data = nullptr;
  try {
    data = device_malloc(bytes, what);
  } catch (...) {
    std::lock_guard lock(mutex_);
    in_use_bytes_ -= bytes;
    throw;
  }
  std::lock_guard lock(mutex_);
  ++allocations_;
  return DeviceBuffer(this, data, bytes);
}

AcceleratorMemoryStats Accelerator::memory_stats() const {
  std::lock_guard lock(mutex_);
  return {budget_bytes_, in_use_bytes_, peak_bytes_, allocations_};
}

void Accelerator::release(void* ptr, size_t bytes) noexcept {
  device_free(ptr, bytes);
  std::lock_guard lock(mutex_);
  in_use_bytes_ -= bytes;
}

}  // namespace zinf::offload
