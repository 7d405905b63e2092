// Inputs, references and typed host buffers shared by the communicator tests (MPI and NCCL).
//
// Every rank can compute every rank's input (input_value(type, rank, index)), so each checks its own
// result against a reference computed locally.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "zerotrain/communicator.hpp"
#include "zerotrain/dtype.hpp"

namespace zt::testing {

using zt::DType;
using zt::ReduceOp;

inline constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};

// ---- typed host buffers ----------------------------------------------------------------------

/// `count` elements of `type` in 8-byte-aligned storage, read and written as double.
class Values {
 public:
  Values(DType type, std::size_t count)
      : type_(type), count_(count), storage_((count * zt::dtype_size(type) + 7) / 8) {}

  void* data() { return count_ == 0 ? nullptr : storage_.data(); }  // count 0 passes a null pointer
  std::byte* bytes() { return reinterpret_cast<std::byte*>(storage_.data()); }
  const std::byte* bytes() const { return reinterpret_cast<const std::byte*>(storage_.data()); }
  std::size_t size() const { return count_; }
  DType type() const { return type_; }

  double get(std::size_t i) const {
    const auto* raw = reinterpret_cast<const std::byte*>(storage_.data());
    switch (type_) {
      case DType::fp32:
        return load<float>(raw, i);
      case DType::fp64:
        return load<double>(raw, i);
      case DType::bf16:
        return static_cast<float>(load<zt::bf16>(raw, i));
      case DType::fp16:
        return static_cast<float>(load<zt::fp16>(raw, i));
      case DType::int32:
        return load<std::int32_t>(raw, i);
      case DType::int64:
        return static_cast<double>(load<std::int64_t>(raw, i));
    }
    return 0;
  }

  void set(std::size_t i, double value) {
    auto* raw = reinterpret_cast<std::byte*>(storage_.data());
    switch (type_) {
      case DType::fp32:
        return store(raw, i, static_cast<float>(value));
      case DType::fp64:
        return store(raw, i, value);
      case DType::bf16:
        return store(raw, i, zt::bf16(static_cast<float>(value)));
      case DType::fp16:
        return store(raw, i, zt::fp16(static_cast<float>(value)));
      case DType::int32:
        return store(raw, i, static_cast<std::int32_t>(value));
      case DType::int64:
        return store(raw, i, static_cast<std::int64_t>(value));
    }
  }

  template <typename ValueAt>
  void fill(ValueAt&& value_at) {
    for (std::size_t i = 0; i < count_; ++i) set(i, value_at(i));
  }

 private:
  template <typename T>
  static T load(const std::byte* raw, std::size_t i) {
    T value;
    std::memcpy(&value, raw + i * sizeof(T), sizeof(T));
    return value;
  }
  template <typename T>
  static void store(std::byte* raw, std::size_t i, T value) {
    std::memcpy(raw + i * sizeof(T), &value, sizeof(T));
  }

  DType type_;
  std::size_t count_;
  std::vector<std::uint64_t> storage_;
};

// ---- inputs and references -------------------------------------------------------------------

/// Rank `rank`'s element `index`: small integers in [-11, 11], exact in every dtype and in every
/// partial sum over 4 ranks (so bf16/fp16 results are exact too). int64 adds (rank+1)*2^33 to
/// show that nothing passes through 32 bits.
inline double input_value(DType type, int rank, std::size_t index) {
  const auto base = static_cast<double>(
      (static_cast<std::int64_t>(rank) * 131 + static_cast<std::int64_t>(index % 1000003) * 17 + 5) % 23 -
      11);
  if (type == DType::int64) return base + static_cast<double>(static_cast<std::int64_t>(rank + 1) << 33);
  return base;
}

/// `value` rounded to `type` as the library stores it (16-bit: round to nearest even via fp32).
inline double round_to(DType type, double value) {
  switch (type) {
    case DType::fp32:
      return static_cast<float>(value);
    case DType::fp64:
      return value;
    case DType::bf16:
      return static_cast<float>(zt::bf16(static_cast<float>(value)));
    case DType::fp16:
      return static_cast<float>(zt::fp16(static_cast<float>(value)));
    case DType::int32:
      return static_cast<std::int32_t>(value);
    case DType::int64:
      return static_cast<double>(static_cast<std::int64_t>(value));
  }
  return value;
}

