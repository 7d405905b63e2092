// Wrong way: kernels must not know MPI's layer.
#include "mpi_layer/mpi_check.hpp"
