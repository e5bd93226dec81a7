#include "io/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "io/fnv1a.hpp"
#include "io/metrics.hpp"
#include "io/sampler.hpp"
#include "io/shard_check.hpp"
#include "io/shard_dataset.hpp"

namespace ddp {

namespace {

constexpr const char* kFormat = "ddp_train.checkpoint";
constexpr std::int64_t kFormatVersion = 1;

// One dataset of the file: its element type and shape, and its bytes.
struct Blob {
  enum Type { F32, I64, F64 } type = F32;
  std::vector<hsize_t> shape;  // {} for a scalar
  std::vector<unsigned char> bytes;
};
using Blobs = std::map<std::string, Blob>;  // by path, e.g. "/model/layers.1.weight"

std::uint64_t checksum_of(const Blobs& blobs) {
  std::uint64_t h = kFnv1aBasis;
  for (const auto& [path, blob] : blobs) {
    h = fnv1a64(path.c_str(), path.size() + 1, h);  // with the NUL
    h = fnv1a64(blob.bytes.data(), blob.bytes.size(), h);
  }
  return h;
}

std::string checksum_text(std::uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "fnv1a64:%016llx", (unsigned long long)h);
  return buf;
}

template <class T>
Blob make_blob(Blob::Type type, std::vector<hsize_t> shape, const T* data, std::size_t n) {
  Blob b;
  b.type = type;
  b.shape = std::move(shape);
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  b.bytes.assign(p, p + n * sizeof(T));
  return b;
}
Blob scalar(std::int64_t v) { return make_blob(Blob::I64, {}, &v, 1); }
Blob scalar(double v) { return make_blob(Blob::F64, {}, &v, 1); }

hid_t native(Blob::Type t) {
  return t == Blob::F32 ? H5T_NATIVE_FLOAT : t == Blob::I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE;
}

std::vector<float> to_host(View1 v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// ---- writing (rank 0). The file is made in memory by HDF5 (the core driver) and
// put on disk with write(2): its size is known before the disk is touched, a failure
// is errno's own (ENOSPC, EDQUOT, EIO), and HDF5 never holds a half-written file.

// Why a step of putting the file on disk failed: "fsync: Input/output error".
struct WriteFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void throw_errno(const std::string& what) {
  throw WriteFailure(what.empty() ? std::strerror(errno) : what + ": " + std::strerror(errno));
}

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  const hid_t type = H5_CHECK(H5Tcopy(H5T_C_S1));
  H5_CHECK(H5Tset_size(type, std::max<std::size_t>(1, value.size())));
  H5_CHECK(H5Tset_strpad(type, H5T_STR_NULLPAD));
  const hid_t space = H5_CHECK(H5Screate(H5S_SCALAR));
  const hid_t attr = H5_CHECK(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT));
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  H5_CHECK(H5Awrite(attr, type, padded.data()));
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
}

void write_int_attr(hid_t obj, const char* name, std::int64_t value) {
  const hid_t space = H5_CHECK(H5Screate(H5S_SCALAR));
  const hid_t attr = H5_CHECK(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(H5Awrite(attr, H5T_NATIVE_INT64, &value));
  H5Aclose(attr);
  H5Sclose(space);
}

void write_blob(hid_t file, const std::string& path, const Blob& b) {
  const hid_t space = b.shape.empty()
                          ? H5_CHECK(H5Screate(H5S_SCALAR))
                          : H5_CHECK(H5Screate_simple(int(b.shape.size()), b.shape.data(), nullptr));
  const hid_t file_type = b.type == Blob::F32   ? H5T_IEEE_F32LE
                          : b.type == Blob::I64 ? H5T_STD_I64LE
                                                : H5T_IEEE_F64LE;
  const hid_t d =
      H5_CHECK(H5Dcreate2(file, path.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  if (!b.bytes.empty()) H5_CHECK(H5Dwrite(d, native(b.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, b.bytes.data()));
  H5Dclose(d);
  H5Sclose(space);
}

// Writes `n` bytes to a new file `path` and fsyncs it.
void write_file(const std::string& path, const char* data, std::size_t n) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("");
  for (std::size_t done = 0; done < n;) {
    const ssize_t w = write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int e = errno;
      close(fd);
      errno = e;
      throw_errno("");
    }
    done += std::size_t(w);
  }
  // A file system that allocates late (NFS, XFS) reports a full disk here or at close.
  if (fsync(fd) != 0) {
    const int e = errno;
    close(fd);
    errno = e;
    throw_errno("fsync");
  }
  if (close(fd) != 0) throw_errno("close");
}

void fsync_dir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw_errno("open of the directory for fsync");
  const int rc = fsync(fd);
  const int e = errno;
  close(fd);
  errno = e;
  if (rc != 0) throw_errno("fsync of the directory");
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir) {
  if (std::rename(from.c_str(), to.c_str()) != 0) throw_errno("rename to " + to);
  fsync_dir(dir);
}

std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_checkpoint_name(const std::string& n) {
  return n.size() == checkpoint_name(0).size() && n.rfind("ckpt_", 0) == 0 &&
         n.compare(n.size() - 3, 3, ".h5") == 0;
}

// Temp files our writers make: ckpt_<step>.h5.tmp.<pid>, latest.tmp.<pid>.
bool is_our_temp_name(const std::string& n) {
  return (n.rfind("ckpt_", 0) == 0 || n.rfind("latest.tmp.", 0) == 0) && n.find(".tmp.") != std::string::npos;
}

// Bytes the file system of `dir` has free for us; -1 when it does not say.
long long free_bytes(const std::string& dir) {
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return -1;
  return (long long)st.f_bavail * (long long)st.f_frsize;
}
long long block_size(const std::string& dir) {
  struct statvfs st {};
  return statvfs(dir.c_str(), &st) == 0 && st.f_frsize > 0 ? (long long)st.f_frsize : 4096;
}

std::string human_bytes(long long n) {
  char buf[32];
  if (n < 0) return "unknown";
  if (n < 1024) return std::to_string(n) + " B";
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  double v = double(n) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// ---- reading (any process; every problem is a CheckpointError)

struct H5Quiet {  // no HDF5 error stack printed while we probe a possibly broken file
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func, data); }
};

