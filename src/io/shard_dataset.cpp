#include "io/shard_dataset.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "comm/backend.hpp"
#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/mpi_wait.hpp"
#include "comm/utc_text.hpp"
#include "comm/watchdog.hpp"
#include "io/shard_check.hpp"

namespace ddp {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

std::int64_t DataFingerprint::samples() const {
  std::int64_t n = 0;
  for (auto c : counts) n += c;
  return n;
}

namespace {

// Rank 0's string to every rank (a message or a packed layout); `what` names the
// collective to the watchdog (the other ranks wait in it while rank 0 reads).
std::string bcast_string(MPI_Comm comm, std::string s, const char* what) {
  const watchdog::Collective guard(what);
  long long n = static_cast<long long>(s.size());
  MPI_CHECK(bcast_waiting(&n, 1, MPI_LONG_LONG, 0, comm));  // while rank 0 reads
  s.resize(static_cast<std::size_t>(n));
  broadcast_bytes(comm, s.data(), s.size(), 0);
  return s;
}

// Every rank throws the same InputError when rank 0 sends a non-empty message.
void agree_or_throw(MPI_Comm comm, const std::string& msg_on_root) {
  const std::string msg = bcast_string(comm, msg_on_root, "the agreement on the data files (MPI_Bcast)");
  if (!msg.empty()) throw InputError(msg);
}

std::int64_t product(const std::vector<std::int64_t>& v) {
  std::int64_t p = 1;
  for (auto e : v) p *= e;
  return p;
}

// Reads rows given as sorted runs (start, length) of a dataset's first dimension
// into `buf`, row after row. Small rows: ONE H5Dread over the union of the runs.
// Rows of kRunReadBytes or more: one H5Dread per run, each a single block: HDF5
// turns a union of scattered blocks into an MPI datatype at a cost that grows with
// the bytes selected, which at 224x224x3 uint8 (147 KB rows, 256 random rows of 4
// shards per batch) capped a rank at ~500 MB/s against 2.2 GB/s for the same bytes
// in file order (perf: most of the time in libhdf5, none in the copy).
// Caller holds hdf5_mutex().
constexpr std::size_t kRunReadBytes = 64 * 1024;

void read_runs(hid_t dset, hid_t mem_type, const std::vector<std::pair<hsize_t, hsize_t>>& runs, void* buf) {
  if (runs.empty()) return;
  const hid_t fspace = H5_CHECK(H5Dget_space(dset));
  const int nd = H5_CHECK(H5Sget_simple_extent_ndims(fspace));
  std::vector<hsize_t> dims(nd), start(nd, 0), count(nd, 1), block(nd);
  H5_CHECK(H5Sget_simple_extent_dims(fspace, dims.data(), nullptr));
  block = dims;
  hsize_t row_elements = 1;
  for (int k = 1; k < nd; ++k) row_elements *= dims[k];
  const std::size_t row_bytes = std::size_t(row_elements) * H5Tget_size(mem_type);
  // Independent transfer: each rank reads its own batch, no rank waits for another.
  const hid_t dxpl = H5_CHECK(H5Pcreate(H5P_DATASET_XFER));
  H5_CHECK(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT));
  const auto read = [&](hsize_t rows, void* to) {
    std::vector<hsize_t> mdims = dims;
    mdims[0] = rows;
    const hid_t mspace = H5_CHECK(H5Screate_simple(nd, mdims.data(), nullptr));
    H5_CHECK(H5Dread(dset, mem_type, mspace, fspace, dxpl, to));
    H5_CHECK(H5Sclose(mspace));
  };
  if (row_bytes >= kRunReadBytes && runs.size() > 1) {
    auto* at = static_cast<unsigned char*>(buf);
    for (const auto& [first, length] : runs) {
      start[0] = first;
      block[0] = length;
      H5_CHECK(
          H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start.data(), nullptr, count.data(), block.data()));
      read(length, at);
      at += std::size_t(length) * row_bytes;
    }
  } else {
    hsize_t rows = 0;
    for (std::size_t i = 0; i < runs.size(); ++i) {
      start[0] = runs[i].first;
      block[0] = runs[i].second;
      rows += runs[i].second;
      H5_CHECK(H5Sselect_hyperslab(fspace, i == 0 ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                                   count.data(), block.data()));
    }
    read(rows, buf);
  }
  H5_CHECK(H5Pclose(dxpl));
  H5_CHECK(H5Sclose(fspace));
}

