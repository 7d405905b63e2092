// Right way: mpi_layer knows base, kernels (the device layer), its own headers and the public ones.
#include "base/seconds_since.hpp"
#include "base/text.hpp"
#include "kernels/device_backend.hpp"
#include "mpi_layer/mpi_check.hpp"
#include "mpi_layer/op_tracker.hpp"
#include "mpi_layer/watchdog.hpp"
#include "zerotrain/runtime.hpp"
