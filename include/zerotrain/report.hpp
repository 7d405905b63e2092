// `zerotrain report`: what this build and this machine offer, gathered from each layer.
#pragma once

#include <string>
#include <vector>

namespace zt {

class Runtime;

struct ReportLine {
  std::string section;  // "build", "mpi", "host", "cuda", "io"
  std::string key;
  std::string value;
};
using Report = std::vector<ReportLine>;

/// Version, build type, compiler, options compiled in.
Report build_report();
/// MPI library and version, thread level, ranks and nodes, UCX availability and how to select it,
/// NCCL version when built with CUDA.
Report mpi_report(const Runtime& runtime);
/// The host kernels' ISA path (kernels/host_isa.hpp) and the paths the CPU supports; CUDA runtime and
/// driver, devices seen (or why none), cuDNN compiled in.
Report device_report();
/// HDF5 version and whether it is parallel; io_uring and libaio usable on this kernel.
Report io_report();

}  // namespace zt