struct Reader {
  hid_t file = -1;
  Blobs blobs;
  std::string error;

  // H5Lvisit's callback (the unversioned names agree with each other in 1.10 to 1.14).
  static herr_t visit(hid_t group, const char* name, const H5L_info_t*, void* self_) {
    auto* self = static_cast<Reader*>(self_);
    const std::string path = std::string("/") + name;
    const hid_t d = H5Oopen(group, name, H5P_DEFAULT);
    if (d < 0) return self->fail("cannot open " + path);
    if (H5Iget_type(d) != H5I_DATASET) {
      H5Oclose(d);
      return 0;
    }
    const hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    Blob b;
    bool ok = type >= 0 && space >= 0;
    if (ok) {
      const H5T_class_t cls = H5Tget_class(type);
      const std::size_t size = H5Tget_size(type);
      if (cls == H5T_FLOAT && size == 4)
        b.type = Blob::F32;
      else if (cls == H5T_FLOAT && size == 8)
        b.type = Blob::F64;
      else if (cls == H5T_INTEGER && size == 8)
        b.type = Blob::I64;
      else
        ok = false;
    }
    if (ok) {
      const int rank = H5Sget_simple_extent_ndims(space);
      b.shape.resize(std::size_t(std::max(rank, 0)));
      if (rank > 0) H5Sget_simple_extent_dims(space, b.shape.data(), nullptr);
      std::size_t n = 1;
      for (auto e : b.shape) n *= e;
      b.bytes.resize(n * (b.type == Blob::F32 ? 4 : 8));
      ok = rank >= 0 &&
           (n == 0 || H5Dread(d, native(b.type), H5S_ALL, H5S_ALL, H5P_DEFAULT, b.bytes.data()) >= 0);
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    if (!ok) return self->fail("cannot read dataset " + path);
    self->blobs[path] = std::move(b);
    return 0;
  }
  int fail(const std::string& why) {
    error = why;
    return -1;
  }
};

std::string read_string_attr(hid_t file, const char* name) {
  if (H5Aexists(file, name) <= 0) throw CheckpointError(std::string("no attribute '") + name + "'");
  const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
  const hid_t type = H5Aget_type(attr);
  std::string s;
  bool ok = attr >= 0 && type >= 0 && H5Tget_class(type) == H5T_STRING && !H5Tis_variable_str(type);
  if (ok) {
    s.resize(H5Tget_size(type));
    ok = H5Aread(attr, type, s.data()) >= 0;
    s = s.c_str();  // drop NUL padding
  }
  if (type >= 0) H5Tclose(type);
  if (attr >= 0) H5Aclose(attr);
  if (!ok) throw CheckpointError(std::string("cannot read attribute '") + name + "'");
  return s;
}

std::int64_t read_int_attr(hid_t file, const char* name) {
  std::int64_t v = 0;
  const hid_t attr = H5Aexists(file, name) > 0 ? H5Aopen(file, name, H5P_DEFAULT) : -1;
  const bool ok = attr >= 0 && H5Aread(attr, H5T_NATIVE_INT64, &v) >= 0;
  if (attr >= 0) H5Aclose(attr);
  if (!ok) throw CheckpointError(std::string("no integer attribute '") + name + "'");
  return v;
}

// Attribute `name` of `group` when the group exists (H5Lexists wants each link of
// the path to exist, so it is asked one level at a time).
std::optional<std::string> group_string_attr(hid_t file, const std::string& group, const char* name) {
  for (std::size_t slash = group.find('/', 1);; slash = group.find('/', slash + 1)) {
    if (H5Lexists(file, group.substr(0, slash).c_str(), H5P_DEFAULT) <= 0) return std::nullopt;
    if (slash == std::string::npos) break;
  }
  const hid_t g = H5Gopen2(file, group.c_str(), H5P_DEFAULT);
  if (g < 0) throw CheckpointError("cannot open " + group);
  try {
    std::string value = read_string_attr(g, name);
    H5Gclose(g);
    return value;
  } catch (...) {
    H5Gclose(g);
    throw;
  }
}

const Blob& need(const Blobs& blobs, const std::string& path, Blob::Type type) {
  auto it = blobs.find(path);
  if (it == blobs.end()) throw CheckpointError("no dataset " + path);
  if (it->second.type != type) throw CheckpointError("dataset " + path + " has the wrong type");
  return it->second;
}
std::int64_t need_int(const Blobs& b, const std::string& path) {
  const Blob& x = need(b, path, Blob::I64);
  if (x.bytes.size() != 8) throw CheckpointError("dataset " + path + " is not a scalar");
  std::int64_t v;
  std::memcpy(&v, x.bytes.data(), 8);
  return v;
}
double need_real(const Blobs& b, const std::string& path) {
  const Blob& x = need(b, path, Blob::F64);
  if (x.bytes.size() != 8) throw CheckpointError("dataset " + path + " is not a scalar");
  double v;
  std::memcpy(&v, x.bytes.data(), 8);
  return v;
}

std::string shape_text(const std::vector<hsize_t>& s) {
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + ")";
}

// The table's entries out of the blobs into `out` (flat, the model's layout).
void unpack_table(const Blobs& blobs, const std::vector<Model::ParamEntry>& table, std::vector<float>& out,
                  const std::string& path) {
  for (const auto& e : table) {
    const std::string p = "/model/" + e.name;
    auto it = blobs.find(p);
    if (it == blobs.end())
      throw InputError("checkpoint " + path + " does not fit the model: it has no " + p +
                       " (was it written for another model.layers?)");
    const std::vector<hsize_t> want(e.shape.begin(), e.shape.end());
    if (it->second.type != Blob::F32 || it->second.shape != want)
      throw InputError("checkpoint " + path + " does not fit the model: " + p + " has shape " +
                       shape_text(it->second.shape) + ", the model's is " + shape_text(want));
    std::memcpy(out.data() + e.offset, it->second.bytes.data(), std::size_t(e.size) * sizeof(float));
  }
}

// Weights or optimizer state with NaN or Inf: such a checkpoint cannot continue a run
// (a diverged step, or bad memory), so it is unusable like a damaged one.
// `optimizer` false: /model only (a checkpoint whose weights alone are wanted).
void check_finite(const Blobs& blobs, bool optimizer) {
  for (const auto& [path, b] : blobs) {
    const bool checked = path.rfind("/model/", 0) == 0 || (optimizer && path.rfind("/optimizer/", 0) == 0);
    if (b.type != Blob::F32 || !checked) continue;
    std::size_t bad = 0;
    for (std::size_t at = 0; at < b.bytes.size(); at += sizeof(float)) {
      float v;
      std::memcpy(&v, b.bytes.data() + at, sizeof v);  // the bytes are not a float array
      bad += !std::isfinite(v);
    }
    if (bad != 0)
      throw CheckpointError(path + " has " + std::to_string(bad) + " non-finite value" +
                            (bad == 1 ? "" : "s"));
  }
}

// A checkpoint file read and checked: format, version, checksum, finite values
// (of the optimizer state too unless `weights_only`).
struct FileContents {
  Blobs blobs;
  std::string config;
  std::string optimizer;             // /optimizer's `name`; "" without /optimizer
  std::optional<std::string> files;  // /data/train's `files`, when recorded
};

FileContents read_verified(const std::string& path, bool weights_only) {
  Reader r;
  FileContents c;
  std::string format, checksum;
  std::int64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Quiet quiet;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) throw CheckpointError(std::strerror(errno));
    if (H5Fis_hdf5(path.c_str()) <= 0) throw CheckpointError("not a readable HDF5 file (truncated?)");
    r.file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r.file < 0) throw CheckpointError("HDF5 cannot open it (truncated?)");
    try {
      format = read_string_attr(r.file, "format");
      version = read_int_attr(r.file, "format_version");
      checksum = read_string_attr(r.file, "checksum");
      c.config = read_string_attr(r.file, "config");
      if (H5Lvisit(r.file, H5_INDEX_NAME, H5_ITER_INC, Reader::visit, &r) < 0)
        throw CheckpointError(r.error.empty() ? "cannot read its contents" : r.error);
      c.optimizer = group_string_attr(r.file, "/optimizer", "name").value_or("");
      c.files = group_string_attr(r.file, "/data/train", "files");
    } catch (...) {
      H5Fclose(r.file);
      throw;
    }
    H5Fclose(r.file);
  }
  if (format != kFormat) throw CheckpointError("format is '" + format + "', not " + kFormat);
  if (version != kFormatVersion)
    throw CheckpointError("format version " + std::to_string(version) + " (this build reads " +
                          std::to_string(kFormatVersion) + ")");
  const std::string actual = checksum_text(checksum_of(r.blobs));
  if (actual != checksum)
    throw CheckpointError("checksum mismatch: stored " + checksum + ", computed " + actual);
  check_finite(r.blobs, !weights_only);
  c.blobs = std::move(r.blobs);
  return c;
}

