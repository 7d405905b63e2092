// Modules: parameter names and counts, tied embeddings, hooks, gradient accumulation, determinism
// across thread counts, 16-bit forward passes against fp32, and error messages.
#include <gtest/gtest.h>

#include "tensor_checks.hpp"
#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/host/host_common.hpp"     // counter_random: fill_normal's definition
#include "kernels/host/polynomial_cos.hpp"  // fill_normal's shortcut
#include "kernels/nn_kernels.hpp"           // scale
#include "kernels/optimizer_kernels.hpp"    // set_host_threads
#include "zerotrain/execution.hpp"
#include "zerotrain/loss.hpp"
#include "zerotrain/nn.hpp"
#include "zerotrain/optimizer.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::error_of;
using zt::testing::random_tokens;
using zt::testing::same_bits;

using zt::DType;
using zt::ExecutionContext;
using zt::Tensor;
namespace nn = zt::nn;

const nn::GptConfig kSmallGpt{.n_layer = 2, .n_head = 2, .d_model = 16, .seq_len = 8, .vocab_size = 13};
// The shape the engine will be benchmarked with.
const nn::GptConfig kBenchGpt{.n_layer = 4, .n_head = 4, .d_model = 128, .seq_len = 64, .vocab_size = 512};

TEST(Gpt, Gpt2SmallHasExactly124439808Parameters) {
  const nn::GptConfig gpt2{};  // the defaults are GPT-2 124M
  EXPECT_EQ(nn::gpt_parameter_count(gpt2), 124'439'808);
  nn::GptConfig untied = gpt2;
  untied.tie_embeddings = false;
  EXPECT_EQ(nn::gpt_parameter_count(untied), 124'439'808 + 50257 * 768);
  // The formula agrees with what a built model holds, tied and untied.
  for (bool tie : {true, false}) {
    nn::GptConfig config = kBenchGpt;
    config.tie_embeddings = tie;
    nn::Gpt gpt(config);
    EXPECT_EQ(gpt.parameter_count(), nn::gpt_parameter_count(config)) << "tied " << tie;
  }
}

TEST(Gpt, ParameterNamesFollowGpt2) {
  nn::Gpt gpt(kSmallGpt);
  std::vector<std::string> names;
  for (nn::Parameter* parameter : gpt.parameters()) names.push_back(parameter->name);
  std::vector<std::string> expected{"wte.weight", "wpe.weight"};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string prefix = "h." + std::to_string(layer) + ".";
    for (const char* local :
         {"ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
          "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"}) {
      expected.push_back(prefix + local);
    }
  }
  expected.push_back("ln_f.weight");
  expected.push_back("ln_f.bias");
  EXPECT_EQ(names, expected);
  ASSERT_NE(gpt.find_module("h.1.attn.qkv"), nullptr);
  EXPECT_EQ(gpt.find_module("h.1.attn.qkv")->type_name(), "Linear");
  EXPECT_EQ(gpt.find_parameter("h.0.mlp.fc.weight")->value.shape(), (zt::Shape{64, 16}));
  EXPECT_EQ(gpt.find_parameter("nope"), nullptr);
}

TEST(Gpt, TiedHeadBorrowsTheTokenEmbedding) {
  nn::Gpt tied(kSmallGpt);
  nn::Module* head = tied.find_module("lm_head");
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(head->direct_parameters().empty());
  ASSERT_EQ(head->borrowed_parameters().size(), 1u);
  EXPECT_EQ(head->borrowed_parameters()[0], tied.find_parameter("wte.weight"));

  nn::GptConfig config = kSmallGpt;
  config.tie_embeddings = false;
  nn::Gpt untied(config);
  EXPECT_TRUE(untied.find_module("lm_head")->borrowed_parameters().empty());
  ASSERT_NE(untied.find_parameter("lm_head.weight"), nullptr);
}

TEST(Gpt, InitializationIsGpt2StyleAndDeterministic) {
  nn::GptConfig config = kBenchGpt;
  nn::Gpt a(config, DType::fp32, 7), b(config, DType::fp32, 7), c(config, DType::fp32, 8);
  const auto stddev = [](const Tensor& t) {
    double sum = 0, squares = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      sum += t.data<float>()[i];
      squares += double(t.data<float>()[i]) * t.data<float>()[i];
    }
    const double mean = sum / double(t.numel());
    return std::sqrt(squares / double(t.numel()) - mean * mean);
  };
  EXPECT_NEAR(stddev(a.find_parameter("wte.weight")->value), 0.02, 0.001);
  EXPECT_NEAR(stddev(a.find_parameter("h.0.attn.qkv.weight")->value), 0.02, 0.001);
  EXPECT_NEAR(stddev(a.find_parameter("h.3.mlp.proj.weight")->value), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_NEAR(stddev(a.find_parameter("h.1.attn.proj.weight")->value), 0.02 / std::sqrt(8.0), 0.0005);
  EXPECT_EQ(a.find_parameter("h.0.attn.qkv.bias")->value.item_as_double(5), 0.0);
  EXPECT_EQ(a.find_parameter("h.2.ln2.weight")->value.item_as_double(3), 1.0);
  EXPECT_EQ(a.find_parameter("ln_f.bias")->value.item_as_double(0), 0.0);
  const auto parameters_a = a.parameters(), parameters_b = b.parameters(), parameters_c = c.parameters();
  for (std::size_t i = 0; i < parameters_a.size(); ++i) {
    EXPECT_EQ(std::memcmp(parameters_a[i]->value.raw_data(), parameters_b[i]->value.raw_data(),
                          parameters_a[i]->value.nbytes()),
              0)
        << parameters_a[i]->name;
  }
  EXPECT_NE(std::memcmp(parameters_a[0]->value.raw_data(), parameters_c[0]->value.raw_data(), 64), 0);
}

/// fill_normal's definition, element by element: Box-Muller with libm's log and cos on the two uniforms
/// of element i (kernels/host/elementwise.cpp), converted once to T.
template <typename T>
T reference_normal(std::uint64_t seed, std::int64_t i, double mean, double stddev) {
  namespace host = zt::kernels::host;
  const auto index = static_cast<std::uint64_t>(i);
  const double u1 = 1.0 - host::to_unit_double(host::counter_random(seed, 0, 2 * index));
  const double u2 = host::to_unit_double(host::counter_random(seed, 0, 2 * index + 1));
  const double value = mean + stddev * (std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return static_cast<T>(value);
  } else {
    return T(static_cast<float>(value));
  }
}

TEST(FillNormal, PolynomialCosineStaysFarInsideTheBoundItIsTrustedWith) {
  // fill_normal keeps polynomial_cos's result only where kFastCosError (2^-40) around it cannot change
  // the converted value; measured against libm here, 2^-46 is a 64x margin.
  double largest = 0;
  constexpr int kSamples = 1 << 22;
  for (int i = 0; i <= kSamples; ++i) {
    const double x = 6.283185307179586 * (static_cast<double>(i) / kSamples);
    largest = std::max(largest, std::abs(zt::kernels::host::polynomial_cos(x) - std::cos(x)));
  }
  EXPECT_LE(largest, 0x1p-46);
  EXPECT_LT(0x1p-46, zt::kernels::host::kFastCosError);
}

