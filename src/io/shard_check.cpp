#include "io/shard_check.hpp"

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "comm/check.hpp"
#include "io/fnv1a.hpp"
#include "io/glob.hpp"

namespace ddp::shard {

namespace {

// Closes an HDF5 handle on every path out, errors included.
struct Handle {
  hid_t id;
  herr_t (*close)(hid_t);
  Handle(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  ~Handle() {
    if (id >= 0) close(id);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

struct DsetInfo {
  H5T_class_t cls = H5T_NO_CLASS;
  std::size_t size = 0;
  bool is_signed = false;
  std::vector<std::int64_t> dims;
};

std::string type_name(const DsetInfo& d) {
  const std::string bits = std::to_string(8 * d.size);
  if (d.cls == H5T_FLOAT) return "float" + bits;
  if (d.cls == H5T_INTEGER) return (d.is_signed ? "int" : "uint") + bits;
  if (d.cls == H5T_STRING) return "string";
  if (d.cls == H5T_COMPOUND) return "compound";
  return "a non-numeric type";
}

DsetInfo describe(hid_t file, const std::string& path, const char* name) {
  const std::string where = path + ": ";
  if (H5Lexists(file, name, H5P_DEFAULT) <= 0) throw InputError(where + "has no dataset " + name);
  Handle d(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (d.id < 0) throw InputError(where + name + " is not a dataset");
  Handle t(H5_CHECK(H5Dget_type(d.id)), H5Tclose);
  Handle s(H5_CHECK(H5Dget_space(d.id)), H5Sclose);
  DsetInfo info;
  info.cls = H5Tget_class(t.id);
  info.size = H5Tget_size(t.id);
  info.is_signed = info.cls == H5T_INTEGER && H5Tget_sign(t.id) == H5T_SGN_2;
  const int nd = H5_CHECK(H5Sget_simple_extent_ndims(s.id));
  if (nd < 1) throw InputError(where + name + " is a scalar; expected (N, ...)");
  std::vector<hsize_t> dims(nd);
  H5_CHECK(H5Sget_simple_extent_dims(s.id, dims.data(), nullptr));
  info.dims.assign(dims.begin(), dims.end());
  return info;
}

struct FileInfo {
  DsetInfo x, y;
  std::uint64_t hash = kFnv1aBasis;
};

// The stored bytes of the given rows (sorted, unique) of dataset `name`, in one read.
std::vector<unsigned char> read_rows(hid_t file, const std::string& path, const char* name,
                                     const std::vector<hsize_t>& rows) {
  auto check = [&](auto rc) {
    if (rc < 0) throw InputError(path + ": cannot read " + name + " (" + h5_error_string() + ")");
    return rc;
  };
  Handle d(check(H5Dopen2(file, name, H5P_DEFAULT)), H5Dclose);
  Handle type(check(H5Dget_type(d.id)), H5Tclose);
  Handle native(check(H5Tget_native_type(type.id, H5T_DIR_ASCEND)), H5Tclose);
  Handle fspace(check(H5Dget_space(d.id)), H5Sclose);
  std::vector<hsize_t> dims(std::size_t(check(H5Sget_simple_extent_ndims(fspace.id))));
  check(H5Sget_simple_extent_dims(fspace.id, dims.data(), nullptr));
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  count[0] = 1;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    start[0] = rows[i];
    check(H5Sselect_hyperslab(fspace.id, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                              count.data(), nullptr));
  }
  hsize_t elements = rows.size();
  for (std::size_t k = 1; k < dims.size(); ++k) elements *= dims[k];
  Handle mspace(check(H5Screate_simple(1, &elements, nullptr)), H5Sclose);
  std::vector<unsigned char> bytes(std::size_t(elements) * H5Tget_size(native.id));
  check(H5Dread(d.id, native.id, mspace.id, fspace.id, H5P_DEFAULT, bytes.data()));
  return bytes;
}

// Layout::hashes: a fixed number of rows, so that a shard of any size costs the same.
std::uint64_t content_hash(hid_t file, const std::string& path, std::int64_t n) {
  std::vector<hsize_t> rows;
  for (std::int64_t i = 0; i < std::min(n, kHashRows); ++i) {
    const auto r = hsize_t(n <= kHashRows ? i : i * (n - 1) / (kHashRows - 1));
    if (rows.empty() || rows.back() != r) rows.push_back(r);
  }
  std::uint64_t h = kFnv1aBasis;
  if (rows.empty()) return h;  // an empty selection is an HDF5 error
  for (const char* name : {"/x", "/y"}) {
    const std::vector<unsigned char> bytes = read_rows(file, path, name, rows);
    h = fnv1a64(bytes.data(), bytes.size(), h);
  }
  return h;
}

FileInfo inspect_file(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || access(path.c_str(), R_OK) != 0)
    throw InputError(path + ": cannot be read (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory, not a shard file");
#if H5_VERSION_GE(1, 12, 0)
  const htri_t is_h5 = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
#endif
  if (is_h5 <= 0) throw InputError(path + ": not an HDF5 file");
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.id < 0) throw InputError(path + ": cannot be opened (" + h5_error_string() + ")");

  FileInfo fi{describe(f.id, path, "/x"), describe(f.id, path, "/y")};
  const bool x_ok = (fi.x.cls == H5T_FLOAT && fi.x.size == 4) ||
                    (fi.x.cls == H5T_INTEGER && fi.x.size == 1 && !fi.x.is_signed);
  if (!x_ok) throw InputError(path + ": /x is " + type_name(fi.x) + "; expected float32 or uint8");
  const bool y_ok = fi.y.cls == H5T_INTEGER || (fi.y.cls == H5T_FLOAT && fi.y.size == 4);
  if (!y_ok)
    throw InputError(path + ": /y is " + type_name(fi.y) + "; expected integer labels or float32 targets");
  if (fi.y.cls == H5T_INTEGER && fi.y.dims.size() != 1)
    throw InputError(path + ": /y holds integer labels of shape " + shape_str(fi.y.dims) +
                     "; labels must be (N)");
  if (fi.y.dims[0] != fi.x.dims[0])
    throw InputError(path + ": /y has " + std::to_string(fi.y.dims[0]) + " samples but /x has " +
                     std::to_string(fi.x.dims[0]));
  fi.hash = content_hash(f.id, path, fi.x.dims[0]);
  return fi;
}

std::vector<std::int64_t> tail(const std::vector<std::int64_t>& dims) {
  return {dims.begin() + 1, dims.end()};
}

const char* y_kind(bool labels) { return labels ? "integer labels" : "float32 targets"; }

}  // namespace

std::string shape_str(const std::vector<std::int64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + ")";
}

Layout inspect(const std::vector<std::string>& patterns, const std::string& what) {
  Layout l;
  l.files = expand_globs(patterns, what);
  std::int64_t total = 0;
  for (std::size_t i = 0; i < l.files.size(); ++i) {
    const std::string& path = l.files[i];
    const FileInfo fi = inspect_file(path);
    const bool labels = fi.y.cls == H5T_INTEGER;
    const bool x_uint8 = fi.x.cls == H5T_INTEGER;
    const auto sample = tail(fi.x.dims), target = tail(fi.y.dims);
    if (i == 0) {
      l.sample_shape = sample;
      l.target_shape = target;
      l.x_uint8 = x_uint8;
      l.labels = labels;
      l.y_bytes = static_cast<std::int64_t>(fi.y.size);
    } else {
      // Every shard must look like the first: the model is built from its shapes.
      const std::string& first = l.files[0];
      if (sample != l.sample_shape)
        throw InputError(path + ": /x has sample shape " + shape_str(sample) + " but " + first + " has " +
                         shape_str(l.sample_shape));
      if (x_uint8 != l.x_uint8)
        throw InputError(path + ": /x is " + type_name(fi.x) + " but " + first + " has " +
                         (l.x_uint8 ? "uint8" : "float32"));
      if (labels != l.labels)
        throw InputError(path + ": /y holds " + y_kind(labels) + " but " + first + " holds " +
                         y_kind(l.labels));
      if (target != l.target_shape)
        throw InputError(path + ": /y has target shape " + shape_str(target) + " but " + first + " has " +
                         shape_str(l.target_shape));
      // Mixed label widths are harmless (read as int32) but bytes() counts the first's.
    }
    l.counts.push_back(fi.x.dims[0]);
    l.hashes.push_back(fi.hash);
    total += fi.x.dims[0];
  }
  if (total == 0) throw InputError(what + ": the files hold no samples");
  return l;
}

// ---- packing: a flat sequence of int64 and length-prefixed strings ----

namespace {
void put(std::string& b, std::int64_t v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }
void put(std::string& b, const std::vector<std::int64_t>& v) {
  put(b, static_cast<std::int64_t>(v.size()));
  for (auto e : v) put(b, e);
}
void put(std::string& b, const std::string& s) {
  put(b, static_cast<std::int64_t>(s.size()));
  b += s;
}

struct Reader {
  const std::string& b;
  std::size_t pos = 0;
  std::int64_t i64() {
    std::int64_t v;
    if (pos + sizeof v > b.size()) throw std::logic_error("shard::unpack: truncated");
    std::memcpy(&v, b.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  std::vector<std::int64_t> vec() {
    std::vector<std::int64_t> v(static_cast<std::size_t>(i64()));
    for (auto& e : v) e = i64();
    return v;
  }
  std::string str() {
    const auto n = static_cast<std::size_t>(i64());
    std::string s = b.substr(pos, n);
    pos += n;
    return s;
  }
};
}  // namespace

std::string pack(const Layout& l) {
  std::string b;
  put(b, static_cast<std::int64_t>(l.files.size()));
  for (const auto& f : l.files) put(b, f);
  put(b, l.counts);
  put(b, l.sample_shape);
  put(b, l.target_shape);
  put(b, static_cast<std::int64_t>(l.x_uint8));
  put(b, static_cast<std::int64_t>(l.labels));
  put(b, l.y_bytes);
  put(b, std::vector<std::int64_t>(l.hashes.begin(), l.hashes.end()));
  return b;
}

Layout unpack(const std::string& bytes) {
  Reader r{bytes};
  Layout l;
  l.files.resize(static_cast<std::size_t>(r.i64()));
  for (auto& f : l.files) f = r.str();
  l.counts = r.vec();
  l.sample_shape = r.vec();
  l.target_shape = r.vec();
  l.x_uint8 = r.i64() != 0;
  l.labels = r.i64() != 0;
  l.y_bytes = r.i64();
  for (std::int64_t h : r.vec()) l.hashes.push_back(std::uint64_t(h));
  return l;
}

}  // namespace ddp::shard
