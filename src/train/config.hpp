#pragma once
// The run's configuration: one typed struct with defaults, filled from a
// Fortran namelist file and `group.key=value` command-line overrides.
// Every key, its type, default and valid range is listed once, in the key
// table of config.cpp; this struct is what the rest of the code reads.

#include <cstdint>
#include <string>
#include <vector>

#include "io/tensorboard_writer.hpp"  // kTensorBoardBuilt: the default of io.tensorboard

namespace ddp {

struct DataConfig {
  std::vector<std::string> train_files;  // glob patterns, relative to the working directory
  std::vector<std::string> val_files;    // glob patterns; empty: no validation
  std::string mode = "auto";             // 'auto' | 'preload' | 'stream'
  double preload_budget_mb = 2048.0;     // 'auto' preloads the training and validation sets up to this size
  bool preload_shared = true;            // one preloaded copy per node in shared memory, not one per rank
  int prefetch_batches = 4;              // batches read ahead by a thread (see Data::prefetch_batches)
  bool shuffle = true;                   // DistributedSampler(shuffle=...)
  bool drop_last = false;                // DistributedSampler(drop_last=...)
  // uint8 images (train/augment.hpp): the side the model sees, 0: as stored; the
  // training transform ('flip', 'crop(pad=N)', 'random_resized_crop(scale=lo,hi)');
  // per channel means then standard deviations, empty: none.
  int image_size = 0;
  std::vector<std::string> augment;
  std::vector<double> normalize;
  // Token shards (/tokens): tokens per sample; sample i is the T + 1 tokens of a shard
  // from i T (inputs the first T, targets the next T). 0: the shards hold /x and /y.
  int seq_len = 0;
};

struct ModelConfig {
  std::vector<std::string> layers;  // e.g. 'linear(256)', 'relu', 'linear(10)'
  std::string loss = "auto";        // 'auto' (from the labels' type) | 'cross_entropy' | 'mse'
};

struct TrainConfig {
  int epochs = 1;
  int batch_size = 64;                    // per rank, per micro-step
  int accumulation_steps = 1;             // micro-steps per optimizer step
  std::string precision = "fp32";         // GEMM/convolution operands: 'fp32' | 'bf16' | 'fp16'
  bool tf32 = false;                      // GPU build: fp32 GEMMs/convolutions may use TF32 tensor cores
  double loss_scale = 65536.0;            // fp16: initial dynamic loss scale
  int loss_scale_growth_interval = 2000;  // fp16: clean steps before the scale doubles
  std::string optimizer = "sgd";          // 'sgd' | 'adamw'
  double lr = 0.01;
  double momentum = 0.0;                     // sgd
  bool nesterov = false;                     // sgd
  double weight_decay = 0.0;                 // sgd: L2 added to the gradient; adamw: decoupled
  bool decay_norm_and_bias = true;           // weight decay on 1-D parameters too (PyTorch's default)
  double label_smoothing = 0.0;              // cross_entropy, as torch.nn.CrossEntropyLoss(label_smoothing=)
  std::vector<double> betas = {0.9, 0.999};  // adamw
  double eps = 1e-8;                         // adamw
  std::string schedule = "constant";         // 'constant' | 'step' | 'multistep' | 'cosine' | 'plateau'
  int warmup_steps = 0;                      // linear warm-up from 0 (any schedule)
  int step_epochs = 30;                      // step: multiply lr by gamma every step_epochs epochs
  std::vector<std::int64_t> milestones;      // multistep: multiply lr by gamma at each of these epochs
  double gamma = 0.1;                        // step, multistep
  double min_lr = 0.0;                       // cosine: final learning rate; plateau: the floor
  // plateau: as torch.optim.lr_scheduler.ReduceLROnPlateau, after each validation
  std::string plateau_metric = "val_loss";   // 'val_loss' (lower is better) | 'val_acc' | 'val_acc5'
  int plateau_patience = 10;                 // epochs without a better metric before lr *= gamma
  double plateau_threshold = 1e-4;           // better: by more than this fraction of the best
  int plateau_cooldown = 0;                  // epochs after a reduction in which none count
  std::int64_t seed = 0;                     // initialisation, sampler permutation, dropout
  int log_every = 100;                       // optimizer steps between progress lines; 0: none
  std::string nonfinite = "stop";            // non-finite loss or gradient: 'stop' the run | 'skip' the step
  double clip_grad_norm = 0.0;               // max total 2-norm of the gradients, as clip_grad_norm_; 0: off
  int patience = 0;  // epochs without a better io.keep_best metric that end the run; 0: off
  double min_delta = 0.0;  // patience: the least change of the metric that counts as better
  // The step's GPU work (forward, loss, backward, NCCL buckets) as a CUDA graph, captured
  // once per batch shape and replayed: 'off' | 'auto' (where it can) | 'on' (an error where it cannot).
  std::string cuda_graph = "off";
};

struct IoConfig {
  std::string run_dir = "runs/default";  // metrics.jsonl and checkpoints/ go here
  int checkpoint_every = 1;              // epochs between checkpoints; 0: none by epoch
  int checkpoint_every_steps = 0;        // optimizer steps between checkpoints; 0: none by step
  double checkpoint_every_minutes = 0;   // minutes between checkpoints; 0: none by time
  int keep_checkpoints = 3;              // the newest this many stay in <run_dir>/checkpoints
  // The validation metric whose best epoch's checkpoint stays as checkpoints/best.h5:
  // 'none' | 'val_loss' (lowest) | 'val_acc' | 'val_acc5' (highest).
  std::string keep_best = "none";
  bool checkpoint_async = false;         // rank 0 puts checkpoints on disk on a thread while training goes on
  std::string resume = "auto";           // 'auto' (run_dir's latest valid) | 'never' | a checkpoint path
  std::string init_from;                 // a checkpoint whose weights start a new run; '': none
  bool allow_data_change = false;        // resume on training data of another sample count (warning)
  bool trace_samples = false;            // debug: <run_dir>/samples_rank<r>_epoch<e>.txt
  std::int64_t sample_tokens = 0;        // a language model writes this many tokens at each validation
  double sample_temperature = 1.0;       // their softmax temperature; 0: the most likely token
  bool tensorboard = kTensorBoardBuilt;  // <run_dir>/tb/events.out.tfevents.*; F without protobuf
  bool trace = false;                    // Chrome-trace timeline: <run_dir>/trace/rank<r>.json
  // The optimizer steps the timeline covers, first and last (1-based, as the progress lines).
  std::vector<std::int64_t> trace_steps = {20, 30};
};

struct CommConfig {
  std::string backend = "auto";  // 'auto' | 'mpi' | 'nccl' (NCCL needs the GPU build)
  std::string overlap = "poll";  // gradient all-reduce during backward: 'poll' | 'thread' | 'none'
  bool shared_memory = true;     // gradient sums in a shared window when every rank is on one node (host)
  int zero = 0;                  // ZeRO stage: 0 DDP; 1 sharded optimizer state; 2 and sharded gradient sums
  double bucket_mb = 25.0;       // gradient bucket size, as DDP's bucket_cap_mb
  double first_bucket_mb = 1.0;  // the first (last layers') bucket, small so it starts early
  double timeout_s = 600.0;      // seconds in one collective that make a hang: name the missing ranks, abort
  int check_every = 1000;        // steps between replica consistency checks (and at checkpoints); 0: those
};

struct Config {
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  IoConfig io;
  CommConfig comm;