template <typename T>
void expect_fill_normal_is_its_definition(DType dtype, std::int64_t count, double mean, double stddev,
                                          std::uint64_t seed) {
  std::vector<T> filled(static_cast<std::size_t>(count));
  zt::kernels::fill_normal(zt::default_stream(zt::Device::host()), dtype, filled.data(), count, mean, stddev,
                           seed);
  std::int64_t mismatches = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const T expected = reference_normal<T>(seed, i, mean, stddev);
    if (std::memcmp(&expected, &filled[static_cast<std::size_t>(i)], sizeof(T)) != 0 && ++mismatches <= 3) {
      ADD_FAILURE() << zt::dtype_name(dtype) << " element " << i << " of " << count << " (seed " << seed
                    << ", mean " << mean << ", stddev " << stddev << ") differs from libm's Box-Muller";
    }
  }
  EXPECT_EQ(mismatches, 0) << zt::dtype_name(dtype);
}

TEST(FillNormal, GivesLibmsBoxMullerValuesBitForBitOnEveryDtypeAndThreadCount) {
  // 2^22 + 77 elements per dtype (not a multiple of a span or a block), several means and deviations:
  // the polynomial cosine's shortcut must never change a value, and the thread count never either.
  const int saved_threads = zt::kernels::host_threads();
  constexpr std::int64_t kCount = (std::int64_t{1} << 22) + 77;
  for (int threads : {2, 1}) {
    zt::kernels::set_host_threads(threads);
    expect_fill_normal_is_its_definition<float>(DType::fp32, kCount, 0.0, 0.02, 11 + threads);
    expect_fill_normal_is_its_definition<zt::bf16>(DType::bf16, kCount, 0.0, 0.02, 12 + threads);
    expect_fill_normal_is_its_definition<zt::fp16>(DType::fp16, kCount / 4, 1.5, 3.0, 13 + threads);
    expect_fill_normal_is_its_definition<float>(DType::fp32, kCount / 4, -2.0, 1e-3, 14 + threads);
    expect_fill_normal_is_its_definition<double>(DType::fp64, 4099, 0.5, 2.0, 15 + threads);
  }
  zt::kernels::set_host_threads(saved_threads);
}

TEST(Hooks, FireAroundEveryModuleInOrder) {
  nn::Mlp mlp({.sizes = {3, 4, 2}, .activation = nn::ActivationKind::gelu});
  std::vector<std::string> log;
  for (nn::Module* module : mlp.modules()) {
    const std::string name = module->name().empty() ? "root" : module->name();
    module->add_forward_pre_hook([&log, name](nn::Module&, const Tensor&) { log.push_back("f<" + name); });
    module->add_forward_post_hook([&log, name](nn::Module&, const Tensor&, const Tensor& output) {
      EXPECT_TRUE(output.defined());
      log.push_back("f>" + name);
    });
    module->add_backward_pre_hook([&log, name](nn::Module&, const Tensor&) { log.push_back("b<" + name); });
    module->add_backward_post_hook([&log, name](nn::Module&, const Tensor&) { log.push_back("b>" + name); });
  }
  const Tensor output = mlp.run_forward(Tensor::zeros({5, 3}, DType::fp32));
  mlp.run_backward(Tensor::zeros(output.shape(), DType::fp32));
  const std::vector<std::string> expected{"f<root", "f<0", "f>0", "f<1", "f>1", "f<2", "f>2", "f>root",
                                          "b<root", "b<2", "b>2", "b<1", "b>1", "b<0", "b>0", "b>root"};
  EXPECT_EQ(log, expected);

  // Removing a hook stops it; unknown handles are reported.
  log.clear();
  const zt::nn::HookHandle handle =
      mlp.add_forward_pre_hook([&](nn::Module&, const Tensor&) { log.push_back("x"); });
  EXPECT_TRUE(mlp.remove_hook(handle));
  EXPECT_FALSE(mlp.remove_hook(handle));
  mlp.run_forward(Tensor::zeros({1, 3}, DType::fp32));
  EXPECT_EQ(std::count(log.begin(), log.end(), "x"), 0);
}

TEST(Hooks, CanGatherAndReleaseParametersAroundEachModule) {
  // What ZeRO-3 will do: parameter values exist only between a module's pre and post hooks.
  nn::Gpt gpt(kSmallGpt, DType::fp32, 3);
  nn::Gpt reference(kSmallGpt, DType::fp32, 3);
  struct Stash {
    nn::Parameter* parameter;
    Tensor full;
  };
  std::vector<Stash> stash;
  for (nn::Parameter* parameter : gpt.parameters()) {
    stash.push_back({parameter, parameter->value});
    parameter->value = Tensor();  // "partitioned away"
  }
  const auto find_full = [&](nn::Parameter* parameter) {
    for (auto& entry : stash) {
      if (entry.parameter == parameter) return entry.full;
    }
    return Tensor();
  };
  const auto gather = [&](nn::Module& module) {
    for (nn::Parameter* p : module.direct_parameters()) p->value = find_full(p).clone();
    for (nn::Parameter* p : module.borrowed_parameters()) p->value = find_full(p).clone();
  };
  const auto release = [&](nn::Module& module) {
    for (nn::Parameter* p : module.direct_parameters()) p->value = Tensor();
    for (nn::Parameter* p : module.borrowed_parameters()) p->value = Tensor();
  };
  for (nn::Module* module : gpt.modules()) {
    module->add_forward_pre_hook([&](nn::Module& m, const Tensor&) { gather(m); });
    module->add_forward_post_hook([&](nn::Module& m, const Tensor&, const Tensor&) { release(m); });
    module->add_backward_pre_hook([&](nn::Module& m, const Tensor&) { gather(m); });
    module->add_backward_post_hook([&](nn::Module& m, const Tensor&) { release(m); });
  }
  const Tensor tokens = random_tokens({2, 8}, 13, 4);
  const Tensor logits = gpt.run_forward(tokens);
  const Tensor expected = reference.run_forward(tokens);
  ASSERT_EQ(logits.numel(), expected.numel());
  EXPECT_EQ(std::memcmp(logits.raw_data(), expected.raw_data(), logits.nbytes()), 0);
  for (nn::Parameter* parameter : gpt.parameters())
    EXPECT_FALSE(parameter->value.defined()) << parameter->name;

  nn::SoftmaxCrossEntropy criterion;
  criterion.forward(logits, tokens);
  gpt.run_backward(criterion.backward());
  criterion.forward(expected, tokens);
  reference.run_backward(criterion.backward());
  const auto ours = gpt.parameters(), theirs = reference.parameters();
  for (std::size_t i = 0; i < ours.size(); ++i) {
    EXPECT_EQ(std::memcmp(ours[i]->grad.raw_data(), theirs[i]->grad.raw_data(), ours[i]->grad.nbytes()), 0)
        << ours[i]->name;
  }
}