std::vector<std::int64_t> need_ints(const Blobs& b, const std::string& path) {
  const Blob& x = need(b, path, Blob::I64);
  std::vector<std::int64_t> v(x.bytes.size() / sizeof(std::int64_t));
  if (!v.empty()) std::memcpy(v.data(), x.bytes.data(), x.bytes.size());
  return v;
}

// /data/train as a DataFingerprint; none when the file has no record.
std::optional<DataFingerprint> read_fingerprint(const FileContents& c) {
  if (!c.files) return std::nullopt;
  DataFingerprint d;
  std::istringstream lines(*c.files);
  for (std::string line; std::getline(lines, line);) d.files.push_back(line);
  d.counts = need_ints(c.blobs, "/data/train/counts");
  for (std::int64_t h : need_ints(c.blobs, "/data/train/hashes")) d.hashes.push_back(std::uint64_t(h));
  d.x_shape = need_ints(c.blobs, "/data/train/x_shape");
  d.y_shape = need_ints(c.blobs, "/data/train/y_shape");
  if (d.files.size() != d.counts.size() || d.hashes.size() != d.counts.size())
    throw CheckpointError("/data/train names " + std::to_string(d.files.size()) + " files but has " +
                          std::to_string(d.counts.size()) + " counts");
  return d;
}

// ---- broadcast of a Checkpoint (rank 0's) as one byte buffer

