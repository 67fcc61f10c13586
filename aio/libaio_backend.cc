// libaio engine: Linux native AIO through io_setup/io_submit/io_getevents. A fixed pool of
// iocbs (one per queue slot) is reused; nothing allocates after construction.
//
// Teardown: io_destroy(2) cancels what it can and blocks until every request of the context
// has completed (fs/aio.c: kill_ioctx, then wait_for_completion until the context's last
// request is freed), so destroying the engine never leaves the kernel writing into memory
// that is freed afterwards; unlike io_uring there is no wait to retry.
#include <libaio.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "aio/backend.h"
#include "aio/error.h"

namespace zinf::aio {
namespace {

class LibaioBackend final : public Backend {
 public:
  explicit LibaioBackend(unsigned queue_depth)
      : depth_(queue_depth == 0 ? 1 : queue_depth),
        iocbs_(depth_),
        events_(depth_),
        in_kernel_(depth_, false) {
    const int rc = io_setup(static_cast<int>(depth_), &context_);
    if (rc < 0) {
      throw IoError("io_setup", "", 0, 0, -rc,
                    "libaio context unavailable (see /proc/sys/fs/aio-max-nr); choose backend "
                    "\"io_uring\" or \"psync\"");
    }
    free_.reserve(depth_);
    staged_.reserve(depth_);
    failed_.reserve(depth_);
    for (auto& cb : iocbs_) free_.push_back(&cb);
  }
  ~LibaioBackend() override {
    const int rc = io_destroy(context_);
    (void)rc;  // only -EINVAL (not a context) or -EFAULT: nothing is left to wait for then
  }

  std::string_view name() const noexcept override { return "libaio"; }
  BackendCaps caps() const noexcept override { return BackendCaps{.kernel_async = true}; }
  unsigned capacity() const noexcept override { return depth_; }

  int prep(const Request& request) override {
    if (free_.empty()) return -EBUSY;
    if (request.file_index >= 0 || request.buffer_index >= 0) return -EINVAL;
    if (request.bytes > kMaxRequestBytes) return -EINVAL;
    iocb* cb = free_.back();
    free_.pop_back();
    if (request.op == Op::kRead) {
      io_prep_pread(cb, request.fd, request.buffer, request.bytes,
                    static_cast<long long>(request.offset));
    } else {
      io_prep_pwrite(cb, request.fd, request.buffer, request.bytes,
                     static_cast<long long>(request.offset));
    }
    // The tag travels in the iocb's user data field (a pointer-sized integer).
    cb->data = reinterpret_cast<void*>(static_cast<uintptr_t>(request.tag));
    staged_.push_back(cb);
    return 0;
  }

  int submit() override {
    int taken = 0;
    size_t first = 0;
    while (first < staged_.size()) {
      const int rc =
          io_submit(context_, static_cast<long>(staged_.size() - first), staged_.data() + first);
      if (rc > 0) {
        for (size_t i = first; i < first + static_cast<size_t>(rc); ++i) {
          in_kernel_[index_of(staged_[i])] = true;
        }
        first += static_cast<size_t>(rc);
        taken += rc;
      } else if (rc == -EAGAIN || rc == -EINTR || rc == 0) {
        break;  // kernel queue full: the caller reaps and submits the rest later
      } else {
        // io_submit fails the first iocb it could not queue (e.g. -EINVAL for a misaligned
        // O_DIRECT request, -EBADF); report it as that request's completion.
        iocb* bad = staged_[first++];
        failed_.push_back(Completion{tag_of(bad), rc});
        free_.push_back(bad);
        ++taken;
      }
    }
    staged_.erase(staged_.begin(), staged_.begin() + static_cast<std::ptrdiff_t>(first));
    if (taken == 0 && !staged_.empty()) return -EAGAIN;
    return taken;
  }

  int reap(std::span<Completion> out, unsigned min_complete) override {
    size_t n = 0;
    while (n < out.size() && !failed_.empty()) {
      out[n++] = failed_.back();
      failed_.pop_back();
    }
    if (n == out.size()) return static_cast<int>(n);
    const long min_nr = min_complete > n ? static_cast<long>(min_complete - n) : 0;
    const long max_nr = static_cast<long>(std::min<size_t>(out.size() - n, depth_));
    const int rc = io_getevents(context_, min_nr, max_nr, events_.data(), nullptr);
    if (rc < 0) return n > 0 ? static_cast<int>(n) : rc;
    for (int i = 0; i < rc; ++i) {
      const io_event& event = events_[static_cast<size_t>(i)];
      // res holds bytes or a negative errno, stored in an unsigned long.
      out[n++] = Completion{tag_of(event.obj), static_cast<int64_t>(static_cast<long>(event.res))};
      in_kernel_[index_of(event.obj)] = false;
      free_.push_back(event.obj);
    }
    return static_cast<int>(n);
  }

  // io_cancel on every request the kernel holds. Since Linux 4.19 a cancelled request still
  // completes through io_getevents (io_cancel answers -EINPROGRESS); an older kernel that
  // answers 0 hands the result back here instead, and it is queued for reap(). File and
  // block I/O is rarely cancellable (-EINVAL/-EAGAIN): such requests run to their end.
  int cancel() override {
    int cancelled = 0;
    for (iocb& cb : iocbs_) {
      const size_t index = index_of(&cb);
      if (!in_kernel_[index]) continue;
      io_event event{};
      if (io_cancel(context_, &cb, &event) == 0) {
        in_kernel_[index] = false;
        failed_.push_back(
            Completion{tag_of(&cb), static_cast<int64_t>(static_cast<long>(event.res))});
        free_.push_back(&cb);
        ++cancelled;
      }
    }
    return cancelled > 0 ? 0 : -EAGAIN;
  }

 private:
  size_t index_of(const iocb* cb) const { return static_cast<size_t>(cb - iocbs_.data()); }

  static uint64_t tag_of(const iocb* cb) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(cb->data));
  }

  const unsigned depth_;
  io_context_t context_{};
  std::vector<iocb> iocbs_;         // one per queue slot, reused
  std::vector<io_event> events_;    // scratch for io_getevents
  std::vector<iocb*> free_;         // iocbs not staged nor in flight
  std::vector<iocb*> staged_;       // prepped, not yet submitted (in prep order)
  std::vector<Completion> failed_;  // requests io_submit refused or io_cancel ended
  std::vector<bool> in_kernel_;     // by iocb index: submitted, completion not yet taken
};

}  // namespace

std::unique_ptr<Backend> make_libaio_backend(unsigned queue_depth) {
  return std::make_unique<LibaioBackend>(queue_depth);
}

}  // namespace zinf::aio
