// NEON kernels (ARM). 16-bit elements are converted lane by lane (portable), arithmetic is
// xsimd's NEON batch.
#include "optimizer_cpu/kernels.h"

#if defined(__aarch64__) || (defined(__ARM_NEON) && defined(__arm__))

#include "optimizer_cpu/kernels_impl.h"
#include "optimizer_cpu/xsimd_ops.h"

namespace zinf::optimizer_cpu::detail {
namespace {

#if defined(__aarch64__)
using NeonOps = XsimdOps<xsimd::neon64>;
#else
using NeonOps = XsimdOps<xsimd::neon>;
#endif

}  // namespace

const KernelTable* kernels_neon() { return &Kernels<NeonOps>::kTable; }

}  // namespace zinf::optimizer_cpu::detail

#else

namespace zinf::optimizer_cpu::detail {
const KernelTable* kernels_neon() { return nullptr; }
}  // namespace zinf::optimizer_cpu::detail

#endif