struct Packer {
  std::vector<char> buf;
  std::size_t at = 0;
  template <class T>
  void put(const T& v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf.insert(buf.end(), p, p + sizeof(T));
  }
  void put(const std::string& s) {
    put(std::uint64_t(s.size()));
    buf.insert(buf.end(), s.begin(), s.end());
  }
  template <class T>
  void put(const std::vector<T>& v) {  // T: a number
    put(std::uint64_t(v.size()));
    const char* p = reinterpret_cast<const char*>(v.data());
    buf.insert(buf.end(), p, p + v.size() * sizeof(T));
  }
  void put(const std::vector<std::string>& v) {
    put(std::uint64_t(v.size()));
    for (const auto& s : v) put(s);
  }
  template <class T>
  void get(T& v) {
    std::memcpy(&v, buf.data() + at, sizeof(T));
    at += sizeof(T);
  }
  void get(std::string& s) {
    std::uint64_t n;
    get(n);
    s.assign(buf.data() + at, n);
    at += n;
  }
  template <class T>
  void get(std::vector<T>& v) {
    std::uint64_t n;
    get(n);
    v.resize(n);
    // An empty vector's data() may be null, and memcpy from or to null is undefined
    // even for 0 bytes (a model without buffers sends none).
    if (n != 0) std::memcpy(v.data(), buf.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
  void get(std::vector<std::string>& v) {
    std::uint64_t n;
    get(n);
    v.resize(n);
    for (auto& s : v) get(s);
  }
};

template <class P, class C>
void fields(P& p, C& c) {
  p.put_or_get(c.path);
  p.put_or_get(c.state);
  p.put_or_get(c.parameters);
  p.put_or_get(c.buffers);
  p.put_or_get(c.optimizer);
  p.put_or_get(c.optimizer_steps);
  std::uint64_t n = c.optimizer_state.size();
  p.put_or_get(n);
  c.optimizer_state.resize(n);
  for (auto& [name, v] : c.optimizer_state) {
    p.put_or_get(name);
    p.put_or_get(v);
  }
  p.put_or_get(c.config);
  std::uint8_t has_data = c.data.has_value();
  p.put_or_get(has_data);
  if (has_data) {
    if (!c.data) c.data.emplace();
    p.put_or_get(c.data->files);
    p.put_or_get(c.data->counts);
    p.put_or_get(c.data->hashes);
    p.put_or_get(c.data->x_shape);
    p.put_or_get(c.data->y_shape);
  }
}
struct Put : Packer {
  template <class T>
  void put_or_get(const T& v) {
    put(v);
  }
};
struct Get : Packer {
  template <class T>
  void put_or_get(T& v) {
    get(v);
  }
};

void broadcast_checkpoint(MPI_Comm comm, int rank, Checkpoint& ck) {
  Put out;
  if (rank == 0) fields(out, ck);
  long long n = (long long)out.buf.size();
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm));
  out.buf.resize(std::size_t(n));
  // In pieces below 2^31 bytes: MPI counts are ints.
  for (long long at = 0; at < n; at += (1ll << 30)) {
    const int len = int(std::min<long long>(n - at, 1ll << 30));
    MPI_CHECK(MPI_Bcast(out.buf.data() + at, len, MPI_CHAR, 0, comm));
  }
  if (rank != 0) {
    Get in;
    in.buf = std::move(out.buf);
    fields(in, ck);
  }
}

// Everything a checkpoint holds, by path; the checksum covers it in path order.
Blobs collect_blobs(const Model& model, const OptimizerSnapshot& optimizer, const TrainingState& state,
                    const DataFingerprint* data) {
  Blobs blobs;
  auto add_table = [&](const std::vector<Model::ParamEntry>& table, const std::vector<float>& flat) {
    for (const auto& e : table)
      blobs["/model/" + e.name] = make_blob(Blob::F32, std::vector<hsize_t>(e.shape.begin(), e.shape.end()),
                                            flat.data() + e.offset, std::size_t(e.size));
  };
  add_table(model.parameter_table(), to_host(model.parameters()));
  add_table(model.buffer_table(), to_host(model.buffers()));
  for (const auto& [sname, v] : optimizer.state) {
    if (std::int64_t(v.size()) != model.num_parameters())
      DDP_FATAL("checkpoint: /optimizer/" << sname << " of " << v.size() << " values for "
                                          << model.num_parameters() << " parameters");
    blobs["/optimizer/" + sname] = make_blob(Blob::F32, {hsize_t(v.size())}, v.data(), v.size());
  }
  blobs["/optimizer/steps"] = scalar(std::int64_t(optimizer.steps));
  blobs["/state/epoch"] = scalar(state.epoch);
  blobs["/state/step"] = scalar(state.step);
  blobs["/state/consumed"] = scalar(state.consumed);
  blobs["/state/seed"] = scalar(state.seed);
  blobs["/state/lr_step"] = scalar(state.lr_step);
  blobs["/state/dropout_position"] = scalar(state.dropout_position);
  blobs["/state/world_size"] = scalar(state.world_size);
  blobs["/state/epoch_loss_sum"] = scalar(state.epoch_loss_sum);
  blobs["/state/epoch_samples"] = scalar(state.epoch_samples);
  blobs["/state/loss_scale"] = scalar(state.loss_scale);
  blobs["/state/loss_scale_clean_steps"] = scalar(state.loss_scale_clean_steps);
  if (data) {
    auto ints = [](const std::vector<std::int64_t>& v) {
      return make_blob(Blob::I64, {hsize_t(v.size())}, v.data(), v.size());
    };
    blobs["/data/train/counts"] = ints(data->counts);
    blobs["/data/train/hashes"] = ints(std::vector<std::int64_t>(data->hashes.begin(), data->hashes.end()));
    blobs["/data/train/x_shape"] = ints(data->x_shape);
    blobs["/data/train/y_shape"] = ints(data->y_shape);
    blobs["/data/train/samples"] = scalar(data->samples());
  }
  return blobs;
}

