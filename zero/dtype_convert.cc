#include "zero/dtype_convert.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <cmath>
#include <cstring>
#include <stdexcept>

#include "optimizer_cpu/half.h"
#include "zero/error.h"

namespace zinf::zero {
namespace {

using optimizer_cpu::bf16_to_float;
using optimizer_cpu::float_to_bf16;
using optimizer_cpu::float_to_fp16;
using optimizer_cpu::fp16_to_float;

// Below this many elements one thread does the work.
constexpr uint64_t kGrain = 1 << 16;

template <typename Fn>
void parallel(uint64_t numel, Fn&& fn) {
  if (numel <= kGrain) {
    fn(uint64_t{0}, numel);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<uint64_t>(0, numel, kGrain),
                    [&](const tbb::blocked_range<uint64_t>& r) { fn(r.begin(), r.end()); });
}

void check_float_type(DType dtype) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16 && dtype != DType::kFloat16) {
    throw ZeroError("dtype conversion: " + std::string(to_string(dtype)) +
                    " is not a floating-point parameter type");
  }
}

}  // namespace

void to_float(const void* src, DType dtype, float* dst, uint64_t numel) {
  check_float_type(dtype);
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, numel * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  parallel(numel, [&](uint64_t begin, uint64_t end) {
    if (dtype == DType::kBFloat16) {
      for (uint64_t i = begin; i < end; ++i) dst[i] = bf16_to_float(in[i]);
    } else {
      for (uint64_t i = begin; i < end; ++i) dst[i] = fp16_to_float(in[i]);
    }
  });
}

void from_float(const float* src, void* dst, DType dtype, uint64_t numel) {
  check_float_type(dtype);
  if (dtype == DType::kFloat32) {
    std::memcpy(dst, src, numel * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  parallel(numel, [&](uint64_t begin, uint64_t end) {
    if (dtype == DType::kBFloat16) {
      for (uint64_t i = begin; i < end; ++i) out[i] = float_to_bf16(src[i]);
    } else {
      for (uint64_t i = begin; i < end; ++i) out[i] = float_to_fp16(src[i]);
    }
  });
}

void accumulate_scaled(float* dst, const void* src, DType dtype, uint64_t numel, float scale) {
  check_float_type(dtype);
  parallel(numel, [&](uint64_t begin, uint64_t end) {
    if (dtype == DType::kFloat32) {
      const auto* in = static_cast<const float*>(src);
      for (uint64_t i = begin; i < end; ++i) dst[i] += scale * in[i];
    } else if (dtype == DType::kBFloat16) {
      const auto* in = static_cast<const uint16_t*>(src);
      for (uint64_t i = begin; i < end; ++i) dst[i] += scale * bf16_to_float(in[i]);
    } else {
      const auto* in = static_cast<const uint16_t*>(src);
      for (uint64_t i = begin; i < end; ++i) dst[i] += scale * fp16_to_float(in[i]);
    }
  });
}

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, uint64_t numel) {
  check_float_type(src_dtype);
  check_float_type(dst_dtype);
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, numel * dtype_size(src_dtype));
    return;
  }
  if (src_dtype == DType::kFloat32) {
    from_float(static_cast<const float*>(src), dst, dst_dtype, numel);
    return;
  }
  if (dst_dtype == DType::kFloat32) {
    to_float(src, src_dtype, static_cast<float*>(dst), numel);
    return;
  }
  // bf16 <-> fp16 through fp32, element by element.
  const auto* in = static_cast<const uint16_t*>(src);
  auto* out = static_cast<uint16_t*>(dst);
  parallel(numel, [&](uint64_t begin, uint64_t end) {
    for (uint64_t i = begin; i < end; ++i) {
      out[i] = src_dtype == DType::kBFloat16 ? float_to_fp16(bf16_to_float(in[i]))
                                             : float_to_bf16(fp16_to_float(in[i]));
    }
  });
}

NormPart norm_part(const float* data, uint64_t numel) {
  auto body = [data](uint64_t begin, uint64_t end, NormPart part) {
    double sum = 0.0;
    for (uint64_t i = begin; i < end; ++i) {
      const float v = data[i];
      if (!std::isfinite(v)) {
        ++part.nonfinite;
      } else {
        sum += static_cast<double>(v) * static_cast<double>(v);
      }
    }
    part.sumsq += sum;
    return part;
  };
  if (numel <= kGrain) {
    return body(0, numel, NormPart{});
  }
  // Deterministic: the same split and the same order of sums in every run.
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<uint64_t>(0, numel, kGrain), NormPart{},
      [&](const tbb::blocked_range<uint64_t>& r, NormPart part) {
        return body(r.begin(), r.end(), part);
      },
      [](NormPart a, NormPart b) {
        return NormPart{a.sumsq + b.sumsq, a.nonfinite + b.nonfinite};
      });
}

DType compute_dtype(Precision precision) noexcept {
  switch (precision) {
    case Precision::kBFloat16:
      return DType::kBFloat16;
    case Precision::kFloat16:
      return DType::kFloat16;
    case Precision::kFloat32:
      break;
  }
  return DType::kFloat32;
}

}  // namespace zinf::zero
