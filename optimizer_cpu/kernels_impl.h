// The update rules as templates over a SIMD "ops" type, instantiated once per instruction
// set by kernels_<level>.cc (each compiled with its own -m flags). Internal.
//
// An ops type provides: V (a vector of kWidth floats), load/store of fp32, bf16 and fp16
// elements (unaligned), broadcast(), fma(), sqrt(), sign() and count_nonfinite(). Everything
// here has internal linkage (anonymous namespace), so code compiled for one instruction set
// can never be merged by the linker into another level's kernels.
//
// Full vectors are processed in place; the last partial vector of a range goes through
// zero-padded stack buffers and the very same vector code, so every element sees identical
// instructions whatever the range boundaries are (results do not depend on tiling).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "optimizer_cpu/kernels.h"

namespace zinf::optimizer_cpu::detail {
namespace {

template <DType D>
using DTypeTag = std::integral_constant<DType, D>;
template <CopyOut C>
using CopyTag = std::integral_constant<CopyOut, C>;

// Calls f(DTypeTag<grad>{}, DTypeTag<state>{}, CopyTag<copy>{}) for the runtime types.
template <class F>
std::uint64_t visit_types(DType grad, DType state, CopyOut copy, F&& f) {
  auto with_copy = [&](auto g, auto s) -> std::uint64_t {
    switch (copy) {
      case CopyOut::kBFloat16:
        return f(g, s, CopyTag<CopyOut::kBFloat16>{});
      case CopyOut::kFloat16:
        return f(g, s, CopyTag<CopyOut::kFloat16>{});
      case CopyOut::kNone:
        break;
    }
    return f(g, s, CopyTag<CopyOut::kNone>{});
  };
  auto with_state = [&](auto g) -> std::uint64_t {
    if (state == DType::kBFloat16) return with_copy(g, DTypeTag<DType::kBFloat16>{});
    return with_copy(g, DTypeTag<DType::kFloat32>{});
  };
  switch (grad) {
    case DType::kBFloat16:
      return with_state(DTypeTag<DType::kBFloat16>{});
    case DType::kFloat16:
      return with_state(DTypeTag<DType::kFloat16>{});
    case DType::kFloat32:
      break;
  }
  return with_state(DTypeTag<DType::kFloat32>{});
}

template <class Ops>
struct Kernels {
  using V = typename Ops::V;
  static constexpr std::size_t kWidth = Ops::kWidth;

  template <DType D>
  static V load(const void* base, std::size_t i) {
    if constexpr (D == DType::kFloat32) {
      return Ops::load(static_cast<const float*>(base) + i);
    } else if constexpr (D == DType::kBFloat16) {
      return Ops::load_bf16(static_cast<const std::uint16_t*>(base) + i);
    } else {
      return Ops::load_fp16(static_cast<const std::uint16_t*>(base) + i);
    }
  }

  template <DType D>
  static void store(void* base, std::size_t i, V v) {
    if constexpr (D == DType::kFloat32) {
      Ops::store(static_cast<float*>(base) + i, v);
    } else if constexpr (D == DType::kBFloat16) {
      Ops::store_bf16(static_cast<std::uint16_t*>(base) + i, v);
    } else {
      Ops::store_fp16(static_cast<std::uint16_t*>(base) + i, v);
    }
  }

  // kStream: a non-temporal store to a vector-aligned address (see run_range()).
  template <CopyOut C, bool kStream>
  static void store_copy(void* base, std::size_t i, V p) {
    auto* dst = static_cast<std::uint16_t*>(base) + i;
    if constexpr (C == CopyOut::kBFloat16) {
      if constexpr (kStream) {
        Ops::stream_bf16(dst, p);
      } else {
        Ops::store_bf16(dst, p);
      }
    } else if constexpr (C == CopyOut::kFloat16) {
      if constexpr (kStream) {
        Ops::stream_fp16(dst, p);
      } else {
        Ops::store_fp16(dst, p);
      }
    }
  }

  static std::size_t size_of(DType d) { return d == DType::kFloat32 ? 4 : 2; }

  // Runs body(arrays, i, std::bool_constant<stream>) for every full vector of [begin, end),
  // and for a partial vector at either end on zero-padded copies; body returns the
  // non-finite count of its vector. With a.stream_copy the 16-bit copy is written with
  // non-temporal stores (no read-for-ownership of lines that are only written): the range
  // is cut so that every full vector's copy is aligned, the partial head going through
  // the buffers like the tail.
  template <class Body>
  static std::uint64_t run_range(const KernelArrays& a, std::size_t begin, std::size_t end,
                                 Body body) {
    const KernelArrays arrays = a;
    std::uint64_t nonfinite = 0;
    std::size_t i = begin;
    if constexpr (Ops::kCanStream) {
      if (a.stream_copy && a.param_copy != nullptr) {
        constexpr std::size_t kCopyBytes = kWidth * 2;
        const auto address =
            reinterpret_cast<std::uintptr_t>(static_cast<std::uint16_t*>(a.param_copy) + i);
        const std::size_t head =
            std::min(end - i, (kCopyBytes - address % kCopyBytes) % kCopyBytes / 2);
        if (head != 0) {
          nonfinite += run_partial(a, i, head, body);
          i += head;
        }
        for (; i + kWidth <= end; i += kWidth) {
          nonfinite += body(arrays, i, std::true_type{});
        }
        if (i < end) nonfinite += run_partial(a, i, end - i, body);
        Ops::fence();
        return nonfinite;
      }
    }
    for (; i + kWidth <= end; i += kWidth) nonfinite += body(arrays, i, std::false_type{});
    if (i < end) nonfinite += run_partial(a, i, end - i, body);
    return nonfinite;
  }

