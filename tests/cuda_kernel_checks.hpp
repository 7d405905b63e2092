// Helpers for the CUDA kernel tests (tests/unit/test_cuda_<family>.cpp): each CUDA kernel runs on the
// same inputs as the host kernel (kernels/host, the reference) and its outputs are compared with a
// tolerance per dtype. Without a usable GPU every such test skips with the reason (ZT_REQUIRE_GPU),
// and ctest shows the program as skipped (tests/CMakeLists.txt: label "gpu").
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"

/// First statement of every GPU test: skip, naming why, when this process has no usable GPU.
#define ZT_REQUIRE_GPU()                                                                                \
  do {                                                                                                  \
    if (!::zt::cuda_status().usable()) GTEST_SKIP() << "no usable GPU: " << ::zt::cuda_status().reason; \
  } while (0)

namespace zt::testing {

/// The same values on the host and on cuda:0: a host Buffer holding them and a device Buffer with a
/// copy. Fill `host` (host_data<T>()), then upload(); after the device kernel, download() brings
/// the device copy back into `downloaded`.
class MirroredBuffer {
 public:
  MirroredBuffer(std::size_t bytes, const Stream& stream)
      : stream_(&stream),
        host(Device::host(), bytes),
        device(stream.device(), bytes),
        downloaded(Device::host(), bytes) {}
  template <typename T>
  T* host_data() {
    return host.as<T>();
  }
  void* device_data() { return device.data(); }
  void upload() {
    copy_bytes(device.data(), device.device(), host.data(), Device::host(), host.size(), stream_);
    stream_->synchronize();
  }
  void download() {
    copy_bytes(downloaded.data(), Device::host(), device.data(), device.device(), device.size(), stream_);
    stream_->synchronize();
  }
  template <typename T>
  const T* downloaded_data() const {
    return downloaded.as<T>();
  }

 private:
  const Stream* stream_;

 public:
  Buffer host;
  Buffer device;
  Buffer downloaded;
};

/// data[i] = value rounded to `dtype` (floating: fp32, fp64, bf16 or fp16, as the host's conversions).
inline void store_as(void* data, DType dtype, std::size_t i, double value) {
  switch (dtype) {
    case DType::fp32:
      static_cast<float*>(data)[i] = static_cast<float>(value);
      return;
    case DType::fp64:
      static_cast<double*>(data)[i] = value;
      return;
    case DType::bf16:
      static_cast<bf16*>(data)[i] = bf16(static_cast<float>(value));
      return;
    case DType::fp16:
      static_cast<fp16*>(data)[i] = fp16(static_cast<float>(value));
      return;
    default:
      FAIL() << "store_as: " << dtype_name(dtype) << " is not floating";
  }
}

/// `count` indices drawn uniform in [low, high] (tokens, targets).
inline std::vector<std::int32_t> random_indices(std::int64_t count, std::int32_t low, std::int32_t high,
                                                std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<std::int32_t> pick(low, high);
  std::vector<std::int32_t> values(static_cast<std::size_t>(count));
  for (auto& value : values) value = pick(engine);
  return values;
}

/// `count` values of `dtype` (floating) drawn uniform in [low, high), rounded to the dtype.
inline void fill_uniform(void* data, DType dtype, std::size_t count, double low, double high,
                         std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> pick(low, high);
  for (std::size_t i = 0; i < count; ++i) store_as(data, dtype, i, pick(engine));
}

inline double element_as_double(const void* data, DType dtype, std::size_t i) {
  switch (dtype) {
    case DType::fp32:
      return static_cast<const float*>(data)[i];
    case DType::fp64:
      return static_cast<const double*>(data)[i];
    case DType::bf16:
      return static_cast<float>(static_cast<const bf16*>(data)[i]);
    case DType::fp16:
      return static_cast<float>(static_cast<const fp16*>(data)[i]);
    case DType::int32:
      return static_cast<const std::int32_t*>(data)[i];
    case DType::int64:
      return static_cast<double>(static_cast<const std::int64_t*>(data)[i]);
  }
  return 0;
}

/// Tolerances for comparing a CUDA result with the host reference: |d - h| <= absolute + relative |h|.
struct Tolerance {
  double absolute = 0;
  double relative = 0;
};
/// Defaults per dtype for kernels whose order of summation differs from the host's (reductions,
/// GEMMs): a few ulps of fp32 accumulation, one or two roundings of 16-bit storage.
inline Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::fp64:
      return {1e-12, 1e-12};
    case DType::fp32:
      return {1e-5, 1e-5};
    case DType::bf16:
      return {1e-2, 1.6e-2};
    case DType::fp16:
      return {2e-3, 2e-3};
    default:
      return {0, 0};
  }
}