/// One forward and backward of a GPT on fixed data; returns the loss.
double train_step(nn::Gpt& gpt, const Tensor& tokens, const Tensor& targets, Tensor* logits_out = nullptr) {
  nn::SoftmaxCrossEntropy criterion;
  const Tensor logits = gpt.run_forward(tokens);
  const double loss = criterion.forward(logits, targets);
  gpt.run_backward(criterion.backward());
  if (logits_out != nullptr) *logits_out = logits;
  return loss;
}

TEST(Gpt, GradientsAccumulateAcrossBackwardCalls) {
  // fp64, so that "twice the gradient" is exact up to rounding of the sums (1e-12 relative).
  nn::Gpt gpt(kSmallGpt, DType::fp64, 5);
  const Tensor tokens = random_tokens({3, 8}, 13, 6), targets = random_tokens({3, 8}, 13, 7);
  train_step(gpt, tokens, targets);
  std::vector<Tensor> once;
  for (nn::Parameter* parameter : gpt.parameters()) once.push_back(parameter->grad.clone());
  train_step(gpt, tokens, targets);
  std::size_t index = 0;
  for (nn::Parameter* parameter : gpt.parameters()) {
    const Tensor& single = once[index++];
    double largest = 0;
    for (std::int64_t i = 0; i < single.numel(); ++i)
      largest = std::max(largest, std::abs(single.data<double>()[i]));
    ASSERT_GT(largest, 0.0) << parameter->name;
    for (std::int64_t i = 0; i < single.numel(); ++i) {
      ASSERT_NEAR(parameter->grad.data<double>()[i], 2.0 * single.data<double>()[i], 1e-12 * largest)
          << parameter->name << " element " << i;
    }
  }
  gpt.zero_grad();
  for (nn::Parameter* parameter : gpt.parameters()) EXPECT_EQ(parameter->grad.item_as_double(0), 0.0);
}

TEST(Gpt, ResultsAreBitwiseIdenticalOnOneAndTwoThreads) {
  const int saved_threads = zt::kernels::host_threads();
  nn::GptConfig config = kBenchGpt;
  config.dropout = 0.1;
  const Tensor tokens = random_tokens({4, 64}, 512, 8), targets = random_tokens({4, 64}, 512, 9);
  struct Run {
    double loss;
    Tensor logits;
    std::vector<Tensor> grads;
  };
  const auto run = [&](int threads) {
    zt::kernels::set_host_threads(threads);
    nn::Gpt gpt(config, DType::fp32, 11);
    Run result;
    result.loss = train_step(gpt, tokens, targets, &result.logits);
    for (nn::Parameter* parameter : gpt.parameters()) result.grads.push_back(parameter->grad);
    return result;
  };
  const Run one = run(1);
  const Run two = run(2);
  zt::kernels::set_host_threads(saved_threads);
  EXPECT_EQ(one.loss, two.loss);
  EXPECT_EQ(std::memcmp(one.logits.raw_data(), two.logits.raw_data(), one.logits.nbytes()), 0);
  nn::Gpt names(config);
  const auto parameters = names.parameters();
  for (std::size_t i = 0; i < one.grads.size(); ++i) {
    EXPECT_EQ(std::memcmp(one.grads[i].raw_data(), two.grads[i].raw_data(), one.grads[i].nbytes()), 0)
        << parameters[i]->name;
  }
}

TEST(Gpt, SixteenBitForwardIsCloseToFp32) {
  const Tensor tokens = random_tokens({2, 64}, 512, 12), targets = random_tokens({2, 64}, 512, 13);
  nn::Gpt reference(kBenchGpt, DType::fp32, 14);
  Tensor reference_logits;
  const double reference_loss = train_step(reference, tokens, targets, &reference_logits);
  double max_logit = 0;
  for (std::int64_t i = 0; i < reference_logits.numel(); ++i) {
    max_logit = std::max(max_logit, std::abs(double(reference_logits.data<float>()[i])));
  }
  // bf16 keeps 8 significant bits (relative step 2^-8), fp16 11 bits.
  for (auto [dtype, tolerance] : {std::pair{DType::bf16, 0.05}, std::pair{DType::fp16, 0.01}}) {
    nn::Gpt gpt(kBenchGpt, dtype, 14);
    Tensor logits;
    const double loss = train_step(gpt, tokens, targets, &logits);
    const Tensor widened = logits.to(DType::fp32);
    double max_error = 0;
    for (std::int64_t i = 0; i < widened.numel(); ++i) {
      max_error =
          std::max(max_error, std::abs(double(widened.data<float>()[i] - reference_logits.data<float>()[i])));
    }
    EXPECT_LE(max_error, tolerance * max_logit) << zt::dtype_name(dtype);
    EXPECT_NEAR(loss, reference_loss, tolerance * 0.1 * reference_loss) << zt::dtype_name(dtype);
    // Gradients flow in 16-bit too.
    EXPECT_NE(gpt.find_parameter("h.0.attn.qkv.weight")->grad.item_as_double(0), 0.0);
  }
}

TEST(Losses, KnownValues) {
  // Uniform logits: the loss is log(V) whatever the target.
  const Tensor logits = Tensor::zeros({2, 3, 7}, DType::fp32);
  const Tensor targets = Tensor::from_vector<std::int32_t>({0, 1, 2, 3, 4, 6}, {2, 3});
  nn::SoftmaxCrossEntropy criterion;
  EXPECT_NEAR(criterion.forward(logits, targets), std::log(7.0), 1e-6);
  const Tensor grad = criterion.backward(6.0);  // scale 6 over 6 rows: (1/7 - onehot) per row
  EXPECT_NEAR(grad.item_as_double(0), 1.0 / 7.0 - 1.0, 1e-6);
  EXPECT_NEAR(grad.item_as_double(1), 1.0 / 7.0, 1e-6);

  nn::MseLoss mse;
  const Tensor prediction = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  const Tensor target = Tensor::from_vector<float>({1, 0, 3, 2}, {4});
  EXPECT_DOUBLE_EQ(mse.forward(prediction, target), 2.0);
  EXPECT_DOUBLE_EQ(mse.backward(1.0).item_as_double(1), 1.0);  // 2 * (2 - 0) / 4
}

TEST(Errors, NameTheModuleAndTheExpectedShape) {
  nn::Gpt gpt(kSmallGpt);
  std::string message = error_of([&] { gpt.run_forward(random_tokens({1, 9}, 13, 1)); });
  EXPECT_NE(message.find("exceeds the model's seq_len 8"), std::string::npos) << message;
  Tensor bad_tokens = random_tokens({1, 4}, 13, 1);
  bad_tokens.data<std::int32_t>()[2] = 13;
  message = error_of([&] { gpt.run_forward(bad_tokens); });
  EXPECT_NE(message.find("token 13 at batch 0, position 2"), std::string::npos) << message;

  nn::Linear& qkv = dynamic_cast<nn::Linear&>(*gpt.find_module("h.1.attn.qkv"));
  message = error_of([&] { qkv.run_forward(Tensor::zeros({2, 5}, DType::fp32)); });
  EXPECT_NE(message.find("Linear 'h.1.attn.qkv'"), std::string::npos) << message;
  EXPECT_NE(message.find("expected the last dimension to be 16"), std::string::npos) << message;
  message = error_of([&] { qkv.run_forward(Tensor::zeros({2, 16}, DType::bf16)); });
  EXPECT_NE(message.find("expected dtype fp32"), std::string::npos) << message;

  nn::SoftmaxCrossEntropy criterion;
  message = error_of([&] {
    criterion.forward(Tensor::zeros({2, 5}, DType::fp32), Tensor::from_vector<std::int32_t>({1, 5}, {2}));
  });
  EXPECT_NE(message.find("target 5 of row 1"), std::string::npos) << message;
  message = error_of([] { nn::Gpt(nn::GptConfig{.n_head = 5}); });
  EXPECT_NE(message.find("multiple of n_head 5"), std::string::npos) << message;
}