// The bytes of the checkpoint file, made by HDF5 in memory. `name` only tells HDF5's
// open files apart.
std::vector<char> file_image(const std::string& name, const Model& model, const OptimizerSnapshot& optimizer,
                             const TrainingState& state, const Config& cfg, const DataFingerprint* data) {
  Blobs blobs = collect_blobs(model, optimizer, state, data);
  const std::string checksum = checksum_text(checksum_of(blobs));
  std::size_t payload = 0;
  for (const auto& [p, b] : blobs) payload += b.bytes.size();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const hid_t fapl = H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
  // Grown in steps of the payload: one allocation, or two with the metadata.
  H5_CHECK(H5Pset_fapl_core(fapl, payload + (1u << 20), /*backing_store=*/0));
  const hid_t file = H5_CHECK(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  H5Pclose(fapl);
  std::vector<const char*> groups = {"/model", "/optimizer", "/state"};
  if (data) groups.insert(groups.end(), {"/data", "/data/train"});
  for (const char* g : groups) H5Gclose(H5_CHECK(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  for (auto& [p, b] : blobs) {
    write_blob(file, p, b);
    std::vector<unsigned char>().swap(b.bytes);  // the image has it now: one copy at a time
  }
  const hid_t opt = H5_CHECK(H5Gopen2(file, "/optimizer", H5P_DEFAULT));
  write_string_attr(opt, "name", optimizer.name);
  H5Gclose(opt);
  if (data) {
    std::string files;
    for (const auto& f : data->files) files += f + "\n";
    const hid_t train = H5_CHECK(H5Gopen2(file, "/data/train", H5P_DEFAULT));
    write_string_attr(train, "files", files);
    H5Gclose(train);
  }
  write_string_attr(file, "format", kFormat);
  write_int_attr(file, "format_version", kFormatVersion);
  write_int_attr(file, "world_size", state.world_size);
  write_string_attr(file, "config", cfg.to_namelist());
  write_string_attr(file, "source_path", cfg.source_path);
  write_string_attr(file, "source_text", cfg.source_text);
  write_string_attr(file, "checksum", checksum);
  H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
  std::vector<char> image(std::size_t(H5_CHECK(H5Fget_file_image(file, nullptr, 0))));
  H5_CHECK(H5Fget_file_image(file, image.data(), image.size()));
  H5_CHECK(H5Fclose(file));
  return image;
}

// Frees `need` bytes in the checkpoint directory if it has less: removes its oldest
// checkpoints, never the newest valid one (resume 'auto' would take it), and warns.
// Removes nothing when no checkpoint is valid: then nothing tells what is safe to lose.
void make_room(const std::string& run_dir, long long need, const std::string& writing) {
  const std::string dir = checkpoint_dir(run_dir);
  const long long before = free_bytes(dir);
  if (before < 0 || before >= need) return;
  std::string keep;
  for (const std::string& path : checkpoint_candidates(run_dir)) {
    try {
      read_verified(path, /*weights_only=*/false);
      keep = path.substr(dir.size() + 1);
      break;
    } catch (const CheckpointError&) {
    }
  }
  if (keep.empty()) return;
  std::string removed;
  for (const std::string& n : list_dir(dir)) {  // oldest first
    if (free_bytes(dir) >= need) break;
    if (is_checkpoint_name(n) && n != keep && std::remove((dir + "/" + n).c_str()) == 0)
      removed += (removed.empty() ? "" : ", ") + n;
  }
  if (!removed.empty())
    log::warn("checkpoint: " + dir + " has " + human_bytes(before) + " free and " + writing + " needs " +
              human_bytes(need) + ": removed the older " + removed + " (" + keep +
              ", the newest valid checkpoint, stays)");
}

// ---- weights-only files: /model/<name> written from a PyTorch state_dict with h5py

// Every dataset under /model, by its name there ('/' of nested groups read as '.'),
// converted to float by HDF5 (float16/32/64, or an integer: num_batches_tracked).
struct WeightsFile {
  struct Tensor {
    std::vector<hsize_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> unreadable;  // datasets that are not numbers

  static herr_t visit(hid_t group, const char* name, const H5L_info_t*, void* self_) {
    auto* self = static_cast<WeightsFile*>(self_);
    std::string key = name;
    std::replace(key.begin(), key.end(), '/', '.');
    const hid_t d = H5Oopen(group, name, H5P_DEFAULT);
    if (d < 0) return -1;
    if (H5Iget_type(d) != H5I_DATASET) {
      H5Oclose(d);
      return 0;
    }
    const hid_t type = H5Dget_type(d), space = H5Dget_space(d);
    const H5T_class_t cls = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    const int rank = space >= 0 ? H5Sget_simple_extent_ndims(space) : -1;
    bool ok = (cls == H5T_FLOAT || cls == H5T_INTEGER) && rank >= 0;
    Tensor t;
    if (ok) {
      t.shape.resize(std::size_t(rank));
      if (rank > 0) H5Sget_simple_extent_dims(space, t.shape.data(), nullptr);
      std::size_t n = 1;
      for (auto e : t.shape) n *= e;
      t.values.resize(n);
      ok = n == 0 || H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, t.values.data()) >= 0;
    }
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    if (ok)
      self->tensors[key] = std::move(t);
    else
      self->unreadable.push_back(key);
    return 0;
  }
};

// Ours ("format" = kFormat, fixed-length, as save_checkpoint writes it) or not.
bool is_checkpoint_file(hid_t file) {
  try {
    return read_string_attr(file, "format") == kFormat;
  } catch (const CheckpointError&) {
    return false;
  }
}

// "a, b, c and 2 more": at most `shown` of `items`, joined by `sep`.
std::string first_of(const std::vector<std::string>& items, std::size_t shown, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < std::min(items.size(), shown); ++i) out += (i ? sep : "") + items[i];
  if (items.size() > shown) out += std::string(sep) + "and " + std::to_string(items.size() - shown) + " more";
  return out;
}

// A weights-only file into ck.parameters and ck.buffers. A name in the file is ours
// ("layers.<i>.<param>", also PyTorch's for a module whose nn.Sequential is
// `self.layers`) or a bare nn.Sequential's ("<i>.<param>", read as "layers.<i>...").
// InputError naming each missing or misshapen tensor with both shapes; tensors the
// model has no place for are ignored with one warning. num_batches_tracked may be
// missing (it only counts batches): the model's own value stays.
void load_weights_file(const std::string& path, const Model& model, Checkpoint& ck) {
  WeightsFile w;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Quiet quiet;
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) throw CheckpointError("HDF5 cannot open it (truncated?)");
    const bool has_model = H5Lexists(file, "/model", H5P_DEFAULT) > 0;
    const hid_t g = has_model ? H5Gopen2(file, "/model", H5P_DEFAULT) : -1;
    const herr_t rc = g >= 0 ? H5Lvisit(g, H5_INDEX_NAME, H5_ITER_INC, WeightsFile::visit, &w) : -1;
    if (g >= 0) H5Gclose(g);
    H5Fclose(file);
    if (!has_model)
      throw CheckpointError("it has no group /model (a weights-only file holds /model/<name> datasets)");
    if (rc < 0) throw CheckpointError("cannot read /model");
  }
  auto ours = [](const std::string& name) {
    return !name.empty() && name[0] >= '0' && name[0] <= '9' ? "layers." + name : name;
  };
  std::map<std::string, std::string> file_name;  // our name -> the file's (ours wins over a bare one)
  for (const auto& [name, t] : w.tensors)
    if (!file_name.count(ours(name)) || ours(name) == name) file_name[ours(name)] = name;
  auto unreadable = [&](const std::string& our_name) {
    return std::any_of(w.unreadable.begin(), w.unreadable.end(),
                       [&](const std::string& n) { return ours(n) == our_name; });
  };
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  std::vector<std::string> problems;
  std::map<std::string, bool> used;
  auto fill = [&](const std::vector<Model::ParamEntry>& table, std::vector<float>& out) {
    for (const auto& e : table) {
      const std::vector<hsize_t> want(e.shape.begin(), e.shape.end());
      const auto it = file_name.find(e.name);
      if (it == file_name.end()) {
        if (!ends_with(e.name, ".num_batches_tracked"))
          problems.push_back(e.name + ": expected shape " + shape_text(want) + ", found none" +
                             (unreadable(e.name) ? " (its dataset is not a number)" : ""));
        continue;
      }
      used[it->second] = true;
      const WeightsFile::Tensor& t = w.tensors.at(it->second);
      if (t.shape != want) {
        problems.push_back(e.name + ": expected shape " + shape_text(want) + ", found " +
                           shape_text(t.shape) + (it->second == e.name ? "" : " (" + it->second + ")"));
        continue;
      }
      const auto bad =
          std::count_if(t.values.begin(), t.values.end(), [](float v) { return !std::isfinite(v); });
      if (bad > 0) {
        problems.push_back(e.name + " has " + std::to_string(bad) + " non-finite value" +
                           (bad == 1 ? "" : "s"));
        continue;
      }
      std::copy(t.values.begin(), t.values.end(), out.begin() + e.offset);
    }
  };
  ck.parameters.assign(std::size_t(model.num_parameters()), 0.0f);
  fill(model.parameter_table(), ck.parameters);
  ck.buffers = to_host(model.buffers());  // what the file may leave out (num_batches_tracked)
  fill(model.buffer_table(), ck.buffers);
  if (!problems.empty()) {
    std::string hint;
    if (used.empty() && !w.tensors.empty())
      hint = " (the file's /model holds " + std::to_string(w.tensors.size()) + " tensors, e.g. '" +
             w.tensors.begin()->first + "': names must be layers.<i>.<param> or <i>.<param>)";
    throw InputError("io.init_from: " + path +
                     " does not fit the model (model.layers): " + first_of(problems, 4, "; ") + hint);
  }
  std::vector<std::string> extra;
  for (const auto& [name, t] : w.tensors)
    if (!used.count(name)) extra.push_back(name + " " + shape_text(t.shape));
  for (const auto& name : w.unreadable)
    if (!used.count(name)) extra.push_back(name);
  if (!extra.empty())
    log::warn("io.init_from: " + path + ": " + std::to_string(extra.size()) + " tensor" +
              (extra.size() == 1 ? "" : "s") +
              " the model has no place for, ignored: " + first_of(extra, 4, ", "));
}

}  // namespace