// Sorted unique rows -> maximal runs of consecutive rows.
std::vector<std::pair<hsize_t, hsize_t>> to_runs(const std::int64_t* rows, std::size_t n, std::int64_t base) {
  std::vector<std::pair<hsize_t, hsize_t>> runs;
  for (std::size_t i = 0; i < n; ++i) {
    const auto r = static_cast<hsize_t>(rows[i] - base);
    if (!runs.empty() && runs.back().first + runs.back().second == r)
      ++runs.back().second;
    else
      runs.emplace_back(r, 1);
  }
  return runs;
}

// Tokens [first, first + n) of a 1-D /tokens into `to` as `T` (int32 or int64).
// Caller holds hdf5_mutex().
template <typename T>
void read_token_run(hid_t dset, std::int64_t first, std::int64_t n, T* to) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "int32 or int64 tokens");
  read_runs(dset, sizeof(T) == 4 ? H5T_NATIVE_INT32 : H5T_NATIVE_INT64, {{hsize_t(first), hsize_t(n)}}, to);
}

}  // namespace

// stat(2) of `path`; bytes -1 when it fails.
ShardDataset::FileStamp ShardDataset::stamp_of(const std::string& path) {
  FileStamp f;
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return f;
  f.device = std::uint64_t(st.st_dev);
  f.inode = std::uint64_t(st.st_ino);
  f.bytes = std::int64_t(st.st_size);
  f.mtime_ns = std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return f;
}

