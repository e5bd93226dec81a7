#pragma once
// Inside the checkpoint layer (src/io/checkpoint_*.cpp), not for its users: the
// file's datasets as typed byte blobs and the checksum over them, the HDF5 helpers
// of writing and reading, a file read and verified, and what the sources of
// io/checkpoint.hpp share of each other's jobs.

#include <hdf5.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace ddp::ckpt {

constexpr const char* kFormat = "ddp_train.checkpoint";
constexpr std::int64_t kFormatVersion = 1;

// ---- the schema (checkpoint_format.cpp)

// One dataset of the file: its element type and shape, and its bytes.
struct Blob {
  enum Type { F32, I64, F64 } type = F32;
  std::vector<hsize_t> shape;  // {} for a scalar
  std::vector<unsigned char> bytes;
};
using Blobs = std::map<std::string, Blob>;  // by path, e.g. "/model/layers.1.weight"

// FNV-1a 64 over every blob's path (with its NUL), then its bytes, in path order.
std::uint64_t checksum_of(const Blobs& blobs);
std::string checksum_text(std::uint64_t h);  // "fnv1a64:<16 hex>"

hid_t native(Blob::Type t);
std::vector<float> to_host(View1 v);
std::string shape_text(const std::vector<hsize_t>& s);  // "(3,4)"

// Dataset `d` of `shape` whole into `out`, as `mem_type` of `elem_bytes` each, in
// blocks of rows of about kReadPieceBytes, each one progress for the ranks waiting
// for this read (rank 0 reads a checkpoint or weights at start-up). One H5Dread of a
// large dataset (a 2048x2048 layer is 16 MiB, a flat optimizer state hundreds) on a
// file system slow to read would say nothing for longer than comm.timeout_s
// (tests/checkpoint/slow_disk.py). False where HDF5 fails.
constexpr std::size_t kReadPieceBytes = std::size_t(4) << 20;
bool read_in_pieces(hid_t d, hid_t mem_type, std::size_t elem_bytes, const std::vector<hsize_t>& shape,
                    void* out);

// The checkpoint file made by HDF5 in memory (the core driver), open until destroyed.
// Its bytes are the driver's own buffer, not a copy (H5Fget_file_image's copy had
// put the file in memory twice): the superblock's first bytes as a closed file has
// them, then the rest straight from the buffer.
class FileImage {
 public:
  // `name` only tells HDF5's open files apart. The optimizer's state is released as
  // the file takes it.
  FileImage(const std::string& name, const Model& model, OptimizerSnapshot optimizer,
            const TrainingState& state, const RunInput& input, const DataFingerprint* data);
  ~FileImage();
  FileImage(const FileImage&) = delete;
  FileImage& operator=(const FileImage&) = delete;

  struct Piece {
    const char* data;
    std::size_t size;
  };
  std::vector<Piece> pieces() const;  // the file's bytes, in order
  std::size_t size() const { return size_; }

 private:
  hid_t file_ = -1;
  std::size_t size_ = 0;
  const char* mem_ = nullptr;  // the core driver's buffer
  std::vector<char> head_;     // its first bytes, the superblock's flags cleared
};

// ---- reading (checkpoint_read.cpp; any process, every problem a CheckpointError)

struct H5Quiet {  // no HDF5 error stack printed while we probe a possibly broken file
  H5E_auto2_t func = nullptr;
  void* data = nullptr;
  H5Quiet() {
    H5Eget_auto2(H5E_DEFAULT, &func, &data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5Quiet() { H5Eset_auto2(H5E_DEFAULT, func, data); }
};

std::string read_string_attr(hid_t file, const char* name);
// Ours ("format" = kFormat, fixed-length, as save_checkpoint writes it) or not.
bool is_checkpoint_file(hid_t file);
std::vector<std::int64_t> need_ints(const Blobs& b, const std::string& path);

// A checkpoint file read and checked: format, version, checksum, finite values
// (of the optimizer state too unless `weights_only`).
struct FileContents {
  Blobs blobs;
  std::string config;
  std::string optimizer;             // /optimizer's `name`; "" without /optimizer
  std::optional<std::string> files;  // /data/train's `files`, when recorded
};
FileContents read_verified(const std::string& path, bool weights_only);

// ---- the training data (checkpoint_data.cpp)

// /data/train as a DataFingerprint; none when the file has no record.
std::optional<DataFingerprint> read_fingerprint(const FileContents& c);
// Rank 0, a resume: the checkpoint's training data against this run's. InputError
// when the sample count changed (unless `allow_change`); warnings otherwise.
void check_training_data(const Checkpoint& ck, const DataFingerprint& now, bool allow_change);

// ---- the checkpoint directory (checkpoint_write.cpp)

std::vector<std::string> list_dir(const std::string& dir);  // sorted; empty when unreadable
bool is_checkpoint_name(const std::string& n);              // ckpt_<9 digits>.h5

}  // namespace ddp::ckpt
