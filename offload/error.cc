#include "offload/error.h"

namespace zinf::offload {

std::string_view to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kConfig:
      return "config";
    case ErrorKind::kBudget:
      return "budget";
    case ErrorKind::kPool:
      return "pool";
    case ErrorKind::kSpace:
      return "space";
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kCorrupt:
      return "corrupt";
    case ErrorKind::kDevice:
      return "device";
    case ErrorKind::kUsage:
      return "usage";
  }
  return "unknown";
}

OffloadError::OffloadError(ErrorKind kind, const std::string& message)
    : std::runtime_error("zinf offload: " + message), kind_(kind) {}

void rethrow_host_function_error(std::exception_ptr error, std::string_view stream) {
  try {
    std::rethrow_exception(error);
  } catch (const OffloadError&) {
    throw;
  } catch (const std::exception& e) {
    throw OffloadError(ErrorKind::kDevice,
                       std::string(stream) + ": host function failed: " + e.what());
  } catch (...) {
    throw OffloadError(ErrorKind::kDevice, std::string(stream) + ": host function failed");
  }
}

}  // namespace zinf::offload