  std::string source_path;  // the input file as given on the command line
  std::string source_text;  // its text, as read by rank 0 and shared with all ranks

  // The resolved configuration as a namelist (every key, defaults included),
  // which is itself a valid input file.
  std::string to_namelist() const;
};

// Parse namelist text (read from `path`) and apply `overrides` ("group.key=value",
// strings need no quotes, arrays are comma-separated). Validates every value.
// Throws InputError with a one-line message "path:line: ..." naming the key;
// unknown groups/keys get "did you mean 'x'?" when a known name is close.
Config parse_config(const std::string& text, const std::string& path,
                    const std::vector<std::string>& overrides);

// One key of the input file as its reference shows it (ddp_train --keys, the man
// page, docs/input.md's table). Every text comes from the key table: the type from
// the field, the default read from a default Config, the range from the key's rule.
struct KeyDoc {
  std::string name;           // "train.lr"
  std::string type;           // "integer", "real", "logical (T/F)", "string", "list of strings", ...
  std::string default_value;  // as in the input file: "0.01", "'sgd'", "T", "0.9, 0.999"; "": none
  std::string range;          // "> 0", "[0, 1)", "one of 'sgd', 'adamw'", "2 values, each >= 1"; "": any
  bool required = false;      // no default: the input file must set it
  std::string meaning;
};

// Every key, in the key table's order (group by group, as to_namelist() writes them).
std::vector<KeyDoc> key_reference();

}  // namespace ddp