/// The documented result of reducing the ranks' values: sums are exact for this data; avg is the
/// sum divided in the type's precision (16-bit: in fp32, rounded once; integers: truncated).
template <typename ValueOfRank>
double reference_reduction(DType type, ReduceOp op, int ranks, ValueOfRank&& value_of_rank) {
  double sum = 0;
  double maximum = value_of_rank(0);
  for (int r = 0; r < ranks; ++r) {
    sum += value_of_rank(r);
    maximum = std::max(maximum, value_of_rank(r));
  }
  switch (op) {
    case ReduceOp::sum:
      return sum;
    case ReduceOp::max:
      return maximum;
    case ReduceOp::avg:
      break;
  }
  switch (type) {
    case DType::fp32:
    case DType::bf16:
    case DType::fp16:
      return round_to(type, static_cast<float>(sum) / static_cast<float>(ranks));
    case DType::fp64:
      return sum / ranks;
    case DType::int32:
    case DType::int64:
      return static_cast<double>(static_cast<std::int64_t>(sum) / ranks);
  }
  return 0;
}

/// Compares actual[offset + i] with expected(i) for i < count; reports the first mismatch and how many.
template <typename Expected>
::testing::AssertionResult matches(const Values& actual, std::size_t offset, std::size_t count,
                                   Expected&& expected) {
  std::size_t mismatches = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < count; ++i) {
    const double want = expected(i);
    const double got = actual.get(offset + i);
    if (got != want) {
      if (mismatches++ == 0) first << "element " << i << ": got " << got << ", expected " << want;
    }
  }
  if (mismatches == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << mismatches << " of " << count << " elements differ; first: " << first.str();
}

inline std::string describe(const zt::Communicator& comm, std::string_view op, DType type, std::size_t count,
                            bool nonblocking, bool in_place, std::string_view extra = {}) {
  std::ostringstream out;
  out << op << " " << zt::dtype_name(type) << " count " << count
      << (nonblocking ? " non-blocking" : " blocking") << (in_place ? " in place" : "") << " " << extra
      << " on '" << comm.name() << "' rank " << comm.rank() << "/" << comm.size();
  return out.str();
}

/// Different counts per rank, including a rank that sends nothing (the last one, with >1 rank).
inline std::vector<std::size_t> uneven_counts(std::size_t base, int ranks) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    counts[static_cast<std::size_t>(r)] =
        (ranks > 1 && r == ranks - 1) ? 0 : base + static_cast<std::size_t>(3 * r + r % 2);
  }
  return counts;
}

/// Every rank's block of `recv` (at offsets[r], counts[r] elements) holds input_value(type, r, i).
inline ::testing::AssertionResult blocks_match(const Values& recv, const std::vector<std::size_t>& counts) {
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    auto result = matches(recv, offset, counts[r],
                          [&](std::size_t i) { return input_value(recv.type(), static_cast<int>(r), i); });
    if (!result) return result << " in the block of rank " << r;
    offset += counts[r];
  }
  return ::testing::AssertionSuccess();
}

/// One step of a ring exchange with a device backend, whose blocking receive waits for its send:
/// even ranks send first, odd ranks receive first, so no rank waits for a peer that waits too.
template <typename Send, typename Receive>
void exchange_in_ring_order(int rank, Send&& send, Receive&& receive) {
  if (rank % 2 == 0) {
    send();
    receive();
  } else {
    receive();
    send();
  }
}

/// Rank `rank`'s input of `count` elements (input_value), in host memory.
inline Values input_values(DType type, std::size_t count, int rank) {
  Values values(type, count);
  values.fill([&](std::size_t i) { return input_value(type, rank, i); });
  return values;
}

/// `count` elements of `value`, in host memory.
inline Values filled_values(DType type, std::size_t count, double value) {
  Values values(type, count);
  values.fill([&](std::size_t) { return value; });
  return values;
}

}  // namespace zt::testing
