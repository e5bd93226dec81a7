// Reading a checkpoint (io/checkpoint.hpp): the file's datasets and attributes,
// verified (format, version, checksum, finite values), and fitted to the model.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>

#include "comm/check.hpp"
#include "io/checkpoint_format.hpp"

namespace ddp {

namespace ckpt {
namespace {

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
    bool ok = type >= 0 && space >= 0 && blob_type(type, b.type);
    if (ok) ok = read_values(d, space, b);
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(d);
    if (!ok) return self->fail("cannot read dataset " + path);
    self->blobs[path] = std::move(b);
    return 0;
  }
  // float32, int64 or float64; false for any other type.
  static bool blob_type(hid_t type, Blob::Type& out) {
    const H5T_class_t cls = H5Tget_class(type);
    const std::size_t size = H5Tget_size(type);
    if (cls == H5T_FLOAT && size == 4)
      out = Blob::F32;
    else if (cls == H5T_FLOAT && size == 8)
      out = Blob::F64;
    else if (cls == H5T_INTEGER && size == 8)
      out = Blob::I64;
    else
      return false;
    return true;
  }
  static bool read_values(hid_t d, hid_t space, Blob& b) {
    const int rank = H5Sget_simple_extent_ndims(space);
    b.shape.resize(std::size_t(std::max(rank, 0)));
    if (rank > 0) H5Sget_simple_extent_dims(space, b.shape.data(), nullptr);
    std::size_t n = 1;
    for (auto e : b.shape) n *= e;
    b.bytes.resize(n * (b.type == Blob::F32 ? 4 : 8));
    return rank >= 0 &&
           read_in_pieces(d, native(b.type), b.type == Blob::F32 ? 4 : 8, b.shape, b.bytes.data());
  }
  int fail(const std::string& why) {
    error = why;
    return -1;
  }
};

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

// The table's entries out of the blobs into `out` (flat, the model's layout), each
// blob's values released once copied.
void unpack_table(Blobs& blobs, const std::vector<Model::ParamEntry>& table, std::vector<float>& out,
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
    std::vector<unsigned char>().swap(it->second.bytes);
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

// The file's attributes and datasets into `r` and `c`, under hdf5_mutex().
void read_file(const std::string& path, Reader& r, FileContents& c, std::string& format,
               std::int64_t& version, std::string& checksum) {
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

}  // namespace

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

bool is_checkpoint_file(hid_t file) {
  try {
    return read_string_attr(file, "format") == kFormat;
  } catch (const CheckpointError&) {
    return false;
  }
}

std::vector<std::int64_t> need_ints(const Blobs& b, const std::string& path) {
  const Blob& x = need(b, path, Blob::I64);
  std::vector<std::int64_t> v(x.bytes.size() / sizeof(std::int64_t));
  if (!v.empty()) std::memcpy(v.data(), x.bytes.data(), x.bytes.size());
  return v;
}

FileContents read_verified(const std::string& path, bool weights_only) {
  Reader r;
  FileContents c;
  std::string format, checksum;
  std::int64_t version = 0;
  read_file(path, r, c, format, version, checksum);
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

namespace {

TrainingState read_state(const Blobs& blobs) {
  TrainingState s;
  s.epoch = need_int(blobs, "/state/epoch");
  s.step = need_int(blobs, "/state/step");
  s.consumed = need_int(blobs, "/state/consumed");
  s.seed = need_int(blobs, "/state/seed");
  s.lr_step = need_int(blobs, "/state/lr_step");
  s.dropout_position = need_int(blobs, "/state/dropout_position");
  s.world_size = need_int(blobs, "/state/world_size");
  s.epoch_loss_sum = need_real(blobs, "/state/epoch_loss_sum");
  s.epoch_samples = need_real(blobs, "/state/epoch_samples");
  // Written since train.precision exists; older checkpoints are fp32 runs.
  if (blobs.count("/state/loss_scale")) {
    s.loss_scale = need_real(blobs, "/state/loss_scale");
    s.loss_scale_clean_steps = need_int(blobs, "/state/loss_scale_clean_steps");
  }
  // io.keep_best's record, where the run kept one: /state/best_<metric> and best_step.
  for (std::int64_t m = 1; best_metric_name(m)[0] != '\0'; ++m)
    if (blobs.count(std::string("/state/best_") + best_metric_name(m))) {
      s.best_metric = m;
      s.best_value = need_real(blobs, std::string("/state/best_") + best_metric_name(m));
      s.best_step = need_int(blobs, "/state/best_step");
      s.best_epoch = need_int(blobs, "/state/best_epoch");
      // Written since train.min_delta exists; before, patience counted from the best.
      const bool patience = blobs.count("/state/patience_epoch") > 0;
      s.patience_value = patience ? need_real(blobs, "/state/patience_value") : s.best_value;
      s.patience_epoch = patience ? need_int(blobs, "/state/patience_epoch") : s.best_epoch;
    }
  // train.schedule = 'plateau''s position, where the run had that schedule.
  if (blobs.count("/state/plateau_lr")) {
    s.plateau_lr = need_real(blobs, "/state/plateau_lr");
    s.plateau_best = need_real(blobs, "/state/plateau_best");
    s.plateau_epoch = need_int(blobs, "/state/plateau_epoch");
    s.plateau_bad_epochs = need_int(blobs, "/state/plateau_bad_epochs");
    s.plateau_cooldown = need_int(blobs, "/state/plateau_cooldown");
  }
  return s;
}

// /optimizer/<state name> into ck.optimizer_state, each (num_parameters); each blob's
// values released once copied.
void read_optimizer_state(Blobs& blobs, const Model& model, const std::string& path, Checkpoint& ck) {
  for (auto& [p, b] : blobs) {
    if (p.rfind("/optimizer/", 0) != 0 || p == "/optimizer/steps") continue;
    if (b.type != Blob::F32 || b.shape != std::vector<hsize_t>{hsize_t(model.num_parameters())})
      throw InputError("checkpoint " + path + " does not fit the model: " + p + " has shape " +
                       shape_text(b.shape));
    std::vector<float> v(std::size_t(model.num_parameters()));
    std::memcpy(v.data(), b.bytes.data(), b.bytes.size());
    std::vector<unsigned char>().swap(b.bytes);
    ck.optimizer_state.emplace_back(p.substr(std::strlen("/optimizer/")), std::move(v));
  }
}

}  // namespace
}  // namespace ckpt

Checkpoint load_checkpoint(const std::string& path, const Model& model, const std::string& optimizer) {
  using namespace ckpt;
  // The file's values are held once: each blob goes as it is copied into `ck`.
  FileContents c = read_verified(path, optimizer.empty());
  Checkpoint ck;
  ck.path = path;
  ck.config = c.config;
  ck.optimizer = c.optimizer;
  ck.data = read_fingerprint(c);
  ck.state = read_state(c.blobs);
  ck.optimizer_steps = need_int(c.blobs, "/optimizer/steps");

  ck.parameters.resize(std::size_t(model.num_parameters()));
  unpack_table(c.blobs, model.parameter_table(), ck.parameters, path);
  ck.buffers.resize(model.buffers().extent(0));
  unpack_table(c.blobs, model.buffer_table(), ck.buffers, path);

  if (!optimizer.empty()) {
    if (ck.optimizer != optimizer)
      throw InputError("checkpoint " + path + " was written with optimizer " + ck.optimizer +
                       ", this run uses " + optimizer + " (train.optimizer)");
    read_optimizer_state(c.blobs, model, path, ck);
  }
  return ck;
}

}  // namespace ddp
