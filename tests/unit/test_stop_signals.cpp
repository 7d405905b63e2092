// zt::StopSignalScope: SIGTERM and SIGUSR1 recorded, not fatal, while a scope lives; nested scopes
// (main's and zt::train's) share the outermost one's record; the previous handlers come back.
#include <gtest/gtest.h>

#include <csignal>

#include "zerotrain/trainer.hpp"

namespace {

volatile std::sig_atomic_t previous_handler_calls = 0;
extern "C" void count_previous_handler(int) {
  previous_handler_calls = previous_handler_calls + 1;
}

/// Installs count_previous_handler for SIGUSR1 and SIGTERM for the test's duration.
class PreviousHandlers {
 public:
  PreviousHandlers() {
    struct sigaction action = {};
    action.sa_handler = count_previous_handler;
    sigemptyset(&action.sa_mask);
    sigaction(SIGUSR1, &action, &usr1_);
    sigaction(SIGTERM, &action, &term_);
    previous_handler_calls = 0;
  }
  ~PreviousHandlers() {
    sigaction(SIGUSR1, &usr1_, nullptr);
    sigaction(SIGTERM, &term_, nullptr);
  }

 private:
  struct sigaction usr1_ = {};
  struct sigaction term_ = {};
};

TEST(StopSignals, RecordedWhileAScopeLivesThenThePreviousHandlerIsBack) {
  PreviousHandlers previous;
  {
    zt::StopSignalScope scope;
    EXPECT_EQ(zt::StopSignalScope::received(), 0);
    std::raise(SIGUSR1);
    EXPECT_EQ(zt::StopSignalScope::received(), SIGUSR1);
    std::raise(SIGTERM);
    EXPECT_EQ(zt::StopSignalScope::received(), SIGTERM);
    EXPECT_EQ(previous_handler_calls, 0);
  }
  std::raise(SIGUSR1);
  EXPECT_EQ(previous_handler_calls, 1);
}

TEST(StopSignals, AnInnerScopeKeepsWhatTheOuterOneRecorded) {
  PreviousHandlers previous;
  zt::StopSignalScope outer;  // main's, before MPI starts
  std::raise(SIGUSR1);        // during start-up
  {
    zt::StopSignalScope inner;  // zt::train's own
    EXPECT_EQ(zt::StopSignalScope::received(), SIGUSR1);
  }
  // The inner scope's end does not restore the previous handler: the outer one still records.
  std::raise(SIGTERM);
  EXPECT_EQ(zt::StopSignalScope::received(), SIGTERM);
  EXPECT_EQ(previous_handler_calls, 0);
}

TEST(StopSignals, AFreshOutermostScopeStartsWithNothingRecorded) {
  PreviousHandlers previous;
  {
    zt::StopSignalScope first;
    std::raise(SIGUSR1);
  }
  zt::StopSignalScope second;
  EXPECT_EQ(zt::StopSignalScope::received(), 0);
}

}  // namespace
