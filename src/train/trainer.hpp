#pragma once
// The data-parallel training loop: DistributedSampler order, forward, backward,
// gradient all-reduce across ranks, optimizer step, validation, metrics.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/shares.hpp"
#include "io/batch_loader.hpp"
#include "io/checkpoint.hpp"
#include "io/metrics.hpp"
#include "io/shard_dataset.hpp"
#include "io/tensorboard_writer.hpp"
#include "model/loss.hpp"
#include "model/model.hpp"
#include "train/augment.hpp"
#include "train/checkpointing.hpp"
#include "train/config.hpp"
#include "train/input_stage.hpp"
#include "train/loss_scaler.hpp"
#include "train/optimizer.hpp"
#include "train/progress.hpp"
#include "train/step_graph.hpp"

namespace ddp {

struct EpochStats {
  std::int64_t epoch = 0;      // 1-based
  std::int64_t step = 0;       // optimizer steps taken so far
  double train_loss = 0.0;     // mean over every sample trained this epoch, all ranks
  double samples_per_s = 0.0;  // training samples of all ranks per second of training
  double train_seconds = 0.0;
  // Rank 0's split of train_seconds (the rest: batch copies, logging, checkpoints).
  double data_wait_seconds = 0.0;  // blocked on the loader
  double forward_seconds = 0.0;    // model forward and loss
  double backward_seconds = 0.0;   // loss gradient and model backward (with bucket starts)
  double comm_seconds = 0.0;       // gradient all-reduce not hidden behind backward
  double optimizer_seconds = 0.0;  // gradient scaling and the optimizer step
  double lr = 0.0;                 // learning rate of the epoch's last step
  double loss_scale = 0.0;         // fp16: the loss scale at the epoch's end; 0: none
  // Steps skipped this epoch for a non-finite loss or gradient (fp16's overflows, or
  // train.nonfinite = 'skip'); their samples count in samples/s, not in train_loss.
  std::int64_t skipped_steps = 0;
  bool complete = true;  // false: stopped mid-epoch (preemption)
  // train.clip_grad_norm > 0: the total gradient norm before clipping, summed over the
  // epoch's steps taken (by this process: after a resume, those since), and the steps
  // whose norm was clipped.
  double grad_norm_sum = 0.0;
  std::int64_t grad_norm_steps = 0;
  std::int64_t clipped_steps = 0;
  double grad_norm() const { return grad_norm_steps > 0 ? grad_norm_sum / double(grad_norm_steps) : 0.0; }
};

struct ValStats {
  double loss = 0.0;       // mean per-sample loss
  double accuracy = 0.0;   // classification only
  std::int64_t count = 0;  // samples evaluated: every sample exactly once
  double loss_sum = 0.0;
  std::int64_t correct = 0;
  // Top-5 accuracy (the label among the 5 highest logits): classification with more
  // than 5 classes only (`top5`), where it is not 1 by construction.
  bool top5 = false;
  double accuracy5 = 0.0;
  std::int64_t correct5 = 0;
  // Language models (token shards): the targets evaluated, count * seq_len; correct and
  // correct5 count tokens and the accuracies are over tokens. 0 otherwise.
  std::int64_t tokens = 0;
  double perplexity() const;  // exp(loss): the mean loss is per token
};

// The validation's fields of a metrics record (val_loss ... val_count; `classify`:
// the accuracies), and of a line: "  val_loss 0.3647  val_acc 0.8656  val_acc5 0.9968".
void append_validation(MetricRecord& r, const ValStats& v, bool classify);
std::string validation_text(const ValStats& v, bool classify);

// Bytes a rank holds for training, by kind (each rank the same under plain data
// parallelism): the flat parameter and gradient buffers, the optimizer's state
// buffers, and the activations Model::activation_floats plans for one batch.
struct MemoryPlan {
  std::int64_t parameters = 0, gradients = 0, optimizer_state = 0, activations = 0;
  // Not in the total: rank 0's checkpoint file, made in host memory while it writes
  // one (the parameters, the buffers and the whole optimizer state, under ZeRO too).
  std::int64_t checkpoint = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state + activations; }
  // "parameters 1.02 MB (1069140 B), gradients ..., in all ...": rank 0's start-up line.
  std::string text(std::int64_t batch) const;
  // "rank 0 makes each checkpoint file in host memory ...": the line after it.
  std::string checkpoint_text() const;
};

