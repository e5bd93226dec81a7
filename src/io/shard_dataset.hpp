#pragma once
// A data set made of HDF5 shard files, read in parallel through the MPI-IO driver.
//
// Shard format: /x (N, ...) float32 or uint8 (uint8 is read as x/255); uint8 images
// (N, C, H, W) or (N, H, W, C) (shard_check.hpp: the layout attribute and its guess);
// /y (N) integer class labels or (N, ...) float32 targets; root attributes
// format = "ddp_train.shard", version = 1 (written by tools/, not required here).
// Samples are numbered globally: shard 0's first, then shard 1's, ...
//
// Token shards (language models): /tokens (N) integer token ids (uint16 where the
// vocabulary fits, else int32 or uint32) and the root attribute vocab_size, no /x or
// /y. With seq_len = T a shard of N tokens holds (N - 1) / T samples (windows), window
// w the tokens [w T, w T + T]: x the first T as floats (exact: vocab_size <= 2^24), its
// T labels the next T. A window never crosses a shard's end; the tokens past a
// shard's last whole window are not read. Sample shape and target shape are (T).

#include <hdf5.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/node_shared.hpp"

namespace ddp {

// HDF5 is built without thread safety here: every HDF5 call made while another
// thread may be in HDF5 (a prefetch thread) holds this one process-wide lock.
std::mutex& hdf5_mutex();

// What a data set looked like when it was opened. A checkpoint keeps its training
// set's, so that a resume can tell whether it continues on the same samples: the
// sampler position it resumes at means nothing on other ones.
struct DataFingerprint {
  std::vector<std::string> files;     // as expanded from the patterns, in sample order
  std::vector<std::int64_t> counts;   // samples per file: the first dim of /x and /y
  std::vector<std::uint64_t> hashes;  // per file: FNV-1a of 16 sampled rows of /x and /y
  std::vector<std::int64_t> x_shape;  // /x dims after the first, e.g. (1,28,28)
  std::vector<std::int64_t> y_shape;  // /y dims after the first; () for labels

  std::int64_t samples() const;
};

class ShardDataset {
 public:
  // Collective over comm. Rank 0 expands the patterns and checks every file; any
  // problem makes every rank throw InputError with the same one-line message
  // naming the file. `what` ("data.train_files") prefixes messages about patterns.
  // seq_len > 0: the files must be token shards, read as windows of seq_len; 0: the
  // files must hold /x and /y (data.seq_len).
  ShardDataset(MPI_Comm comm, const std::vector<std::string>& patterns, const std::string& what,
               std::int64_t seq_len = 0);
  // Collective: closes the files. Before MPI_Finalize, after every BatchLoader on it.
  ~ShardDataset();
  ShardDataset(const ShardDataset&) = delete;
  ShardDataset& operator=(const ShardDataset&) = delete;

  std::int64_t size() const { return total_; }  // samples over all shards
  // Per-sample shape of /x, e.g. (1, 28, 28); images as (C, H, W) whatever their layout.
  const std::vector<std::int64_t>& sample_shape() const { return sample_shape_; }
  // As stored: (H, W, C) for NHWC images, else sample_shape().
  const std::vector<std::int64_t>& stored_shape() const { return stored_shape_; }
  std::int64_t sample_numel() const { return sample_numel_; }
  bool x_is_uint8() const { return x_uint8_; }
  bool nhwc() const { return nhwc_; }                        // images stored (N, H, W, C)
  std::int64_t class_names() const { return class_names_; }  // entries of class_names; 0: none
  bool has_class_labels() const { return labels_; }          // /y integer, or token shards
  bool tokens() const { return tokens_; }                     // token shards: windows of seq_len
  std::int64_t vocab_size() const { return vocab_size_; }     // token shards' attribute; 0 otherwise
  // Per-sample shape of float targets (y's dims after the first); {} for labels, (T)
  // for token shards, whose T labels a sample (the labels of read() are n T then).
  const std::vector<std::int64_t>& target_shape() const { return target_shape_; }
  std::int64_t target_numel() const { return target_numel_; }  // 1 for labels; T for tokens
  const std::vector<std::string>& files() const { return files_; }
  const std::string& what() const { return what_; }
  // As opened, the same on every rank.
  const DataFingerprint& fingerprint() const { return fingerprint_; }

  // Collective: every label in [0, n_classes), else every rank throws InputError
  // naming the file, the sample and the value. InputError also for float targets.
  // Token shards: every token (so every input and target), and vocab_size, below
  // n_classes; `model` names what sets it ("the model's output of 512 classes").
  void check_labels(std::int64_t n_classes, const std::string& model = "");

