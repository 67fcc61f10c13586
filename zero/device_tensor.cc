#include "zero/device_tensor.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <numeric>

#include "zero/comm/torch_dtype.h"
#include "zero/error.h"

namespace zinf::zero {

c10::Device compute_device(offload::Accelerator& accelerator) {
  const offload::ComputeView view = accelerator.compute_device();
  return view.device == offload::ComputeDevice::kCuda
             ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(view.index))
             : c10::Device(c10::DeviceType::CPU);
}

at::Tensor device_tensor(offload::Accelerator& accelerator, void* device_ptr,
                         c10::IntArrayRef shape, DType dtype) {
  const auto numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  const offload::ComputeView view =
      accelerator.compute_view(device_ptr, static_cast<size_t>(numel) * dtype_size(dtype));
  auto options = at::TensorOptions().dtype(detail::scalar_type(dtype));
  if (view.device == offload::ComputeDevice::kCuda) {
    options = options.device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(view.index));
  }
  return at::from_blob(view.data, shape, options);
}

void wait_for_compute(const c10::Device& device) {
  if (device.is_cpu()) {
    return;
  }
  const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
  impl->getStream(device).synchronize();
}

DType dtype_of(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat:
      return DType::kFloat32;
    case c10::kBFloat16:
      return DType::kBFloat16;
    case c10::kHalf:
      return DType::kFloat16;
    case c10::kDouble:
      return DType::kFloat64;
    case c10::kLong:
      return DType::kInt64;
    default:
      throw ZeroError(
          fmt::format("a tensor of type {} where fp32, bf16, fp16, fp64 or int64 was "
                      "expected",
                      c10::toString(type)));
  }
}

}  // namespace zinf::zero
