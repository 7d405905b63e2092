// 16-bit float conversions: exhaustive round trips and the rounding rules at the edges.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "zerotrain/dtype.hpp"

namespace {

TEST(DType, SizesAndNames) {
  EXPECT_EQ(zt::dtype_size(zt::DType::fp32), 4u);
  EXPECT_EQ(zt::dtype_size(zt::DType::fp64), 8u);
  EXPECT_EQ(zt::dtype_size(zt::DType::bf16), 2u);
  EXPECT_EQ(zt::dtype_size(zt::DType::fp16), 2u);
  EXPECT_EQ(zt::dtype_size(zt::DType::int32), 4u);
  EXPECT_EQ(zt::dtype_size(zt::DType::int64), 8u);
  for (zt::DType type : zt::kAllDTypes) EXPECT_EQ(zt::parse_dtype(zt::dtype_name(type)), type);
  EXPECT_EQ(zt::parse_dtype("bfloat16"), zt::DType::bf16);
  EXPECT_EQ(zt::parse_dtype("half"), zt::DType::fp16);
  try {
    zt::parse_dtype("fp8");
    FAIL() << "fp8 accepted";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'fp8'"), std::string::npos) << e.what();
  }
}

TEST(Fp16, EveryValueRoundTrips) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float value = zt::fp16::to_float(static_cast<std::uint16_t>(bits));
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(zt::fp16::to_float(zt::fp16::from_float(value))));
      continue;
    }
    ASSERT_EQ(zt::fp16::from_float(value), bits) << "fp16 bits " << bits << " value " << value;
  }
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(zt::fp16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(zt::fp16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(static_cast<float>(zt::fp16(65520.0f))));  // halfway to 65536 rounds up to inf
  EXPECT_EQ(static_cast<float>(zt::fp16(65519.0f)), 65504.0f);
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1).
  EXPECT_EQ(static_cast<float>(zt::fp16(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(static_cast<float>(zt::fp16(1.0f + 0x1p-11f + 0x1p-20f)), 1.0f + 0x1p-10f);
  // Smallest subnormal 2^-24; half of it ties to zero, a bit more rounds up.
  EXPECT_EQ(static_cast<float>(zt::fp16(0x1p-24f)), 0x1p-24f);
  EXPECT_EQ(static_cast<float>(zt::fp16(0x1p-25f)), 0.0f);
  EXPECT_EQ(static_cast<float>(zt::fp16(0x1.1p-25f)), 0x1p-24f);
  EXPECT_TRUE(std::signbit(static_cast<float>(zt::fp16(-0.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(zt::fp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(static_cast<float>(zt::fp16(-std::numeric_limits<float>::infinity()))));
}

TEST(Bf16, EveryValueRoundTrips) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float value = std::bit_cast<float>(bits << 16);
    if (std::isnan(value)) continue;
    ASSERT_EQ(zt::bf16::from_float(value), bits);
  }
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(static_cast<float>(zt::bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(static_cast<float>(zt::bf16(1.0f + 0x1p-7f + 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(static_cast<float>(zt::bf16(3.0f)), 3.0f);
  // A NaN whose payload sits only in the low bits must not become inf.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(static_cast<float>(zt::bf16(low_payload_nan))));
  EXPECT_TRUE(std::isinf(static_cast<float>(zt::bf16(std::numeric_limits<float>::max()))));
}

}  // namespace