std::string checkpoint_dir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%09lld.h5", (long long)step);
  return buf;
}

OptimizerSnapshot snapshot_of(Optimizer& optimizer) {
  OptimizerSnapshot snap{optimizer.name(), optimizer.steps(), {}};
  for (auto& [name, view] : optimizer.state()) snap.state.emplace_back(name, to_host(view));
  return snap;
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model, Optimizer& optimizer,
                            const TrainingState& state, const Config& cfg, const DataFingerprint* data) {
  return save_checkpoint(run_dir, keep, model, snapshot_of(optimizer), state, cfg, data);
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model,
                            const OptimizerSnapshot& optimizer, const TrainingState& state, const Config& cfg,
                            const DataFingerprint* data) {
  const std::string dir = checkpoint_dir(run_dir);
  const std::string name = checkpoint_name(state.step);
  const std::string path = dir + "/" + name;
  const std::string problem = make_directories(dir);
  if (!problem.empty()) throw CheckpointWriteError("cannot write checkpoint " + path + ": " + problem);
  // What an earlier attempt left (a writer killed, or refused by a full disk) may hold
  // the very space this one needs.
  for (const std::string& n : list_dir(dir))
    if (is_our_temp_name(n)) std::remove((dir + "/" + n).c_str());

  std::vector<char> image = file_image(path, model, optimizer, state, cfg, data);
  const long long block = block_size(dir);
  // The file in whole blocks, and a block for `latest`.
  const long long need = ((long long)image.size() + block - 1) / block * block + block;
  make_room(run_dir, need, name);

  std::string previous;  // what `latest` names now: it stays so if this write fails
  {
    std::ifstream in(dir + "/latest");
    in >> previous;
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  const std::string latest_tmp = dir + "/latest.tmp." + std::to_string(getpid());
  bool renamed = false;
  try {
    write_file(tmp, image.data(), image.size());
    if (const char* delay = std::getenv("DDP_TEST_CHECKPOINT_DELAY_MS"))  // test hook, see the header
      std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(delay)));
    rename_durably(tmp, path, dir);
    renamed = true;
    // The pointer, the same way: a reader sees the old name or the new one, never a torn one.
    const std::string line = name + "\n";
    write_file(latest_tmp, line.data(), line.size());
    rename_durably(latest_tmp, dir + "/latest", dir);
  } catch (const WriteFailure& e) {
    // Leave the directory as it was: no temp file to fill the disk for the next
    // attempt, and no checkpoint that `latest` does not name.
    std::remove(tmp.c_str());
    std::remove(latest_tmp.c_str());
    if (renamed && name != previous) std::remove(path.c_str());
    throw CheckpointWriteError("cannot write checkpoint " + path + ": " + e.what() + " (" + dir + " has " +
                               human_bytes(free_bytes(dir)) + " free, the checkpoint needs " +
                               human_bytes((long long)image.size()) + "); " +
                               (previous.empty() ? "no earlier checkpoint" : previous + " stays the latest"));
  }

  // Keep the newest `keep`.
  std::vector<std::string> ckpts;
  for (const std::string& n : list_dir(dir))
    if (is_checkpoint_name(n)) ckpts.push_back(n);
  for (std::size_t i = 0; i + std::size_t(keep) < ckpts.size(); ++i)
    if (ckpts[i] != name) std::remove((dir + "/" + ckpts[i]).c_str());
  return path;
}

