// make_nccl_communicator in a build without CUDA: a clear error instead of a missing symbol.
#include "zerotrain/nccl_communicator.hpp"

#if !ZT_HAVE_CUDA

#include "zerotrain/error.hpp"

namespace zt {

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, Device, std::string name, const Stream*) {
  ZT_THROW_AS(CommError, "make_nccl_communicator('", name,
              "'): zerotrain was built without CUDA, so there is no NCCL backend; rebuild with "
              "-DZT_WITH_CUDA=ON (needs the CUDA toolkit and NCCL)");
}

void* nccl_stream(const Communicator& communicator) {
  ZT_THROW_AS(CommError, "nccl_stream: communicator '", communicator.name(),
              "' is not a NCCL communicator (zerotrain was built without CUDA)");
}

}  // namespace zt

#endif
