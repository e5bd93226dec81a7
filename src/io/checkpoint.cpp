#include "io/checkpoint.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <hdf5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
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
#include "io/metrics.hpp"
#include "io/sampler.hpp"
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

std::uint64_t fnv1a64(const Blobs& blobs) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto feed = [&h](const unsigned char* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  for (const auto& [path, blob] : blobs) {
    feed(reinterpret_cast<const unsigned char*>(path.data()), path.size() + 1);  // with the NUL
    feed(blob.bytes.data(), blob.bytes.size());
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

// ---- writing (rank 0; HDF5 failures here abort, as any I/O error mid-run does)

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

void fsync_path(const std::string& path, bool directory) {
  const int fd = open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) DDP_FATAL("checkpoint: cannot open '" << path << "' for fsync: " << std::strerror(errno));
  if (fsync(fd) != 0) DDP_FATAL("checkpoint: fsync of '" << path << "' failed: " << std::strerror(errno));
  close(fd);
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    DDP_FATAL("checkpoint: cannot rename '" << from << "' to '" << to << "': " << std::strerror(errno));
  fsync_path(dir, true);
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
  void put(const std::vector<float>& v) {
    put(std::uint64_t(v.size()));
    const char* p = reinterpret_cast<const char*>(v.data());
    buf.insert(buf.end(), p, p + v.size() * sizeof(float));
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
  void get(std::vector<float>& v) {
    std::uint64_t n;
    get(n);
    v.resize(n);
    // An empty vector's data() may be null, and memcpy from or to null is undefined
    // even for 0 bytes (a model without buffers sends none).
    if (n != 0) std::memcpy(v.data(), buf.data() + at, n * sizeof(float));
    at += n * sizeof(float);
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

}  // namespace

std::string checkpoint_dir(const std::string& run_dir) { return run_dir + "/checkpoints"; }

std::string checkpoint_name(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt_%09lld.h5", (long long)step);
  return buf;
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model, Optimizer& optimizer,
                            const TrainingState& state, const Config& cfg) {
  const std::string dir = checkpoint_dir(run_dir);
  const std::string problem = make_directories(dir);
  if (!problem.empty()) DDP_FATAL("checkpoint: " << problem);
  const std::string name = checkpoint_name(state.step);
  const std::string path = dir + "/" + name;
  const std::string tmp = path + ".tmp." + std::to_string(getpid());

  // Everything the file holds, by path; the checksum covers it in path order.
  Blobs blobs;
  const std::vector<float> params = to_host(model.parameters());
  const std::vector<float> buffers = to_host(model.buffers());
  auto add_table = [&](const std::vector<Model::ParamEntry>& table, const std::vector<float>& flat) {
    for (const auto& e : table)
      blobs["/model/" + e.name] = make_blob(Blob::F32, std::vector<hsize_t>(e.shape.begin(), e.shape.end()),
                                            flat.data() + e.offset, std::size_t(e.size));
  };
  add_table(model.parameter_table(), params);
  add_table(model.buffer_table(), buffers);
  for (auto& [sname, view] : optimizer.state()) {
    const std::vector<float> v = to_host(view);
    blobs["/optimizer/" + sname] = make_blob(Blob::F32, {hsize_t(v.size())}, v.data(), v.size());
  }
  blobs["/optimizer/steps"] = scalar(std::int64_t(optimizer.steps()));
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

  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    const hid_t file = H5_CHECK(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    for (const char* g : {"/model", "/optimizer", "/state"})
      H5Gclose(H5_CHECK(H5Gcreate2(file, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
    for (const auto& [p, b] : blobs) write_blob(file, p, b);
    const hid_t opt = H5_CHECK(H5Gopen2(file, "/optimizer", H5P_DEFAULT));
    write_string_attr(opt, "name", optimizer.name());
    H5Gclose(opt);
    write_string_attr(file, "format", kFormat);
    write_int_attr(file, "format_version", kFormatVersion);
    write_int_attr(file, "world_size", state.world_size);
    write_string_attr(file, "config", cfg.to_namelist());
    write_string_attr(file, "source_path", cfg.source_path);
    write_string_attr(file, "source_text", cfg.source_text);
    write_string_attr(file, "checksum", checksum_text(fnv1a64(blobs)));
    H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL));
    H5_CHECK(H5Fclose(file));
  }
  fsync_path(tmp, false);
  if (const char* delay = std::getenv("DDP_TEST_CHECKPOINT_DELAY_MS"))  // test hook, see the header
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(delay)));
  rename_durably(tmp, path, dir);

  // The pointer, the same way: a reader sees the old name or the new one, never a torn one.
  const std::string latest_tmp = dir + "/latest.tmp." + std::to_string(getpid());
  {
    std::ofstream out(latest_tmp, std::ios::trunc);
    out << name << "\n";
    if (!out.flush()) DDP_FATAL("checkpoint: cannot write '" << latest_tmp << "'");
  }
  fsync_path(latest_tmp, false);
  rename_durably(latest_tmp, dir + "/latest", dir);

  // Keep the newest `keep`; temp files of killed writers go too.
  std::vector<std::string> ckpts;
  for (const std::string& n : list_dir(dir)) {
    if (is_checkpoint_name(n))
      ckpts.push_back(n);
    else if (n.find(".tmp.") != std::string::npos)
      std::remove((dir + "/" + n).c_str());
  }
  for (std::size_t i = 0; i + std::size_t(keep) < ckpts.size(); ++i)
    if (ckpts[i] != name) std::remove((dir + "/" + ckpts[i]).c_str());
  return path;
}

Checkpoint load_checkpoint(const std::string& path, const Model& model, const std::string& optimizer) {
  Reader r;
  std::string format, checksum;
  std::int64_t version = 0;
  Checkpoint ck;
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
      ck.config = read_string_attr(r.file, "config");
      if (H5Lvisit(r.file, H5_INDEX_NAME, H5_ITER_INC, Reader::visit, &r) < 0)
        throw CheckpointError(r.error.empty() ? "cannot read its contents" : r.error);
      if (H5Lexists(r.file, "/optimizer", H5P_DEFAULT) > 0) {
        const hid_t g = H5Gopen2(r.file, "/optimizer", H5P_DEFAULT);
        ck.optimizer = read_string_attr(g, "name");
        H5Gclose(g);
      }
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
  const std::string actual = checksum_text(fnv1a64(r.blobs));
  if (actual != checksum)
    throw CheckpointError("checksum mismatch: stored " + checksum + ", computed " + actual);

  ck.path = path;
  TrainingState& s = ck.state;
  s.epoch = need_int(r.blobs, "/state/epoch");
  s.step = need_int(r.blobs, "/state/step");
  s.consumed = need_int(r.blobs, "/state/consumed");
  s.seed = need_int(r.blobs, "/state/seed");
  s.lr_step = need_int(r.blobs, "/state/lr_step");
  s.dropout_position = need_int(r.blobs, "/state/dropout_position");
  s.world_size = need_int(r.blobs, "/state/world_size");
  s.epoch_loss_sum = need_real(r.blobs, "/state/epoch_loss_sum");
  s.epoch_samples = need_real(r.blobs, "/state/epoch_samples");
  // Written since train.precision exists; older checkpoints are fp32 runs.
  if (r.blobs.count("/state/loss_scale")) {
    s.loss_scale = need_real(r.blobs, "/state/loss_scale");
    s.loss_scale_clean_steps = need_int(r.blobs, "/state/loss_scale_clean_steps");
  }
  ck.optimizer_steps = need_int(r.blobs, "/optimizer/steps");

  ck.parameters.resize(std::size_t(model.num_parameters()));
  unpack_table(r.blobs, model.parameter_table(), ck.parameters, path);
  ck.buffers.resize(model.buffers().extent(0));
  unpack_table(r.blobs, model.buffer_table(), ck.buffers, path);

  if (!optimizer.empty()) {
    if (ck.optimizer != optimizer)
      throw InputError("checkpoint " + path + " was written with optimizer " + ck.optimizer +
                       ", this run uses " + optimizer + " (train.optimizer)");
    for (const auto& [p, b] : r.blobs) {
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

std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only) {
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
      if (!found && !cfg.io.init_from.empty()) {
        try {
          ck = load_checkpoint(cfg.io.init_from, model, "");
          found = 2;
        } catch (const CheckpointError& e) {
          throw InputError("io.init_from: checkpoint " + cfg.io.init_from + " is unusable: " + e.what());
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
