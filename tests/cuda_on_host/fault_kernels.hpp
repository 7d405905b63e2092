// Kernels with the faults tests/cuda_on_host's runtime must catch (fault_kernels.cu, translated like
// the kernels under test), for the CudaFibers tests in test_cuda_on_host.cpp.
#pragma once

#include <cstddef>
#include <string>

namespace fault_kernels {

/// The error the last launch left (cudaGetLastError, cleared), "" for none.
std::string take_launch_error();

/// One block of 256 threads sums values[0..256) through shared memory into *sum; without the barrier
/// between the writes and the final read, thread 0 reads slots not yet written.
void block_sum(const float* values, float* sum, bool with_barrier);
/// Threads of the first warp return before a __syncthreads the others wait at.
void divergent_barrier();
/// Lanes 16-31 return, then lanes 0-15 shuffle with the full mask.
void shuffle_after_exit();
/// 512 threads launched on a kernel declared __launch_bounds__(256).
void launch_over_bounds();
/// A block of `threads` threads.
void launch_block_of(unsigned int threads);
/// A launch with `bytes` of dynamic shared memory, after raising the kernel's limit or not.
void launch_with_dynamic_shared(std::size_t bytes, bool raise_limit);

}  // namespace fault_kernels
