// Shared by the MPI test programs (their main() is tests/mpi_test_main.cpp).
#pragma once

#include "zerotrain/runtime.hpp"

namespace zt::testing {

/// The runtime that the test main created for this process.
Runtime& runtime();

}  // namespace zt::testing