class Trainer {
 public:
  // What the trainer is made for. Evaluation (ddp_train --evaluate) holds what
  // validate() needs alone: no optimizer, gradient buckets or graphs, and no lines.
  enum class Use { training, evaluation };
  // `prefetch_batches` > 0 reads ahead on a thread (streamed data, large preloaded batches).
  Trainer(const Config& cfg, Communicator& comm, Model& model, LossKind loss, ShardDataset& train,
          ShardDataset* val, int prefetch_batches, Use use = Use::training);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Continue from a checkpoint: its weights, and unless `weights_only` (init_from)
  // its optimizer state and training position. Same on every rank, but `ck` may hold
  // only this rank's share of the optimizer state (optimizer_shares).
  void restore(const Checkpoint& ck, bool weights_only);
  // The checkpoint's parameters and batch-norm buffers into the model (restore's first
  // part; what --evaluate measures).
  void load_weights(const Checkpoint& ck);
  // Under ZeRO (comm.zero >= 1) the W + 1 bounds of the ranks' shares of the optimizer
  // state, else null: what find_start_checkpoint needs to send each rank its share only.
  const std::vector<std::int64_t>* optimizer_shares() const {
    return shares_.bounds.empty() ? nullptr : &shares_.bounds;
  }

  // The remaining epochs of cfg.train, from where restore() left off: one line per
  // epoch on rank 0, one metrics record, checkpoints at the io.checkpoint_* cadence
  // and at the end. Returns the process exit status: 0, or kExitRequeue (75) after
  // a preemption signal made every rank stop at a step boundary and rank 0 write a
  // checkpoint. A checkpoint that cannot be written (disk full) ends every rank with
  // one line `error: cannot write checkpoint ...` and exit status 1 (fatal_all).
  // `tb` (may be null): TensorBoard scalars at every progress line and epoch end.
  int fit(MetricsWriter* metrics, TensorBoardWriter* tb = nullptr);

  // One whole epoch (0-based), no checkpoints: the unit the equivalence tests use.
  EpochStats train_epoch(std::int64_t epoch);
  ValStats validate(ShardDataset& data);

