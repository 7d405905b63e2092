// Right way: the engine knows every layer.
#include "base/text.hpp"
#include "io/hdf5_file.hpp"
#include "kernels/nn_kernels.hpp"
#include "mpi_layer/mpi_check.hpp"
#include "src/config/json_reader.hpp"
#include "src/engine/parameter_store.hpp"
#include "zerotrain/engine.hpp"
