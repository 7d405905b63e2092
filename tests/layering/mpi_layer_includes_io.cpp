// Wrong way: mpi_layer must not know io.
#include "io/hdf5_file.hpp"
