#include "io/shard_check.hpp"

#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "comm/check.hpp"
#include "comm/watchdog.hpp"
#include "io/checkpoint_format.hpp"
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
  DsetInfo x, y;  // token shards: x is /tokens, y unused
  bool tokens = false;
  std::int64_t vocab_size = 0;
  std::uint64_t hash = kFnv1aBasis;
  bool nhwc = false;
  std::int64_t class_names = 0;
};

// A string attribute of `obj`, variable or fixed length; nullopt when absent.
std::optional<std::string> string_attribute(hid_t obj, const std::string& path, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  const std::string where = path + ": attribute " + name;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (a.id < 0) throw InputError(where + " cannot be read (" + h5_error_string() + ")");
  Handle t(H5_CHECK(H5Aget_type(a.id)), H5Tclose);
  Handle space(H5_CHECK(H5Aget_space(a.id)), H5Sclose);
  if (H5Tget_class(t.id) != H5T_STRING || H5Sget_simple_extent_npoints(space.id) != 1)
    throw InputError(where + " is not a string");
  if (H5Tis_variable_str(t.id) > 0) {
    Handle mem(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
    H5_CHECK(H5Tset_size(mem.id, H5T_VARIABLE));
    H5_CHECK(H5Tset_cset(mem.id, H5Tget_cset(t.id)));
    char* text = nullptr;
    if (H5Aread(a.id, mem.id, &text) < 0)
      throw InputError(where + " cannot be read (" + h5_error_string() + ")");
    std::string s = text ? text : "";
    H5free_memory(text);
    return s;
  }
  std::string s(H5Tget_size(t.id), '\0');
  if (H5Aread(a.id, t.id, s.data()) < 0)
    throw InputError(where + " cannot be read (" + h5_error_string() + ")");
  return s.substr(0, s.find('\0'));
}

// An integer scalar attribute of `obj`; nullopt when absent.
std::optional<std::int64_t> int_attribute(hid_t obj, const std::string& path, const char* name) {
  if (H5Aexists(obj, name) <= 0) return std::nullopt;
  const std::string where = path + ": attribute " + name;
  Handle a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (a.id < 0) throw InputError(where + " cannot be read (" + h5_error_string() + ")");
  Handle t(H5_CHECK(H5Aget_type(a.id)), H5Tclose);
  Handle space(H5_CHECK(H5Aget_space(a.id)), H5Sclose);
  if (H5Tget_class(t.id) != H5T_INTEGER || H5Sget_simple_extent_npoints(space.id) != 1)
    throw InputError(where + " is not an integer");
  std::int64_t v = 0;
  if (H5Aread(a.id, H5T_NATIVE_INT64, &v) < 0)
    throw InputError(where + " cannot be read (" + h5_error_string() + ")");
  return v;
}

// /x's layout: the attribute when there is one, else the guess for 4-D uint8 images.
bool stored_nhwc(hid_t file, const std::string& path, const DsetInfo& x) {
  const bool image_u8 = x.dims.size() == 4 && x.cls == H5T_INTEGER;
  Handle d(H5_CHECK(H5Dopen2(file, "/x", H5P_DEFAULT)), H5Dclose);
  const auto layout = string_attribute(d.id, path, "layout");
  if (!layout) {
    const auto channels = [](std::int64_t e) { return e == 1 || e == 3 || e == 4; };
    return image_u8 && channels(x.dims[3]) && !channels(x.dims[1]);
  }
  if (*layout != "NHWC" && *layout != "NCHW")
    throw InputError(path + ": /x has layout = '" + *layout + "'; expected 'NHWC' or 'NCHW'");
  if (!image_u8)
    throw InputError(path + ": /x has layout = '" + *layout + "' but is " + type_name(x) + " of shape " +
                     shape_str(x.dims) + "; a layout needs uint8 images (N, H, W, C) or (N, C, H, W)");
  return *layout == "NHWC";
}

std::int64_t class_name_count(hid_t file) {
  if (H5Aexists(file, "class_names") <= 0) return 0;
  Handle a(H5Aopen(file, "class_names", H5P_DEFAULT), H5Aclose);
  if (a.id < 0) return 0;  // informative only: a file that cannot say is not an error
  Handle space(H5Aget_space(a.id), H5Sclose);
  return space.id < 0 ? 0 : std::int64_t(H5Sget_simple_extent_npoints(space.id));
}

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
  if (H5Lexists(file, "/tokens", H5P_DEFAULT) > 0) {
    // One token a row: a run of kHashTokens from each place, so a window's worth is seen.
    std::vector<hsize_t> runs;
    for (hsize_t r : rows)
      for (hsize_t k = r; k < std::min<hsize_t>(hsize_t(n), r + kHashTokens); ++k)
        if (runs.empty() || runs.back() < k) runs.push_back(k);
    const std::vector<unsigned char> bytes = read_rows(file, path, "/tokens", runs);
    return fnv1a64(bytes.data(), bytes.size(), h);
  }
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

  if (H5Lexists(f.id, "/tokens", H5P_DEFAULT) > 0) {
    if (H5Lexists(f.id, "/x", H5P_DEFAULT) > 0)
      throw InputError(path + ": holds both /tokens and /x; a shard is token ids (/tokens) or samples (/x, /y)");
    FileInfo fi;
    fi.tokens = true;
    fi.x = describe(f.id, path, "/tokens");
    if (fi.x.cls != H5T_INTEGER || fi.x.dims.size() != 1 || fi.x.size > 4)
      throw InputError(path + ": /tokens is " + type_name(fi.x) + " of shape " + shape_str(fi.x.dims) +
                       "; expected (N) token ids as uint16, int32 or uint32");
    const auto vocab = int_attribute(f.id, path, "vocab_size");
    if (!vocab)
      throw InputError(path + ": /tokens needs the root attribute vocab_size (the vocabulary's size)");
    if (*vocab < 1 || *vocab > (std::int64_t(1) << 24))
      throw InputError(path + ": attribute vocab_size = " + std::to_string(*vocab) +
                       " is outside [1, 16777216] (token ids travel as exact floats)");
    fi.vocab_size = *vocab;
    fi.hash = content_hash(f.id, path, fi.x.dims[0]);
    return fi;
  }
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
  fi.nhwc = stored_nhwc(f.id, path, fi.x);
  fi.class_names = class_name_count(f.id);
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
    if (i > 0 && fi.tokens != l.tokens)
      throw InputError(path + ": holds " + (fi.tokens ? "token ids (/tokens)" : "samples (/x, /y)") + " but " +
                       l.files[0] + " holds " + (l.tokens ? "token ids (/tokens)" : "samples (/x, /y)"));
    if (fi.tokens) {
      if (i == 0) {
        l.tokens = true;
        l.vocab_size = fi.vocab_size;
        l.labels = true;
        l.y_bytes = static_cast<std::int64_t>(fi.x.size);
      } else if (fi.vocab_size != l.vocab_size) {
        throw InputError(path + ": attribute vocab_size = " + std::to_string(fi.vocab_size) + " but " +
                         l.files[0] + " has " + std::to_string(l.vocab_size) +
                         "; the shards of a set share one vocabulary");
      }
      l.counts.push_back(fi.x.dims[0]);
      l.hashes.push_back(fi.hash);
      total += fi.x.dims[0];
      watchdog::progress();
      continue;
    }
    const bool labels = fi.y.cls == H5T_INTEGER;
    const bool x_uint8 = fi.x.cls == H5T_INTEGER;
    auto sample = tail(fi.x.dims);
    const auto target = tail(fi.y.dims);
    if (fi.nhwc) sample = {sample[2], sample[0], sample[1]};  // (H, W, C) -> (C, H, W)
    if (i == 0) {
      l.nhwc = fi.nhwc;
      l.class_names = fi.class_names;
      l.sample_shape = sample;
      l.target_shape = target;
      l.x_uint8 = x_uint8;
      l.labels = labels;
      l.y_bytes = static_cast<std::int64_t>(fi.y.size);
    } else {
      // Every shard must look like the first: the model is built from its shapes.
      const std::string& first = l.files[0];
      const auto layout_name = [](bool nhwc) { return nhwc ? "NHWC (N, H, W, C)" : "NCHW (N, C, H, W)"; };
      if (fi.nhwc != l.nhwc)
        throw InputError(path + ": /x is stored " + layout_name(fi.nhwc) + " but " + first + " is " +
                         layout_name(l.nhwc) + "; the shards of a set must share one layout");
      if (sample != l.sample_shape && x_uint8 && l.x_uint8 && l.sample_shape.size() == 3 &&
          sample.size() == 3)
        throw InputError(path + ": /x holds images of (C,H,W) = " + shape_str(sample) + " but " + first +
                         " holds " + shape_str(l.sample_shape) +
                         "; every shard needs the same side and channels");
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
    watchdog::progress();  // the ranks waiting for the layout wait on while files are read
  }
  if (total == 0) throw InputError(what + (l.tokens ? ": the files hold no tokens" : ": the files hold no samples"));
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

std::vector<std::string> vocabulary(const std::string& path) {
  const ckpt::H5Quiet quiet;
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.id < 0 || H5Lexists(f.id, "/vocab_bytes", H5P_DEFAULT) <= 0 ||
      H5Lexists(f.id, "/vocab_offsets", H5P_DEFAULT) <= 0)
    return {};
  // A whole 1-D dataset as `type`, or empty.
  auto read = [&](const char* name, hid_t type, std::size_t element) {
    std::vector<unsigned char> out;
    Handle d(H5Dopen2(f.id, name, H5P_DEFAULT), H5Dclose);
    if (d.id < 0) return out;
    Handle space(H5Dget_space(d.id), H5Sclose);
    hsize_t n = 0;
    if (space.id < 0 || H5Sget_simple_extent_ndims(space.id) != 1 ||
        H5Sget_simple_extent_dims(space.id, &n, nullptr) < 0)
      return out;
    out.resize(std::size_t(n) * element);
    if (n > 0 && H5Dread(d.id, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) out.clear();
    return out;
  };
  const std::vector<unsigned char> bytes = read("/vocab_bytes", H5T_NATIVE_UCHAR, 1),
                                   raw = read("/vocab_offsets", H5T_NATIVE_INT64, sizeof(std::int64_t));
  std::vector<std::int64_t> offsets(raw.size() / sizeof(std::int64_t));
  if (!raw.empty()) std::memcpy(offsets.data(), raw.data(), raw.size());
  std::vector<std::string> table;
  for (std::size_t v = 0; v + 1 < offsets.size(); ++v) {
    if (offsets[v] < 0 || offsets[v] > offsets[v + 1] || offsets[v + 1] > std::int64_t(bytes.size()))
      return {};
    table.emplace_back(reinterpret_cast<const char*>(bytes.data()) + offsets[v],
                       std::size_t(offsets[v + 1] - offsets[v]));
  }
  return table;
}

std::string pack(const Layout& l) {
  std::string b;
  put(b, static_cast<std::int64_t>(l.files.size()));
  for (const auto& f : l.files) put(b, f);
  put(b, l.counts);
  put(b, l.sample_shape);
  put(b, l.target_shape);
  put(b, static_cast<std::int64_t>(l.x_uint8));
  put(b, static_cast<std::int64_t>(l.nhwc));
  put(b, l.class_names);
  put(b, static_cast<std::int64_t>(l.labels));
  put(b, l.y_bytes);
  put(b, std::vector<std::int64_t>(l.hashes.begin(), l.hashes.end()));
  put(b, static_cast<std::int64_t>(l.tokens));
  put(b, l.vocab_size);
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
  l.nhwc = r.i64() != 0;
  l.class_names = r.i64();
  l.labels = r.i64() != 0;
  l.y_bytes = r.i64();
  for (std::int64_t h : r.vec()) l.hashes.push_back(std::uint64_t(h));
  l.tokens = r.i64() != 0;
  l.vocab_size = r.i64();
  return l;
}

}  // namespace ddp::shard
