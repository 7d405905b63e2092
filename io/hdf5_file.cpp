// HDF5 files for checkpoints (see hdf5_file.hpp).
#include "io/hdf5_file.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string_view>

#include "io/splitmix64.hpp"
#include "zerotrain/error.hpp"

namespace zt::io {
namespace {

/// The innermost message of HDF5's error stack ("truncated file: eof = ...", "unable to open
/// file"), for our own exception; HDF5's automatic printing is switched off.
std::string hdf5_error_message() {
  std::string message;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* error, void* out) -> herr_t {
        auto& text = *static_cast<std::string*>(out);
        if (error->desc != nullptr && text.empty()) text = error->desc;
        return 0;
      },
      &message);
  H5Eclear2(H5E_DEFAULT);
  return message.empty() ? "HDF5 error" : message;
}

void silence_hdf5() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

hid_t checked(hid_t id, const std::string& path, const std::string& what) {
  if (id < 0) ZT_THROW_AS(IoError, "HDF5 file '", path, "': ", what, " failed: ", hdf5_error_message());
  return id;
}

void checked_status(herr_t status, const std::string& path, const std::string& what) {
  if (status < 0) ZT_THROW_AS(IoError, "HDF5 file '", path, "': ", what, " failed: ", hdf5_error_message());
}

/// Select elements [first, first + count) of a row-major dataspace of `dims` as a union of
/// hyperslab blocks: a partial leading row, whole rows, a partial trailing row, recursively.
void select_range(hid_t space, const std::vector<hsize_t>& dims, std::size_t dim, std::vector<hsize_t>& start,
                  std::vector<hsize_t>& count, hsize_t first, hsize_t end, bool& any) {
  if (first >= end) return;
  auto add_block = [&] {
    checked_status(H5Sselect_hyperslab(space, any ? H5S_SELECT_OR : H5S_SELECT_SET, start.data(), nullptr,
                                       count.data(), nullptr),
                   "", "selecting a hyperslab");
    any = true;
  };
  if (dim + 1 == dims.size()) {
    start[dim] = first;
    count[dim] = end - first;
    add_block();
    return;
  }
  hsize_t row = 1;
  for (std::size_t d = dim + 1; d < dims.size(); ++d) row *= dims[d];
  auto inner = [&](hsize_t r, hsize_t a, hsize_t b) {
    start[dim] = r;
    count[dim] = 1;
    select_range(space, dims, dim + 1, start, count, a, b, any);
  };
  hsize_t first_row = first / row;
  const hsize_t end_row = end / row;
  if (first_row == end_row) {
    inner(first_row, first % row, end % row);
    return;
  }
  if (first % row != 0) {
    inner(first_row, first % row, row);
    ++first_row;
  }
  if (end_row > first_row) {
    start[dim] = first_row;
    count[dim] = end_row - first_row;
    for (std::size_t d = dim + 1; d < dims.size(); ++d) {
      start[d] = 0;
      count[d] = dims[d];
    }
    add_block();
  }
  if (end % row != 0) inner(end_row, 0, end % row);
}

Hid string_type(std::size_t length) {
  Hid type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), std::max<std::size_t>(1, length));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  return type;
}

}  // namespace

Hid& Hid::operator=(Hid&& other) noexcept {
  if (this != &other) {
    Hid discarded(id_);
    id_ = other.id_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

Hid::~Hid() {
  if (id_ < 0) return;
  // One close for every kind of identifier; errors while closing are not recoverable here.
  switch (H5Iget_type(id_)) {
    case H5I_FILE:
      H5Fclose(id_);
      break;
    case H5I_GROUP:
      H5Gclose(id_);
      break;
    case H5I_DATASET:
      H5Dclose(id_);
      break;
    case H5I_DATASPACE:
      H5Sclose(id_);
      break;
    case H5I_DATATYPE:
      H5Tclose(id_);
      break;
    case H5I_GENPROP_LST:
      H5Pclose(id_);
      break;
    case H5I_ATTR:
      H5Aclose(id_);
      break;
    default:
      break;
  }
}

namespace {

template <std::size_t ElementSize>
std::uint64_t checksum_of(const unsigned char* bytes, std::int64_t first_index, std::int64_t count) {
  std::uint64_t sum = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, bytes + static_cast<std::size_t>(i) * ElementSize, ElementSize);
    const auto index = static_cast<std::uint64_t>(first_index + i);
    sum += detail::mix64(detail::mix64(index * detail::kSplitMixGolden + 1) ^ bits);
  }
  return sum;
}

}  // namespace