ShardDataset::ShardDataset(MPI_Comm comm, const std::vector<std::string>& patterns, const std::string& what,
                           std::int64_t seq_len)
    : what_(what) {
  // Our messages are the one-line user errors; HDF5's own stack dumps would bury them.
  // H5_CHECK still reads the error stack.
  {
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  std::string error, packed;
  if (rank == 0) {
    const watchdog::During reading(Phase::data);
    inject_fault(FaultSite::shard_layout, 0);
    try {
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      packed = shard::pack(shard::inspect(patterns, what));
    } catch (const InputError& e) {
      error = e.what();
    }
  }
  agree_or_throw(comm, error);  // before the dup: nothing to free on the way out
  shard::Layout l =
      shard::unpack(bcast_string(comm, packed, "the broadcast of the data files' layout (MPI_Bcast)"));

  // Every rank holds the same layout now: a problem with it throws the same error on each.
  if (l.tokens && seq_len <= 0)
    throw InputError(what_ + ": " + l.files[0] +
                     " holds token ids (/tokens): set data.seq_len, the tokens a sample holds");
  if (!l.tokens && seq_len > 0)
    throw InputError("data.seq_len = " + std::to_string(seq_len) + " needs token shards (/tokens), but " +
                     l.files[0] + " (" + what_ + ") holds samples (/x, /y)");
  if (l.tokens) {
    tokens_ = true;
    seq_len_ = seq_len;
    vocab_size_ = l.vocab_size;
    l.sample_shape = l.target_shape = {seq_len};
    for (std::size_t i = 0; i < l.files.size(); ++i) {
      if (l.counts[i] < seq_len + 1)
        throw InputError(l.files[i] + ": " + std::to_string(l.counts[i]) +
                         " tokens, fewer than one sample's window of data.seq_len + 1 = " +
                         std::to_string(seq_len + 1) + " (inputs and their next-token targets)");
      total_tokens_ += l.counts[i];
    }
  }
  files_ = l.files;
  sample_shape_ = l.sample_shape;
  nhwc_ = l.nhwc;
  class_names_ = l.class_names;
  stored_shape_ =
      nhwc_ ? std::vector<std::int64_t>{sample_shape_[1], sample_shape_[2], sample_shape_[0]} : sample_shape_;
  target_shape_ = l.target_shape;
  sample_numel_ = product(sample_shape_);
  target_numel_ = product(target_shape_);
  x_uint8_ = l.x_uint8;
  labels_ = l.labels;
  y_stored_bytes_ = static_cast<std::size_t>(l.y_bytes);
  fingerprint_ = {l.files, l.counts, l.hashes, l.sample_shape, l.target_shape};
  std::int64_t token_base = 0;
  for (std::size_t i = 0; i < files_.size(); ++i) {
    Shard s;
    s.path = files_[i];
    s.offset = total_;
    s.count = l.counts[i];
    if (tokens_) {
      s.tokens = l.counts[i];
      s.token_base = token_base;
      token_base += s.tokens;
      s.count = (s.tokens - 1) / seq_len_;
      fingerprint_.counts[i] = s.count;
    }
    total_ += s.count;
    shards_.push_back(s);
  }
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  open_all();
  if (rank == 0)
    for (auto& shard : shards_) shard.opened = stamp_of(shard.path);
}

std::vector<std::string> ShardDataset::vocabulary() const {
  if (!tokens_ || files_.empty()) return {};
  std::lock_guard<std::mutex> lock(hdf5_mutex());  // a loader's thread may be in HDF5
  return shard::vocabulary(files_.front());
}

std::string ShardDataset::changed_in_place() const {
  std::string first;
  int more = 0;
  for (const auto& shard : shards_) {
    if (shard.opened.bytes < 0) continue;  // not rank 0, or not known
    const FileStamp now = stamp_of(shard.path);
    // Gone, or another file by now (a rename over it): what is open stays what was read.
    if (now.bytes < 0 || now.device != shard.opened.device || now.inode != shard.opened.inode) continue;
    if (now.bytes == shard.opened.bytes && now.mtime_ns == shard.opened.mtime_ns) continue;
    if (!first.empty()) {
      ++more;
      continue;
    }
    first = what_ + ": " + shard.path + " was written over in place while this run read it (" +
            std::to_string(shard.opened.bytes) + " bytes, modified " +
            utc_text(std::time_t(shard.opened.mtime_ns / 1000000000)) + " when opened; now " +
            std::to_string(now.bytes) + " bytes, modified " +
            utc_text(std::time_t(now.mtime_ns / 1000000000)) + ")";
  }
  if (first.empty()) return "";
  if (more > 0) first += " and " + std::to_string(more) + " more of its files";
  return first +
         ": the batches read from it since may hold other samples, or zeros past its new end, so nothing "
         "trained on them is kept (no epoch line, no checkpoint: the last one stays latest); put the file "
         "back and resume, or start a new run (io.resume = 'never'). To change data under a running job, "
         "write new files and rename them over the old ones: the job reads on what it opened";
}

// Opening and closing a file through MPI-IO are collective (MPI_File_open and
// MPI_File_close wait for every rank): a rank whose file system stops answering there
// leaves the others waiting inside HDF5, so the watchdog guards both.
void ShardDataset::open_all() {
  const watchdog::Collective opening("the opening of the data files (HDF5 through MPI-IO)",
                                     watchdog::Through::file_system);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  inject_fault(FaultSite::shard_open, 0);
  for (auto& s : shards_) {
    const hid_t fapl = H5_CHECK(H5Pcreate(H5P_FILE_ACCESS));
    H5_CHECK(H5Pset_fapl_mpio(fapl, comm_, MPI_INFO_NULL));
    s.file = H5_CHECK(H5Fopen(s.path.c_str(), H5F_ACC_RDONLY, fapl));
    H5_CHECK(H5Pclose(fapl));
    if (tokens_) {
      s.x = H5_CHECK(H5Dopen2(s.file, "/tokens", H5P_DEFAULT));
      continue;
    }
    s.x = H5_CHECK(H5Dopen2(s.file, "/x", H5P_DEFAULT));
    s.y = H5_CHECK(H5Dopen2(s.file, "/y", H5P_DEFAULT));
  }
}

ShardDataset::~ShardDataset() {
  {
    const watchdog::Collective closing("the closing of the data files (HDF5 through MPI-IO)",
                                       watchdog::Through::file_system);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    inject_fault(FaultSite::shard_close, 0);
    for (auto& s : shards_) {
      H5_CHECK(H5Dclose(s.x));
      if (s.y >= 0) H5_CHECK(H5Dclose(s.y));
      H5_CHECK(H5Fclose(s.file));
    }
  }
  MPI_Comm_free(&comm_);
}

std::size_t ShardDataset::bytes() const {
  if (tokens_) return std::size_t(total_tokens_) * y_stored_bytes_;
  const auto n = static_cast<std::size_t>(total_);
  return n * static_cast<std::size_t>(sample_numel_) * (x_uint8_ ? 1 : 4) +
         n * static_cast<std::size_t>(target_numel_) * y_stored_bytes_;
}

void ShardDataset::check_labels(std::int64_t n_classes, const std::string& model) {
  if (!labels_) throw InputError(what_ + ": /y holds float32 targets, not integer class labels");
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  std::string error;
  const std::string of_model =
      model.empty() ? "the model's " + std::to_string(n_classes) + " classes" : model;
  if (tokens_ && vocab_size_ > n_classes)
    throw InputError(files_[0] + ": attribute vocab_size = " + std::to_string(vocab_size_) +
                     " (token ids up to " + std::to_string(vocab_size_ - 1) + ") but " + of_model +
                     " takes ids below " + std::to_string(n_classes) +
                     ": the model's vocabulary must hold the shards'");
  if (rank == 0 && tokens_) {
    const watchdog::During reading(Phase::data);
    constexpr std::int64_t piece = 1 << 20;
    std::vector<std::int64_t> t;
    for (const auto& s : shards_) {
      // The tokens a window reads: those past the last whole window never reach the model.
      const std::int64_t used = s.count * seq_len_ + 1;
      for (std::int64_t start = 0; start < used && error.empty(); start += piece) {
        const std::int64_t m = std::min(piece, used - start);
        t.resize(static_cast<std::size_t>(m));
        {
          std::lock_guard<std::mutex> lock(hdf5_mutex());
          read_token_run(s.x, start, m, t.data());
        }
        watchdog::progress();
        for (std::int64_t i = 0; i < m; ++i)
          if (t[i] < 0 || t[i] >= n_classes) {
            error = s.path + ": token /tokens[" + std::to_string(start + i) + "] = " + std::to_string(t[i]) +
                    " is outside [0, " + std::to_string(n_classes) + "): " + of_model + " has no such token";
            break;
          }
      }
      if (!error.empty()) break;
    }
  } else if (rank == 0) {
    const watchdog::During reading(Phase::data);
    // In pieces, so a huge shard's labels need not fit in memory at once.
    constexpr std::int64_t piece = 1 << 20;
    std::vector<std::int64_t> y;
    for (const auto& s : shards_) {
      for (std::int64_t start = 0; start < s.count && error.empty(); start += piece) {
        const std::int64_t m = std::min(piece, s.count - start);
        y.resize(static_cast<std::size_t>(m));
        {
          std::lock_guard<std::mutex> lock(hdf5_mutex());
          read_runs(s.y, H5T_NATIVE_INT64, {{hsize_t(start), hsize_t(m)}}, y.data());
        }
        watchdog::progress();
        for (std::int64_t i = 0; i < m; ++i)
          if (y[i] < 0 || y[i] >= n_classes) {
            error = s.path + ": label /y[" + std::to_string(start + i) + "] = " + std::to_string(y[i]) +
                    " is outside [0, " + std::to_string(n_classes) + ") for a model with " +
                    std::to_string(n_classes) + " classes";
            break;
          }
      }
      if (!error.empty()) break;
    }
  }
  agree_or_throw(comm_, error);
}

namespace {
std::size_t line_up(std::size_t b) { return (b + 63) / 64 * 64; }
}  // namespace

std::size_t ShardDataset::preload_bytes() const {
  if (tokens_) return line_up(std::size_t(total_tokens_) * sizeof(std::int32_t));
  const auto n = static_cast<std::size_t>(total_);
  const std::size_t x = n * static_cast<std::size_t>(sample_numel_) * (x_uint8_ ? 1 : 4);
  const std::size_t y = labels_ ? n * sizeof(std::int32_t) : n * static_cast<std::size_t>(target_numel_) * 4;
  return line_up(x) + line_up(y);
}

void ShardDataset::preload(std::shared_ptr<NodeShared> node, std::size_t offset) {
  if (preloaded_) return;
  if (tokens_) {
    preload_tokens(std::move(node), offset);
    return;
  }
  const auto n = static_cast<std::size_t>(total_);
  const std::size_t row = static_cast<std::size_t>(sample_numel_) * (x_uint8_ ? 1 : 4);
  if (!node) own_.resize(preload_bytes());
  std::uint8_t* x = node ? node->data() + offset : own_.data();
  std::uint8_t* y = x + line_up(n * row);
  auto* labels = reinterpret_cast<std::int32_t*>(y);
  auto* targets = reinterpret_cast<float*>(y);
  const std::size_t y_bytes = labels_ ? n * sizeof(std::int32_t) : n * std::size_t(target_numel_) * 4;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  // One reader and a broadcast: W ranks reading the same bytes would hit the file
  // system W times.
  if (rank == 0) {
    const watchdog::During reading(Phase::data);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    // In pieces of about 64 MiB, each one progress for the ranks waiting for it.
    const std::int64_t piece = std::max<std::int64_t>(1, (std::int64_t(64) << 20) / std::int64_t(row));
    for (const auto& s : shards_)
      for (std::int64_t start = 0; start < s.count; start += piece) {  // none for an empty shard
        const std::int64_t m = std::min(piece, s.count - start);
        const std::vector<std::pair<hsize_t, hsize_t>> rows{{hsize_t(start), hsize_t(m)}};
        const auto o = static_cast<std::size_t>(s.offset + start);
        read_runs(s.x, x_uint8_ ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, rows, x + o * row);
        if (labels_)
          read_runs(s.y, H5T_NATIVE_INT32, rows, labels + o);
        else
          read_runs(s.y, H5T_NATIVE_FLOAT, rows, targets + o * std::size_t(target_numel_));
        watchdog::progress();
      }
  }
  {
    const watchdog::Collective guard("the broadcast of the preloaded data (MPI_Bcast)");
    // Held by the node: the nodes' first ranks alone take it, and the others on a node
    // read what their first rank put there once it has (the barrier).
    const MPI_Comm to = node ? node->firsts() : comm_;
    if (to != MPI_COMM_NULL) {
      broadcast_bytes(to, x, n * row, 0);
      broadcast_bytes(to, y, y_bytes, 0);
    }
    if (node) MPI_CHECK(MPI_Barrier(node->node()));
  }
  node_ = std::move(node);
  x_mem_ = x;
  labels_mem_ = labels_ ? labels : nullptr;
  targets_mem_ = labels_ ? nullptr : targets;
  preloaded_ = true;
}

// Every shard's tokens as int32, one after the other (Shard::token_base).
void ShardDataset::preload_tokens(std::shared_ptr<NodeShared> node, std::size_t offset) {
  if (!node) own_.resize(preload_bytes());
  std::uint8_t* mem = node ? node->data() + offset : own_.data();
  auto* tokens = reinterpret_cast<std::int32_t*>(mem);
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm_, &rank));
  if (rank == 0) {
    const watchdog::During reading(Phase::data);
    std::lock_guard<std::mutex> lock(hdf5_mutex());
    constexpr std::int64_t piece = std::int64_t(16) << 20;  // 64 MiB of int32
    for (const auto& s : shards_)
      for (std::int64_t start = 0; start < s.tokens; start += piece) {
        read_token_run(s.x, start, std::min(piece, s.tokens - start), tokens + s.token_base + start);
        watchdog::progress();
      }
  }
  {
    const watchdog::Collective guard("the broadcast of the preloaded data (MPI_Bcast)");
    const MPI_Comm to = node ? node->firsts() : comm_;
    if (to != MPI_COMM_NULL) broadcast_bytes(to, mem, std::size_t(total_tokens_) * sizeof(std::int32_t), 0);
    if (node) MPI_CHECK(MPI_Barrier(node->node()));
  }
  node_ = std::move(node);
  x_mem_ = mem;
  preloaded_ = true;
}