Checkpoint load_checkpoint(const std::string& path, const Model& model, const std::string& optimizer) {
  const FileContents c = read_verified(path, optimizer.empty());
  Checkpoint ck;
  ck.path = path;
  ck.config = c.config;
  ck.optimizer = c.optimizer;
  ck.data = read_fingerprint(c);
  TrainingState& s = ck.state;
  s.epoch = need_int(c.blobs, "/state/epoch");
  s.step = need_int(c.blobs, "/state/step");
  s.consumed = need_int(c.blobs, "/state/consumed");
  s.seed = need_int(c.blobs, "/state/seed");
  s.lr_step = need_int(c.blobs, "/state/lr_step");
  s.dropout_position = need_int(c.blobs, "/state/dropout_position");
  s.world_size = need_int(c.blobs, "/state/world_size");
  s.epoch_loss_sum = need_real(c.blobs, "/state/epoch_loss_sum");
  s.epoch_samples = need_real(c.blobs, "/state/epoch_samples");
  // Written since train.precision exists; older checkpoints are fp32 runs.
  if (c.blobs.count("/state/loss_scale")) {
    s.loss_scale = need_real(c.blobs, "/state/loss_scale");
    s.loss_scale_clean_steps = need_int(c.blobs, "/state/loss_scale_clean_steps");
  }
  ck.optimizer_steps = need_int(c.blobs, "/optimizer/steps");

  ck.parameters.resize(std::size_t(model.num_parameters()));
  unpack_table(c.blobs, model.parameter_table(), ck.parameters, path);
  ck.buffers.resize(model.buffers().extent(0));
  unpack_table(c.blobs, model.buffer_table(), ck.buffers, path);

  if (!optimizer.empty()) {
    if (ck.optimizer != optimizer)
      throw InputError("checkpoint " + path + " was written with optimizer " + ck.optimizer +
                       ", this run uses " + optimizer + " (train.optimizer)");
    for (const auto& [p, b] : c.blobs) {
      if (p.rfind("/optimizer/", 0) != 0 || p == "/optimizer/steps") continue;
      if (b.type != Blob::F32 || b.shape != std::vector<hsize_t>{hsize_t(model.num_parameters())})
        throw InputError("checkpoint " + path + " does not fit the model: " + p + " has shape " +
                         shape_text(b.shape));
      std::vector<float> v(std::size_t(model.num_parameters()));
      std::memcpy(v.data(), b.bytes.data(), b.bytes.size());
      ck.optimizer_state.emplace_back(p.substr(std::strlen("/optimizer/")), std::move(v));
    }
  }
  return ck;
}

Checkpoint load_initial_weights(const std::string& path, const Model& model) {
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Quiet quiet;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) throw CheckpointError(std::strerror(errno));
    if (H5Fis_hdf5(path.c_str()) <= 0) throw CheckpointError("not a readable HDF5 file (truncated?)");
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) throw CheckpointError("HDF5 cannot open it (truncated?)");
    ours = is_checkpoint_file(file);
    H5Fclose(file);
  }
  if (ours) return load_checkpoint(path, model, "");
  Checkpoint ck;
  ck.path = path;
  load_weights_file(path, model, ck);
  return ck;
}

std::vector<std::string> checkpoint_candidates(const std::string& run_dir) {
  const std::string dir = checkpoint_dir(run_dir);
  std::vector<std::string> names;
  for (const std::string& n : list_dir(dir))
    if (is_checkpoint_name(n)) names.push_back(n);
  std::reverse(names.begin(), names.end());  // newest first
  std::ifstream in(dir + "/latest");
  std::string latest;
  if (in >> latest) {
    auto it = std::find(names.begin(), names.end(), latest);
    if (it != names.end()) std::rotate(names.begin(), it, it + 1);
  }
  for (auto& n : names) n = dir + "/" + n;
  return names;
}

