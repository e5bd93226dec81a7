#pragma once
// Rank 0 writes TensorBoard scalars to <run_dir>/tb/events.out.tfevents.<unix time>.<host>
// (`tensorboard --logdir runs/`): TFRecord-framed Event messages (io/tfrecord.hpp,
// io/tensorboard/events.hpp). A resumed run starts a new file beside the old ones;
// TensorBoard merges the files of a directory. Each file says at which step its run
// starts, so TensorBoard drops what the files before it hold of later steps: the
// steps a run before this one trained and this one trains again (metrics.hpp).
//
// Scalars are buffered in memory and written at flush(): the trainer flushes at its
// progress lines and epoch ends, never inside a step. A failure to create or write
// the file is one warning, after which nothing more is written: a metrics file must
// not end a training run.

#include <cstdint>
#include <cstdio>
#include <string>

#ifndef DDP_WITH_TENSORBOARD
#define DDP_WITH_TENSORBOARD 0
#endif

namespace ddp {

// Whether this build writes TensorBoard events (it was configured with protobuf).
constexpr bool kTensorBoardBuilt = DDP_WITH_TENSORBOARD != 0;

class TensorBoardWriter {
 public:
  // Only the rank that passes enabled=true writes; `run_dir` must exist.
  // `start_step`: the optimizer step this run starts from (0 for a new run).
  TensorBoardWriter(const std::string& run_dir, bool enabled, std::int64_t start_step = 0);
  ~TensorBoardWriter();  // flushes
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void scalar(const std::string& tag, std::int64_t step, double value);  // buffered
  void flush();
  bool active() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

 private:
  void fail(const std::string& what);  // the one warning; stops writing

  std::string path_;
  std::FILE* file_ = nullptr;
  std::string pending_;  // framed records not yet written
};

}  // namespace ddp