  // The n < kWidth elements at i, through zero-padded stack copies of every array.
  template <class Body>
  static std::uint64_t run_partial(const KernelArrays& a, std::size_t i, std::size_t n, Body body) {
    alignas(64) float p_buf[kWidth] = {};
    alignas(64) unsigned char g_buf[kWidth * 4] = {};
    alignas(64) unsigned char m_buf[kWidth * 4] = {};
    alignas(64) unsigned char v_buf[kWidth * 4] = {};
    alignas(64) unsigned char c_buf[kWidth * 2] = {};
    const std::size_t g_size = size_of(a.grad_dtype);
    const std::size_t s_size = size_of(a.state_dtype);
    KernelArrays tail = a;
    tail.params = p_buf;
    tail.grads = g_buf;
    tail.exp_avg = a.exp_avg != nullptr ? m_buf : nullptr;
    tail.exp_avg_sq = a.exp_avg_sq != nullptr ? v_buf : nullptr;
    tail.param_copy = a.param_copy != nullptr ? c_buf : nullptr;
    std::memcpy(p_buf, a.params + i, n * 4);
    std::memcpy(g_buf, static_cast<const unsigned char*>(a.grads) + i * g_size, n * g_size);
    if (a.exp_avg != nullptr) {
      std::memcpy(m_buf, static_cast<const unsigned char*>(a.exp_avg) + i * s_size, n * s_size);
    }
    if (a.exp_avg_sq != nullptr) {
      std::memcpy(v_buf, static_cast<const unsigned char*>(a.exp_avg_sq) + i * s_size, n * s_size);
    }
    const std::uint64_t nonfinite = body(tail, 0, std::false_type{});
    std::memcpy(a.params + i, p_buf, n * 4);
    if (a.exp_avg != nullptr) {
      std::memcpy(static_cast<unsigned char*>(a.exp_avg) + i * s_size, m_buf, n * s_size);
    }
    if (a.exp_avg_sq != nullptr) {
      std::memcpy(static_cast<unsigned char*>(a.exp_avg_sq) + i * s_size, v_buf, n * s_size);
    }
    if (a.param_copy != nullptr) {
      std::memcpy(static_cast<unsigned char*>(a.param_copy) + i * 2, c_buf, n * 2);
    }
    return nonfinite;
  }

  template <DType G, DType S, CopyOut C>
  static std::uint64_t adam_typed(const AdamCoefficients& k, const KernelArrays& a,
                                  std::size_t begin, std::size_t end) {
    const V scale = Ops::broadcast(a.grad_scale);
    const V beta1 = Ops::broadcast(k.beta1);
    const V beta2 = Ops::broadcast(k.beta2);
    const V one_minus_beta1 = Ops::broadcast(k.one_minus_beta1);
    const V one_minus_beta2 = Ops::broadcast(k.one_minus_beta2);
    const V eps = Ops::broadcast(k.eps);
    const V inv_sqrt_bc2 = Ops::broadcast(k.inv_sqrt_bias_correction2);
    const V step_size = Ops::broadcast(k.step_size);
    const V decoupled_decay = Ops::broadcast(k.decoupled_decay);
    const V l2_decay = Ops::broadcast(k.l2_decay);
    return run_range(a, begin, end, [=](const KernelArrays& x, std::size_t i, auto stream) {
      V g = load<G>(x.grads, i) * scale;
      const std::uint32_t nonfinite = Ops::count_nonfinite(g);
      V p = Ops::load(x.params + i);
      V m = load<S>(x.exp_avg, i);
      V v = load<S>(x.exp_avg_sq, i);
      g = Ops::fma(p, l2_decay, g);
      m = Ops::fma(g, one_minus_beta1, m * beta1);
      v = Ops::fma(g * g, one_minus_beta2, v * beta2);
      const V denom = Ops::fma(Ops::sqrt(v), inv_sqrt_bc2, eps);
      p = Ops::fma(p, decoupled_decay, p);
      p = Ops::fma(m / denom, step_size, p);
      Ops::store(x.params + i, p);
      store<S>(x.exp_avg, i, m);
      store<S>(x.exp_avg_sq, i, v);
      store_copy<C, decltype(stream)::value>(x.param_copy, i, p);
      return nonfinite;
    });
  }