DataChange compare_data(const DataFingerprint& then, const DataFingerprint& now) {
  std::vector<std::string> changes;
  auto samples = [](std::int64_t n) { return std::to_string(n) + (n == 1 ? " sample" : " samples"); };
  std::map<std::string, std::size_t> then_at, now_at;
  for (std::size_t i = 0; i < then.files.size(); ++i) then_at[then.files[i]] = i;
  for (std::size_t i = 0; i < now.files.size(); ++i) now_at[now.files[i]] = i;
  for (std::size_t i = 0; i < then.files.size(); ++i)
    if (!now_at.count(then.files[i]))
      changes.push_back(then.files[i] + " (" + samples(then.counts[i]) + ") is gone");
  for (std::size_t i = 0; i < now.files.size(); ++i)
    if (!then_at.count(now.files[i]))
      changes.push_back(now.files[i] + " (" + samples(now.counts[i]) + ") is new");
  std::vector<std::size_t> order;  // where the files of both were then, in the order of now
  for (std::size_t i = 0; i < now.files.size(); ++i) {
    const auto it = then_at.find(now.files[i]);
    if (it == then_at.end()) continue;
    const std::size_t j = it->second;
    order.push_back(j);
    if (then.counts[j] != now.counts[i])
      changes.push_back(now.files[i] + " has " + samples(now.counts[i]) + ", had " +
                        std::to_string(then.counts[j]));
    else if (then.hashes[j] != now.hashes[i])
      changes.push_back(now.files[i] + " has other contents in its sampled rows");
  }
  // Another order of the same files renumbers the samples the sampler position counts.
  if (!std::is_sorted(order.begin(), order.end())) changes.push_back("the files are in another order");
  if (then.x_shape != now.x_shape)
    changes.push_back("samples are " + shard::shape_str(now.x_shape) + ", were " +
                      shard::shape_str(then.x_shape));
  if (then.y_shape != now.y_shape)
    changes.push_back("targets are " + shard::shape_str(now.y_shape) + ", were " +
                      shard::shape_str(then.y_shape));

  constexpr std::size_t kShown = 4;  // one line, also for a thousand shards
  std::string list;
  for (std::size_t i = 0; i < std::min(changes.size(), kShown); ++i) list += (i ? "; " : "") + changes[i];
  if (changes.size() > kShown) list += "; and " + std::to_string(changes.size() - kShown) + " more changes";
  DataChange c;
  if (then.samples() != now.samples())
    c.count =
        std::to_string(then.samples()) + " samples then, " + std::to_string(now.samples()) + " now: " + list;
  else
    c.other = list;
  return c;
}

namespace {
// Rank 0, a resume: the checkpoint's training data against this run's. InputError
// when the sample count changed (unless io.allow_data_change); warnings otherwise.
void check_training_data(const Checkpoint& ck, const DataFingerprint& now, bool allow_change) {
  if (!ck.data) {
    log::warn("checkpoint " + ck.path +
              " has no record of its training data (written before ddp_train kept one): the data this "
              "run resumes on cannot be checked against it");
    return;
  }
  const DataChange c = compare_data(*ck.data, now);
  const std::string since = "the training data changed since checkpoint " + ck.path + " was written (";
  if (!c.count.empty() && !allow_change)
    throw InputError(since + c.count +
                     "); its sampler position would continue the epoch on other samples. Set "
                     "io.allow_data_change = T to continue on this data anyway");
  if (!c.count.empty())
    log::warn(since + c.count + "); continuing on it (io.allow_data_change = T)");
  else if (!c.other.empty())
    log::warn(since + c.other + "; the same " + std::to_string(now.samples()) +
              " samples in all); continuing");
}
}  // namespace

std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only,
                                                const DataFingerprint* data) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  Checkpoint ck;
  int found = 0;  // 0 none, 1 resume, 2 init_from
  std::string problem;
  if (rank == 0) {
    try {
      if (cfg.io.resume == "auto") {
        for (const std::string& path : checkpoint_candidates(cfg.io.run_dir)) {
          try {
            ck = load_checkpoint(path, model, optimizer);
            found = 1;
            break;
          } catch (const CheckpointError& e) {
            log::warn("checkpoint " + path + " is unusable (" + e.what() + "); trying the previous one");
          }
        }
      } else if (cfg.io.resume != "never") {
        try {
          ck = load_checkpoint(cfg.io.resume, model, optimizer);
          found = 1;
        } catch (const CheckpointError& e) {
          throw InputError("io.resume: checkpoint " + cfg.io.resume + " is unusable: " + e.what());
        }
      }
      if (found && data) check_training_data(ck, *data, cfg.io.allow_data_change);
      if (!found && !cfg.io.init_from.empty()) {
        try {
          ck = load_initial_weights(cfg.io.init_from, model);
          found = 2;
        } catch (const CheckpointError& e) {
          throw InputError("io.init_from: " + cfg.io.init_from + " is unusable: " + e.what());
        }
      }
    } catch (const InputError& e) {
      problem = e.what();
    }
  }
  int status[2] = {found, problem.empty() ? 0 : 1};
  MPI_CHECK(MPI_Bcast(status, 2, MPI_INT, 0, comm));
  if (status[1]) fatal_all(comm, problem);
  if (weights_only) *weights_only = status[0] == 2;
  if (status[0] == 0) return std::nullopt;
  broadcast_checkpoint(comm, rank, ck);
  return ck;
}

std::vector<std::int64_t> epoch_indices(std::int64_t dataset_size, int world, int rank, bool shuffle,
                                        std::uint64_t seed, bool drop_last, std::int64_t epoch,
                                        std::int64_t consumed) {
  DistributedSampler sampler(dataset_size, world, rank, shuffle, seed, drop_last);
  sampler.set_epoch(epoch);
  if (consumed <= 0) return sampler.indices();
  std::vector<std::int64_t> order;  // P: the unpadded order
  if (shuffle) {
    order = seeded_permutation(dataset_size, seed + std::uint64_t(epoch));
  } else {
    order.resize(std::size_t(dataset_size));
    std::iota(order.begin(), order.end(), std::int64_t{0});
  }
  std::vector<std::int64_t> rest(order.begin() + std::min<std::int64_t>(consumed, dataset_size), order.end());
  const std::size_t w = std::size_t(world);
  if (drop_last) {
    rest.resize(rest.size() / w * w);
  } else if (!order.empty()) {
    for (std::size_t i = 0; rest.size() % w != 0; ++i) rest.push_back(order[i % order.size()]);
  }
  std::vector<std::int64_t> mine;
  for (std::size_t i = std::size_t(rank); i < rest.size(); i += w) mine.push_back(rest[i]);
  return mine;
}

}  // namespace ddp
