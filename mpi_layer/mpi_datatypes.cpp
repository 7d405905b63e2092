#include "mpi_layer/mpi_datatypes.hpp"

#include <bit>
#include <cstdint>
#include <mutex>

#include "mpi_layer/mpi_check.hpp"

namespace zt::detail {
namespace {

// ---- 16-bit arithmetic ---------------------------------------------------------------------

struct Bf16Format {
  static float widen(std::uint16_t bits) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  static std::uint16_t narrow(float value) { return bf16::from_float(value); }
};

struct Fp16Format {
  static float widen(std::uint16_t bits) { return fp16::to_float(bits); }
  static std::uint16_t narrow(float value) { return fp16::from_float(value); }
};

struct Add {
  float operator()(float a, float b) const { return a + b; }
};

/// max that propagates NaN (so an overflow flag reduced with max is never lost); `a != a` is the
/// NaN test that stays correct without <cmath> and vectorizes.
struct Max {
  float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};

/// inout[i] = round16(widen(in[i]) (op) widen(inout[i])): one rounding per pairwise combine, as NCCL.
template <typename Format, typename Combine>
void combine_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const Combine combine;
  for (int i = 0; i < *length; ++i) b[i] = Format::narrow(combine(Format::widen(a[i]), Format::widen(b[i])));
}

template <typename Format>
void divide_16bit(void* data, std::size_t count, float divisor) {
  auto* values = static_cast<std::uint16_t*>(data);
  for (std::size_t i = 0; i < count; ++i) values[i] = Format::narrow(Format::widen(values[i]) / divisor);
}

template <typename T>
void divide_values(void* data, std::size_t count, T divisor) {
  auto* values = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) values[i] /= divisor;
}

// ---- the MPI objects for bf16 and fp16 -----------------------------------------------------

struct SixteenBitMpiObjects {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype fp16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op bf16_max = MPI_OP_NULL;
  MPI_Op fp16_sum = MPI_OP_NULL;
  MPI_Op fp16_max = MPI_OP_NULL;
};

std::mutex sixteen_bit_mutex;
SixteenBitMpiObjects sixteen_bit_objects;
bool sixteen_bit_created = false;

/// Runs inside MPI_Finalize (attributes of MPI_COMM_SELF are deleted first), while MPI still works.
int free_sixteen_bit_objects(MPI_Comm, int keyval, void*, void*) {
  const std::lock_guard lock(sixteen_bit_mutex);
  SixteenBitMpiObjects& objects = sixteen_bit_objects;
  for (MPI_Op* op : {&objects.bf16_sum, &objects.bf16_max, &objects.fp16_sum, &objects.fp16_max}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  for (MPI_Datatype* type : {&objects.bf16, &objects.fp16}) {
    if (*type != MPI_DATATYPE_NULL) MPI_Type_free(type);
  }
  sixteen_bit_created = false;
  MPI_Comm_free_keyval(&keyval);
  return MPI_SUCCESS;
}

MPI_Datatype make_16bit_type(const char* name) {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  ZT_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &type), "MPI_COMM_SELF");
  ZT_CHECK_MPI(MPI_Type_commit(&type), "MPI_COMM_SELF");
  ZT_CHECK_MPI(MPI_Type_set_name(type, name), "MPI_COMM_SELF");
  return type;
}

MPI_Op make_op(MPI_User_function* function) {
  MPI_Op op = MPI_OP_NULL;
  ZT_CHECK_MPI(MPI_Op_create(function, /*commute=*/1, &op), "MPI_COMM_SELF");
  return op;
}

const SixteenBitMpiObjects& sixteen_bit() {
  const std::lock_guard lock(sixteen_bit_mutex);
  if (!sixteen_bit_created) {
    SixteenBitMpiObjects& objects = sixteen_bit_objects;
    objects.bf16 = make_16bit_type("zerotrain_bf16");
    objects.fp16 = make_16bit_type("zerotrain_fp16");
    objects.bf16_sum = make_op(&combine_16bit<Bf16Format, Add>);
    objects.bf16_max = make_op(&combine_16bit<Bf16Format, Max>);
    objects.fp16_sum = make_op(&combine_16bit<Fp16Format, Add>);
    objects.fp16_max = make_op(&combine_16bit<Fp16Format, Max>);
    int keyval = MPI_KEYVAL_INVALID;
    ZT_CHECK_MPI(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &free_sixteen_bit_objects, &keyval, nullptr),
                 "MPI_COMM_SELF");
    ZT_CHECK_MPI(MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr), "MPI_COMM_SELF");
    sixteen_bit_created = true;
  }
  return sixteen_bit_objects;
}

}  // namespace

MPI_Datatype mpi_datatype(DType type) {
  switch (type) {
    case DType::fp32:
      return MPI_FLOAT;
    case DType::fp64:
      return MPI_DOUBLE;
    case DType::int32:
      return MPI_INT32_T;
    case DType::int64:
      return MPI_INT64_T;
    case DType::bf16:
      return sixteen_bit().bf16;
    case DType::fp16:
      return sixteen_bit().fp16;
  }
  ZT_THROW_AS(CommError, "no MPI datatype for dtype value ", static_cast<unsigned>(type));
}

MPI_Op mpi_reduce_op(DType type, ReduceOp op) {
  const bool maximum = op == ReduceOp::max;
  switch (type) {
    case DType::bf16:
      return maximum ? sixteen_bit().bf16_max : sixteen_bit().bf16_sum;
    case DType::fp16:
      return maximum ? sixteen_bit().fp16_max : sixteen_bit().fp16_sum;
    default:
      return maximum ? MPI_MAX : MPI_SUM;
  }
}

void divide_for_average(void* data, std::size_t count, DType type, int divisor) {
  switch (type) {
    case DType::fp32:
      return divide_values<float>(data, count, static_cast<float>(divisor));
    case DType::fp64:
      return divide_values<double>(data, count, static_cast<double>(divisor));
    case DType::int32:
      return divide_values<std::int32_t>(data, count, divisor);
    case DType::int64:
      return divide_values<std::int64_t>(data, count, divisor);
    case DType::bf16:
      return divide_16bit<Bf16Format>(data, count, static_cast<float>(divisor));
    case DType::fp16:
      return divide_16bit<Fp16Format>(data, count, static_cast<float>(divisor));
  }
}

}  // namespace zt::detail