  // From the model and the configuration: what the optimizer will hold is known
  // before it holds it.
  MemoryPlan memory_plan() const;
  std::int64_t step() const { return step_; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  const TrainingState& position() const { return pos_; }

 private:
  // Flags agreed on by all ranks at a step boundary (one small all-reduce).
  struct Agreed {
    bool preempt = false;    // some rank got SIGUSR1/SIGTERM
    bool time_due = false;   // rank 0's clock: checkpoint_every_minutes elapsed
    bool step_due = false;   // checkpoint_every_steps divides the step count (same on every rank)
    bool nonfinite = false;  // some rank's loss or the reduced gradients hold an inf or NaN
    bool stepped = true;     // the optimizer step was taken (not skipped)
    bool stop = false;       // non-finite and not to be skipped: the run ends (stop_nonfinite)
    // Rank 0's checkpoint on its thread (io.checkpoint_async): its write has ended, or failed.
    BackgroundCheckpoint::State written = BackgroundCheckpoint::none_ended;
  };
  Agreed poll();
  // The constructor's steps: the optimizer (its share under ZeRO) and fp16's loss
  // scaler; the gradient buckets (comm.overlap) and their line on rank 0.
  void make_optimizer_and_scaler();
  void make_reducer();
  // The gradient buckets over the parameter table (comm.bucket_mb, first_bucket_mb).
  std::vector<Bucket> bucket_plan() const;
  // Collective. Ends the run in one line where a node's room (comm/memory_room.hpp)
  // cannot hold what its ranks are still to take (CPU build; the CUDA build's are on
  // the device).
  void check_memory_room(const MemoryPlan& plan) const;
  // fit() but for the ending of a failed checkpoint: checkpoint() throws
  // CheckpointWriteError on every rank when rank 0 could not write (its text on rank 0).
  int fit_epochs(MetricsWriter* metrics);
  // The epoch's scalars (val_ null: no validation) by global step, then flushed.
  void write_tensorboard(const EpochStats& e, std::int64_t steps, const ValStats& v, bool classify);
  // Trains epoch pos_.epoch from position pos_.consumed. With `checkpoints`, writes
  // them mid-epoch at the step/time cadence and stops at a preemption (complete =
  // false); `pending` then holds the flags of the epoch's last step.
  EpochStats run_epoch(bool checkpoints, Agreed* pending);
  // What run_epoch's steps share of the epoch in progress.
  struct EpochRun {
    std::int64_t epoch = 0;      // 0-based
    std::int64_t start = 0;      // positions of the global order done when it began (a resume)
    std::int64_t batches = 0;    // this rank's
    double prior_loss = 0.0;     // the epoch's loss sum of the run resumed from (rank 0; else 0)
    double prior_samples = 0.0;  // and its samples
    double t0 = 0.0;             // its start
    double mark = 0.0;           // the last progress line (or the start): its samples/s
    std::int64_t mark_consumed = 0;
    // Samples trained (samples/s), and those of the steps taken (the loss's mean), of
    // the progress line's window and of the step's micro-batches so far.
    std::int64_t samples = 0, loss_samples = 0, window_samples = 0, group_samples = 0;
    int micro = 0;           // micro-batches of the step so far
    bool stopped = false;    // a preemption's checkpoint is written
    bool nonfinite = false;  // stop_nonfinite() once the loader is stopped
    std::string problem;     // a collective error found mid-epoch, reported once the loader is stopped
    // Micro-batches this process trained, and graphs_' counts when the epoch began.
    std::int64_t micro_batches = 0, graph_replays = 0, graph_captures = 0;
  };
  EpochRun begin_epoch();
  // Forward, loss and backward of one micro-batch (the stage's slot `slot`); with
  // `last_micro` backward starts the gradient buckets, and under a CUDA graph that
  // takes the collectives (graph_plan_.collectives) the gradients are reduced too;
  // adds to `stats`' times (a replay's launch counts as backward).
  void forward_backward(int slot, const Batch& batch, bool last_micro, EpochStats& stats);
  // After a step: its samples counted, gradients zeroed, the position advanced, the
  // comm.check_every comparison and the progress line. False: stop (r.problem).
  bool after_step(EpochRun& r, const Agreed& a);
  void progress_line(EpochRun& r);
  // The step/time/preemption checkpoint inside an epoch. True: stop the epoch
  // (preempted, or r.problem).
  bool checkpoint_mid_epoch(EpochRun& r, const Agreed& a);
  // The loader stopped, non-finite or collective errors reported, the epoch's stats
  // summed over the ranks, the position moved to the next epoch when it completed.
  EpochStats end_epoch(EpochRun& r, std::unique_ptr<BatchLoader>& loader, EpochStats& stats);
  // fit()'s epoch line on rank 0 and metrics record.
  void log_epoch(const EpochStats& e, const ValStats& v, double val_seconds);
  void write_sample(std::int64_t epoch);  // io.sample_tokens
  void write_metrics(MetricsWriter& metrics, const EpochStats& e, const ValStats& v, double val_seconds);
  // io.keep_best, every rank alike: whether the epoch's validation `v` beats the best so
  // far; then pos_ records it, and the checkpoint made next holds it and becomes best.h5.
  bool record_best(const ValStats& v);
  // train.schedule = 'plateau', every rank alike: the epoch's validation `v` into
  // pos_.plateau_* (plateau_step); the line saying the rate was reduced, or "".
  std::string reduce_on_plateau(const ValStats& v);
  // Every rank calls it; rank 0 writes pos_ (`in_background`: starts its write on
  // background_'s thread), after finishing the one under way there.
  std::string checkpoint(bool in_background = false);
  // Rank 0: waits for the checkpoint under way on background_'s thread, if any, and
  // says when it is on disk. Its CheckpointWriteError's text, else "".
  std::string finish_background();
  // Every rank, at a step whose agreement says background_'s write has ended: rank 0
  // finishes it. False (and r.problem) when it failed.
  bool background_written(EpochRun& r, const Agreed& a);
  // The optimizer's whole state, on rank 0 (under ZeRO gathered from the shares;
  // collective); the other ranks' snapshot has no state.
  OptimizerSnapshot optimizer_snapshot();
  // Collective: why the state must not be saved ("" when it may): a streamed data
  // file written over in place (data_changed), parameters that differ between ranks,
  // or are not finite.
  std::string unsafe_to_save();
  // Collective, at each epoch's end and before each checkpoint, so that nothing
  // trained on it is logged or saved: a streamed data file written over in place
  // since the run opened it (ShardDataset::changed_in_place). Rank 0's line on rank
  // 0, a stand-in on the others (fatal_all prints rank 0's); "" on every rank when none.
  std::string data_changed();
  int stop();                                     // after a preemption's checkpoint: kExitRequeue
  void use_inputs(int slot, const Batch& batch);  // x_, labels_, targets_: the stage's slot
  // The all-reduce (or the wait for the buckets still in flight), the step's flags
  // (preemption, time, non-finite values) agreed in one all-reduce, the scaling and
  // the optimizer step, or its skip; adds to `stats`' comm and optimizer times.
  // Returns with `stop`, having changed nothing, when the run must end
  // (train.nonfinite = 'stop', or 'skip' with non-finite parameters).
  // `reduced`: forward_backward reduced the gradients already (in a CUDA graph).
  Agreed reduce_and_step(std::int64_t samples_per_rank, bool reduced, EpochStats& stats);
  // reduce_and_step's steps: the gradients summed over the ranks (or the buckets
  // waited for); the step's health and flags agreed on (`inv`: the gradients' scale
  // to their mean); the optimizer step (and ZeRO's all-gather) at `step_scale`.
  void reduce_gradients();
  Agreed agree_on_step(double inv);
  void take_step(double step_scale, EpochStats& stats);
  // Collective, after the epoch's loader is stopped: the one line that says which
  // step went non-finite and, where a batch is the cause, its shards and samples;
  // then every rank exits 1 without a checkpoint.
  [[noreturn]] void stop_nonfinite();
  // io.trace: rank 0 makes <run_dir>/trace, every rank opens its timeline there and
  // names the bucket rows by the layers they hold (collective).
  void open_trace();
  // The timeline at the start of optimizer step step_ + 1: recording on inside
  // io.trace_steps; the files written (and said where) once past it.
  void trace_step_start();
  void close_trace();  // at the run's end or stop: a window cut short is written too

  const Config& cfg_;
  Communicator& comm_;
  Model& model_;
  LossKind loss_kind_;
  // Labels a sample holds: 1, or data.seq_len for token shards (a label per token).
  std::int64_t label_rows_ = 1;
  ShardDataset& train_;
  ShardDataset* val_;
  Tensor sample_x_;                 // (1, T): io.sample_tokens' input, kept for the run (sample_text.hpp)
  std::vector<std::string> vocab_;  // the validation shards' id -> bytes (rank 0, once read)
  bool vocab_read_ = false;
  int prefetch_;
  // The training batches' buffers, kept from one epoch to the next (BatchLoader's
  // reuse): an epoch's first batches are read into them, not into new ones.
  std::vector<Batch> batch_buffers_;
  // uint8 data: the images' conversion on the rank (data.augment, data.normalize),
  // before stage_, which sizes its slots from it; null for float32 data.
  std::unique_ptr<ImageTransform> transform_;
  std::unique_ptr<Optimizer> optimizer_;
  Shares shares_;  // comm.zero >= 1: the ranks' shares of the flat buffers (optimizer_ has this rank's)
  std::unique_ptr<BucketReducer> reducer_;  // null: one all-reduce after backward
  // Where the model's gradients live in the reducer's buffer (take_gradients), they go
  // back into the model's own before the reducer goes, also when the constructor
  // throws: declared after reducer_, so destroyed before it.
  struct PlacedGradients {
    Model* model = nullptr;
    ~PlacedGradients() {
      if (model) model->place_gradients(nullptr);
    }
  } placed_gradients_;
  std::unique_ptr<LossScaler> scaler_;  // fp16 only
  std::int64_t step_ = 0;
  std::int64_t steps_per_epoch_ = 0;
  std::int64_t epoch_positions_ = 0;  // the sampler's global order per epoch (padded)
  TrainingState pos_;                 // epoch, consumed, dropout position, partial loss sums
  std::uint64_t dropout_key_ = 0;     // this rank's dropout streams: reseeded per micro-batch
  double last_checkpoint_time_ = 0.0;
  BackgroundCheckpoint background_;  // rank 0, io.checkpoint_async
  RunEta eta_;                       // progress lines' time left, from this process's measurements
  TensorBoardWriter* tb_ = nullptr;  // set by fit(); null: no TensorBoard events
  // This rank's view of the step that went non-finite, for stop_nonfinite().
  std::vector<std::int64_t> step_indices_;  // the global samples of its micro-batches
  bool loss_nonfinite_ = false;             // its loss sum of the step
  std::int64_t grads_nonfinite_ = 0;        // values in the reduced gradients (same on every rank)
  std::int64_t params_nonfinite_ = 0;       // values in the parameters ('skip': skipping cannot help)
  // train.clip_grad_norm: the last step's total norm of the averaged gradients, before
  // clipping (the same on every rank), and whether it was inf or NaN.
  double grad_norm_ = 0.0;
  bool norm_nonfinite_ = false;
  // (epoch, since the last progress line, this step) sums of the per-sample loss, in
  // double on the device; a step's sum joins the others when the step is taken.
  Kokkos::View<double[3]> loss_acc_;
  // count_step_nonfinite's, where the host reads it without a copy: pinned host memory
  // on a GPU, which its kernel writes as it ends (a deep_copy fences the whole device,
  // the next batch's copy included).
#if defined(KOKKOS_ENABLE_CUDA)
  using NonfiniteSpace = Kokkos::CudaHostPinnedSpace;
#else
  using NonfiniteSpace = Kokkos::HostSpace;
#endif
  Kokkos::View<std::int64_t, NonfiniteSpace> step_nonfinite_{"Trainer::step_nonfinite"};
  Kokkos::View<double*> clip_sums_;  // grad_block_sums' scratch, kept from step to step

  InputStage stage_;  // batches to the compute space, one on its way while a step runs
  Tensor x_;          // (B, sample...) the step's slot of stage_
  LabelView labels_;  // (B label_rows_)
  View1 targets_;     // (B * target_numel)
  View1 loss_;        // (B) per-sample loss
  View1 correct_;     // (B) 1 where argmax == label
  View1 hits5_;       // (B) validation: 1 where the label is among the 5 highest logits
  View1 loss_rows_;   // (row_scratch_floats) where label_rows_ > 1: the tokens' values before their means
  Tensor dout_;       // (B, out...)

  // train.cuda_graph, as it can be in this run, and the step's graphs.
  StepGraphPlan graph_plan_;
  StepGraphs graphs_;
  // io.trace: the current step's start (ns on the timeline); -1 when not recording.
  std::int64_t trace_step_begin_ = -1;
};

}  // namespace ddp
