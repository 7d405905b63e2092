// Modules: parameter names and counts, tied embeddings, hooks, gradient accumulation, determinism
// across thread counts, 16-bit forward passes against fp32, and error messages.
#include <gtest/gtest.h>

#include "test_helpers.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/optimizer_kernels.hpp"  // set_host_threads
#include "zerotrain/nn.hpp"
#include "zerotrain/tensor.hpp"

namespace {

using zt::testing::error_of;
using zt::testing::random_tokens;

using zt::DType;
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