/// For sums over `rows` terms that the host adds in sequence and the GPU in chunks: in fp32 and fp64
/// their roundings differ by about sqrt(rows) ulps of the partial sums, which a sum near zero does
/// not cover with a relative tolerance; 16-bit results are dominated by their final rounding.
inline Tolerance summed_over_rows_tolerance(DType dtype, std::int64_t rows) {
  Tolerance tolerance = default_tolerance(dtype);
  if (dtype == DType::fp32 || dtype == DType::fp64)
    tolerance.absolute *= std::max(1.0, std::sqrt(static_cast<double>(rows)));
  return tolerance;
}

/// "fp32 37x100": a case's dtype and two sizes, for failure messages.
inline std::string case_name(DType dtype, std::int64_t a, std::int64_t b) {
  return std::string(dtype_name(dtype)) + " " + std::to_string(a) + "x" + std::to_string(b);
}

/// Compare `count` elements of the CUDA result with the host's; reports the worst element and how
/// many exceed the tolerance, naming `what`.
inline ::testing::AssertionResult all_close(const void* host, const void* device, DType dtype,
                                            std::size_t count, Tolerance tolerance, const std::string& what) {
  std::size_t failures = 0, worst = 0;
  double worst_excess = -1;
  for (std::size_t i = 0; i < count; ++i) {
    const double h = element_as_double(host, dtype, i), d = element_as_double(device, dtype, i);
    const double allowed = tolerance.absolute + tolerance.relative * std::abs(h);
    const double error = std::abs(d - h);
    const bool bad = !(error <= allowed) && !(std::isnan(h) && std::isnan(d)) && !(h == d);
    if (bad) ++failures;
    const double excess = std::isnan(error) ? 1e300 : error - allowed;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << failures << " of " << count << " " << dtype_name(dtype)
         << " elements differ from the host beyond abs " << tolerance.absolute << " + rel "
         << tolerance.relative << "; worst at [" << worst << "]: cuda "
         << element_as_double(device, dtype, worst) << " vs host " << element_as_double(host, dtype, worst);
}

/// The MirroredBuffer's host values against its downloaded device values.
inline ::testing::AssertionResult all_close(const MirroredBuffer& buffer, DType dtype, Tolerance tolerance,
                                            const std::string& what) {
  return all_close(buffer.host.data(), buffer.downloaded.data(), dtype,
                   buffer.host.size() / dtype_size(dtype), tolerance, what);
}

/// A fixture for CUDA kernel tests: skips without a usable GPU, else gives the host stream (the
/// reference kernels) and a stream on cuda:0.
class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZT_REQUIRE_GPU();
    cuda = std::make_unique<Stream>(Device::cuda(0));
  }
  Stream host;  // the host stream: the reference kernels
  std::unique_ptr<Stream> cuda;
};

/// `count` elements of `dtype` uniform in [low, high), on the host and uploaded.
inline MirroredBuffer uniform_buffer(DType dtype, std::int64_t count, double low, double high,
                                     std::uint64_t seed, const Stream& stream) {
  MirroredBuffer buffer(static_cast<std::size_t>(count) * dtype_size(dtype), stream);
  fill_uniform(buffer.host.data(), dtype, static_cast<std::size_t>(count), low, high, seed);
  buffer.upload();
  return buffer;
}

/// Host and device copies holding the same garbage bytes, so that an element a kernel forgets to write
/// shows up as a difference.
inline MirroredBuffer garbage_buffer(std::size_t bytes, const Stream& stream) {
  MirroredBuffer buffer(bytes, stream);
  std::memset(buffer.host.data(), 0x5a, buffer.host.size());
  buffer.upload();
  return buffer;
}

inline std::uint64_t element_bits(const unsigned char* element, std::size_t size) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, element, size);
  return bits;
}

/// Every element of the downloaded CUDA result has the host's bits; a NaN matches any NaN (CUDA's
/// conversions may give another NaN payload than bf16 / fp16, which keep the input's).
inline ::testing::AssertionResult same_bits(const MirroredBuffer& buffer, DType dtype,
                                            const std::string& what) {
  const std::size_t size = dtype_size(dtype);
  const std::size_t count = buffer.host.size() / size;
  const auto* host = static_cast<const unsigned char*>(buffer.host.data());
  const auto* device = static_cast<const unsigned char*>(buffer.downloaded.data());
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(host + i * size, device + i * size, size) == 0) continue;
    if (dtype_is_floating(dtype) && std::isnan(element_as_double(host, dtype, i)) &&
        std::isnan(element_as_double(device, dtype, i))) {
      continue;
    }
    if (mismatches++ == 0) first = i;
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << mismatches << " of " << count << " " << dtype_name(dtype)
         << " elements differ from the host's bits; first at [" << first << "]: cuda "
         << element_as_double(device, dtype, first) << " (0x" << std::hex
         << element_bits(device + first * size, size) << ") vs host " << std::dec
         << element_as_double(host, dtype, first) << " (0x" << std::hex
         << element_bits(host + first * size, size) << ")";
}

}  // namespace zt::testing
