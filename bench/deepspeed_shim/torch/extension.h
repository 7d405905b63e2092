// Stand-in for <torch/extension.h> so that DeepSpeed's csrc/includes/cpu_adam.h compiles without
// PyTorch (bench/deepspeed_cpu_adam.cpp). The benchmark calls Adam_Optimizer::Step_AVX on fp32 arrays,
// DeepSpeed's own kernel; only the names its header mentions for other dtypes and for the Python
// binding are declared here, none is used.
#pragma once

#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

namespace c10 {
struct Half {
  unsigned short x;
};
struct BFloat16 {
  unsigned short x;
};
}  // namespace c10

namespace torch {
class Tensor;
}  // namespace torch
