// Pieces shared by the Communicator implementations: the Work of a collective that finished
// when it was issued, the argument checks every implementation applies before it issues a
// collective (so a bad call fails the same way on every backend), and the one-line
// description of a collective used in error messages ("all_gather of 1000 fp32 elements").
//
// Thread safety: pure functions; a completed Work may be used from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "zero/comm/communicator.h"

namespace zinf::zero::detail {

// A Work that is already complete: wait() returns at once, completed() is true.
[[nodiscard]] WorkPtr completed_work();

// "all_reduce of 1000 fp32 elements (sum)"; `op` may be empty for collectives without one.
[[nodiscard]] std::string describe(std::string_view name, size_t count, DType dtype,
                                   std::string_view op = {});

// Each throws CommError(name, rank, ...) naming the argument at fault: a null buffer with a
// non-zero count, a dtype outside the enum, buffers that overlap where the layout forbids
// it (all_gather alone may pass send == recv + rank * count), a root outside [0, world).
void check_all_gather(const void* send, const void* recv, size_t count, DType dtype, int rank,
                      int world_size);
void check_reduce_scatter(const void* send, const void* recv, size_t count, DType dtype,
                          ReduceOp op, int rank, int world_size);
void check_all_reduce(const void* data, size_t count, DType dtype, ReduceOp op, int rank);
void check_broadcast(const void* data, size_t count, DType dtype, int root, int rank,
                     int world_size);

// Whether all_gather was called in place (send is this rank's slice of recv).
[[nodiscard]] bool all_gather_in_place(const void* send, const void* recv, size_t count,
                                       DType dtype, int rank) noexcept;

}  // namespace zinf::zero::detail
