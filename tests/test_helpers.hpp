// Small helpers shared by the test programs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "zerotrain/error.hpp"
#include "zerotrain/tensor.hpp"

namespace zt::testing {

/// Run `body` and return the message of the zt::Error it throws (fails the test if none).
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const zt::Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a zt::Error";
  return {};
}

/// int32 token ids uniform in [0, vocab), deterministic in `seed`.
inline Tensor random_tokens(const Shape& shape, std::int32_t vocab, std::uint64_t seed) {
  Tensor tokens = Tensor::empty(shape, DType::int32);
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<std::int32_t> pick(0, vocab - 1);
  for (std::int64_t i = 0; i < tokens.numel(); ++i) tokens.data<std::int32_t>()[i] = pick(engine);
  return tokens;
}

}  // namespace zt::testing