// ---- micro-batch slots ----------------------------------------------------------------------

std::vector<Tensor> gradients_of(nn::Module& module) {
  std::vector<Tensor> grads;
  for (nn::Parameter* parameter : module.parameters()) grads.push_back(parameter->grad.clone());
  return grads;
}

/// Collects streamed gradients (nn::GradientSink) in ranges of a few rows, as an engine's reduce
/// buckets would ask for them, into full tensors of its own.
class RowsCollector final : public nn::GradientSink {
 public:
  explicit RowsCollector(std::int64_t rows_per_range) : rows_per_range_(rows_per_range) {}
  void stream(nn::Parameter& parameter, std::int64_t rows, const RowsFunction& compute) override {
    const DType dtype = parameter.value.dtype();
    Tensor& total = collected_[parameter.name];
    EXPECT_FALSE(total.defined()) << parameter.name << " streamed twice";
    total = Tensor::zeros(parameter.value.shape(), dtype);
    const std::int64_t row = parameter.value.numel() / rows;
    const std::size_t element = zt::dtype_size(dtype);
    for (std::int64_t first = 0; first < rows; first += rows_per_range_) {
      const std::int64_t count = std::min(rows_per_range_, rows - first);
      Tensor part = Tensor::zeros({count * row}, dtype);
      compute(first, count, part.raw_data());
      std::memcpy(static_cast<std::byte*>(total.raw_data()) + static_cast<std::size_t>(first * row) * element,
                  part.raw_data(), static_cast<std::size_t>(count * row) * element);
    }
  }
  Tensor& full_gradient(nn::Parameter& parameter) override {
    parameter.grad = Tensor::zeros(parameter.value.shape(), parameter.value.dtype());
    return parameter.grad;
  }
  const Tensor& collected(const std::string& name) { return collected_[name]; }

 private:
  std::int64_t rows_per_range_;
  std::map<std::string, Tensor> collected_;
};

/// The layers that stream their gradients (Linear and LmHead weights by output rows, the token
/// table by rows of tokens) give, range by range, the gradient they accumulate in one call, in fp32
/// and bf16: the token table's bits; the GEMM rows within rounding (a BLAS GEMM of 3 rows may sum in
/// another order than one of all rows: OpenBLAS's kernels depend on the row count), everything else
/// (biases, LayerNorms, positions, which stay full-shape) bit for bit.
TEST(GradientSink, StreamedRowsAreTheFullGradients) {
  nn::GptConfig config = kSmallGpt;
  config.tie_embeddings = false;  // one contribution per parameter (a tied table would get two)
  for (DType dtype : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(zt::dtype_name(dtype));
    const Tensor tokens = random_tokens({3, 8}, 13, 6), targets = random_tokens({3, 8}, 13, 7);
    nn::Gpt reference(config, dtype, 5);
    train_step(reference, tokens, targets);
    nn::Gpt streamed(config, dtype, 5);
    RowsCollector collector(3);  // 3 rows at a time: ranges end inside every table
    int streaming_modules = 0;
    for (nn::Module* module : streamed.modules()) {
      if (!module->streams_gradients()) continue;
      ++streaming_modules;
      module->add_backward_pre_hook([&collector](nn::Module& self, const Tensor&) {
        for (nn::Parameter* parameter : self.direct_parameters()) {
          if (parameter->name.ends_with(".bias")) continue;  // full-shape, through grad_pointer
          parameter->grad = Tensor();
          parameter->gradient_sink = &collector;
        }
      });
      module->add_backward_post_hook([](nn::Module& self, const Tensor&) {
        for (nn::Parameter* parameter : self.direct_parameters()) parameter->gradient_sink = nullptr;
      });
    }
    EXPECT_EQ(streaming_modules, 2 * config.n_layer * 2 + 2);  // qkv, proj, fc, proj per layer; wte, lm_head
    train_step(streamed, tokens, targets);
    const std::vector<nn::Parameter*> expected = reference.parameters();
    const std::vector<nn::Parameter*> actual = streamed.parameters();
    ASSERT_EQ(actual.size(), expected.size());
    int compared_streams = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
      const std::string& name = actual[i]->name;
      const bool streamed_rows = !actual[i]->grad.defined();
      const Tensor& gradient = streamed_rows ? collector.collected(name) : actual[i]->grad;
      compared_streams += streamed_rows ? 1 : 0;
      if (!streamed_rows || name == "wte.weight") {
        EXPECT_TRUE(same_bits(gradient, expected[i]->grad)) << name;
        continue;
      }
      // fp32: a few ulps of the largest element; bf16: one rounding of an fp32 sum that differs
      // that much can move an element by one bf16 ulp (2^-8 relative).
      const Tensor got = gradient.to(DType::fp32), want = expected[i]->grad.to(DType::fp32);
      double largest = 0, difference = 0;
      for (std::int64_t k = 0; k < want.numel(); ++k) {
        largest = std::max(largest, static_cast<double>(std::abs(want.data<float>()[k])));
        difference =
            std::max(difference, static_cast<double>(std::abs(got.data<float>()[k] - want.data<float>()[k])));
      }
      ASSERT_GT(largest, 0.0) << name;
      EXPECT_LE(difference, (dtype == DType::fp32 ? 1e-6 : 1.0 / 128) * largest) << name;
    }
    EXPECT_EQ(compared_streams, streaming_modules);
  }
}

