// zerotrain dtypes and reduce ops as MPI sees them (private to the MPI layer).
//
// fp32, fp64, int32 and int64 map to MPI's predefined types and ops. MPI has no bf16 or fp16, so
// each gets a committed 16-bit derived datatype and user-defined commutative sum and max ops that
// widen each pair to fp32, combine, and round back to nearest even. The data stays 16-bit on the
// wire. These objects are made on first use and freed inside MPI_Finalize.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "zerotrain/communicator.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::detail {

/// The MPI datatype that carries one element of `type`.
MPI_Datatype mpi_datatype(DType type);

/// The MPI_Op that reduces `type` with `op`. avg maps to the sum: the caller divides afterwards
/// with divide_for_average().
MPI_Op mpi_reduce_op(DType type, ReduceOp op);

/// data[i] /= divisor, the second half of an average. Floating types divide in their own
/// precision (bf16/fp16: in fp32, rounded once); integers truncate toward zero (C++ division).
void divide_for_average(void* data, std::size_t count, DType type, int divisor);

}  // namespace zt::detail
