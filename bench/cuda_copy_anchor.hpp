// The trivial copy kernel zt_bench_cuda_kernels measures as its anchor (bench/cuda_copy_anchor.cu).
#pragma once

#include <cstddef>

namespace zt::bench {

/// Copies `bytes` (a multiple of 16) from `source` to `destination`, both device memory of the
/// current device, on the cudaStream_t `stream`; asynchronous.
void launch_copy_anchor(const void* source, void* destination, std::size_t bytes, void* stream);

}  // namespace zt::bench