TEST(MicroBatches, TwoForwardsThenTwoBackwardsEqualTwoPairsForAGptWithDropout) {
  nn::GptConfig config = kSmallGpt;
  config.dropout = 0.2;
  const Tensor tokens[2] = {random_tokens({2, 8}, 13, 40), random_tokens({2, 8}, 13, 41)};
  const Tensor targets[2] = {random_tokens({2, 8}, 13, 42), random_tokens({2, 8}, 13, 43)};

  nn::Gpt pairs(config, DType::fp32, 9);
  Tensor pair_logits[2];
  for (int m = 0; m < 2; ++m) {
    pair_logits[m] = pairs.run_forward(tokens[m]);
    pairs.run_backward(zt::cross_entropy_loss(pair_logits[m], targets[m]).gradient(0.5));
  }

  nn::Gpt interleaved(config, DType::fp32, 9);
  const nn::RunContext slot[2] = {{.micro_batch = 0}, {.micro_batch = 1}};
  Tensor logits[2];
  for (int m = 0; m < 2; ++m) logits[m] = interleaved.run_forward(tokens[m], slot[m]);
  EXPECT_GT(interleaved.saved_activation_count(), 0u);
  for (int m = 0; m < 2; ++m) {
    const Tensor grad_tokens =
        interleaved.run_backward(zt::cross_entropy_loss(logits[m], targets[m]).gradient(0.5), slot[m]);
    EXPECT_FALSE(grad_tokens.defined());
  }
  EXPECT_EQ(interleaved.saved_activation_count(), 0u) << "backward frees the activations it took";
  for (int m = 0; m < 2; ++m) EXPECT_TRUE(same_bits(logits[m], pair_logits[m])) << "micro-batch " << m;
  EXPECT_FALSE(same_bits(logits[0], logits[1])) << "the micro-batches differ (the check is not vacuous)";
  const std::vector<Tensor> expected = gradients_of(pairs), actual = gradients_of(interleaved);
  const auto parameters = pairs.parameters();
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_TRUE(same_bits(actual[i], expected[i])) << parameters[i]->name;
}

TEST(MicroBatches, TwoForwardsThenTwoBackwardsInEitherOrderEqualTwoPairsForAnMlp) {
  const nn::MlpConfig config{.sizes = {5, 9, 4}, .activation = nn::ActivationKind::gelu};
  std::mt19937_64 engine(44);
  std::normal_distribution<float> normal;
  Tensor inputs[2], targets[2];
  for (int m = 0; m < 2; ++m) {
    std::vector<float> x(15), y(12);
    for (float& v : x) v = normal(engine);
    for (float& v : y) v = normal(engine);
    inputs[m] = Tensor::from_vector(x, {3, 5});
    targets[m] = Tensor::from_vector(y, {3, 4});
  }
  // The backwards run in the opposite order of the forwards (as a pipeline may): each must take
  // its own micro-batch's activations. The pairs accumulate in the same order.
  nn::Mlp pairs(config, DType::fp32, 45), interleaved(config, DType::fp32, 45);
  Tensor pair_grad_input[2], grad_input[2], outputs[2];
  for (int m : {1, 0}) {
    const Tensor output = pairs.run_forward(inputs[m]);
    pair_grad_input[m] = pairs.run_backward(zt::mse_loss(output, targets[m]).gradient(1.0));
  }
  for (int m : {0, 1}) outputs[m] = interleaved.run_forward(inputs[m], {.micro_batch = std::uint32_t(m)});
  for (int m : {1, 0}) {
    grad_input[m] = interleaved.run_backward(zt::mse_loss(outputs[m], targets[m]).gradient(1.0),
                                             {.micro_batch = std::uint32_t(m)});
    EXPECT_TRUE(same_bits(grad_input[m], pair_grad_input[m])) << "input gradient of micro-batch " << m;
  }
  EXPECT_FALSE(same_bits(grad_input[0], grad_input[1]));
  const std::vector<Tensor> expected = gradients_of(pairs), actual = gradients_of(interleaved);
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(same_bits(actual[i], expected[i])) << i;
}

TEST(MicroBatches, MisuseOfSlotsIsAClearError) {
  nn::Gpt gpt(kSmallGpt);
  const Tensor tokens = random_tokens({1, 4}, 13, 46);
  std::string message = error_of([&] { gpt.run_backward(Tensor::zeros({1, 4, 13}, DType::fp32)); });
  EXPECT_NE(message.find("backward of LmHead 'lm_head' for micro-batch 0 without its forward"),
            std::string::npos)
      << message;

  const Tensor logits = gpt.run_forward(tokens, {.micro_batch = 3});
  message = error_of([&] { gpt.run_forward(tokens, {.micro_batch = 3}); });
  EXPECT_NE(message.find("Embedding 'wte': a second forward into micro-batch slot 3 before its backward"),
            std::string::npos)
      << message;
  message = error_of([&] { gpt.run_backward(Tensor::zeros({1, 4, 13}, DType::fp32), {.micro_batch = 2}); });
  EXPECT_NE(message.find("for micro-batch 2 without its forward"), std::string::npos) << message;
  // The refused forward left the first one's activations alone: its backward runs.
  const std::size_t held = gpt.saved_activation_count();
  EXPECT_GT(held, 0u);
  gpt.run_backward(zt::cross_entropy_loss(logits, tokens).gradient(1.0), {.micro_batch = 3});
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
  message = error_of([&] { gpt.run_backward(Tensor::zeros({1, 4, 13}, DType::fp32), {.micro_batch = 3}); });
  EXPECT_NE(message.find("or its backward ran already"), std::string::npos) << message;
}

TEST(MicroBatches, FailedPassesAndForwardsWithoutBackwardLeaveNoActivations) {
  nn::Gpt gpt(kSmallGpt);
  const Tensor tokens = random_tokens({2, 8}, 13, 47);
  // A forward that fails half way (in a hook of the final LayerNorm) releases what it saved.
  nn::Module& ln_f = *gpt.find_module("ln_f");
  const nn::HookHandle failing =
      ln_f.add_forward_pre_hook([](nn::Module&, const Tensor&) { ZT_THROW("hook refuses"); });
  EXPECT_NE(error_of([&] { gpt.run_forward(tokens); }).find("hook refuses"), std::string::npos);
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
  ln_f.remove_hook(failing);

  // A backward that fails releases its micro-batch.
  gpt.run_forward(tokens);
  EXPECT_NE(error_of([&] {
              gpt.run_backward(Tensor::zeros({2, 8, 5}, DType::fp32));
            }).find("expected the last dimension to be 13"),
            std::string::npos);
  EXPECT_EQ(gpt.saved_activation_count(), 0u);

  // Evaluation mode and save_for_backward = false save nothing; release_activations drops slots.
  gpt.eval();
  gpt.run_forward(tokens);
  gpt.run_forward(tokens);
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
  gpt.train();
  gpt.run_forward(tokens, {.save_for_backward = false});
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
  gpt.run_forward(tokens, {.micro_batch = 0});
  gpt.run_forward(tokens, {.micro_batch = 1});
  const std::size_t two = gpt.saved_activation_count();
  gpt.release_activations(0);
  EXPECT_EQ(gpt.saved_activation_count(), two / 2);
  gpt.release_activations();
  EXPECT_EQ(gpt.saved_activation_count(), 0u);
}

TEST(MicroBatches, ActivationMemoryIsFreedAfterBackward) {
  nn::Gpt gpt(kBenchGpt, DType::fp32, 48);
  const Tensor tokens = random_tokens({2, 64}, 512, 49);
  const auto activations = [] {
    return zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].current;
  };
  const std::size_t before = activations();
  {
    const Tensor logits = gpt.run_forward(tokens);
    EXPECT_GT(activations(), before + logits.nbytes()) << "the forward keeps activations for its backward";
    gpt.run_backward(zt::cross_entropy_loss(logits, tokens).gradient(1.0));
  }
  EXPECT_EQ(activations(), before);
}

