// The checkpoint's schema (io/checkpoint.hpp): what goes where, as typed blobs, the
// checksum over them, and the file made from them in memory by HDF5.
#include "io/checkpoint_format.hpp"

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "comm/check.hpp"
#include "comm/watchdog.hpp"
#include "io/fnv1a.hpp"

namespace ddp::ckpt {

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

hid_t native(Blob::Type t) {
  return t == Blob::F32 ? H5T_NATIVE_FLOAT : t == Blob::I64 ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE;
}

std::vector<float> to_host(View1 v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

bool read_in_pieces(hid_t d, hid_t mem_type, std::size_t elem_bytes, const std::vector<hsize_t>& shape,
                    void* out) {
  std::size_t n = 1, row = 1;  // elements in all, and in one row (the first index fixed)
  for (std::size_t i = 0; i < shape.size(); ++i) {
    n *= shape[i];
    if (i > 0) row *= shape[i];
  }
  if (n == 0) return true;
  const hsize_t rows = shape.empty() ? 1 : shape[0];
  const hsize_t per_piece =
      std::max<hsize_t>(1, kReadPieceBytes / std::max<std::size_t>(1, row * elem_bytes));
  if (shape.empty() || per_piece >= rows) {
    const bool ok = H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) >= 0;
    watchdog::progress();
    return ok;
  }
  const hid_t file_space = H5Dget_space(d);
  bool ok = file_space >= 0;
  std::vector<hsize_t> start(shape.size(), 0), count = shape;
  for (hsize_t r = 0; ok && r < rows; r += per_piece) {
    start[0] = r;
    count[0] = std::min(per_piece, rows - r);
    const hsize_t elems = count[0] * row;
    const hid_t mem_space = H5Screate_simple(1, &elems, nullptr);
    ok = mem_space >= 0 &&
         H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) >= 0 &&
         H5Dread(d, mem_type, mem_space, file_space, H5P_DEFAULT,
                 static_cast<unsigned char*>(out) + r * row * elem_bytes) >= 0;
    if (mem_space >= 0) H5Sclose(mem_space);
    watchdog::progress();
  }
  if (file_space >= 0) H5Sclose(file_space);
  return ok;
}

std::string shape_text(const std::vector<hsize_t>& s) {
  std::string t = "(";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? "," : "") + std::to_string(s[i]);
  return t + ")";
}

namespace {

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

void add_state(Blobs& blobs, const TrainingState& state) {
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
  if (state.best_metric != 0 && state.best_step >= 0) {  // io.keep_best, once a validation has run
    blobs[std::string("/state/best_") + best_metric_name(state.best_metric)] = scalar(state.best_value);
    blobs["/state/best_step"] = scalar(state.best_step);
    blobs["/state/best_epoch"] = scalar(state.best_epoch);
    blobs["/state/patience_value"] = scalar(state.patience_value);
    blobs["/state/patience_epoch"] = scalar(state.patience_epoch);
  }
  if (state.plateau_lr > 0) {  // train.schedule = 'plateau'
    blobs["/state/plateau_lr"] = scalar(state.plateau_lr);
    blobs["/state/plateau_best"] = scalar(state.plateau_best);
    blobs["/state/plateau_epoch"] = scalar(state.plateau_epoch);
    blobs["/state/plateau_bad_epochs"] = scalar(state.plateau_bad_epochs);
    blobs["/state/plateau_cooldown"] = scalar(state.plateau_cooldown);
  }
}

void add_fingerprint(Blobs& blobs, const DataFingerprint& data) {
  auto ints = [](const std::vector<std::int64_t>& v) {
    return make_blob(Blob::I64, {hsize_t(v.size())}, v.data(), v.size());
  };
  blobs["/data/train/counts"] = ints(data.counts);
  blobs["/data/train/hashes"] = ints(std::vector<std::int64_t>(data.hashes.begin(), data.hashes.end()));
  blobs["/data/train/x_shape"] = ints(data.x_shape);
  blobs["/data/train/y_shape"] = ints(data.y_shape);
  blobs["/data/train/samples"] = scalar(data.samples());
}

// Everything a checkpoint holds, by path; the checksum covers it in path order.
// The optimizer's state vectors are released as their blobs are made.
Blobs collect_blobs(const Model& model, OptimizerSnapshot& optimizer, const TrainingState& state,
                    const DataFingerprint* data) {
  Blobs blobs;
  auto add_table = [&](const std::vector<Model::ParamEntry>& table, const std::vector<float>& flat) {
    for (const auto& e : table)
      blobs["/model/" + e.name] = make_blob(Blob::F32, std::vector<hsize_t>(e.shape.begin(), e.shape.end()),
                                            flat.data() + e.offset, std::size_t(e.size));
  };
  add_table(model.parameter_table(), to_host(model.parameters()));
  add_table(model.buffer_table(), to_host(model.buffers()));
  for (auto& [sname, v] : optimizer.state) {
    if (std::int64_t(v.size()) != model.num_parameters())
      DDP_FATAL("checkpoint: /optimizer/" << sname << " of " << v.size() << " values for "
                                          << model.num_parameters() << " parameters");
    blobs["/optimizer/" + sname] = make_blob(Blob::F32, {hsize_t(v.size())}, v.data(), v.size());
    std::vector<float>().swap(v);
  }
  blobs["/optimizer/steps"] = scalar(std::int64_t(optimizer.steps));
  add_state(blobs, state);
  if (data) add_fingerprint(blobs, *data);
  return blobs;
}

// The attributes: /optimizer's name, /data/train's files, and those of /.
void write_attributes(hid_t file, const OptimizerSnapshot& optimizer, const TrainingState& state,
                      const RunInput& input, const DataFingerprint* data, const std::string& checksum) {
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
  write_string_attr(file, "config", input.config);
  write_string_attr(file, "source_path", input.source_path);
  write_string_attr(file, "source_text", input.source_text);
  write_string_attr(file, "checksum", checksum);
}

}  // namespace

