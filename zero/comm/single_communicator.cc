#include "zero/comm/single_communicator.h"

#include <cstring>

#include "zero/comm/comm_util.h"

namespace zinf::zero {

WorkPtr SingleCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype) {
  detail::check_all_gather(send, recv, count, dtype, 0, 1);
  if (count > 0 && send != recv) {
    std::memcpy(recv, send, count * dtype_size(dtype));
  }
  return detail::completed_work();
}

WorkPtr SingleCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                                           ReduceOp op) {
  detail::check_reduce_scatter(send, recv, count, dtype, op, 0, 1);
  if (count > 0) {
    std::memcpy(recv, send, count * dtype_size(dtype));
  }
  return detail::completed_work();
}

WorkPtr SingleCommunicator::all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  detail::check_all_reduce(data, count, dtype, op, 0);
  return detail::completed_work();
}

WorkPtr SingleCommunicator::broadcast(void* data, size_t count, DType dtype, int root) {
  detail::check_broadcast(data, count, dtype, root, 0, 1);
  return detail::completed_work();
}

WorkPtr SingleCommunicator::barrier() { return detail::completed_work(); }

}  // namespace zinf::zero