// ---- loss helpers and the scale kernel --------------------------------------------------------

TEST(LossHelpers, KeepTheLossOnTheDeviceAndMatchTheStatefulLosses) {
  const Tensor logits =
      Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.0f, 1.0f, 1.0f, -3.0f, 0.25f, 4.0f}, {3, 3});
  const Tensor targets = Tensor::from_vector<std::int32_t>({2, -100, 0}, {3});
  const zt::Loss loss = zt::cross_entropy_loss(logits, targets);
  EXPECT_EQ(loss.value.shape(), zt::Shape{});
  EXPECT_EQ(loss.value.dtype(), DType::fp64);
  EXPECT_EQ(loss.counted_rows.item_as_double(), 2.0);
  EXPECT_EQ(loss.output.raw_data(), logits.raw_data());
  nn::SoftmaxCrossEntropy criterion;
  EXPECT_EQ(loss.value.item_as_double(), criterion.forward(logits, targets));
  EXPECT_EQ(criterion.counted_rows(), 2);
  EXPECT_TRUE(same_bits(loss.gradient(3.0), criterion.backward(3.0)));
  // No counted row: loss 0 and a zero gradient, not a division by zero.
  const zt::Loss none =
      zt::cross_entropy_loss(logits, Tensor::from_vector<std::int32_t>({-100, -100, -100}, {3}));
  EXPECT_EQ(none.value.item_as_double(), 0.0);
  EXPECT_EQ(none.gradient(1.0).item_as_double(4), 0.0);

  const Tensor prediction = Tensor::from_vector<float>({1, 2, 3, 4}, {4});
  const Tensor target = Tensor::from_vector<float>({1, 0, 3, 2}, {4});
  const zt::Loss mse = zt::mse_loss(prediction, target);
  EXPECT_EQ(mse.value.item_as_double(), 2.0);
  EXPECT_FALSE(mse.counted_rows.defined());
  EXPECT_EQ(mse.gradient(2.0).item_as_double(3), 2.0);  // 2 * 2 * (4 - 2) / 4

  // On the emulated device: the same bits, the value stays there.
  const ExecutionContext context(zt::Device::emulated());
  const zt::Loss on_device =
      zt::cross_entropy_loss(context.on_device(logits), context.on_device(targets), context);
  EXPECT_EQ(on_device.value.device(), zt::Device::emulated());
  EXPECT_TRUE(same_bits(on_device.value, loss.value));
  EXPECT_TRUE(same_bits(on_device.gradient(3.0), loss.gradient(3.0)));
  const std::string message = error_of([&] { zt::cross_entropy_loss(logits, targets, context); });
  EXPECT_NE(message.find("expected memory of the execution context's device emulated:0"), std::string::npos)
      << message;
}

TEST(Kernels, ScaleMultipliesInTheAccumulationType) {
  for (DType dtype : {DType::fp32, DType::bf16, DType::fp64}) {
    Tensor values = Tensor::from_vector<float>({1.5f, -2.0f, 0.375f}, {3}).to(dtype);
    zt::kernels::scale(zt::default_stream(zt::Device::host()), dtype, values.raw_data(), 3, 0.25);
    EXPECT_EQ(values.item_as_double(0), 0.375) << zt::dtype_name(dtype);
    EXPECT_EQ(values.item_as_double(1), -0.5) << zt::dtype_name(dtype);
    Tensor on_device =
        Tensor::from_vector<float>({1.5f, -2.0f, 0.375f}, {3}).to(dtype).to(zt::Device::emulated());
    zt::kernels::scale(zt::default_stream(zt::Device::emulated()), dtype, on_device.raw_data(), 3, 0.25);
    EXPECT_TRUE(same_bits(on_device, values)) << zt::dtype_name(dtype);
  }
}

// ---- attention: saved log-sum-exps, recomputed probabilities ------------------------------------

/// Causal attention of one shape in fp64 the plain way: full [T, T] probabilities per head.
struct AttentionReference {
  std::vector<double> output, row_logsumexp, grad_qkv;
};

AttentionReference reference_attention(const std::vector<double>& qkv, const std::vector<double>& grad_output,
                                       const zt::kernels::AttentionShape& shape) {
  const std::int64_t T = shape.seq_len, D = shape.head_dim, C = shape.n_head * D, H = shape.n_head;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  AttentionReference r{std::vector<double>(shape.batch * T * C), std::vector<double>(shape.batch * H * T),
                       std::vector<double>(qkv.size())};
  const auto at = [&](std::int64_t b, std::int64_t t, std::int64_t part, std::int64_t h, std::int64_t d) {
    return ((b * T + t) * 3 + part) * C + h * D + d;  // qkv index: part 0 q, 1 k, 2 v
  };
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = 0; h < H; ++h) {
      std::vector<double> p(T * T, 0.0), dp(T * T, 0.0);
      for (std::int64_t t = 0; t < T; ++t) {
        double row_max = -INFINITY;
        for (std::int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += qkv[at(b, t, 0, h, d)] * qkv[at(b, s, 1, h, d)];
          p[t * T + s] = scale * dot;
          row_max = std::max(row_max, p[t * T + s]);
        }
        double sum = 0;
        for (std::int64_t s = 0; s <= t; ++s) sum += std::exp(p[t * T + s] - row_max);
        r.row_logsumexp[(b * H + h) * T + t] = row_max + std::log(sum);
        for (std::int64_t s = 0; s <= t; ++s) p[t * T + s] = std::exp(p[t * T + s] - row_max) / sum;
        for (std::int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (std::int64_t s = 0; s <= t; ++s) o += p[t * T + s] * qkv[at(b, s, 2, h, d)];
          r.output[(b * T + t) * C + h * D + d] = o;
        }
      }
      for (std::int64_t t = 0; t < T; ++t) {
        double row_dot = 0;
        for (std::int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += grad_output[(b * T + t) * C + h * D + d] * qkv[at(b, s, 2, h, d)];
          dp[t * T + s] = dot;
          row_dot += p[t * T + s] * dot;
        }
        for (std::int64_t s = 0; s <= t; ++s) {
          const double ds = p[t * T + s] * (dp[t * T + s] - row_dot);
          for (std::int64_t d = 0; d < D; ++d) {
            r.grad_qkv[at(b, t, 0, h, d)] += scale * ds * qkv[at(b, s, 1, h, d)];
            r.grad_qkv[at(b, s, 1, h, d)] += scale * ds * qkv[at(b, t, 0, h, d)];
            r.grad_qkv[at(b, s, 2, h, d)] += p[t * T + s] * grad_output[(b * T + t) * C + h * D + d];
          }
        }
      }
    }
  }
  return r;
}

/// max |actual - expected| over max(1, max |expected|).
double relative_error(const Tensor& actual, const std::vector<double>& expected) {
  double error = 0, scale = 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    error = std::max(error, std::abs(actual.item_as_double(static_cast<std::int64_t>(i)) - expected[i]));
    scale = std::max(scale, std::abs(expected[i]));
  }
  return error / scale;
}