std::uint64_t range_checksum(const void* data, std::size_t element_size, std::int64_t first_index,
                             std::int64_t count) {
  // The element size fixed at compile time makes the copy a plain load (5x faster than a memcpy of
  // a run-time size, which showed as the largest item in a profile of a save).
  const auto* bytes = static_cast<const unsigned char*>(data);
  switch (element_size) {
    case 2:
      return checksum_of<2>(bytes, first_index, count);
    case 4:
      return checksum_of<4>(bytes, first_index, count);
    case 8:
      return checksum_of<8>(bytes, first_index, count);
    default:
      ZT_THROW("range_checksum: elements of ", element_size, " bytes (expected 2, 4 or 8)");
  }
}

hid_t native_type(DType dtype) {
  switch (dtype) {
    case DType::fp32:
      return H5T_NATIVE_FLOAT;
    case DType::fp64:
      return H5T_NATIVE_DOUBLE;
    case DType::int32:
      return H5T_NATIVE_INT32;
    case DType::int64:
      return H5T_NATIVE_INT64;
    case DType::bf16:
    case DType::fp16:
      return H5T_NATIVE_UINT16;
    default:
      ZT_THROW_AS(IoError, "no HDF5 type for dtype ", dtype_name(dtype));
  }
}

H5File H5File::create_parallel(const std::string& path, MPI_Comm comm) {
  silence_hdf5();
  Hid access(H5Pcreate(H5P_FILE_ACCESS));
  checked_status(H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL), path, "setting MPI-IO access");
  Hid file(
      checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()), path, "creating the file"));
  return H5File(std::move(file), path, true);
}

H5File H5File::open_parallel(const std::string& path, MPI_Comm comm) {
  silence_hdf5();
  Hid access(H5Pcreate(H5P_FILE_ACCESS));
  checked_status(H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL), path, "setting MPI-IO access");
  Hid file(checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get()), path, "opening the file"));
  return H5File(std::move(file), path, true);
}

H5File H5File::open_serial(const std::string& path) {
  silence_hdf5();
  Hid file(checked(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), path, "opening the file"));
  return H5File(std::move(file), path, false);
}

H5File H5File::open_serial_for_update(const std::string& path) {
  silence_hdf5();
  Hid file(checked(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), path, "opening the file for update"));
  return H5File(std::move(file), path, false);
}

H5File H5File::create_serial(const std::string& path) {
  silence_hdf5();
  Hid file(
      checked(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), path, "creating the file"));
  return H5File(std::move(file), path, false);
}

void H5File::close() {
  if (!file_.valid()) return;
  // Closing flushes the metadata: a full disk shows here, and must not pass silently.
  checked_status(H5Fclose(file_.release()), path_, "closing (flushing) the file");
}

void H5File::create_dataset(const std::string& name, const std::vector<std::int64_t>& shape, DType dtype) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  if (dims.empty()) dims.push_back(1);
  Hid space(checked(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), path_,
                    "dataspace of '" + name + "'"));
  Hid links(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(links.get(), 1);
  Hid dataset(checked(H5Dcreate2(file_.get(), name.c_str(), native_type(dtype), space.get(), links.get(),
                                 H5P_DEFAULT, H5P_DEFAULT),
                      path_, "creating dataset '" + name + "'"));
}

bool H5File::exists(const std::string& name) const {
  // H5Lexists needs every intermediate link to exist: check the path one component at a time.
  std::size_t at = 0;
  while (true) {
    const std::size_t slash = name.find('/', at);
    const std::string prefix = name.substr(0, slash);
    if (H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) return true;
    at = slash + 1;
  }
}