FileImage::FileImage(const std::string& name, const Model& model, OptimizerSnapshot optimizer,
                     const TrainingState& state, const RunInput& input, const DataFingerprint* data) {
  Blobs blobs = collect_blobs(model, optimizer, state, data);
  const std::string checksum = checksum_text(checksum_of(blobs));
  std::size_t payload = 0;
  for (const auto& [p, b] : blobs) payload += b.bytes.size();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  const hid_t fapl = H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
  // The driver grows its buffer in steps of the increment and writes zeros over each
  // step at once: a step of the whole payload made the file's memory resident beside
  // every blob not yet written (twice the file, for a moment). In steps of a
  // sixteenth, the file is resident as it is written, the blobs released as they go.
  const std::size_t step = std::max(payload / 16, std::size_t(16) << 20);
  H5_CHECK(H5Pset_fapl_core(fapl, step, /*backing_store=*/0));
  file_ = H5_CHECK(H5Fcreate(name.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl));
  H5Pclose(fapl);
  std::vector<const char*> groups = {"/model", "/optimizer", "/state"};
  if (data) groups.insert(groups.end(), {"/data", "/data/train"});
  for (const char* g : groups)
    H5Gclose(H5_CHECK(H5Gcreate2(file_, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT)));
  for (auto& [p, b] : blobs) {
    write_blob(file_, p, b);
    std::vector<unsigned char>().swap(b.bytes);  // the image has it now: one copy at a time
    watchdog::progress();                        // for the ranks waiting for this checkpoint
  }
  write_attributes(file_, optimizer, state, input, data, checksum);
  H5_CHECK(H5Fflush(file_, H5F_SCOPE_GLOBAL));
  size_ = std::size_t(H5_CHECK(H5Fget_file_image(file_, nullptr, 0)));  // the size alone: no copy
  void* handle = nullptr;  // the core driver's: the address of its buffer
  H5_CHECK(H5Fget_vfd_handle(file_, H5P_DEFAULT, &handle));
  mem_ = *static_cast<const char* const*>(handle);
  // While the file is open for writing, its superblock's status flags say so; a
  // closed file, and H5Fget_file_image's copy, have them cleared. They are bytes
  // 20-23 of a version 0 or 1 superblock (HDF5's default, which this file has),
  // byte 11 of a version 2 or 3.
  static const char signature[8] = {'\211', 'H', 'D', 'F', '\r', '\n', '\032', '\n'};
  DDP_REQUIRE(size_ >= 24 && std::equal(signature, signature + 8, mem_),
              "checkpoint " << name << ": no HDF5 superblock at the start of the file made in memory");
  const int version = mem_[8];
  DDP_REQUIRE(version >= 0 && version <= 3, "checkpoint " << name << ": superblock version " << version);
  head_.assign(mem_, mem_ + 24);
  if (version <= 1)
    std::fill(head_.begin() + 20, head_.begin() + 24, 0);
  else
    head_[11] = 0;
}

FileImage::~FileImage() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  H5Fclose(file_);
}

std::vector<FileImage::Piece> FileImage::pieces() const {
  return {{head_.data(), head_.size()}, {mem_ + head_.size(), size_ - head_.size()}};
}

}  // namespace ddp::ckpt
