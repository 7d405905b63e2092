// Thin RAII layer over the HDF5 C API for checkpoints: files opened collectively through MPI-IO
// (or serially by the tools), datasets written and read by ranges of their row-major elements
// (collective writes, independent reads), scalar and string attributes, and a checksum that does not depend
// on how the elements were split across ranks. Internal to the library (io/); errors are zt::IoError naming
// the file and the object.
#pragma once

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zerotrain/dtype.hpp"

namespace zt::io {

/// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, property list, attribute).
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  Hid(Hid&& other) noexcept : id_(other.id_) { other.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& other) noexcept;
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid();
  hid_t get() const { return id_; }
  /// Give up ownership (the caller closes it).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  bool valid() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// Layout-independent checksum of a range of a dataset's elements: the sum over elements of
/// mix(global index, element bits), so pieces computed on different ranks add up (mod 2^64) to the
/// same value however the dataset was split.
std::uint64_t range_checksum(const void* data, std::size_t element_size, std::int64_t first_index,
                             std::int64_t count);

/// HDF5 element type of a zt dtype (fp32, fp64, int32, int64, uint16 for bf16/fp16 bits, uint64).
hid_t native_type(DType dtype);

class H5File {
 public:
  /// Create (truncate) `path` collectively on `comm` through MPI-IO.
  static H5File create_parallel(const std::string& path, MPI_Comm comm);
  /// Open `path` collectively on `comm`, read-only.
  static H5File open_parallel(const std::string& path, MPI_Comm comm);
  /// Open or create on one process (the tools).
  static H5File open_serial(const std::string& path);
  /// Open `path` on one process for reading and writing (the attribute checksum after a save).
  static H5File open_serial_for_update(const std::string& path);
  static H5File create_serial(const std::string& path);

  const std::string& path() const { return path_; }
  bool parallel() const { return parallel_; }
  void close();

  /// Dataset `name` ("model/h.0.attn.qkv.weight"; groups are created as needed) of `shape`.
  void create_dataset(const std::string& name, const std::vector<std::int64_t>& shape, DType dtype);
  bool exists(const std::string& name) const;
  std::vector<std::int64_t> shape(const std::string& name) const;
  /// Write / read elements [first, first + count) of the dataset in row-major order. In a parallel
  /// file writes are collective (every rank calls for every dataset, count 0 where it has nothing)
  /// and reads independent (a rank reads only what it needs).
  void write_range(const std::string& name, std::int64_t first, std::int64_t count, const void* data,
                   DType dtype);
  void read_range(const std::string& name, std::int64_t first, std::int64_t count, void* data,
                  DType dtype) const;

  /// Attributes on an object ("" for the root group). Every rank of a parallel file writes the
  /// same value.
  void set_attribute(const std::string& object, const std::string& key, std::int64_t value);
  void set_attribute(const std::string& object, const std::string& key, std::uint64_t value);
  void set_attribute(const std::string& object, const std::string& key, double value);
  void set_attribute(const std::string& object, const std::string& key, const std::string& value);
  std::int64_t int_attribute(const std::string& object, const std::string& key) const;
  std::uint64_t uint_attribute(const std::string& object, const std::string& key) const;
  double double_attribute(const std::string& object, const std::string& key) const;
  std::string string_attribute(const std::string& object, const std::string& key) const;
  bool has_attribute(const std::string& object, const std::string& key) const;

  /// Every dataset's path, depth-first in name order.
  std::vector<std::string> datasets() const;

  /// What a name is in the file, without following any link.
  enum class ObjectKind { missing, dataset, group, other };
  ObjectKind kind(const std::string& name) const;
  /// Every object below the root reached through hard links ("engine", "engine/rng_streams", ...),
  /// depth-first in name order, with its kind.
  std::vector<std::pair<std::string, ObjectKind>> objects() const;
  /// The layout of a dataset, checked so that reading it cannot go wrong: a simple dataspace of
  /// rank >= 1 (not a scalar, not a null dataspace), dimensions whose element count fits in int64, an
  /// integer or float element type, contiguous storage inside the file (no external raw files, no
  /// virtual or chunked layouts) of exactly count x element size bytes. Throws zt::IoError naming
  /// the file and the dataset otherwise.
  struct DatasetLayout {
    std::vector<std::int64_t> shape;
    std::int64_t count = 0;        // elements
    char kind = 'f';               // 'f' float, 'i' signed integer, 'u' unsigned integer
    std::size_t element_size = 0;  // bytes
  };
  DatasetLayout dataset_layout(const std::string& name) const;
  /// Throws zt::IoError unless every link in the file is a hard link (no soft links, no external
  /// links to other files, no user-defined links): a checkpoint is one self-contained file.
  void check_only_hard_links() const;
  /// The layout-free checksum of every attribute of every object (names, kinds and values), except
  /// the root attribute `excluded_root_key` (where it is stored): FNV-1a 64 over a canonical byte
  /// stream, docs/checkpoint-format.md. Attributes must be scalars of integer, float or
  /// fixed-length string type (what set_attribute writes); anything else throws zt::IoError.
  std::uint64_t attributes_checksum(const std::string& excluded_root_key) const;

 private:
  H5File(Hid file, std::string path, bool parallel)
      : file_(std::move(file)), path_(std::move(path)), parallel_(parallel) {}
  Hid open_object(const std::string& object) const;
  void transfer(const std::string& name, std::int64_t first, std::int64_t count, void* data, DType dtype,
                bool write) const;
  /// The dataset `name`, opened after checking that it is one (no link followed).
  Hid open_dataset(const std::string& name) const;

  Hid file_;
  std::string path_;
  bool parallel_ = false;
};

}  // namespace zt::io