void ShardDataset::read_windows(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* labels) {
  const std::int64_t T = seq_len_;
  std::vector<std::int32_t> run(std::size_t(T + 1));
  const auto* mem = reinterpret_cast<const std::int32_t*>(x_mem_);
  std::size_t shard = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t g = idx[i];
    if (g < shards_[shard].offset) shard = 0;
    while (g >= shards_[shard].offset + shards_[shard].count) ++shard;
    const Shard& s = shards_[shard];
    const std::int64_t first = (g - s.offset) * T;
    const std::int32_t* t = nullptr;
    if (preloaded_) {
      t = mem + s.token_base + first;
    } else {
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      read_token_run(s.x, first, T + 1, run.data());
      t = run.data();
    }
    if (x)
      for (std::int64_t k = 0; k < T; ++k) x[i * T + k] = static_cast<float>(t[k]);
    if (labels) std::memcpy(labels + i * T, t + 1, std::size_t(T) * sizeof(std::int32_t));
  }
}

void ShardDataset::read(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* labels,
                        float* targets) {
  read_rows(idx, n, x, true, labels, targets);
}

void ShardDataset::read_stored(const std::int64_t* idx, std::int64_t n, void* x, std::int32_t* labels,
                               float* targets) {
  read_rows(idx, n, x, false, labels, targets);
}

