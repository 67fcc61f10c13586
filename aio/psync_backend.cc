// psync engine: pread/pwrite performed by the calling thread inside submit(). One system
// call per request and its result reported as is (short transfers and -EINTR included), so
// the caller's continuation logic is the same as for the kernel-async engines.
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "aio/backend.h"

namespace zinf::aio {
namespace {

class PsyncBackend final : public Backend {
 public:
  explicit PsyncBackend(unsigned queue_depth) : depth_(queue_depth == 0 ? 1 : queue_depth) {
    staged_.reserve(depth_);
    done_.reserve(depth_);
  }

  std::string_view name() const noexcept override { return "psync"; }
  BackendCaps caps() const noexcept override { return BackendCaps{}; }
  unsigned capacity() const noexcept override { return depth_; }

  int prep(const Request& request) override {
    if (staged_.size() + done_.size() >= depth_) return -EBUSY;
    if (request.file_index >= 0 || request.buffer_index >= 0) return -EINVAL;
    if (request.bytes > kMaxRequestBytes) return -EINVAL;
    staged_.push_back(request);
    return 0;
  }

  int submit() override {
    for (const Request& r : staged_) {
      const ssize_t rc = r.op == Op::kRead
                             ? ::pread(r.fd, r.buffer, r.bytes, static_cast<off_t>(r.offset))
                             : ::pwrite(r.fd, r.buffer, r.bytes, static_cast<off_t>(r.offset));
      done_.push_back(Completion{r.tag, rc < 0 ? -static_cast<int64_t>(errno) : rc});
    }
    const int taken = static_cast<int>(staged_.size());
    staged_.clear();
    return taken;
  }

  int reap(std::span<Completion> out, unsigned min_complete) override {
    (void)min_complete;  // everything submitted is already complete
    size_t n = 0;
    while (n < out.size() && !done_.empty()) {
      out[n++] = done_.back();
      done_.pop_back();
    }
    return static_cast<int>(n);
  }

 private:
  const unsigned depth_;
  std::vector<Request> staged_;
  std::vector<Completion> done_;
};

}  // namespace

std::unique_ptr<Backend> make_psync_backend(unsigned queue_depth) {
  return std::make_unique<PsyncBackend>(queue_depth);
}

}  // namespace zinf::aio