  std::size_t bytes() const;  // /x and /y as stored on disk

  // In memory, preloaded: /x as stored (uint8 stays uint8), int32 labels or float32
  // targets, each part at a 64-byte boundary.
  std::size_t preload_bytes() const;

  // Collective: reads everything into memory; read() then touches no file. Rank 0
  // reads the files; the others get it by broadcast. Into `node` at `offset` where
  // given (preload_bytes() from there, comm/node_shared.hpp: one copy a node, filled
  // by the node's first rank, the set broadcast among those ranks only), else into
  // memory of this rank's own.
  void preload(std::shared_ptr<NodeShared> node = nullptr, std::size_t offset = 0);
  bool preloaded() const { return preloaded_; }

  // Not collective, thread-safe. Samples by global index, any order, repeats allowed:
  // x: (n, stored...) floats (uint8 as x/255, in the stored layout); labels: (n) or
  // targets: (n, target...) floats, nullptr for what is not wanted. Throws
  // std::out_of_range on a bad index.
  void read(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* labels, float* targets);
  // The same with x's rows as stored, byte for byte: (n, stored...) uint8 or float32.
  // uint8 images go to the compute space like this (train/augment.hpp converts them).
  void read_stored(const std::int64_t* idx, std::int64_t n, void* x, std::int32_t* labels, float* targets);

  // Where global sample `index` is stored: its shard file and its row there.
  std::pair<std::string, std::int64_t> locate(std::int64_t index) const;

  // Rank 0 of the data set's ranks (the others: ""): the first of its files written
  // over in place since they were opened, as one line naming it, its size and
  // modification time then and now; "" when none. A file rewritten in place (cp over
  // it, a script that opens it for writing, a truncation) hands the batches read from
  // it since other samples, or zeros past its new end (HDF5 reads past a file's end as
  // zeros), and nothing says so. A file replaced by a rename, or removed, is not one:
  // the open files still read what was opened. One stat(2) a file.
  std::string changed_in_place() const;
  // Token shards: the first file's vocabulary, id to bytes (tools/token_shards.py's
  // /vocab_bytes and /vocab_offsets), or empty where it has none. Reads the file: for
  // the rank that prints.
  std::vector<std::string> vocabulary() const;

 private:
  // What stat(2) says of a file.
  struct FileStamp {
    std::uint64_t device = 0, inode = 0;
    std::int64_t bytes = -1;  // -1: not known
    std::int64_t mtime_ns = 0;
  };
  static FileStamp stamp_of(const std::string& path);

  struct Shard {
    std::string path;
    std::int64_t offset = 0;  // global index of its first sample
    std::int64_t count = 0;
    hid_t file = -1, x = -1, y = -1;  // token shards: x is /tokens, y -1
    std::int64_t tokens = 0;          // token shards: tokens in the file
    std::int64_t token_base = 0;      // token shards: its first token's place in the preloaded tokens
    FileStamp opened;  // once opened, rank 0 only (changed_in_place)
  };

  void open_all();
  void read_rows(const std::int64_t* idx, std::int64_t n, void* x, bool to_float, std::int32_t* labels,
                 float* targets);
  void preload_tokens(std::shared_ptr<NodeShared> node, std::size_t offset);
  void read_windows(const std::int64_t* idx, std::int64_t n, float* x, std::int32_t* labels);

  MPI_Comm comm_ = MPI_COMM_NULL;  // private duplicate: HDF5's MPI-IO traffic stays apart
  std::string what_;
  std::vector<std::string> files_;
  std::vector<Shard> shards_;
  std::int64_t total_ = 0;
  std::vector<std::int64_t> sample_shape_, stored_shape_, target_shape_;
  std::int64_t sample_numel_ = 1, target_numel_ = 1;
  bool x_uint8_ = false;
  bool nhwc_ = false;
  std::int64_t class_names_ = 0;
  bool labels_ = false;
  bool tokens_ = false;
  std::int64_t seq_len_ = 0, vocab_size_ = 0, total_tokens_ = 0;
  std::size_t y_stored_bytes_ = 0;  // per element, as on disk
  DataFingerprint fingerprint_;

  bool preloaded_ = false;
  std::vector<std::uint8_t> own_;             // preload_bytes(), unless held by the node
  std::shared_ptr<NodeShared> node_;          // the node's copy, unless held by this rank
  const std::uint8_t* x_mem_ = nullptr;       // (N, sample...) uint8 or float32 bytes; tokens: int32
  const std::int32_t* labels_mem_ = nullptr;  // (N)
  const float* targets_mem_ = nullptr;        // (N, target...)
};

}  // namespace ddp