std::vector<std::int64_t> H5File::shape(const std::string& name) const {
  return dataset_layout(name).shape;
}

H5File::ObjectKind H5File::kind(const std::string& name) const {
  // One component at a time, each a hard link (H5Lexists needs every intermediate link to exist).
  std::size_t at = 0;
  while (true) {
    const std::size_t slash = name.find('/', at);
    const std::string prefix = name.substr(0, slash);
    if (prefix.empty() || H5Lexists(file_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return ObjectKind::missing;
    }
    H5L_info_t link{};
    if (H5Lget_info(file_.get(), prefix.c_str(), &link, H5P_DEFAULT) < 0 || link.type != H5L_TYPE_HARD) {
      H5Eclear2(H5E_DEFAULT);
      return ObjectKind::other;
    }
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  H5O_info_t info{};
  if (H5Oget_info_by_name2(file_.get(), name.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
    H5Eclear2(H5E_DEFAULT);
    return ObjectKind::other;
  }
  if (info.type == H5O_TYPE_DATASET) return ObjectKind::dataset;
  if (info.type == H5O_TYPE_GROUP) return ObjectKind::group;
  return ObjectKind::other;
}

std::vector<std::pair<std::string, H5File::ObjectKind>> H5File::objects() const {
  std::vector<std::pair<std::string, ObjectKind>> found;
  checked_status(H5Ovisit2(
                     file_.get(), H5_INDEX_NAME, H5_ITER_INC,
                     [](hid_t, const char* name, const H5O_info_t* info, void* out) -> herr_t {
                       if (std::string_view(name) == ".") return 0;
                       const ObjectKind kind = info->type == H5O_TYPE_DATASET ? ObjectKind::dataset
                                               : info->type == H5O_TYPE_GROUP ? ObjectKind::group
                                                                              : ObjectKind::other;
                       static_cast<std::vector<std::pair<std::string, ObjectKind>>*>(out)->emplace_back(name,
                                                                                                        kind);
                       return 0;
                     },
                     &found, H5O_INFO_BASIC),
                 path_, "listing the objects");
  return found;
}

Hid H5File::open_dataset(const std::string& name) const {
  if (parallel_) {
    // A file opened in parallel was checked serially by its readers first (hard links only, every
    // object's kind: src/engine/checkpoint_validation.cpp); H5Lget_info on it failed on rank 1 of a
    // pipelined load (HDF5 1.10, independent metadata reads), so it is opened by name.
    ZT_CHECK_AS(IoError, exists(name), "checkpoint '", path_, "' has no dataset '", name, "'");
    return Hid(
        checked(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), path_, "opening dataset '" + name + "'"));
  }
  const ObjectKind found = kind(name);
  ZT_CHECK_AS(IoError, found != ObjectKind::missing, "checkpoint '", path_, "' has no dataset '", name, "'");
  ZT_CHECK_AS(IoError, found == ObjectKind::dataset, "checkpoint '", path_, "': '", name, "' is ",
              found == ObjectKind::group ? "a group" : "a link or an object of another kind",
              ", not a dataset");
  return Hid(
      checked(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), path_, "opening dataset '" + name + "'"));
}

H5File::DatasetLayout H5File::dataset_layout(const std::string& name) const {
  const Hid dataset = open_dataset(name);
  const std::string where = "checkpoint '" + path_ + "' dataset '" + name + "'";
  const Hid space(checked(H5Dget_space(dataset.get()), path_, "dataspace of '" + name + "'"));
  const H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
  ZT_CHECK_AS(IoError, space_class == H5S_SIMPLE, where, " has a ",
              space_class == H5S_SCALAR ? "scalar (0-d)"
              : space_class == H5S_NULL ? "null"
                                        : "unknown",
              " dataspace; expected an array of rank >= 1");
  const int rank = H5Sget_simple_extent_ndims(space.get());
  ZT_CHECK_AS(IoError, rank >= 1 && rank <= H5S_MAX_RANK, where, " has rank ", rank, "; expected >= 1");
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  DatasetLayout layout;
  layout.count = 1;
  for (hsize_t d : dims) {
    ZT_CHECK_AS(IoError,
                d <= static_cast<hsize_t>(std::numeric_limits<std::int64_t>::max()) &&
                    (d == 0 || static_cast<std::uint64_t>(layout.count) <=
                                   static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / d),
                where, " has dimensions whose product does not fit in 64 bits");
    layout.shape.push_back(static_cast<std::int64_t>(d));
    layout.count *= static_cast<std::int64_t>(d);
  }
  const Hid type(checked(H5Dget_type(dataset.get()), path_, "element type of '" + name + "'"));
  const H5T_class_t type_class = H5Tget_class(type.get());
  layout.element_size = H5Tget_size(type.get());
  if (type_class == H5T_FLOAT) {
    layout.kind = 'f';
  } else if (type_class == H5T_INTEGER) {
    layout.kind = H5Tget_sign(type.get()) == H5T_SGN_NONE ? 'u' : 'i';
  } else {
    ZT_THROW_AS(IoError, where, " has elements of HDF5 class ", static_cast<int>(type_class),
                "; expected integers or floats");
  }
  ZT_CHECK_AS(IoError, layout.element_size == 2 || layout.element_size == 4 || layout.element_size == 8,
              where, " has elements of ", layout.element_size, " bytes; expected 2, 4 or 8");
  const Hid create(checked(H5Dget_create_plist(dataset.get()), path_, "properties of '" + name + "'"));
  const H5D_layout_t storage = H5Pget_layout(create.get());
  ZT_CHECK_AS(IoError, storage == H5D_CONTIGUOUS || storage == H5D_COMPACT, where,
              " is not stored contiguously (chunked or virtual layout); zerotrain writes and reads "
              "contiguous datasets only");
  ZT_CHECK_AS(IoError, H5Pget_external_count(create.get()) == 0, where,
              " keeps its data in external files; a checkpoint must hold its data itself");
  const hsize_t stored = H5Dget_storage_size(dataset.get());
  const auto expected = static_cast<std::uint64_t>(layout.count) * layout.element_size;
  ZT_CHECK_AS(
      IoError, layout.count <= std::numeric_limits<std::int64_t>::max() / 8 && stored == expected, where,
      " holds ", stored, " bytes of storage, but its shape ",
      [&] {
        std::string text = "[";
        for (std::size_t i = 0; i < layout.shape.size(); ++i)
          text += (i ? ", " : "") + std::to_string(layout.shape[i]);
        return text + "]";
      }(),
      " needs ", expected, ": the file is truncated or damaged");
  return layout;
}

void H5File::check_only_hard_links() const {
  struct Visit {
    std::string bad_name;
    H5L_type_t bad_type = H5L_TYPE_HARD;
  } visit;
  const herr_t status = H5Lvisit(
      file_.get(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t, const char* name, const H5L_info_t* info, void* out) -> herr_t {
        auto& found = *static_cast<Visit*>(out);
        if (info->type == H5L_TYPE_HARD) return 0;
        found.bad_name = name;
        found.bad_type = info->type;
        return 1;  // stop
      },
      &visit);
  if (!visit.bad_name.empty()) {
    const char* what = visit.bad_type == H5L_TYPE_SOFT       ? "a soft link"
                       : visit.bad_type == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                                             : "a user-defined link";
    ZT_THROW_AS(IoError, "checkpoint '", path_, "': '", visit.bad_name, "' is ", what,
                "; a checkpoint holds hard links only, and links are never followed");
  }
  checked_status(status, path_, "listing the links");
}

void H5File::transfer(const std::string& name, std::int64_t first, std::int64_t count, void* data,
                      DType dtype, bool write) const {
  std::vector<hsize_t> dims;
  hsize_t total = 1;
  if (!write) {
    // Whatever the file says, a read selects only inside a checked simple dataspace of a numeric type.
    const DatasetLayout layout = dataset_layout(name);
    const bool floats = dtype == DType::fp32 || dtype == DType::fp64;
    ZT_CHECK_AS(IoError, (layout.kind == 'f') == floats, "checkpoint '", path_, "' dataset '", name,
                "' holds ", layout.kind == 'f' ? "floats" : "integers", "; expected ",
                floats ? "floats" : "integers", " (", dtype_name(dtype), ")");
    dims.assign(layout.shape.begin(), layout.shape.end());
    total = static_cast<hsize_t>(layout.count);
  }
  Hid dataset = open_dataset(name);
  Hid file_space(checked(H5Dget_space(dataset.get()), path_, "dataspace of '" + name + "'"));
  if (write) {
    const int rank = H5Sget_simple_extent_ndims(file_space.get());
    ZT_CHECK_AS(IoError, rank >= 1, "dataset '", name, "' in '", path_, "' has rank ", rank);
    dims.resize(static_cast<std::size_t>(rank));
    H5Sget_simple_extent_dims(file_space.get(), dims.data(), nullptr);
    for (hsize_t d : dims) total *= d;
  }
  ZT_CHECK_AS(IoError,
              first >= 0 && count >= 0 && count <= std::numeric_limits<std::int64_t>::max() - first &&
                  static_cast<hsize_t>(first + count) <= total,
              "dataset '", name, "' in '", path_, "' has ", total, " elements; asked for [", first, ", ",
              first + count, ")");
  const hsize_t memory_count = static_cast<hsize_t>(std::max<std::int64_t>(count, 1));
  Hid memory_space(H5Screate_simple(1, &memory_count, nullptr));
  if (count == 0) {
    H5Sselect_none(file_space.get());
    H5Sselect_none(memory_space.get());
  } else {
    std::vector<hsize_t> start(dims.size(), 0), block_count(dims.size(), 1);
    bool any = false;
    select_range(file_space.get(), dims, 0, start, block_count, static_cast<hsize_t>(first),
                 static_cast<hsize_t>(first + count), any);
  }
  Hid transfer_list(H5Pcreate(H5P_DATASET_XFER));
  // Writes are collective (MPI-IO may aggregate the ranks' pieces); reads are independent: each
  // rank reads its own range, and a collective read per dataset made every rank wait for the
  // slowest one's turn (cold loads 2x faster at 4 ranks on 2 cores, docs/benchmarks.md).
  if (parallel_) H5Pset_dxpl_mpio(transfer_list.get(), write ? H5FD_MPIO_COLLECTIVE : H5FD_MPIO_INDEPENDENT);
  const herr_t status = write ? H5Dwrite(dataset.get(), native_type(dtype), memory_space.get(),
                                         file_space.get(), transfer_list.get(), data)
                              : H5Dread(dataset.get(), native_type(dtype), memory_space.get(),
                                        file_space.get(), transfer_list.get(), data);
  checked_status(status, path_,
                 std::string(write ? "writing" : "reading") + " dataset '" + name + "' elements [" +
                     std::to_string(first) + ", " + std::to_string(first + count) + ")");
}

void H5File::write_range(const std::string& name, std::int64_t first, std::int64_t count, const void* data,
                         DType dtype) {
  transfer(name, first, count, const_cast<void*>(data), dtype, true);
}

void H5File::read_range(const std::string& name, std::int64_t first, std::int64_t count, void* data,
                        DType dtype) const {
  transfer(name, first, count, data, dtype, false);
}

Hid H5File::open_object(const std::string& object) const {
  const std::string name = object.empty() ? "/" : object;
  ZT_CHECK_AS(IoError, object.empty() || exists(object), "checkpoint '", path_, "' has no object '", object,
              "'");
  return Hid(checked(H5Oopen(file_.get(), name.c_str(), H5P_DEFAULT), path_, "opening '" + name + "'"));
}

namespace {

void write_attribute(hid_t object, const std::string& path, const std::string& key, hid_t type,
                     const void* value) {
  if (H5Aexists(object, key.c_str()) > 0) H5Adelete(object, key.c_str());
  Hid space(H5Screate(H5S_SCALAR));
  Hid attribute(checked(H5Acreate2(object, key.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT), path,
                        "creating attribute '" + key + "'"));
  checked_status(H5Awrite(attribute.get(), type, value), path, "writing attribute '" + key + "'");
}

}  // namespace

void H5File::set_attribute(const std::string& object, const std::string& key, std::int64_t value) {
  write_attribute(open_object(object).get(), path_, key, H5T_NATIVE_INT64, &value);
}

void H5File::set_attribute(const std::string& object, const std::string& key, std::uint64_t value) {
  write_attribute(open_object(object).get(), path_, key, H5T_NATIVE_UINT64, &value);
}

void H5File::set_attribute(const std::string& object, const std::string& key, double value) {
  write_attribute(open_object(object).get(), path_, key, H5T_NATIVE_DOUBLE, &value);
}

void H5File::set_attribute(const std::string& object, const std::string& key, const std::string& value) {
  const Hid type = string_type(value.size());
  write_attribute(open_object(object).get(), path_, key, type.get(), value.empty() ? "" : value.data());
}

bool H5File::has_attribute(const std::string& object, const std::string& key) const {
  if (!object.empty() && !exists(object)) return false;
  return H5Aexists(open_object(object).get(), key.c_str()) > 0;
}

namespace {

Hid open_attribute(hid_t object, const std::string& path, const std::string& owner, const std::string& key) {
  ZT_CHECK_AS(IoError, H5Aexists(object, key.c_str()) > 0, "checkpoint '", path, "': '",
              owner.empty() ? "/" : owner, "' has no attribute '", key, "'");
  return Hid(checked(H5Aopen(object, key.c_str(), H5P_DEFAULT), path, "opening attribute '" + key + "'"));
}

}  // namespace

namespace {

template <typename Value>
Value read_scalar_attribute(hid_t owner, const std::string& path, const std::string& object,
                            const std::string& key, hid_t type) {
  const Hid attribute = open_attribute(owner, path, object, key);
  Value value{};
  checked_status(H5Aread(attribute.get(), type, &value), path, "reading attribute '" + key + "'");
  return value;
}

}  // namespace

std::int64_t H5File::int_attribute(const std::string& object, const std::string& key) const {
  return read_scalar_attribute<std::int64_t>(open_object(object).get(), path_, object, key, H5T_NATIVE_INT64);
}

std::uint64_t H5File::uint_attribute(const std::string& object, const std::string& key) const {
  return read_scalar_attribute<std::uint64_t>(open_object(object).get(), path_, object, key,
                                              H5T_NATIVE_UINT64);
}

double H5File::double_attribute(const std::string& object, const std::string& key) const {
  return read_scalar_attribute<double>(open_object(object).get(), path_, object, key, H5T_NATIVE_DOUBLE);
}

std::string H5File::string_attribute(const std::string& object, const std::string& key) const {
  const Hid owner = open_object(object);
  const Hid attribute = open_attribute(owner.get(), path_, object, key);
  const Hid stored(H5Aget_type(attribute.get()));
  ZT_CHECK_AS(IoError, H5Tget_class(stored.get()) == H5T_STRING, "checkpoint '", path_, "': attribute '", key,
              "' of '", object, "' is not a string");
  const std::size_t size = H5Tget_size(stored.get());
  const Hid type = string_type(size);
  std::string value(size, '\0');
  checked_status(H5Aread(attribute.get(), type.get(), value.data()), path_,
                 "reading attribute '" + key + "'");
  value.resize(std::strlen(value.c_str()));
  return value;
}

std::vector<std::string> H5File::datasets() const {
  std::vector<std::string> names;
  checked_status(H5Ovisit2(
                     file_.get(), H5_INDEX_NAME, H5_ITER_INC,
                     [](hid_t, const char* name, const H5O_info_t* info, void* out) -> herr_t {
                       if (info->type == H5O_TYPE_DATASET)
                         static_cast<std::vector<std::string>*>(out)->push_back(name);
                       return 0;
                     },
                     &names, H5O_INFO_BASIC),
                 path_, "listing the datasets");
  return names;
}

namespace {

/// FNV-1a 64 over the canonical stream of attributes (docs/checkpoint-format.md).
class Fnv1a64 {
 public:
  void bytes(const void* data, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < size; ++i) {
      hash_ ^= p[i];
      hash_ *= 0x100000001b3ULL;
    }
  }
  /// A field: its length as 8 little-endian bytes, then its bytes.
  void field(const void* data, std::size_t size) {
    unsigned char length[8];
    for (int i = 0; i < 8; ++i)
      length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(size) >> (8 * i));
    bytes(length, sizeof length);
    bytes(data, size);
  }
  void field(const std::string& text) { field(text.data(), text.size()); }
  void little_endian(std::uint64_t value) {
    unsigned char out[8];
    for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
    field(out, sizeof out);
  }
  std::uint64_t value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

struct AttributeWalk {
  const std::string* path = nullptr;
  const std::string* excluded_root_key = nullptr;
  std::string object;  // "/" or "/engine", ...
  Fnv1a64 hash;
  std::string failure;
};

herr_t hash_attribute(hid_t owner, const char* key, const H5A_info_t*, void* out) {
  auto& walk = *static_cast<AttributeWalk*>(out);
  if (walk.object == "/" && key == *walk.excluded_root_key) return 0;
  const std::string where = "attribute '" + std::string(key) + "' of '" + walk.object + "'";
  const Hid attribute(H5Aopen(owner, key, H5P_DEFAULT));
  const Hid space(H5Aget_space(attribute.get()));
  const Hid type(H5Aget_type(attribute.get()));
  if (!attribute.valid() || !space.valid() || !type.valid()) {
    walk.failure = "cannot open " + where;
    return -1;
  }
  if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) {
    walk.failure = where + " is not a scalar";
    return -1;
  }
  walk.hash.field(walk.object);
  walk.hash.field(std::string(key));
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      const bool is_unsigned = H5Tget_sign(type.get()) == H5T_SGN_NONE;
      std::uint64_t bits = 0;
      if (H5Aread(attribute.get(), is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, &bits) < 0) break;
      walk.hash.field(is_unsigned ? "u" : "i", 1);
      walk.hash.little_endian(bits);
      return 0;
    }
    case H5T_FLOAT: {
      double value = 0;
      if (H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &value) < 0) break;
      std::uint64_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      walk.hash.field("f", 1);
      walk.hash.little_endian(bits);
      return 0;
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0) {
        walk.failure = where + " is a variable-length string; zerotrain writes fixed-length strings";
        return -1;
      }
      const std::size_t size = H5Tget_size(type.get());
      std::string value(size, '\0');
      if (size == 0 || H5Aread(attribute.get(), type.get(), value.data()) < 0) break;
      value.resize(std::strlen(value.c_str()));
      walk.hash.field("s", 1);
      walk.hash.field(value);
      return 0;
    }
    default:
      walk.failure = where + " has a type other than integer, float or fixed-length string";
      return -1;
  }
  walk.failure = "cannot read " + where + ": " + hdf5_error_message();
  return -1;
}

}  // namespace

std::uint64_t H5File::attributes_checksum(const std::string& excluded_root_key) const {
  AttributeWalk walk;
  walk.path = &path_;
  walk.excluded_root_key = &excluded_root_key;
  // Objects by name (the root first), each object's attributes by name.
  const herr_t status = H5Ovisit2(
      file_.get(), H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t root, const char* name, const H5O_info_t*, void* out) -> herr_t {
        auto& state = *static_cast<AttributeWalk*>(out);
        state.object = std::string_view(name) == "." ? "/" : "/" + std::string(name);
        const Hid object(H5Oopen(root, name, H5P_DEFAULT));
        if (!object.valid()) {
          state.failure = "cannot open '" + state.object + "'";
          return -1;
        }
        hsize_t index = 0;
        return H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_INC, &index, hash_attribute, out) < 0 ? -1
                                                                                                      : 0;
      },
      &walk, H5O_INFO_BASIC);
  if (!walk.failure.empty()) {
    H5Eclear2(H5E_DEFAULT);
    ZT_THROW_AS(IoError, "checkpoint '", path_, "': ", walk.failure);
  }
  checked_status(status, path_, "reading the attributes");
  return walk.hash.value();
}

}  // namespace zt::io
