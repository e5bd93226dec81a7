#include "train/setup.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "comm/backend.hpp"
#include "comm/bytes_text.hpp"
#include "comm/check.hpp"
#include "comm/compute_communicator.hpp"
#include "comm/cuda_aware.hpp"
#include "comm/log.hpp"
#include "comm/memory_room.hpp"
#include "comm/node_shared.hpp"
#include "io/checkpoint.hpp"
#include "io/metrics.hpp"
#include "io/run_dir_lock.hpp"
#include "io/sampler.hpp"
#include "model/backend.hpp"
#include "model/planes.hpp"
#include "train/augment.hpp"
#include "train/checkpointing.hpp"
#include "train/optimizer.hpp"

namespace ddp {

// Preloaded batches of at least this many bytes are gathered ahead on the prefetch
// thread (data.prefetch_batches of them); smaller ones on the main thread.
constexpr double kPrefetchPreloadedBytes = 1024.0 * 1024.0;

namespace {

// The validation metrics a run chooses by name, with their keys: io.keep_best's, and
// train.plateau_metric where the schedule is 'plateau'.
std::vector<std::pair<std::string, std::string>> validation_metrics(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> named;
  if (cfg.io.keep_best != "none") named.emplace_back("io.keep_best", cfg.io.keep_best);
  if (cfg.train.schedule == "plateau") named.emplace_back("train.plateau_metric", cfg.train.plateau_metric);
  return named;
}

// Whether a preload of `bytes`, held once per node (`shared`) or by each rank, fits
// the room each node's first rank finds (comm/memory_room.hpp): "" where it does or
// nothing is known, else the lowest short node's words, on every rank. Past a cgroup's limit (Slurm's --mem)
// the kernel kills a rank with no word; 'auto' keeps half of the room for the rest of the run. Collective.
std::string preload_short_of(const Context& ctx, const Config& cfg, double bytes, bool shared) {
  std::string mine;
  if (ctx.local_rank() == 0) {
    const MemoryRoom room = memory_room();
    const int copies = shared ? 1 : ctx.local_size();
    const double need = bytes * copies,
                 can = cfg.data.mode == "auto" ? double(room.free) / 2 : double(room.free);
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    const std::string held =
        shared ? "one copy in shared memory for its " + std::to_string(ctx.local_size()) + " rank(s)"
               : "a copy on each of its " + std::to_string(ctx.local_size()) + " rank(s)";
    if (room.free >= 0 && need > can) {
      if (cfg.data.mode == "auto")
        mine = "data: streamed, not preloaded: the preload would take " + mib_text(need) + " on node " +
               host + " (" + held + "), more than half of the " + mib_text(double(room.free)) +
               " free under " + room.what + " (data.mode = 'auto'; 'preload' would take it)";
      else
        mine =
            "data.mode = 'preload': the data need " + mib_text(need) + " on node " + host + " (" + held +
            ") and " + std::string(room.free > 0 ? mib_text(double(room.free)) : "nothing") +
            " is free under " + room.what +
            ": ask the batch system for more memory (sbatch --mem), set data.mode = 'stream', or run fewer "
            "ranks per node";
    }
  }
  return first_words(ctx.world(), mine);
}

}  // namespace

Config load_config(const Context& ctx, const CommandLine& cli) {
  // Rank 0 reads the file once; a shared file system is not asked N times.
  std::string text, problem;
  if (ctx.rank() == 0) {
    std::ifstream in(cli.input_file, std::ios::binary);
    struct stat st {};
    if (!in) {
      problem = "cannot read input file '" + cli.input_file + "': " + std::strerror(errno);
    } else if (stat(cli.input_file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      problem = "cannot read input file '" + cli.input_file + "': it is a directory";
    } else {
      std::ostringstream os;
      os << in.rdbuf();
      text = os.str();
    }
  }
  long long len = problem.empty() ? (long long)text.size() : -1;
  MPI_CHECK(MPI_Bcast(&len, 1, MPI_LONG_LONG, 0, ctx.world()));
  if (len < 0) fatal_all(ctx.world(), problem);
  text.resize(std::size_t(len));
  broadcast_bytes(ctx.world(), text.data(), text.size(), 0);
  return collective_input(ctx.world(), [&] { return parse_config(text, cli.input_file, cli.overrides); });
}

Data open_data(const Context& ctx, const Config& cfg, bool training) {
  Data data;
  collective_input(ctx.world(), [&] {
    data.train =
        std::make_unique<ShardDataset>(ctx.world(), cfg.data.train_files, "data.train_files", cfg.data.seq_len);
    if (!cfg.data.val_files.empty())
      data.val =
          std::make_unique<ShardDataset>(ctx.world(), cfg.data.val_files, "data.val_files", cfg.data.seq_len);
    // Images: the transform checks every set against the model's input side and
    // says what is wrong with data.augment, data.normalize, data.image_size.
    const auto transform =
        make_image_transform(cfg.data, std::uint64_t(cfg.train.seed), *data.train, data.val.get());
    data.input_shape = model_input_shape(*data.train, transform.get());
    if (data.val && !transform && data.val->sample_shape() != data.train->sample_shape())
      throw InputError("data.val_files: samples have shape " + shape_str(data.val->sample_shape()) +
                       " but the training samples have " + shape_str(data.train->sample_shape()));
    const DistributedSampler sampler(data.train->size(), ctx.size(), ctx.rank(), cfg.data.shuffle, 0,
                                     cfg.data.drop_last);
    if (training && cfg.train.batch_size > sampler.num_samples())
      throw InputError("train.batch_size = " + std::to_string(cfg.train.batch_size) +
                       " is larger than each rank's share of the training data (" +
                       std::to_string(sampler.num_samples()) +
                       " samples = " + std::to_string(data.train->size()) + " over " +
                       std::to_string(ctx.size()) + " ranks): lower the batch size or run on fewer ranks");
    return 0;
  });

  const double budget = cfg.data.preload_budget_mb * 1024.0 * 1024.0;
  // --evaluate reads the validation set alone.
  const double bytes =
      (training ? double(data.train->bytes()) : 0.0) + (data.val ? double(data.val->bytes()) : 0.0);
  bool preload = cfg.data.mode == "preload" || (cfg.data.mode == "auto" && bytes <= budget);
  // One copy a node where data.preload_shared and the node's /dev/shm take it; a copy
  // on every rank where not. Either is checked against the node's room first.
  std::shared_ptr<NodeShared> node;
  if (preload) {
    const double held = (training ? double(data.train->preload_bytes()) : 0.0) +
                        (data.val ? double(data.val->preload_bytes()) : 0.0);
    bool shared = cfg.data.preload_shared && ctx.size() > 1;
    std::string short_of = preload_short_of(ctx, cfg, held, shared);
    if (shared && short_of.empty()) {
      std::string why;
      node = NodeShared::make(ctx.world(), std::size_t(held), &why);
      if (!node) {
        if (ctx.rank() == 0)  // every rank has the same words
          log::warn(
              "data: no shared memory for the preload, a copy on every rank instead (data.preload_shared): " +
              why);
        shared = false;
        short_of = preload_short_of(ctx, cfg, held, shared);
      }
    }
    if (!short_of.empty()) {
      if (cfg.data.mode == "preload") fatal_all(ctx.world(), short_of);
      log::info(short_of);
      preload = false;
    }
  }
  if (preload) {
    if (training) data.train->preload(node, 0);
    if (data.val) data.val->preload(node, training ? data.train->preload_bytes() : 0);
    // A preloaded batch is copied out of memory: on the main thread where that is
    // quicker than handing it over from another, on the prefetch thread (which then
    // touches no MPI or HDF5) where a batch is large: ImageNet's 38.5 MB at batch
    // 256 took 8 to 13 ms a step on the main thread.
    const double batch_bytes = double(data.train->bytes()) /
                               double(std::max<std::int64_t>(data.train->size(), 1)) *
                               double(cfg.train.batch_size);
    if (batch_bytes >= kPrefetchPreloadedBytes) data.prefetch_batches = cfg.data.prefetch_batches;
  } else if (ctx.thread_multiple()) {
    data.prefetch_batches = cfg.data.prefetch_batches;
  } else {
    log::warn(
        "MPI gives no MPI_THREAD_MULTIPLE: streaming reads happen on the main thread, without prefetch");
  }
  std::ostringstream os;
  os << "data: " << data.train->size() << " training samples of shape "
     << shape_str(data.train->sample_shape());
  if (data.train->x_is_uint8() && data.train->sample_shape().size() == 3) {
    // Which layout was read: (N, H, W, C) from decoders, or (N, C, H, W).
    os << " uint8 " << (data.train->nhwc() ? "NHWC" : "NCHW");
    if (data.train->class_names() > 0) os << ", " << data.train->class_names() << " class names";
    if (data.input_shape != data.train->sample_shape()) os << ", cropped to " << shape_str(data.input_shape);
    if (!cfg.data.augment.empty()) {
      os << ", augmented:";
      for (const auto& a : cfg.data.augment) os << " " << a;
    }
    if (!cfg.data.normalize.empty()) os << ", normalized";
  }
  if (data.val) os << ", " << data.val->size() << " validation samples";
  char size[64];
  std::snprintf(size, sizeof size, " (%.1f MiB)", bytes / (1024.0 * 1024.0));
  os << "; " << (training ? "" : "--evaluate reads the validation set alone: ")
     << (!preload ? "streamed"
         : node   ? "preloaded, one copy per node in shared memory"
                  : "preloaded on every rank")
     << size;
  if (preload && data.prefetch_batches > 0)
    os << ", batches gathered " << data.prefetch_batches << " ahead on a thread";
  log::info(os.str());
  return data;
}

namespace {

// Token ids go into an embedding and nothing else does: a token shard into linear(n)
// would train on ids as numbers, and floats into an embedding index its table by them.
void check_first_layer(const Config& cfg, const ShardDataset& train) {
  if (cfg.model.layers.empty()) return;  // the model says so
  const std::string& spec = cfg.model.layers[0];
  std::string name;
  for (char c : spec) {
    if (c == '(') break;
    if (!std::isspace(static_cast<unsigned char>(c)))
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  const bool embeds = name == "embedding";
  if (train.tokens() && !embeds)
    throw InputError("model.layers(1) " + spec + " takes floats, but the shards (" + train.what() +
                     ") hold token ids: a language model starts with embedding(vocab, d)");
  if (!train.tokens() && embeds)
    throw InputError("model.layers(1) " + spec + " takes token ids, but the shards (" + train.what() +
                     ") hold samples (/x, /y): embedding needs token shards (/tokens) and data.seq_len");
}

}  // namespace

ModelSetup build_model(const Context& ctx, const Config& cfg, Data& data) {
  return collective_input(ctx.world(), [&] {
    ModelSetup setup;
    check_first_layer(cfg, *data.train);
    setup.model = std::make_unique<Model>(cfg.model.layers, data.input_shape, std::uint64_t(cfg.train.seed));
    const Precision precision = parse_precision(cfg.train.precision);
    const std::string unsupported = compute_backend().precision_unsupported(precision);
    if (!unsupported.empty()) {
      const bool fp16_runs = compute_backend().precision_unsupported(Precision::fp16).empty();
      throw InputError("train.precision = '" + cfg.train.precision + "' cannot run on " + unsupported +
                       "; use 'fp32'" + (precision == Precision::bf16 && fp16_runs ? " or 'fp16'" : ""));
    }
    setup.model->set_precision(precision);  // before the summary: it plans layouts
    // train.tf32 is for fp32's convolutions and GEMMs only (not the fp32 kernels that
    // DDP_CUDNN_NARROW=0 runs bf16/fp16 convolutions in).
    const std::string no_tf32 = precision != Precision::fp32 ? "train.precision = '" + cfg.train.precision +
                                                                   "' runs no fp32 convolutions or GEMMs"
                                                             : compute_backend().allow_tf32(cfg.train.tf32);
    log::info("compute: " + compute_backend().name());
    log::info("precision: " + compute_backend().precision_text(precision));
    if (cfg.train.tf32 && !no_tf32.empty()) log::info("train.tf32 = T has no effect: " + no_tf32);
    // Read here (DDP_ELEMENT_WARPS, DDP_ELEMENT_VECTORS, DDP_BN_RELU_MASK), so that a
    // bad value ends the start-up.
    const bool vectors = element_vectors();
    const bool mask_from_input = bn_relu_mask_from_input();
#if defined(KOKKOS_ENABLE_CUDA)
    log::info("element loops: " + std::to_string(element_team_size()) + " warps a block, " +
              (vectors ? "8 elements a load where the channels allow"
                       : "one element a load (DDP_ELEMENT_VECTORS=0)") +
              (mask_from_input ? "; batch norm's relu mask from its input (DDP_BN_RELU_MASK=input)" : ""));
#else
    (void)vectors;  // the host's element loops over its own layouts load one at a time
    (void)mask_from_input;
#endif
    const bool labels = data.train->has_class_labels();
    if (data.val && data.val->has_class_labels() != labels)
      throw InputError("data.val_files: /y holds " + std::string(labels ? "targets" : "class labels") +
                       " but the training /y holds " + (labels ? "class labels" : "targets"));
    std::string loss = cfg.model.loss;
    if (loss == "auto") loss = labels ? "cross_entropy" : "mse";
    const Shape out = setup.model->output_shape();
    const std::int64_t out_numel = shape_numel(out);
    if (loss == "cross_entropy") {
      if (!labels)
        throw InputError(
            "model.loss = 'cross_entropy' needs integer class labels in /y, but /y holds float targets");
      std::int64_t classes = 0;
      std::string model_classes;
      if (data.train->tokens()) {
        const std::int64_t T = data.train->target_numel();
        if (out.size() != 2 || out[0] != T)
          throw InputError("token shards need the model to give (seq_len, vocabulary) logits, a row per token "
                           "(here (" +
                           std::to_string(T) + ", V)), but it gives " + shape_str(out) +
                           ": end a language model with linear(V)");
        classes = out[1];
        model_classes = "the model's output (" + std::to_string(classes) + " logits a token)";
        // check_first_layer: layer 0 is the embedding, its table (vocab, d).
        for (const auto& p : setup.model->parameter_table())
          if (p.name == "layers.0.weight" && p.shape[0] < classes) {
            classes = p.shape[0];
            model_classes = "the model's embedding(" + std::to_string(p.shape[0]) + ", " +
                            std::to_string(p.shape[1]) + ")";
          }
      } else {
        if (out.size() != 1)
          throw InputError("model.loss = 'cross_entropy' needs a flat output (classes), the model gives " +
                           shape_str(out));
        classes = out[0];
      }
      data.train->check_labels(classes, model_classes);
      if (data.val) data.val->check_labels(classes, model_classes);
      setup.loss = LossKind::CrossEntropy;
      for (const auto& [key, metric] : validation_metrics(cfg))
        if (metric == "val_acc5" && classes <= 5)
          throw InputError(key +
                           " = 'val_acc5' needs top-5 accuracy, which models of more than 5 classes have; "
                           "this one has " +
                           std::to_string(classes) + ": use 'val_acc' or 'val_loss'");
    } else {
      if (labels)
        throw InputError("model.loss = 'mse' needs float targets in /y, but /y holds integer class labels");
      if (out_numel != data.train->target_numel())
        throw InputError("the model gives " + std::to_string(out_numel) +
                         " outputs per sample but the targets have " +
                         std::to_string(data.train->target_numel()) + " values");
      setup.loss = LossKind::MSE;
      if (cfg.train.label_smoothing != 0.0)
        throw InputError("train.label_smoothing needs model.loss = 'cross_entropy'; this run's loss is mse");
      for (const auto& [key, metric] : validation_metrics(cfg))
        if (metric == "val_acc" || metric == "val_acc5")
          throw InputError(key + " = '" + metric +
                           "' needs model.loss = 'cross_entropy'; this run's loss is mse: use 'val_loss'");
    }
    log::info(setup.model->summary());
    return setup;
  });
}

std::unique_ptr<Communicator> make_communicator(const Context& ctx, const Config& cfg) {
  CommChoice choice;
  auto comm = collective_input(ctx.world(), [&] {
    return make_compute_communicator(ctx.world(), cfg.comm.backend,
                                     cfg.comm.timeout_s > 0 ? cfg.comm.timeout_s : 1e9, &choice);
  });
  log::info("comm: " + choice.reason);
  return comm;
}

namespace {

// io.keep_best: a file or directory where best.h5 goes is one error line at start-up,
// not replaced by the run's first best (or its checkpoint failing on a directory).
void check_best_link(const Context& ctx, const Config& cfg) {
  if (cfg.io.keep_best == "none") return;
  const std::string problem = ctx.rank() == 0 ? best_link_problem(cfg.io.run_dir) : "";
  fatal_if_any(ctx.world(), !problem.empty(), problem);
}

}  // namespace

RunDirLock prepare_run_dir(const Context& ctx, const Config& cfg) {
  std::string problem;
  if (ctx.rank() == 0) problem = make_directories(cfg.io.run_dir);
  fatal_if_any(ctx.world(), !problem.empty(), "io.run_dir: " + problem);
  RunDirLock lock;
  if (ctx.rank() == 0) lock = RunDirLock(cfg.io.run_dir, cfg.source_path);
  fatal_if_any(ctx.world(), !lock.problem().empty(), lock.problem());
  if (!lock.warning().empty()) log::warn(lock.warning());
  check_best_link(ctx, cfg);
  log::info(input_banner(ctx, cfg, ""));
  return lock;
}

std::string input_banner(const Context& ctx, const Config& cfg, const std::string& option) {
  std::ostringstream os;
  os << "ddp_train " << DDP_VERSION << (option.empty() ? "" : " " + option) << ": " << ctx.size() << " rank"
     << (ctx.size() > 1 ? "s" : "") << (ctx.device().empty() ? "" : ", rank 0 on GPU " + ctx.device())
     << ", input " << cfg.source_path << "\n--- resolved input ---\n"
     << cfg.to_namelist() << "----------------------";
  return os.str();
}

void start_from_checkpoint(const Context& ctx, const Config& cfg, const Model& model, const Data& data,
                           Trainer& trainer) {
  bool weights_only = false;
  const std::string optimizer = make_optimizer(cfg.train, 0)->name();
  const auto ck = find_start_checkpoint(ctx.world(), cfg, model, optimizer, &weights_only,
                                        &data.train->fingerprint(), trainer.optimizer_shares());
  if (ck) trainer.restore(*ck, weights_only);
}

namespace {

// --check's line on the checkpoint a run would resume from: where it would go on, with
// io.keep_best's record; or, where it is the run's end, that it would train nothing.
std::string resume_text(const Config& cfg, const Checkpoint& ck) {
  TrainingState pos = ck.state;
  // The record the resume carries on (Trainer::restore's test): rank 0 says it.
  const std::string dropped =
      dropped_best_text(pos, cfg, pos.best_step >= 0 && holds_checkpoint(cfg.io.run_dir, pos.best_step));
  if (!dropped.empty() || pos.best_metric != best_metric_index(cfg.io.keep_best)) forget_best(pos, cfg);
  const std::string done = nothing_to_train(pos, cfg);
  if (!done.empty())
    return "checkpoint: would start from " + ck.path + " (epoch " + std::to_string(pos.epoch) + ", step " +
           std::to_string(pos.step) + ") and train nothing: " + done;
  std::string text = "checkpoint: would resume from " + ck.path + " (epoch " + std::to_string(pos.epoch + 1) +
                     ", step " + std::to_string(pos.step) + ")";
  if (pos.best_step >= 0) {
    char best[256];
    std::snprintf(best, sizeof best, "; the best %s so far, %.4f at epoch %lld, is %s",
                  best_metric_name(pos.best_metric), pos.best_value, (long long)pos.best_epoch,
                  checkpoint_name(pos.best_step).c_str());
    text += best;
  }
  // train.schedule = 'plateau' goes on from the checkpoint's position (Trainer::restore).
  if (cfg.train.schedule == "plateau" && pos.plateau_lr > 0) {
    char plateau[256];
    std::snprintf(plateau, sizeof plateau, "; train.schedule = 'plateau' at lr %.6g", pos.plateau_lr);
    text += plateau;
    if (pos.plateau_epoch > 0) {
      const std::string cooldown =
          pos.plateau_cooldown > 0 ? ", " + std::to_string(pos.plateau_cooldown) + " of cooldown" : "";
      std::snprintf(plateau, sizeof plateau, " (best %s %.4f at epoch %lld; %lld epoch%s not better%s)",
                    cfg.train.plateau_metric.c_str(), pos.plateau_best, (long long)pos.plateau_epoch,
                    (long long)pos.plateau_bad_epochs, pos.plateau_bad_epochs == 1 ? "" : "s",
                    cooldown.c_str());
      text += plateau;
    }
  }
  return dropped.empty() ? text : text + "; " + dropped;
}

}  // namespace

int check_run(const Context& ctx, const Config& cfg) {
  log::info(input_banner(ctx, cfg, "--check"));
  Data data = open_data(ctx, cfg);
  ModelSetup net = build_model(ctx, cfg, data);
  bool weights_only = false;
  const std::string optimizer = make_optimizer(cfg.train, 0)->name();
  // Rank 0 says what it found: the other ranks need not hold the checkpoint.
  const auto ck = find_start_checkpoint(ctx.world(), cfg, *net.model, optimizer, &weights_only,
                                        &data.train->fingerprint(), nullptr, false);
  if (ck && weights_only)
    log::info("checkpoint: a new run from the weights of " + ck->path);
  else if (ck)
    log::info(resume_text(cfg, *ck));
  else
    log::info("checkpoint: none; a new run");
  check_best_link(ctx, cfg);
  if (ctx.rank() == 0) {
    const std::string holder = RunDirLock::holder(cfg.io.run_dir);
    if (!holder.empty())
      log::warn("io.run_dir '" + cfg.io.run_dir + "' is in use by another run of ddp_train now (" + holder +
                "): this run would stop at start-up until that one has ended");
  }
  log::info("check passed");
  return 0;
}

}  // namespace ddp
