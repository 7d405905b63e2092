// Bitwise comparison of tensors on any device, shared by the nn, activation checkpoint and CUDA
// stream tests.
#pragma once

#include <gtest/gtest.h>

#include <cstring>

#include "zerotrain/tensor.hpp"

namespace zt::testing {

/// Both defined, the same dtype and element count, and the same bytes (each brought to the host).
inline ::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.dtype() != b.dtype() || a.numel() != b.numel())
    return ::testing::AssertionFailure() << a.description() << " vs " << b.description();
  const Tensor host_a = a.to(Device::host()), host_b = b.to(Device::host());
  if (std::memcmp(host_a.raw_data(), host_b.raw_data(), host_a.nbytes()) != 0)
    return ::testing::AssertionFailure() << a.description() << ": the bits differ";
  return ::testing::AssertionSuccess();
}

}  // namespace zt::testing
