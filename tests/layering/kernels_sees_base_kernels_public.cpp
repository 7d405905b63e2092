// Right way: kernels knows base, its own headers and the public headers.
#include "base/round_up.hpp"
#include "base/seconds_since.hpp"
#include "base/text.hpp"
#include "kernels/dispatch.hpp"
#include "kernels/nn_kernels.hpp"
#include "kernels/optimizer_kernels.hpp"
#include "zerotrain/tensor.hpp"
