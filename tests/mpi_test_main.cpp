// The one main() of every MPI test program.
//
// - MPI comes up through zt::Runtime (so errors name their rank, and an uncaught exception aborts
//   the whole job rather than hanging the other ranks).
// - Only rank 0 prints GoogleTest's output.
// - After each test, pass/fail is reduced over all ranks: a failure on any rank fails the test on
//   every rank, and rank 0's report names the ranks that failed.
// - The exit code is the same on all ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test_main.hpp"
#include "zerotrain/runtime.hpp"

namespace zt::testing {
namespace {
Runtime* current_runtime = nullptr;
}
Runtime& runtime() {
  return *current_runtime;
}
}  // namespace zt::testing

namespace {

/// Wraps GoogleTest's printer: reduces each test's outcome across ranks before anything is printed.
class RankReducingListener : public ::testing::EmptyTestEventListener {
 public:
  RankReducingListener(std::unique_ptr<::testing::TestEventListener> printer, int rank, int size)
      : printer_(std::move(printer)), rank_(rank), size_(size) {}

  void OnTestProgramStart(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnTestProgramStart, unit);
  }
  void OnTestIterationStart(const ::testing::UnitTest& unit, int iteration) override {
    if (rank_ == 0) printer_->OnTestIterationStart(unit, iteration);
  }
  void OnEnvironmentsSetUpStart(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnEnvironmentsSetUpStart, unit);
  }
  void OnEnvironmentsSetUpEnd(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnEnvironmentsSetUpEnd, unit);
  }
  void OnTestSuiteStart(const ::testing::TestSuite& suite) override {
    if (rank_ == 0) printer_->OnTestSuiteStart(suite);
  }
  void OnTestStart(const ::testing::TestInfo& info) override {
    if (rank_ == 0) printer_->OnTestStart(info);
  }
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (rank_ == 0) {
      printer_->OnTestPartResult(result);
    } else if (result.failed()) {
      // Other ranks' printers are silent; their own failures still reach stderr, tagged.
      std::ostringstream out;
      out << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
          << result.line_number() << ": Failure\n"
          << result.message() << "\n";
      std::fputs(out.str().c_str(), stderr);
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const int failed_here = info.result()->Failed() ? 1 : 0;
    std::vector<int> failed(static_cast<std::size_t>(size_));
    MPI_Allgather(&failed_here, 1, MPI_INT, failed.data(), 1, MPI_INT, MPI_COMM_WORLD);
    std::string failed_ranks;
    for (int r = 0; r < size_; ++r) {
      if (failed[static_cast<std::size_t>(r)] != 0)
        failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    // Still inside the test (GoogleTest clears the current test after OnTestEnd), so this failure
    // is attributed to it on every rank, including those where it passed.
    if (!failed_ranks.empty()) {
      ADD_FAILURE() << "test failed on rank " << failed_ranks << " of " << size_;
    }
    if (rank_ == 0) printer_->OnTestEnd(info);
  }
  void OnTestSuiteEnd(const ::testing::TestSuite& suite) override {
    if (rank_ == 0) printer_->OnTestSuiteEnd(suite);
  }
  void OnEnvironmentsTearDownStart(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnEnvironmentsTearDownStart, unit);
  }
  void OnEnvironmentsTearDownEnd(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnEnvironmentsTearDownEnd, unit);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& unit, int iteration) override {
    if (rank_ == 0) printer_->OnTestIterationEnd(unit, iteration);
  }
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    forward(&Listener::OnTestProgramEnd, unit);
  }

 private:
  using Listener = ::testing::TestEventListener;
  void forward(void (Listener::*event)(const ::testing::UnitTest&), const ::testing::UnitTest& unit) {
    if (rank_ == 0) (printer_.get()->*event)(unit);
  }

  std::unique_ptr<::testing::TestEventListener> printer_;
  int rank_;
  int size_;
};

}  // namespace

int main(int argc, char** argv) {
  zt::Runtime runtime(&argc, &argv);
  zt::testing::current_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  std::unique_ptr<::testing::TestEventListener> printer(
      listeners.Release(listeners.default_result_printer()));
  listeners.Append(new RankReducingListener(std::move(printer), runtime.world_rank(), runtime.world_size()));
  if (runtime.world_rank() == 0) {
    std::printf("[zerotrain] MPI test on %d rank(s), %d node(s), thread level %s\n", runtime.world_size(),
                runtime.node_count(), zt::Runtime::thread_level_name(runtime.thread_level()).c_str());
  }

  const int local_result = RUN_ALL_TESTS();
  int result = 0;
  MPI_Allreduce(&local_result, &result, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return result;
}
