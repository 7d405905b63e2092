// The smallest program that uses an installed zerotrain: bring up MPI, all-reduce, print.
#include <cstdio>
#include <vector>

#include "zerotrain/zerotrain.hpp"

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  return zt::run_and_report([&] {
    std::vector<float> values(1000, static_cast<float>(runtime.world_rank() + 1));
    runtime.world().all_reduce(values.data(), values.data(), values.size(), zt::DType::fp32,
                               zt::ReduceOp::sum);
    const float expected = static_cast<float>(runtime.world_size() * (runtime.world_size() + 1) / 2);
    if (values.front() != expected || values.back() != expected) {
      std::fprintf(stderr, "consumer: rank %d got %g, expected %g\n", runtime.world_rank(), values.front(),
                   expected);
      return 1;
    }
    if (runtime.world_rank() == 0) {
      std::printf("consumer: zerotrain %s, %d ranks, all_reduce ok\n", zt::build_info::version,
                  runtime.world_size());
    }
    return 0;
  });
}
