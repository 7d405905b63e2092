// check_device_buffers (see device_buffers.hpp).
#include "mpi_layer/device_buffers.hpp"

#include "kernels/emulated_device.hpp"
#include "zerotrain/error.hpp"

namespace zt::detail {

void check_device_buffers(const Communicator& comm, CommOp op, std::initializer_list<const void*> buffers,
                          std::size_t count) {
  if (count == 0 || !comm.device().is_emulated()) return;
  for (const void* buffer : buffers) {
    ZT_CHECK_AS(CommError, buffer == nullptr || is_emulated_device_address(buffer), comm_op_name(op),
                " on communicator '", comm.name(), "' (rank ", comm.rank(), " of ", comm.size(),
                "): the buffer at ", buffer, " is not in ", comm.device().str(),
                " memory; a device communicator takes buffers in its device's memory (copy host values to "
                "the device first, or use the group's host communicator)");
  }
}

}  // namespace zt::detail
