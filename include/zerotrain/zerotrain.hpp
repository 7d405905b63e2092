// zerotrain: ZeRO training for C++, C and Fortran codes under MPI. One header for all of it.
#pragma once

#include "zerotrain/build_info.hpp"
#include "zerotrain/communicator.hpp"
#include "zerotrain/device.hpp"
#include "zerotrain/dtype.hpp"
#include "zerotrain/error.hpp"
#include "zerotrain/mpi_communicator.hpp"
#include "zerotrain/process_grid.hpp"
#include "zerotrain/report.hpp"
#include "zerotrain/runtime.hpp"
