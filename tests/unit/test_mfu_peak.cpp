// The MFU's two halves (docs/metrics.md, "MFU"): the model FLOPs per token against a hand count for
// GPT-2 124M, and the peak it is divided by: the data-sheet table of GPUs (kernels/gpu_peaks.hpp) by
// the names CUDA reports, and the host's measured matmul rate where no table entry applies.
#include <gtest/gtest.h>

#include <string>

#include "kernels/gpu_peaks.hpp"
#include "src/engine/model_flops.hpp"
#include "zerotrain/config.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/estimate.hpp"

namespace {

using zt::kernels::datasheet_peak_flops;
using zt::kernels::GpuMath;

TEST(MfuPeak, Gpt2SmallFlopsPerTokenMatchHandCount) {
  zt::Config config;
  config.model = zt::GptModelConfig{.n_layer = 12,
                                    .n_head = 12,
                                    .d_model = 768,
                                    .seq_len = 1024,
                                    .vocab_size = 50257,
                                    .tie_embeddings = true};
  // By hand: token table 50257 x 768, positions 1024 x 768, per layer two layer norms (2 x 2 x 768),
  // qkv 768 x 2304 + 2304, proj 768 x 768 + 768, fc 768 x 3072 + 3072, proj 3072 x 768 + 768; the
  // final layer norm 2 x 768; the LM head tied.
  const std::int64_t per_layer =
      4 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768);
  const std::int64_t parameters = 50257 * 768 + 1024 * 768 + 12 * per_layer + 2 * 768;
  EXPECT_EQ(parameters, 124439808);
  EXPECT_EQ(zt::model_parameter_count(config), parameters);
  // 6 per parameter, plus attention's Q K^T and P V: 2 x 2 x seq_len x d_model per token and layer
  // forward, twice that backward.
  const double expected = 6.0 * 124439808 + 12.0 * 12 * 1024 * 768;
  EXPECT_DOUBLE_EQ(expected, 859885056.0);
  EXPECT_DOUBLE_EQ(zt::engine_detail::model_flops_per_token(config, parameters), expected);
}

TEST(MfuPeak, DatasheetKnowsHopperAndAmpereByCudaName) {
  // The names cudaDeviceProp::name gives.
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H200", GpuMath::bf16_fp16), 989.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 80GB HBM3", GpuMath::bf16_fp16), 989.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA GH200 480GB", GpuMath::bf16_fp16), 989.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 PCIe", GpuMath::bf16_fp16), 756.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H100 NVL", GpuMath::bf16_fp16), 835.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H200 NVL", GpuMath::bf16_fp16), 835.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA A100-SXM4-80GB", GpuMath::bf16_fp16), 312e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA A100 80GB PCIe", GpuMath::tf32), 156e12);
  // fp32 GEMMs: TF32 tensor cores or the fp32 pipes.
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H200", GpuMath::tf32), 494.5e12);
  EXPECT_EQ(datasheet_peak_flops("NVIDIA H200", GpuMath::fp32), 67e12);
  EXPECT_EQ(datasheet_peak_flops("nvidia h200", GpuMath::bf16_fp16), 989.5e12) << "case-insensitive";
}

TEST(MfuPeak, DatasheetSaysNothingOfWhatItDoesNotHold) {
  EXPECT_FALSE(datasheet_peak_flops("NVIDIA GeForce RTX 4090", GpuMath::bf16_fp16));
  EXPECT_FALSE(datasheet_peak_flops("", GpuMath::bf16_fp16));
  EXPECT_FALSE(datasheet_peak_flops("NVIDIA H200", GpuMath::fp64));
}

TEST(MfuPeak, GemmMathFollowsDtypeAndTf32) {
  EXPECT_EQ(zt::kernels::gpu_math_of(zt::DType::bf16, false), GpuMath::bf16_fp16);
  EXPECT_EQ(zt::kernels::gpu_math_of(zt::DType::fp16, true), GpuMath::bf16_fp16);
  EXPECT_EQ(zt::kernels::gpu_math_of(zt::DType::fp32, true), GpuMath::tf32);
  EXPECT_EQ(zt::kernels::gpu_math_of(zt::DType::fp32, false), GpuMath::fp32);
  EXPECT_THROW(zt::kernels::gpu_math_of(zt::DType::int32, false), zt::Error);
}

TEST(MfuPeak, HostPeakIsTheMeasuredMatmulRate) {
  for (const zt::Device device : {zt::Device::host(), zt::Device::emulated()}) {
    const zt::engine_detail::RankPeakFlops peak = zt::engine_detail::rank_peak_flops(device, zt::DType::fp32);
    EXPECT_EQ(peak.source, "matmul probe") << device.str();
    // Between 100 MFLOP/s and 100 TFLOP/s: a real measurement on any CPU, however loaded.
    EXPECT_GT(peak.flops_per_second, 1e8) << device.str();
    EXPECT_LT(peak.flops_per_second, 1e14) << device.str();
    EXPECT_NE(peak.detail.find("^3 fp32, best of "), std::string::npos) << peak.detail;
    EXPECT_EQ(peak.detail.find(" on "), std::string::npos) << "the host is not named: " << peak.detail;
  }
}

TEST(MfuPeak, CudaDeviceWithoutGpuSaysWhy) {
  if (zt::cuda_status().usable()) GTEST_SKIP() << "a GPU is usable here: this checks the case without one";
  try {
    (void)zt::kernels::cuda_device_facts(0);
    FAIL() << "cuda_device_facts(0) returned without a GPU";
  } catch (const zt::CudaError& error) {
    EXPECT_NE(std::string(error.what()).find("cuda:0"), std::string::npos) << error.what();
  }
}

}  // namespace