std::vector<double> values_of(const Tensor& tensor) {
  std::vector<double> out(static_cast<std::size_t>(tensor.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = tensor.item_as_double(static_cast<std::int64_t>(i));
  return out;
}

// The host kernel works in blocks of 64 query rows over the keys at or below each block; only the
// rows' log-sum-exps are saved and the backward recomputes the probabilities from them. Shapes around
// and across the block size, every floating dtype, against the full-softmax reference in fp64 (on the
// inputs rounded to the dtype).
TEST(Kernels, AttentionMatchesTheFullSoftmaxReferenceAcrossQueryBlocks) {
  const zt::kernels::AttentionShape shapes[] = {{1, 1, 2, 4},  {2, 63, 2, 8},  {1, 64, 1, 16},
                                                {1, 65, 3, 8}, {2, 130, 2, 8}, {1, 200, 1, 5}};
  const zt::Stream& host = zt::default_stream(zt::Device::host());
  std::mt19937_64 random(61);
  for (const auto& shape : shapes) {
    const std::int64_t tokens = shape.batch * shape.seq_len, C = shape.n_head * shape.head_dim;
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    std::vector<float> qkv_values(tokens * 3 * C), grad_values(tokens * C);
    for (float& x : qkv_values) x = uniform(random);
    for (float& x : grad_values) x = uniform(random);
    for (DType dtype : {DType::fp64, DType::fp32, DType::bf16, DType::fp16}) {
      const std::string name = std::string(zt::dtype_name(dtype)) + " T" + std::to_string(shape.seq_len) +
                               " H" + std::to_string(shape.n_head) + " D" + std::to_string(shape.head_dim);
      const Tensor qkv = Tensor::from_vector<float>(qkv_values, {tokens, 3 * C}).to(dtype);
      const Tensor grad_output = Tensor::from_vector<float>(grad_values, {tokens, C}).to(dtype);
      const AttentionReference expected = reference_attention(values_of(qkv), values_of(grad_output), shape);
      Tensor output = Tensor::empty({tokens, C}, dtype);
      Tensor row_logsumexp =
          Tensor::empty({shape.batch, shape.n_head, shape.seq_len}, zt::kernels::stat_dtype(dtype));
      Tensor grad_qkv = Tensor::empty({tokens, 3 * C}, dtype);
      zt::kernels::attention_forward(host, dtype, qkv.raw_data(), output.raw_data(), row_logsumexp.raw_data(),
                                     shape);
      zt::kernels::attention_backward(host, dtype, grad_output.raw_data(), qkv.raw_data(), output.raw_data(),
                                      row_logsumexp.raw_data(), grad_qkv.raw_data(), shape);
      // Outputs are rounded once to the dtype; the statistics stay in fp32 (fp64 for fp64).
      const double rounding = dtype == DType::fp64   ? 1e-13
                              : dtype == DType::fp32 ? 2e-6
                              : dtype == DType::bf16 ? 8e-3
                                                     : 1e-3;
      const double statistics = dtype == DType::fp64 ? 1e-13 : 2e-6;
      EXPECT_LT(relative_error(output, expected.output), rounding) << name;
      EXPECT_LT(relative_error(row_logsumexp, expected.row_logsumexp), statistics) << name;
      EXPECT_LT(relative_error(grad_qkv, expected.grad_qkv), 4 * rounding) << name;
    }
  }
}

// What the attention keeps for its backward grows as T, not T^2: doubling the sequence doubles the
// activations held between forward and backward exactly (qkv, the output, the log-sum-exps).
TEST(MicroBatches, AttentionKeepsActivationsLinearInTheSequenceLength) {
  const auto held = [](std::int64_t seq_len) {
    nn::CausalSelfAttention attention(16, 2, DType::fp32);
    std::vector<float> values(static_cast<std::size_t>(seq_len * 16), 0.5f);
    const Tensor input = Tensor::from_vector<float>(values, {1, seq_len, 16});
    const auto activations = [] {
      return zt::memory_snapshot(zt::DeviceType::host)[zt::MemoryCategory::activations].current;
    };
    const std::size_t before = activations();
    std::size_t kept = 0;
    {
      const Tensor output = attention.run_forward(input);
      kept = activations() - before - output.nbytes();
      attention.run_backward(output);
    }
    EXPECT_EQ(activations(), before);
    return kept;
  };
  const std::size_t at_256 = held(256), at_512 = held(512);
  // qkv [T, 48] + the output [T, 16] + the log-sum-exps [2, T], fp32.
  EXPECT_EQ(at_256, 256u * (48 + 16 + 2) * 4);
  EXPECT_EQ(at_512, 2 * at_256) << "the [H, T, T] probabilities would make it 4x";
}

// ---- the emulated device ----------------------------------------------------------------------

TEST(EmulatedDevice, GptForwardBackwardAndAdamStepGiveTheHostBits) {
  nn::GptConfig config = kSmallGpt;
  config.dropout = 0.1;
  const zt::Device emulated = zt::Device::emulated();
  const ExecutionContext context(emulated);
  const nn::RunContext on_device{.execution = &context};
  for (DType dtype : {DType::fp32, DType::bf16}) {
    SCOPED_TRACE(zt::dtype_name(dtype));
    nn::Gpt host(config, dtype, 50);
    nn::Gpt device(config, dtype, 50, emulated);
    const auto host_parameters = host.parameters(), device_parameters = device.parameters();
    for (std::size_t i = 0; i < host_parameters.size(); ++i) {
      ASSERT_EQ(device_parameters[i]->value.device(), emulated);
      EXPECT_TRUE(same_bits(device_parameters[i]->value, host_parameters[i]->value))
          << "initialized on the device: " << host_parameters[i]->name;
    }
    const Tensor tokens = random_tokens({2, 8}, 13, 51), targets = random_tokens({2, 8}, 13, 52);
    const Tensor host_logits = host.run_forward(tokens);
    const zt::Loss host_loss = zt::cross_entropy_loss(host_logits, targets);
    host.run_backward(host_loss.gradient(0.5));

    const Tensor device_logits = device.run_forward(context.on_device(tokens), on_device);
    EXPECT_EQ(device_logits.device(), emulated);
    const zt::Loss device_loss = zt::cross_entropy_loss(device_logits, context.on_device(targets), context);
    device.run_backward(device_loss.gradient(0.5), on_device);
    EXPECT_TRUE(same_bits(device_logits, host_logits));
    EXPECT_TRUE(same_bits(device_loss.value, host_loss.value));
    for (std::size_t i = 0; i < host_parameters.size(); ++i) {
      EXPECT_TRUE(same_bits(device_parameters[i]->grad, host_parameters[i]->grad))
          << host_parameters[i]->name;
    }
    if (dtype != DType::fp32) continue;

    // One AdamW step over every parameter (fp32: the parameters are their own master weights).
    const auto buffers_of = [](const std::vector<nn::Parameter*>& parameters) {
      std::vector<zt::ParamBuffer> params;
      std::vector<zt::GradBuffer> grads;
      for (nn::Parameter* p : parameters) {
        params.push_back({p->value.data<float>(), static_cast<std::size_t>(p->value.numel())});
        grads.push_back({p->grad.raw_data(), DType::fp32});
      }
      return std::pair{params, grads};
    };
    zt::OptimizerParams hp;
    hp.weight_decay = 0.1f;
    auto [host_params, host_grads] = buffers_of(host_parameters);
    auto [device_params, device_grads] = buffers_of(device_parameters);
    auto host_adam = zt::make_optimizer("adamw", host_params, hp);
    auto device_adam = zt::make_optimizer("adamw", device_params, hp, emulated);
    host_adam->step(host_grads, 0.5f, 1e-2f);
    device_adam->step(device_grads, 0.5f, 1e-2f, {}, &context.compute());
    for (std::size_t i = 0; i < host_parameters.size(); ++i) {
      EXPECT_TRUE(same_bits(device_parameters[i]->value, host_parameters[i]->value))
          << "after the step: " << host_parameters[i]->name;
      const std::span<const float> host_state = host_adam->state("exp_avg_sq", i);
      std::vector<float> device_state(host_state.size());
      context.to_host(device_state.data(), device_adam->state("exp_avg_sq", i).data(),
                      device_state.size() * sizeof(float));
      EXPECT_EQ(std::memcmp(device_state.data(), host_state.data(), device_state.size() * sizeof(float)), 0)
          << "exp_avg_sq of " << host_parameters[i]->name;
    }
  }
}

TEST(EmulatedDevice, ZeroGradClearsOnTheContextsComputeStream) {
  const ExecutionContext context(zt::Device::emulated());
  const nn::RunContext on_device{.execution = &context};
  nn::Gpt gpt(kSmallGpt, DType::fp32, 55, zt::Device::emulated());
  const Tensor tokens = context.on_device(random_tokens({2, 8}, 13, 56));
  const auto all_zero = [&] {
    for (nn::Parameter* parameter : gpt.parameters()) {
      if (!parameter->grad.defined()) continue;
      Tensor host = Tensor::empty(parameter->grad.shape(), DType::fp32);
      context.to_host(host.raw_data(), parameter->grad.raw_data(), host.nbytes());
      for (std::int64_t i = 0; i < host.numel(); ++i) {
        if (host.data<float>()[i] != 0.0f) return false;
      }
    }
    return true;
  };
  for (int pass = 0; pass < 2; ++pass) {
    const Tensor logits = gpt.run_forward(tokens, on_device);
    gpt.run_backward(zt::cross_entropy_loss(logits, tokens, context).gradient(1.0), on_device);
    ASSERT_FALSE(all_zero());
    if (pass == 0) {
      gpt.zero_grad(context);
    } else {
      gpt.zero_grad();  // the emulated device's work runs at once: no stream needed
    }
    EXPECT_TRUE(all_zero()) << "pass " << pass;
  }
  const std::string message = error_of([&] { gpt.zero_grad(ExecutionContext::host()); });
  EXPECT_NE(message.find("ExecutionContext on host: zero of fp32"), std::string::npos) << message;
}

TEST(EmulatedDevice, ModulesRefuseMemoryOfAnotherDevice) {
  const ExecutionContext context(zt::Device::emulated());
  nn::Gpt device(kSmallGpt, DType::fp32, 53, zt::Device::emulated());
  const Tensor tokens = random_tokens({1, 4}, 13, 54);
  std::string message = error_of([&] { device.run_forward(tokens, {.execution = &context}); });
  EXPECT_NE(message.find("Embedding 'wte': tokens is int32[1, 4] on host, expected memory of the run "
                         "context's device emulated:0"),
            std::string::npos)
      << message;
  nn::Gpt host(kSmallGpt);  // host parameters under an emulated context
  message = error_of([&] { host.run_forward(context.on_device(tokens), {.execution = &context}); });
  EXPECT_NE(message.find("parameter 'wte.weight' is fp32[13, 16] on host"), std::string::npos) << message;
}

// The protection is real: reading a tensor's memory on the emulated device directly crashes.
TEST(EmulatedDeviceDeathTest, ReadingATensorOutsideTheDeviceApiCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  nn::Linear linear(4, 3, true, DType::fp32, zt::Device::emulated());
  const Tensor& weight = linear.weight().value;
  EXPECT_DEATH(std::printf("%f\n", static_cast<double>(weight.data<float>()[0])),
               "access to emulated device memory");
  EXPECT_DEATH(std::memset(linear.weight().grad.raw_data(), 0, 4), "access to emulated device memory");
}

}  // namespace

namespace {

/// Writes a small fp64 GPT's weights, a batch, its loss and its gradients for
/// tests/python/gpt_reference.py, which rebuilds the model in PyTorch and compares.
/// Runs only when ZT_GPT_DUMP_DIR names an existing directory.
TEST(GptReference, DumpForPyTorch) {
  const char* directory = std::getenv("ZT_GPT_DUMP_DIR");
  if (directory == nullptr)
    GTEST_SKIP() << "set ZT_GPT_DUMP_DIR to dump a model for tests/python/gpt_reference.py";
  const std::string tied_env = std::getenv("ZT_GPT_DUMP_UNTIED") != nullptr ? "0" : "1";
  nn::GptConfig config{.n_layer = 2, .n_head = 4, .d_model = 32, .seq_len = 16, .vocab_size = 50};
  config.tie_embeddings = tied_env == "1";
  nn::Gpt gpt(config, DType::fp64, 21);
  const Tensor tokens = random_tokens({3, 12}, 50, 22);
  Tensor targets = random_tokens({3, 12}, 50, 23);
  targets.data<std::int32_t>()[5] = -100;
  nn::SoftmaxCrossEntropy criterion;
  const Tensor logits = gpt.run_forward(tokens);
  const double loss = criterion.forward(logits, targets);
  gpt.run_backward(criterion.backward());

  std::ofstream manifest(std::string(directory) + "/manifest.txt");
  manifest.precision(17);
  manifest << "config " << config.n_layer << ' ' << config.n_head << ' ' << config.d_model << ' '
           << config.seq_len << ' ' << config.vocab_size << ' ' << tied_env << "\nloss " << loss << '\n';
  int file_index = 0;
  const auto write = [&](const std::string& kind, const std::string& name, const Tensor& tensor) {
    std::string file = std::to_string(file_index++);
    file += ".bin";
    std::ofstream out(std::string(directory).append("/").append(file), std::ios::binary);
    out.write(static_cast<const char*>(tensor.raw_data()), static_cast<std::streamsize>(tensor.nbytes()));
    manifest << kind << ' ' << name << ' ' << zt::dtype_name(tensor.dtype()) << ' ' << file;
    for (std::int64_t extent : tensor.shape()) manifest << ' ' << extent;
    manifest << '\n';
  };
  write("input", "tokens", tokens);
  write("input", "targets", targets);
  write("output", "logits", logits);
  for (nn::Parameter* parameter : gpt.parameters()) {
    write("param", parameter->name, parameter->value);
    write("grad", parameter->name, parameter->grad);
  }
}

}  // namespace
