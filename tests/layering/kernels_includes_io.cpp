// Wrong way: kernels must not know io.
#include "io/hdf5_file.hpp"