  template <DType G, DType S, CopyOut C>
  static std::uint64_t adagrad_typed(const AdagradCoefficients& k, const KernelArrays& a,
                                     std::size_t begin, std::size_t end) {
    const V scale = Ops::broadcast(a.grad_scale);
    const V eps = Ops::broadcast(k.eps);
    const V step_size = Ops::broadcast(k.step_size);
    const V l2_decay = Ops::broadcast(k.l2_decay);
    return run_range(a, begin, end, [=](const KernelArrays& x, std::size_t i, auto stream) {
      V g = load<G>(x.grads, i) * scale;
      const std::uint32_t nonfinite = Ops::count_nonfinite(g);
      V p = Ops::load(x.params + i);
      V sum = load<S>(x.exp_avg_sq, i);
      g = Ops::fma(p, l2_decay, g);
      sum = Ops::fma(g, g, sum);
      const V denom = Ops::sqrt(sum) + eps;
      p = Ops::fma(g / denom, step_size, p);
      Ops::store(x.params + i, p);
      store<S>(x.exp_avg_sq, i, sum);
      store_copy<C, decltype(stream)::value>(x.param_copy, i, p);
      return nonfinite;
    });
  }

  template <DType G, DType S, CopyOut C>
  static std::uint64_t lion_typed(const LionCoefficients& k, const KernelArrays& a,
                                  std::size_t begin, std::size_t end) {
    const V scale = Ops::broadcast(a.grad_scale);
    const V beta1 = Ops::broadcast(k.beta1);
    const V beta2 = Ops::broadcast(k.beta2);
    const V one_minus_beta1 = Ops::broadcast(k.one_minus_beta1);
    const V one_minus_beta2 = Ops::broadcast(k.one_minus_beta2);
    const V neg_lr = Ops::broadcast(k.neg_lr);
    const V decoupled_decay = Ops::broadcast(k.decoupled_decay);
    return run_range(a, begin, end, [=](const KernelArrays& x, std::size_t i, auto stream) {
      const V g = load<G>(x.grads, i) * scale;
      const std::uint32_t nonfinite = Ops::count_nonfinite(g);
      V p = Ops::load(x.params + i);
      V m = load<S>(x.exp_avg, i);
      const V update = Ops::sign(Ops::fma(g, one_minus_beta1, m * beta1));
      p = Ops::fma(p, decoupled_decay, p);
      p = Ops::fma(update, neg_lr, p);
      m = Ops::fma(g, one_minus_beta2, m * beta2);
      Ops::store(x.params + i, p);
      store<S>(x.exp_avg, i, m);
      store_copy<C, decltype(stream)::value>(x.param_copy, i, p);
      return nonfinite;
    });
  }

  static std::uint64_t adam(const AdamCoefficients& k, const KernelArrays& a, std::size_t begin,
                            std::size_t end) {
    return visit_types(a.grad_dtype, a.state_dtype, a.copy_out, [&](auto g, auto s, auto c) {
      return adam_typed<decltype(g)::value, decltype(s)::value, decltype(c)::value>(k, a, begin,
                                                                                    end);
    });
  }

  static std::uint64_t adagrad(const AdagradCoefficients& k, const KernelArrays& a,
                               std::size_t begin, std::size_t end) {
    return visit_types(a.grad_dtype, a.state_dtype, a.copy_out, [&](auto g, auto s, auto c) {
      return adagrad_typed<decltype(g)::value, decltype(s)::value, decltype(c)::value>(k, a, begin,
                                                                                       end);
    });
  }

  static std::uint64_t lion(const LionCoefficients& k, const KernelArrays& a, std::size_t begin,
                            std::size_t end) {
    return visit_types(a.grad_dtype, a.state_dtype, a.copy_out, [&](auto g, auto s, auto c) {
      return lion_typed<decltype(g)::value, decltype(s)::value, decltype(c)::value>(k, a, begin,
                                                                                    end);
    });
  }

  template <DType D>
  static std::uint64_t count_typed(const void* data, float scale, std::size_t begin,
                                   std::size_t end) {
    const V s = Ops::broadcast(scale);
    std::uint64_t nonfinite = 0;
    std::size_t i = begin;
    for (; i + kWidth <= end; i += kWidth) nonfinite += Ops::count_nonfinite(load<D>(data, i) * s);
    const std::size_t n = end - i;
    if (n != 0) {
      alignas(64) unsigned char buf[kWidth * 4] = {};
      std::memcpy(buf, static_cast<const unsigned char*>(data) + i * size_of(D), n * size_of(D));
      nonfinite += Ops::count_nonfinite(load<D>(buf, 0) * s);
    }
    return nonfinite;
  }

  static std::uint64_t count_nonfinite(const void* data, DType dtype, float scale,
                                       std::size_t begin, std::size_t end) {
    switch (dtype) {
      case DType::kBFloat16:
        return count_typed<DType::kBFloat16>(data, scale, begin, end);
      case DType::kFloat16:
        return count_typed<DType::kFloat16>(data, scale, begin, end);
      case DType::kFloat32:
        break;
    }
    return count_typed<DType::kFloat32>(data, scale, begin, end);
  }

  static constexpr KernelTable kTable = {&adam, &adagrad, &lion, &count_nonfinite};
};

}  // namespace
}  // namespace zinf::optimizer_cpu::detail
