// One rank fails while the others wait in a collective: the job must end, with the failing rank's
// message, instead of hanging. Modes:
//   caught     rank 1 throws inside zt::run_and_report
//   uncaught   rank 1 throws outside any handler (the terminate handler reports it)
//   mpi-error  rank 1 sends to a rank that does not exist (MPI error -> zt::CommError)
#include <mpi.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

#include "zerotrain/error.hpp"
#include "zerotrain/runtime.hpp"

namespace {
void fail_on_rank_one(zt::Runtime& runtime, std::string_view mode) {
  if (runtime.world_rank() != 1) return;
  if (mode == "mpi-error") {
    int value = 0;
    runtime.world().send(&value, 1, zt::DType::int32, runtime.world_size() + 5);
  }
  ZT_THROW("deliberate failure in mode ", mode);
}
}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "caught";
  if (mode == "uncaught") {
    fail_on_rank_one(runtime, mode);
    runtime.world().barrier();
    return 0;
  }
  return zt::run_and_report([&] {
    fail_on_rank_one(runtime, mode);
    runtime.world().barrier();  // the other ranks wait here; only an abort releases them
    return 0;
  });
}
