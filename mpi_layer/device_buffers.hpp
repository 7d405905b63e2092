// The rule every device communicator shares: its buffers are in its device's memory. Checked where
// that is cheap (the emulated device knows its address range), so that a host buffer handed to a
// device communicator fails here with a clear error rather than on a GPU, where NCCL cannot read it.
#pragma once

#include <cstddef>
#include <initializer_list>

#include "zerotrain/communicator.hpp"

namespace zt::detail {

/// Throws zt::CommError ("<op> on communicator '<name>' (rank r of n): the buffer at ... is not in
/// emulated:0 memory; ...") when `comm` is on the emulated device and one of `buffers` (null ones
/// skipped) lies outside its memory; nothing for `count` 0 or another device (a CUDA pointer query
/// would cost a driver call per operation).
void check_device_buffers(const Communicator& comm, CommOp op, std::initializer_list<const void*> buffers,
                          std::size_t count);

}  // namespace zt::detail