void ShardDataset::read_rows(const std::int64_t* idx, std::int64_t n, void* x, bool to_float,
                             std::int32_t* labels, float* targets) {
  for (std::int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || idx[i] >= total_)
      throw std::out_of_range(what_ + ": sample index " + std::to_string(idx[i]) + " is outside [0, " +
                              std::to_string(total_) + ")");
  if (tokens_) {  // floats either way: token ids are stored as no model input is
    (void)to_float;
    (void)targets;
    read_windows(idx, n, static_cast<float*>(x), labels);
    return;
  }
  const std::size_t numel = static_cast<std::size_t>(sample_numel_);
  const std::size_t tnumel = static_cast<std::size_t>(target_numel_);
  const std::size_t xrow = numel * (x_uint8_ ? 1 : 4);

  const std::uint8_t* xsrc = x_mem_;
  const std::int32_t* lsrc = labels_mem_;
  const float* tsrc = targets_mem_;
  if (preloaded_ && x) {
    // The rows are scattered over a set larger than the cache, and the copy below
    // walks them one after the other: asked for all at once, their misses overlap
    // (MLP on Zen 4: 35 -> 20-28 us per batch of 64).
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint8_t* row = xsrc + static_cast<std::size_t>(idx[i]) * xrow;
      for (std::size_t at = 0; at < xrow; at += 64) __builtin_prefetch(row + at);
      if (labels && labels_) __builtin_prefetch(lsrc + idx[i]);
    }
  }
  // Streaming: the rows in file order, each once; request i's row in the staging
  // buffers is its rank among them.
  std::vector<std::int64_t> rows;
  if (!preloaded_) {
    rows.assign(idx, idx + n);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  }
  // Streamed large rows as stored: each read straight into its place in x, in file
  // order, with no staging buffer to allocate, fill and copy (38 MB per batch of 256
  // at 224x224x3: 510 -> 960 MB/s on one rank with the per-run reads of read_runs).
  const bool direct = !preloaded_ && x && xrow >= kRunReadBytes && !(x_uint8_ && to_float);
  if (direct) {
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) order[std::size_t(i)] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return idx[a] < idx[b]; });
    auto* out = static_cast<std::uint8_t*>(x);
    std::size_t shard = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::int64_t i = order[k], g = idx[i];
      if (k > 0 && idx[order[k - 1]] == g) {  // a repeat (the sampler's padding): read once
        std::memcpy(out + std::size_t(i) * xrow, out + std::size_t(order[k - 1]) * xrow, xrow);
        continue;
      }
      while (g >= shards_[shard].offset + shards_[shard].count) ++shard;
      const Shard& sh = shards_[shard];
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      read_runs(sh.x, x_uint8_ ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, {{hsize_t(g - sh.offset), 1}},
                out + std::size_t(i) * xrow);
    }
  }
  std::vector<std::uint8_t> xbuf;  // (rows, sample...) as stored
  std::vector<std::int32_t> lbuf;  // (rows)
  std::vector<float> tbuf;         // (rows, target...)
  if (!preloaded_) {
    if (x && !direct) xbuf.resize(rows.size() * xrow);
    if (labels_)
      lbuf.resize(rows.size());
    else
      tbuf.resize(rows.size() * tnumel);
    std::size_t begin = 0;
    for (const auto& s : shards_) {
      std::size_t end = begin;
      while (end < rows.size() && rows[end] < s.offset + s.count) ++end;
      if (end == begin) continue;
      const auto runs = to_runs(rows.data() + begin, end - begin, s.offset);
      std::lock_guard<std::mutex> lock(hdf5_mutex());
      if (x && !direct)
        read_runs(s.x, x_uint8_ ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, runs, xbuf.data() + begin * xrow);
      if (labels && labels_) read_runs(s.y, H5T_NATIVE_INT32, runs, lbuf.data() + begin);
      if (targets && !labels_) read_runs(s.y, H5T_NATIVE_FLOAT, runs, tbuf.data() + begin * tnumel);
      begin = end;
    }
    xsrc = xbuf.data();
    lsrc = lbuf.data();
    tsrc = tbuf.data();
  }

  for (std::int64_t i = 0; i < n; ++i) {
    // In memory a request's row is its global index; staged, its rank among `rows`.
    const auto r = static_cast<std::size_t>(
        preloaded_ ? idx[i] : std::lower_bound(rows.begin(), rows.end(), idx[i]) - rows.begin());
    if (x && x_uint8_ && to_float) {
      float* dst = static_cast<float*>(x) + static_cast<std::size_t>(i) * numel;
      const std::uint8_t* src = xsrc + r * xrow;
      // A division, not * (1/255): the same floats as torchvision's ToTensor.
      for (std::size_t k = 0; k < numel; ++k) dst[k] = src[k] / 255.0f;
    } else if (x && !direct) {
      std::memcpy(static_cast<std::uint8_t*>(x) + static_cast<std::size_t>(i) * xrow, xsrc + r * xrow, xrow);
    }
    if (labels && labels_) labels[i] = lsrc[r];
    if (targets && !labels_)
      std::memcpy(targets + static_cast<std::size_t>(i) * tnumel, tsrc + r * tnumel, tnumel * sizeof(float));
  }
}

std::pair<std::string, std::int64_t> ShardDataset::locate(std::int64_t index) const {
  for (const Shard& s : shards_)
    if (index >= s.offset && index < s.offset + s.count) return {s.path, index - s.offset};
  throw std::out_of_range(what_ + ": sample index " + std::to_string(index) + " is outside [0, " +
                          std::to_string(total_) + ")");
}

}  // namespace ddp
