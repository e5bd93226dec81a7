// io.init_from (io/checkpoint.hpp): the weights of a checkpoint of ours, or of a
// weights-only file, /model/<name> written from a PyTorch state_dict with h5py.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "io/checkpoint_format.hpp"

namespace ddp {

namespace {

using ckpt::shape_text;

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
      ok = ckpt::read_in_pieces(d, H5T_NATIVE_FLOAT, sizeof(float), t.shape, t.values.data());
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

// "a, b, c and 2 more": at most `shown` of `items`, joined by `sep`.
std::string first_of(const std::vector<std::string>& items, std::size_t shown, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < std::min(items.size(), shown); ++i) out += (i ? sep : "") + items[i];
  if (items.size() > shown) out += std::string(sep) + "and " + std::to_string(items.size() - shown) + " more";
  return out;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// /model of `path`, every dataset, under hdf5_mutex().
WeightsFile read_weights(const std::string& path) {
  WeightsFile w;
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  ckpt::H5Quiet quiet;
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
  return w;
}

// The file's tensors matched to the model's tables by name: ours
// ("layers.<i>.<param>", also PyTorch's for a module whose nn.Sequential is
// `self.layers`) or a bare nn.Sequential's ("<i>.<param>", read as "layers.<i>...").
struct Matcher {
  const WeightsFile& w;
  std::map<std::string, std::string> file_name;  // our name -> the file's (ours wins over a bare one)
  std::vector<std::string> problems;             // a missing, misshapen or non-finite tensor each
  std::map<std::string, bool> used;              // the file's names taken

  static std::string ours(const std::string& name) {
    return !name.empty() && name[0] >= '0' && name[0] <= '9' ? "layers." + name : name;
  }
  explicit Matcher(const WeightsFile& weights) : w(weights) {
    for (const auto& [name, t] : w.tensors)
      if (!file_name.count(ours(name)) || ours(name) == name) file_name[ours(name)] = name;
  }
  bool unreadable(const std::string& our_name) const {
    return std::any_of(w.unreadable.begin(), w.unreadable.end(),
                       [&](const std::string& n) { return ours(n) == our_name; });
  }
  // The table's tensors into `out` (flat, the model's layout); num_batches_tracked
  // may be missing (it only counts batches): the model's own value stays.
  void fill(const std::vector<Model::ParamEntry>& table, std::vector<float>& out) {
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
  }
  // The file's tensors no table took: "name (shape)", or the name of one not a number.
  std::vector<std::string> extra() const {
    std::vector<std::string> out;
    for (const auto& [name, t] : w.tensors)
      if (!used.count(name)) out.push_back(name + " " + shape_text(t.shape));
    for (const auto& name : w.unreadable)
      if (!used.count(name)) out.push_back(name);
    return out;
  }
};

// A weights-only file into ck.parameters and ck.buffers. InputError naming each
// missing or misshapen tensor with both shapes; tensors the model has no place for
// are ignored with one warning.
void load_weights_file(const std::string& path, const Model& model, Checkpoint& ck) {
  const WeightsFile w = read_weights(path);
  Matcher m(w);
  ck.parameters.assign(std::size_t(model.num_parameters()), 0.0f);
  m.fill(model.parameter_table(), ck.parameters);
  ck.buffers = ckpt::to_host(model.buffers());  // what the file may leave out (num_batches_tracked)
  m.fill(model.buffer_table(), ck.buffers);
  if (!m.problems.empty()) {
    std::string hint;
    if (m.used.empty() && !w.tensors.empty())
      hint = " (the file's /model holds " + std::to_string(w.tensors.size()) + " tensors, e.g. '" +
             w.tensors.begin()->first + "': names must be layers.<i>.<param> or <i>.<param>)";
    throw InputError("io.init_from: " + path +
                     " does not fit the model (model.layers): " + first_of(m.problems, 4, "; ") + hint);
  }
  const std::vector<std::string> extra = m.extra();
  if (!extra.empty())
    log::warn("io.init_from: " + path + ": " + std::to_string(extra.size()) + " tensor" +
              (extra.size() == 1 ? "" : "s") +
              " the model has no place for, ignored: " + first_of(extra, 4, ", "));
}

}  // namespace

Checkpoint load_initial_weights(const std::string& path, const Model& model) {
  bool ours = false;
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    ckpt::H5Quiet quiet;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) throw CheckpointError(std::strerror(errno));
    if (H5Fis_hdf5(path.c_str()) <= 0) throw CheckpointError("not a readable HDF5 file (truncated?)");
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (file < 0) throw CheckpointError("HDF5 cannot open it (truncated?)");
    ours = ckpt::is_checkpoint_file(file);
    H5Fclose(file);
  }
  if (ours) return load_checkpoint(path, model, "");
  Checkpoint ck;
  ck.path = path;
  load_weights_file(path, model, ck);
  return ck;
}

}  // namespace ddp
