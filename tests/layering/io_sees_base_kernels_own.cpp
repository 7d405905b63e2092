// Right way: io knows base, kernels (buffers, tensors), its own headers and the public ones.
#include "base/round_up.hpp"
#include "base/text.hpp"
#include "io/hdf5_file.hpp"
#include "io/swap_queues.hpp"
#include "kernels/nn_kernels.hpp"
#include "zerotrain/swap.hpp"
#include "zerotrain/tensor.hpp"
