// The build part of `zerotrain report`.
#include "zerotrain/report.hpp"
#include "zerotrain/build_info.hpp"

namespace zt {

Report build_report() {
  return {
      {"build", "zerotrain", build_info::version},
      {"build", "build type", build_info::build_type},
      {"build", "compiler", build_info::cxx_compiler},
      {"build", "CUDA + NCCL",
       build_info::have_cuda
           ? std::string("compiled in (architectures ") + build_info::cuda_architectures + ")"
           : std::string("not compiled in")},
      {"build", "io_uring", build_info::have_uring ? "compiled in" : "not compiled in"},
  };
}

}  // namespace zt
