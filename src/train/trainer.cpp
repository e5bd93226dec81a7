#include "train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>
#include <utility>

#include "comm/bytes_text.hpp"
#include "comm/check.hpp"
#include "comm/json.hpp"
#include "comm/log.hpp"
#include "comm/memory_room.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"
#include "io/sampler.hpp"
#include "model/backend.hpp"
#include "model/rng.hpp"
#include "train/checkpointing.hpp"
#include "train/sample_text.hpp"
#include "train/schedule.hpp"
#include "train/signals.hpp"
#include "train/trainer_internal.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/device.hpp"
#endif

// The trainer's construction, resume, checkpoints and the run over its epochs;
// trainer_epoch.cpp has the epoch loop and validation, trainer_step.cpp the step.

namespace ddp {

using trainer_detail::now;

Trainer::Trainer(const Config& cfg, Communicator& comm, Model& model, LossKind loss, ShardDataset& train,
                 ShardDataset* val, int prefetch_batches, Use use)
    : cfg_(cfg),
      comm_(comm),
      model_(model),
      loss_kind_(loss),
      label_rows_(loss == LossKind::CrossEntropy ? train.target_numel() : 1),
      train_(train),
      val_(val),
      prefetch_(prefetch_batches),
      transform_(make_image_transform(cfg.data, std::uint64_t(cfg.train.seed), train, val)),
      stage_(cfg.train.batch_size, shape_numel(model_input_shape(train, transform_.get())),
             train.has_class_labels(), train.target_numel(),
             transform_ ? std::max(train.sample_numel(), val ? val->sample_numel() : 0) : 0) {
  const std::int64_t B = cfg_.train.batch_size;
  loss_ = View1("Trainer::loss", std::size_t(B));
  correct_ = View1("Trainer::correct", std::size_t(B));
  hits5_ = View1("Trainer::hits5", std::size_t(B));
  if (label_rows_ > 1)
    loss_rows_ = View1("Trainer::loss_rows",
                       row_scratch_floats(B, label_rows_, shape_numel(model_.output_shape()) / label_rows_));
  if (use == Use::evaluation) return;  // build_model set train.precision: the run's arithmetic
  const std::int64_t n_params = model_.num_parameters();
  // comm.zero >= 1: this rank keeps optimizer state for its share of the flat buffer.
  if (cfg_.comm.zero > 0) shares_ = Shares::split(n_params, comm_.size());
  // The run's arithmetic before the plan: it decides attention's path and which
  // activations are narrow, so what the memory line counts.
  model_.set_precision(parse_precision(cfg_.train.precision));
  check_memory_room(memory_plan());
  // The reducer before the optimizer's state: a shared-memory reducer takes the
  // gradients into its window and the model releases its own buffer, so that the two
  // copies are held at once while the optimizer's state is not yet (with momentum or
  // AdamW a rank's peak is then what the memory line counts, not a gradient buffer more).
  if (cfg_.comm.overlap != "none" && comm_.size() > 1) make_reducer();
  make_optimizer_and_scaler();
  // Every rank starts from rank 0's weights, as DDP does at construction.
  comm_.broadcast(model_.parameters().data(), std::size_t(n_params), 0);
  comm_.wait_device("the broadcast of rank 0's parameters (NCCL, on the device)");
  model_.set_communicator(&comm_);  // SyncBatchNorm's statistics
  graph_plan_ = collective_input(comm_.mpi_comm(), [&] {
    return plan_step_graphs(cfg_.train.cuda_graph, compute_backend().graphs_unsupported(),
                            model_.graph_obstacle(), cfg_.io.trace, comm_.captures_collectives());
  });
  if (!graph_plan_.line.empty()) log::info(graph_plan_.line);
  if (graph_plan_.on) watch_device_memory();
  const MemoryPlan plan = memory_plan();
  log::info("memory per rank: " + plan.text(cfg_.train.batch_size));
  log::info("checkpoints: " + plan.checkpoint_text());
  if (cfg_.comm.zero > 0) {
    char line[320];
    std::snprintf(line, sizeof line,
                  "ZeRO stage %d: each of %d ranks keeps the optimizer state of its share of the %lld "
                  "parameters (at most %lld, rank 0's above) and updates it; parameters all-gathered after "
                  "each step%s",
                  cfg_.comm.zero, comm_.size(), (long long)n_params, (long long)shares_.size(0),
                  cfg_.comm.zero == 2 ? "; gradients reduce-scattered to the shares" : "");
    log::info(line);
  }
  // Dropout streams differ per rank and restart per micro-batch from (key, position),
  // so a checkpoint's one number (the position) restores them exactly.
  dropout_key_ = hash64(std::uint64_t(cfg_.train.seed), std::uint64_t(comm_.rank()));
  model_.reseed_dropout(dropout_key_);
  pos_.seed = cfg_.train.seed;
  pos_.world_size = comm_.size();
  pos_.best_metric = best_metric_index(cfg_.io.keep_best);
  if (cfg_.train.schedule == "plateau") pos_.plateau_lr = cfg_.train.lr;

  const DistributedSampler sampler(train_.size(), comm_.size(), comm_.rank(), cfg_.data.shuffle,
                                   std::uint64_t(cfg_.train.seed), cfg_.data.drop_last);
  const std::int64_t batches = (sampler.num_samples() + B - 1) / B;
  steps_per_epoch_ = (batches + cfg_.train.accumulation_steps - 1) / cfg_.train.accumulation_steps;
  epoch_positions_ = sampler.total_size();
  eta_ = RunEta(cfg_.train.epochs, epoch_positions_, val_ ? val_->size() : 0);

  loss_acc_ = Kokkos::View<double[3]>("Trainer::loss_acc");
  dout_.data = View1("Trainer::dout", std::size_t(B * shape_numel(model_.output_shape())));
  if (cfg_.io.trace) open_trace();
}

void Trainer::make_optimizer_and_scaler() {
  const std::int64_t n_params = model_.num_parameters();
  std::vector<ParamRange> no_decay;  // train.decay_norm_and_bias = F: batch norms' gamma and beta, biases
  if (!cfg_.train.decay_norm_and_bias)
    for (const Model::ParamEntry& e : model_.parameter_table())
      if (e.shape.size() == 1) no_decay.push_back({e.offset, e.size});
  const ParamRange owned = cfg_.comm.zero > 0
                               ? ParamRange{shares_.begin(comm_.rank()), shares_.size(comm_.rank())}
                               : ParamRange{0, -1};
  optimizer_ = make_optimizer(cfg_.train, std::size_t(n_params), no_decay, owned);

  if (parse_precision(cfg_.train.precision) == Precision::fp16) {
    LossScalerOptions o;
    o.init_scale = cfg_.train.loss_scale;
    o.growth_interval = cfg_.train.loss_scale_growth_interval;
    scaler_ = std::make_unique<LossScaler>(o);
  }
}

std::vector<Bucket> Trainer::bucket_plan() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> tensors;
  for (const Model::ParamEntry& p : model_.parameter_table()) tensors.push_back({p.offset, p.size});
  return plan_buckets(tensors, cfg_.comm.bucket_mb, cfg_.comm.first_bucket_mb);
}

void Trainer::make_reducer() {
  const std::int64_t n_params = model_.num_parameters();
  reducer_ = comm_.make_bucket_reducer(model_.gradients().data(), bucket_plan(), cfg_.comm.overlap,
                                       cfg_.comm.shared_memory,
                                       cfg_.comm.zero == 2 ? shares_.bounds : std::vector<std::int64_t>{});
  if (float* shared = reducer_ ? reducer_->take_gradients() : nullptr) {
    model_.place_gradients(shared);
    placed_gradients_.model = &model_;
  }
  char line[200];
  if (reducer_)
    std::snprintf(line, sizeof line, "gradients: %zu bucket(s) of %.2f MB in all, %s",
                  reducer_->buckets().size(), double(n_params) * 4.0 / (1024.0 * 1024.0),
                  reducer_->method().c_str());
  else
    std::snprintf(line, sizeof line,
                  "gradients: %.2f MB all-reduced after backward (this backend has no buckets)",
                  double(n_params) * 4.0 / (1024.0 * 1024.0));
  log::info(line);
}

namespace {
// A validation's value of a metric named as io.keep_best and train.plateau_metric name them.
double metric_value(const ValStats& v, const std::string& metric) {
  return metric == "val_loss" ? v.loss : metric == "val_acc" ? v.accuracy : v.accuracy5;
}

std::string mb_and_bytes(std::int64_t b) {
  char t[64];
  std::snprintf(t, sizeof t, "%.2f MB (%lld B)", double(b) / (1024.0 * 1024.0), (long long)b);
  return t;
}
}  // namespace

std::string MemoryPlan::checkpoint_text() const {
  return "rank 0 holds each checkpoint file in host memory while it writes it, besides the above: about " +
         mb_and_bytes(checkpoint) + ", the parameters, buffers and whole optimizer state";
}

std::string MemoryPlan::text(std::int64_t batch) const {
  return "parameters " + mb_and_bytes(parameters) + ", gradients " + mb_and_bytes(gradients) +
         ", optimizer state " + mb_and_bytes(optimizer_state) + ", activations " + mb_and_bytes(activations) +
         " (planned at batch " + std::to_string(batch) +
         ": layer outputs, the gradients between layers and what layers and their libraries keep), in all " +
         mb_and_bytes(total());
}

MemoryPlan Trainer::memory_plan() const {
  MemoryPlan m;
  const std::int64_t n = model_.num_parameters(), copies = optimizer_state_copies(cfg_.train);
  m.parameters = m.gradients = 4 * n;
  m.optimizer_state = 4 * copies * (cfg_.comm.zero > 0 ? shares_.size(comm_.rank()) : n);
  // and the loss's gradient into the model (dout_), the size of its output
  // and what the libraries hold for the layers' calls (oneDNN's copies and scratchpads)
  m.activations = 4 * (model_.activation_floats(cfg_.train.batch_size) +
                       cfg_.train.batch_size * shape_numel(model_.output_shape())) +
                  model_.library_bytes(cfg_.train.batch_size);
  m.checkpoint = 4 * ((1 + copies) * n + std::int64_t(model_.buffers().extent(0)));
  return m;
}

void Trainer::check_memory_room(const MemoryPlan& plan) const {
#if !defined(KOKKOS_ENABLE_CUDA)
  // Taken already: the parameters and gradients (the room counts them). To come: the
  // optimizer's state now, the activations at the first step, rank 0's checkpoint
  // file at the first checkpoint (where checkpoints are scheduled).
  const IoConfig& io = cfg_.io;
  const bool checkpoints = io.checkpoint_every > 0 || io.checkpoint_every_steps > 0 ||
                           io.checkpoint_every_minutes > 0 || io.keep_best != "none";
  long long mine[3] = {(long long)plan.optimizer_state, (long long)plan.activations,
                       comm_.rank() == 0 && checkpoints ? (long long)plan.checkpoint : 0},
            node_sum[3] = {0, 0, 0};
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_.mpi_comm(), MPI_COMM_TYPE_SHARED, comm_.rank(), MPI_INFO_NULL, &node));
  int local = 0, ranks = 1;
  MPI_CHECK(MPI_Comm_rank(node, &local));
  MPI_CHECK(MPI_Comm_size(node, &ranks));
  {
    const watchdog::Collective guard("the sum of the node's memory plan (MPI_Reduce)");
    MPI_CHECK(MPI_Reduce(mine, node_sum, 3, MPI_LONG_LONG, MPI_SUM, 0, node));
  }
  MPI_CHECK(MPI_Comm_free(&node));
  std::string short_of;
  const long long need = node_sum[0] + node_sum[1] + node_sum[2];
  const MemoryRoom room = local == 0 ? memory_room() : MemoryRoom{};
  if (local == 0 && room.free >= 0 && need > room.free) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    short_of =
        "the run needs " + mib_text(double(need)) + " more on node " + host + " than its " +
        std::to_string(ranks) + " rank(s) hold now (optimizer state " + mib_text(double(node_sum[0])) +
        " and activations " + mib_text(double(node_sum[1])) + " in all" +
        (node_sum[2] > 0 ? ", rank 0's checkpoint file " + mib_text(double(node_sum[2])) : "") +
        ", as the memory line counts them) and " + mib_text(double(std::max<long long>(room.free, 0))) +
        " is free under " + room.what +
        ": ask the batch system for more memory (sbatch --mem), lower train.batch_size, set comm.zero = 1, "
        "or run fewer ranks per node";
  }
  short_of = first_words(comm_.mpi_comm(), short_of);
  if (!short_of.empty()) fatal_all(comm_.mpi_comm(), short_of);
#else
  // The GPU's memory: the optimizer state and activations still to come, summed over
  // the node's ranks holding this GPU (the lowest of them holds the sum), against what
  // the device has free now (every process's use counted). Ranks hold one GPU where
  // its UUID is the same: MIG instances of one card share its bus id, not its memory.
  std::int64_t used = -1, total = -1;
  const bool known = cuda::device_memory(&used, &total);
  const std::string bus = cuda::current_bus_id();
  MPI_Comm node = MPI_COMM_NULL, gpu = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_.mpi_comm(), MPI_COMM_TYPE_SHARED, comm_.rank(), MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_split(node, int(std::hash<std::string>{}(cuda::current_uuid()) & 0x7fffffff),
                           comm_.rank(), &gpu));
  long long mine[2] = {(long long)plan.optimizer_state, (long long)plan.activations}, sum[2] = {0, 0};
  {
    const watchdog::Collective guard("the sum of the GPU's memory plan (MPI_Reduce)");
    MPI_CHECK(MPI_Reduce(mine, sum, 2, MPI_LONG_LONG, MPI_SUM, 0, gpu));
  }
  int first = 0, sharing = 1;
  MPI_CHECK(MPI_Comm_rank(gpu, &first));
  MPI_CHECK(MPI_Comm_size(gpu, &sharing));
  MPI_CHECK(MPI_Comm_free(&gpu));
  MPI_CHECK(MPI_Comm_free(&node));
  std::string short_of = first == 0 ? short_on_device(comm_.rank(), sharing, "GPU " + bus, sum[0], sum[1],
                                                      known ? total - used : -1, total)
                                    : "";
  short_of = first_words(comm_.mpi_comm(), short_of);
  if (!short_of.empty()) fatal_all(comm_.mpi_comm(), short_of);
#endif
}

void Trainer::open_trace() {
  const std::string dir = cfg_.io.run_dir + "/trace";
  std::string problem;
  if (comm_.rank() == 0) problem = make_directories(dir);
  fatal_if_any(comm_.mpi_comm(), !problem.empty(), "io.trace: " + problem);
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const std::string path = dir + "/rank" + std::to_string(comm_.rank()) + ".json";
  std::string layers;
  for (const std::string& l : cfg_.model.layers) layers += (layers.empty() ? "" : ", ") + json_string(l);
  // The gradient buckets as the reducer plans them on any number of ranks (one rank
  // has no reducer, but tools/scaling_model predicts more from its trace): in the
  // order they are reduced, each one's bytes and the layers whose gradients it holds.
  std::string buckets;
  const auto& table = model_.parameter_table();
  for (const Bucket& b : bucket_plan()) {
    std::int64_t first = -1, last = -1;
    for (const Model::ParamEntry& p : table)
      if (p.offset >= b.begin && p.offset < b.end) {
        const std::int64_t i = std::stoll(p.name.substr(p.name.find('.') + 1));  // "layers.<i>...."
        first = first < 0 ? i : std::min(first, i);
        last = std::max(last, i);
      }
    buckets += std::string(buckets.empty() ? "" : ", ") +
               "{\"bytes\": " + std::to_string((b.end - b.begin) * 4) + ", \"layers\": [" +
               std::to_string(first) + ", " + std::to_string(last) + "]}";
  }
  const std::string meta = "\"world_size\": " + std::to_string(comm_.size()) +
                           ", \"host\": " + json_string(host) +
                           ", \"backend\": " + json_string(cfg_.comm.backend) +
                           ", \"overlap\": " + json_string(cfg_.comm.overlap) +
                           ", \"batch_size\": " + std::to_string(cfg_.train.batch_size) +
                           ", \"accumulation_steps\": " + std::to_string(cfg_.train.accumulation_steps) +
                           ", \"precision\": " + json_string(cfg_.train.precision) + ", \"layers\": [" +
                           layers + "]" + ", \"buckets\": [" + buckets + "]";
  trace::open(comm_.mpi_comm(), path, cfg_.io.trace_steps[0], cfg_.io.trace_steps[1],
              "rank " + std::to_string(comm_.rank()) + " (" + host + ")", meta);
  if (!reducer_) return;
  // A bucket's row says which tensors it carries, "all-reduce bucket 0: layers.6.bias
  // (40 B)", "all-reduce bucket 1: layers.0-4 (1.27 MB)": buckets are contiguous
  // ranges of whole tensors.
  const auto& reduced = reducer_->buckets();
  for (std::size_t b = 0; b < reduced.size(); ++b) {
    std::vector<const Model::ParamEntry*> in;
    for (const Model::ParamEntry& p : table)
      if (p.offset >= reduced[b].begin && p.offset < reduced[b].end) in.push_back(&p);
    if (in.empty()) continue;
    const auto layer = [](const std::string& name) { return name.substr(0, name.rfind('.')); };  // "layers.4"
    const std::string first = layer(in.front()->name), last = layer(in.back()->name);
    std::string tensors = in.size() == 1  ? in.front()->name
                          : first == last ? first
                                          : first + "-" + last.substr(last.find('.') + 1);
    const double bytes = double(reduced[b].end - reduced[b].begin) * 4.0;
    char size[32];
    if (bytes < 1024.0)
      std::snprintf(size, sizeof size, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024.0)
      std::snprintf(size, sizeof size, "%.1f KB", bytes / 1024.0);
    else
      std::snprintf(size, sizeof size, "%.2f MB", bytes / (1024.0 * 1024.0));
    trace::name_row(trace::kBucketRow + int(b),
                    "all-reduce bucket " + std::to_string(b) + ": " + tensors + " (" + size + ")");
  }
}

void Trainer::trace_step_start() {
  if (!cfg_.io.trace) return;
  const std::string written = trace::begin_step(step_ + 1);
  trace_step_begin_ = trace::recording() ? trace::now_ns() : -1;
  if (!written.empty() && comm_.rank() == 0)
    log::info("trace: steps " + std::to_string(cfg_.io.trace_steps[0]) + "-" +
              std::to_string(cfg_.io.trace_steps[1]) + " of every rank in " + cfg_.io.run_dir +
              "/trace (tools/merge_traces " + cfg_.io.run_dir + "/trace: one file, a row per rank)");
}

void Trainer::close_trace() {
  if (!cfg_.io.trace) return;
  const std::string written = trace::close();
  if (!written.empty() && comm_.rank() == 0)
    log::info("trace: the run ended inside io.trace_steps; steps " + std::to_string(cfg_.io.trace_steps[0]) +
              "-" + std::to_string(step_) + " of every rank in " + cfg_.io.run_dir + "/trace");
}

void Trainer::use_inputs(int slot, const Batch& batch) {
  const Inputs in = stage_.take(slot);
  x_.data = in.x;
  x_.shape = {batch.size};
  for (auto d : model_.input_shape()) x_.shape.push_back(d);
  labels_ = in.labels;
  targets_ = in.targets;
}

using HostIn = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;

void Trainer::load_weights(const Checkpoint& ck) {
  Kokkos::deep_copy(model_.parameters(), HostIn(ck.parameters.data(), ck.parameters.size()));
  if (!ck.buffers.empty()) Kokkos::deep_copy(model_.buffers(), HostIn(ck.buffers.data(), ck.buffers.size()));
}

void Trainer::restore(const Checkpoint& ck, bool weights_only) {
  load_weights(ck);
  if (weights_only) {
    log::info("initialised from " + ck.path + " (weights only; a new run)");
    return;
  }
  for (auto& state : optimizer_->state()) {
    const std::string& name = state.first;
    auto it = std::find_if(ck.optimizer_state.begin(), ck.optimizer_state.end(),
                           [&](const auto& e) { return e.first == name; });
    if (it == ck.optimizer_state.end()) DDP_FATAL("checkpoint " << ck.path << " has no /optimizer/" << name);
    // The file holds the whole state; under ZeRO this rank takes its share of it (`ck`
    // may have been sent that share alone, from ck.optimizer_offset).
    const Optimizer::Range owned = optimizer_->owned();
    const std::int64_t from = owned.offset - ck.optimizer_offset;
    DDP_REQUIRE(from >= 0 && std::int64_t(it->second.size()) >= from + owned.size,
                "checkpoint " << ck.path << ": /optimizer/" << name << " holds " << it->second.size()
                              << " values from " << ck.optimizer_offset << ", this rank needs " << owned.size
                              << " from " << owned.offset);
    Kokkos::deep_copy(state.second, HostIn(it->second.data() + from, std::size_t(owned.size)));
  }
  optimizer_->set_steps(ck.optimizer_steps);
  if (scaler_ && ck.state.loss_scale > 0)
    scaler_->restore(ck.state.loss_scale, int(ck.state.loss_scale_clean_steps));
  step_ = ck.state.step;
  watchdog::set_step(step_);  // a hang before the first step names the resumed one
  pos_ = ck.state;
  pos_.world_size = comm_.size();
  // io.keep_best's record carries on where this run directory holds its checkpoint (not
  // when resumed from another directory's, or after a rotation of a continuation left
  // behind): rank 0 looks (and points best.h5 at it), and every rank takes its answer.
  const bool same = pos_.best_metric == best_metric_index(cfg_.io.keep_best);
  double held =
      same && pos_.best_step >= 0 && comm_.rank() == 0 && restore_best_link(cfg_.io.run_dir, pos_.best_step)
          ? 1.0
          : 0.0;
  if (same && pos_.best_step >= 0) comm_.allreduce_sum_host_waiting(&held, 1);
  const std::string dropped = dropped_best_text(pos_, cfg_, held != 0.0);
  if (!dropped.empty()) log::info("checkpoint: " + dropped);
  if (!same || !dropped.empty()) forget_best(pos_, cfg_);
  // train.schedule = 'plateau' goes on from the checkpoint's position where its run had
  // that schedule, else starts at train.lr; no other schedule keeps one.
  if (cfg_.train.schedule != "plateau" || pos_.plateau_lr <= 0) {
    pos_.plateau_lr = cfg_.train.schedule == "plateau" ? cfg_.train.lr : 0.0;
    pos_.plateau_best = 0.0;
    pos_.plateau_epoch = pos_.plateau_bad_epochs = pos_.plateau_cooldown = 0;
  }
  if (ck.state.world_size != comm_.size()) {
    // The schedule is a function of the step, and steps per epoch change with the
    // rank count: continue it at the same fraction of the epoch instead, so that the
    // learning rate carries on from where it was rather than jumping.
    pos_.lr_step =
        pos_.epoch * steps_per_epoch_ +
        std::int64_t(std::llround(double(pos_.consumed) / double(epoch_positions_) * steps_per_epoch_));
  }
  if (pos_.seed != cfg_.train.seed)
    log::warn("train.seed is " + std::to_string(cfg_.train.seed) + " but the checkpoint's run used " +
              std::to_string(pos_.seed) + ": the sample order keeps the checkpoint's seed");
  char line[512];
  std::snprintf(
      line, sizeof line,
      "resumed from %s at epoch %lld step %lld (%lld of the epoch's %lld samples done; written by %lld "
      "rank%s, continuing on %d)",
      ck.path.c_str(), (long long)pos_.epoch + 1, (long long)step_, (long long)pos_.consumed,
      (long long)train_.size(), (long long)ck.state.world_size, ck.state.world_size == 1 ? "" : "s",
      comm_.size());
  log::info(line);
  if (pos_.lr_step != ck.state.lr_step) {
    std::snprintf(line, sizeof line,
                  "learning-rate schedule: step %lld on %lld rank%s continues as step %lld on %d (%lld steps "
                  "per epoch)",
                  (long long)ck.state.lr_step, (long long)ck.state.world_size,
                  ck.state.world_size == 1 ? "" : "s", (long long)pos_.lr_step, comm_.size(),
                  (long long)steps_per_epoch_);
    log::info(line);
  }
}

Trainer::Agreed Trainer::poll() {
  // One all-reduce of two numbers per step: a signal seen by any rank, and rank 0's
  // clock for the time cadence (so that every rank takes the same decision).
  const double minutes = cfg_.io.checkpoint_every_minutes;
  double flags[2] = {
      preemption_signal() != 0 ? 1.0 : 0.0,
      comm_.rank() == 0 && minutes > 0 && now() - last_checkpoint_time_ >= minutes * 60.0 ? 1.0 : 0.0};
  comm_.allreduce_sum_host(flags, 2);
  Agreed a;
  a.preempt = flags[0] > 0;
  a.time_due = flags[1] > 0;
  return a;
}

std::string Trainer::finish_background() {
  if (!background_.busy()) return "";
  const BackgroundCheckpoint::Outcome o = background_.finish();
  if (o.error.empty()) {
    char line[512];
    std::snprintf(line, sizeof line,
                  "checkpoint %s on disk (%.1f MB in %.1f s, written while the ranks trained on: "
                  "io.checkpoint_async)",
                  o.path.c_str(), double(o.bytes) / 1e6, o.seconds);
    log::info(line);
  }
  return o.error;
}

std::string Trainer::checkpoint(bool in_background) {
  std::string path, error;
  pos_.step = step_;
  pos_.world_size = comm_.size();
  pos_.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  pos_.loss_scale_clean_steps = scaler_ ? scaler_->clean_steps() : 0;
  const trace::Span span("checkpoint", "io");
  comm_.wait_device("the collectives before a checkpoint (NCCL, on the device)");  // ZeRO's all-gather
  watchdog::set_phase(Phase::checkpoint);  // the other ranks wait for rank 0 in the agreement below
  // The file holds the whole optimizer state whatever the stage: under ZeRO rank 0
  // gathers the shares first (io/checkpoint.hpp, OptimizerSnapshot).
  OptimizerSnapshot snapshot = optimizer_snapshot();
  if (comm_.rank() == 0) {
    try {
      error = finish_background();  // the one before: on disk, and its temp file not removed
      if (error.empty()) {
        auto pending = std::make_unique<PendingCheckpoint>(cfg_.io.run_dir, cfg_.io.keep_checkpoints, model_,
                                                           std::move(snapshot), pos_, run_input(cfg_),
                                                           &train_.fingerprint());
        path = pending->path();
        if (in_background)
          background_.start(std::move(pending));
        else
          pending->write();
      }
    } catch (const CheckpointWriteError& e) {
      error = e.what();
    }
  }
  // Only rank 0 knows whether it worked; a failure ends every rank together.
  double failed = error.empty() ? 0.0 : 1.0;
  comm_.allreduce_sum_host_waiting(&failed, 1);
  watchdog::set_phase(Phase::compute);
  if (failed > 0) throw CheckpointWriteError(error);  // fit() ends the job; only rank 0's has the text
  last_checkpoint_time_ = now();
  return path;
}

OptimizerSnapshot Trainer::optimizer_snapshot() {
  const bool root = comm_.rank() == 0;
  // Unsharded, rank 0 holds the whole state; the other ranks copy nothing.
  if (cfg_.comm.zero == 0) return root ? snapshot_of(*optimizer_) : OptimizerSnapshot{};
  OptimizerSnapshot snap{optimizer_->name(), optimizer_->steps(), {}};
  const ShareCounts c = share_counts(shares_.bounds, 0, shares_.bounds.back());
  for (auto& [name, view] : optimizer_->state()) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    std::vector<float> mine(host.data(), host.data() + host.extent(0));
    watchdog::Collective guard("the gather of the optimizer state's shares for a checkpoint (MPI_Gatherv)");
    std::vector<float> whole(root ? std::size_t(shares_.bounds.back()) : 0);
    MPI_CHECK(MPI_Gatherv(mine.data(), int(mine.size()), MPI_FLOAT, whole.data(), c.counts.data(),
                          c.displs.data(), MPI_FLOAT, 0, comm_.mpi_comm()));
    if (root) snap.state.emplace_back(name, std::move(whole));
  }
  return snap;
}

int Trainer::stop() {
  // Rank 0 has written the checkpoint; after this barrier every rank knows it is on
  // disk, and a SIGTERM (a launcher reacting to the first rank's exit 75) ends the
  // rank at once with 75 instead of waiting, swallowed, for the SIGKILL.
  comm_.barrier();
  exit_on_sigterm(kExitRequeue);
  return kExitRequeue;
}

int Trainer::fit(MetricsWriter* metrics, TensorBoardWriter* tb) {
  tb_ = tb;
  try {
    const int status = fit_epochs(metrics);
    close_trace();
    return status;
  } catch (const CheckpointWriteError& e) {
    // Every rank is here (checkpoint() agreed on it), past its epoch's loader thread.
    fatal_all(comm_.mpi_comm(), e.what());
  }
}

void Trainer::write_tensorboard(const EpochStats& e, std::int64_t steps, const ValStats& v, bool classify) {
  const std::int64_t step = e.step;
  tb_->scalar("epoch/train_loss", step, e.train_loss);
  if (val_) {
    tb_->scalar("epoch/val_loss", step, v.loss);
    if (v.tokens > 0) tb_->scalar("epoch/val_ppl", step, v.perplexity());
    if (classify) tb_->scalar("epoch/val_acc", step, v.accuracy);
    if (v.top5) tb_->scalar("epoch/val_acc5", step, v.accuracy5);
    if (pos_.best_step >= 0)
      tb_->scalar(std::string("epoch/best_") + best_metric_name(pos_.best_metric), step, pos_.best_value);
  }
  tb_->scalar("epoch/samples_per_s", step, e.samples_per_s);
  tb_->scalar("epoch/lr", step, e.lr);
  if (scaler_) tb_->scalar("epoch/loss_scale", step, e.loss_scale);
  // Rank 0's seconds per optimizer step of this epoch, by phase (metrics.jsonl has the sums).
  if (steps > 0) {
    const double per_step = 1.0 / double(steps);
    tb_->scalar("step_time/data_wait", step, e.data_wait_seconds * per_step);
    tb_->scalar("step_time/forward", step, e.forward_seconds * per_step);
    tb_->scalar("step_time/backward", step, e.backward_seconds * per_step);
    tb_->scalar("step_time/comm", step, e.comm_seconds * per_step);
    tb_->scalar("step_time/optimizer", step, e.optimizer_seconds * per_step);
  }
  tb_->flush();
}

// io.sample_tokens: every rank writes the same text (train/sample_text.hpp); rank 0
// prints it on one line and appends it, as it is, to run_dir/samples.txt.
void Trainer::write_sample(std::int64_t epoch) {
  const trace::Span span("sample_tokens", "validation");
  const TextSample s = sample_tokens(model_, *val_, cfg_.io.sample_tokens, cfg_.io.sample_temperature,
                                     hash64(std::uint64_t(cfg_.train.seed), std::uint64_t(epoch)), sample_x_);
  if (comm_.rank() != 0) return;
  if (!vocab_read_) {
    vocab_ = val_->vocabulary();
    vocab_read_ = true;
  }
  const std::string prompt = decode(s.prompt, vocab_), text = decode(s.continuation, vocab_);
  log::info("sample (epoch " + std::to_string(epoch) + ", " + std::to_string(s.continuation.size()) +
            " tokens after " + std::to_string(s.prompt.size()) +
            " of the validation set's first window): " + escaped(prompt) + " >>> " + escaped(text));
  std::FILE* f = std::fopen((cfg_.io.run_dir + "/samples.txt").c_str(), "ab");
  if (!f) {
    log::warn("io.sample_tokens: cannot append to " + cfg_.io.run_dir + "/samples.txt");
    return;
  }
  std::ostringstream head;
  head << "== epoch " << epoch << " (temperature " << cfg_.io.sample_temperature << ")\n";
  const std::string record = head.str() + prompt + " >>> " + text + "\n";
  std::fwrite(record.data(), 1, record.size(), f);
  std::fclose(f);
}

void Trainer::log_epoch(const EpochStats& e, const ValStats& v, double val_seconds) {
  const bool classify = loss_kind_ == LossKind::CrossEntropy;
  char line[320];
  int len = std::snprintf(line, sizeof line, "epoch %lld/%d  step %lld  train_loss %.4f", (long long)e.epoch,
                          cfg_.train.epochs, (long long)e.step, e.train_loss);
  if (val_) len += std::snprintf(line + len, sizeof line - len, "%s", validation_text(v, classify).c_str());
  len += std::snprintf(line + len, sizeof line - len, "  samples/s %.0f  time %.2f s", e.samples_per_s,
                       e.train_seconds + val_seconds);
  if (scaler_) len += std::snprintf(line + len, sizeof line - len, "  loss_scale %g", e.loss_scale);
  if (scaler_ || cfg_.train.nonfinite == "skip")
    len += std::snprintf(line + len, sizeof line - len, "  skipped %lld", (long long)e.skipped_steps);
  if (cfg_.train.clip_grad_norm > 0)
    len += std::snprintf(line + len, sizeof line - len, "  grad_norm %.4g  clipped %lld", e.grad_norm(),
                         (long long)e.clipped_steps);
  std::snprintf(line + len, sizeof line - len, "  eta run %s",
                duration_text(eta_.run_left(pos_.epoch, pos_.consumed)).c_str());
  log::info(line);
}

double ValStats::perplexity() const { return std::exp(loss); }

void append_validation(MetricRecord& r, const ValStats& v, bool classify) {
  r.push_back({"val_loss", v.loss});
  if (v.tokens > 0) r.push_back({"val_ppl", v.perplexity()});
  if (classify) r.push_back({"val_acc", v.accuracy});
  if (classify) r.push_back({"val_correct", (long long)v.correct});
  if (v.top5) r.push_back({"val_acc5", v.accuracy5});
  if (v.top5) r.push_back({"val_correct5", (long long)v.correct5});
  r.push_back({"val_count", (long long)v.count});
  if (v.tokens > 0) r.push_back({"val_tokens", (long long)v.tokens});
}

std::string validation_text(const ValStats& v, bool classify) {
  char text[128];
  int len = std::snprintf(text, sizeof text, "  val_loss %.4f", v.loss);
  if (v.tokens > 0) len += std::snprintf(text + len, sizeof text - len, "  val_ppl %.3f", v.perplexity());
  if (classify) len += std::snprintf(text + len, sizeof text - len, "  val_acc %.4f", v.accuracy);
  if (v.top5) std::snprintf(text + len, sizeof text - len, "  val_acc5 %.4f", v.accuracy5);
  return text;
}

void Trainer::write_metrics(MetricsWriter& metrics, const EpochStats& e, const ValStats& v,
                            double val_seconds) {
  const bool classify = loss_kind_ == LossKind::CrossEntropy;
  MetricRecord r = {{"epoch", (long long)e.epoch}, {"step", (long long)e.step}, {"train_loss", e.train_loss}};
  if (val_) append_validation(r, v, classify);
  if (pos_.best_step >= 0) {  // io.keep_best: the best so far, this epoch's included
    r.push_back({std::string("best_") + best_metric_name(pos_.best_metric), pos_.best_value});
    r.push_back({"best_epoch", (long long)pos_.best_epoch});
  }
  r.push_back({"samples_per_s", e.samples_per_s});
  r.push_back({"train_seconds", e.train_seconds});
  r.push_back({"val_seconds", val_seconds});
  r.push_back({"data_wait_seconds", e.data_wait_seconds});
  r.push_back({"forward_seconds", e.forward_seconds});
  r.push_back({"backward_seconds", e.backward_seconds});
  r.push_back({"comm_seconds", e.comm_seconds});
  r.push_back({"optimizer_seconds", e.optimizer_seconds});
  r.push_back({"lr", e.lr});
  r.push_back({"world_size", (long long)comm_.size()});
  if (scaler_) r.push_back({"loss_scale", e.loss_scale});
  if (scaler_ || cfg_.train.nonfinite == "skip") r.push_back({"skipped_steps", (long long)e.skipped_steps});
  if (cfg_.train.clip_grad_norm > 0) {
    r.push_back({"grad_norm", e.grad_norm()});
    r.push_back({"clipped_steps", (long long)e.clipped_steps});
  }
  metrics.write(r);
}

bool Trainer::record_best(const ValStats& v) {
  if (pos_.best_metric == 0) return false;
  const std::string metric = best_metric_name(pos_.best_metric);
  const bool lower = metric == "val_loss";
  const double value = metric_value(v, metric);
  if (!std::isfinite(value)) return false;
  // train.patience's reference: improved on by more than train.min_delta, as Keras's
  // EarlyStopping (current - min_delta > best, or current + min_delta < best for a loss).
  const double delta = cfg_.train.min_delta;
  if (pos_.best_step < 0 ||
      (lower ? value + delta < pos_.patience_value : value - delta > pos_.patience_value)) {
    pos_.patience_value = value;
    pos_.patience_epoch = pos_.epoch;
  }
  // A tie keeps the earlier epoch, as PyTorch's ImageNet example (acc1 > best_acc1).
  if (pos_.best_step >= 0 && !(lower ? value < pos_.best_value : value > pos_.best_value)) return false;
  pos_.best_value = value;
  pos_.best_step = step_;
  pos_.best_epoch = pos_.epoch;
  return true;
}

std::string Trainer::reduce_on_plateau(const ValStats& v) {
  const TrainConfig& t = cfg_.train;
  const double before = pos_.plateau_lr;
  const std::int64_t bad =
      plateau_step(pos_, t, metric_value(v, t.plateau_metric), t.plateau_metric == "val_loss");
  if (bad == 0) return "";
  char line[512];
  std::snprintf(
      line, sizeof line,
      "plateau: lr %.6g -> %.6g from epoch %lld: %s has not improved on %.4f (epoch %lld) by more than "
      "%g of it for %lld epochs (train.plateau_patience = %d)",
      before, pos_.plateau_lr, (long long)pos_.epoch + 1, t.plateau_metric.c_str(), pos_.plateau_best,
      (long long)pos_.plateau_epoch, t.plateau_threshold, (long long)bad, t.plateau_patience);
  return line;
}

int Trainer::fit_epochs(MetricsWriter* metrics) {
  const bool classify = loss_kind_ == LossKind::CrossEntropy;
  const IoConfig& io = cfg_.io;
  const bool scheduled =
      io.checkpoint_every > 0 || io.checkpoint_every_steps > 0 || io.checkpoint_every_minutes > 0;
  last_checkpoint_time_ = now();
  const std::string done = nothing_to_train(pos_, cfg_);
  if (!done.empty()) {
    log::info("nothing to train: " + done);
    return 0;
  }
  while (pos_.epoch < cfg_.train.epochs) {
    Agreed last_step;
    const std::int64_t first_step = step_;
    const EpochStats e = run_epoch(true, &last_step);
    if (!e.complete) return stop();
    ValStats v;
    double val_seconds = 0.0;
    if (val_) {
      const double t0 = now();
      v = validate(*val_);
      val_seconds = now() - t0;
      eta_.validated(val_seconds);
    }
    const bool best = val_ && record_best(v);  // before the records, which carry the best so far
    const std::string plateau = val_ && cfg_.train.schedule == "plateau" ? reduce_on_plateau(v) : "";
    log_epoch(e, v, val_seconds);
    if (val_ && cfg_.io.sample_tokens > 0) write_sample(e.epoch);
    if (!plateau.empty()) log::info(plateau);
    if (metrics) write_metrics(*metrics, e, v, val_seconds);
    if (tb_) write_tensorboard(e, e.step - first_step, v, classify);

    // A signal that came during validation counts too.
    const Agreed now_flags = poll();
    const bool preempt = last_step.preempt || now_flags.preempt;
    const bool early =
        stopped_early(pos_, cfg_.train.patience);  // train.patience: this epoch is the run's last
    const bool last = pos_.epoch >= cfg_.train.epochs || early;
    const bool due =
        best || (scheduled && ((io.checkpoint_every > 0 && e.epoch % io.checkpoint_every == 0) ||
                               last_step.step_due || last_step.time_due || now_flags.time_due || last));
    if (due || (preempt && !last)) {
      const std::string problem = unsafe_to_save();
      if (!problem.empty()) fatal_all(comm_.mpi_comm(), problem);
      // The last checkpoint, and a preemption's, are on disk before the run ends.
      const std::string path = checkpoint(io.checkpoint_async && !last && !preempt);
      if (best) {
        char line[512];
        std::snprintf(line, sizeof line, "best: %s %.4f at epoch %lld is the best so far; %s names %s",
                      io.keep_best.c_str(), pos_.best_value, (long long)e.epoch,
                      best_link(io.run_dir).c_str(), checkpoint_name(step_).c_str());
        log::info(line);
      }
      if (preempt && !last) {
        char line[512];
        std::snprintf(line, sizeof line, "preempted: checkpoint %s written at step %lld; exit %d for requeue",
                      path.c_str(), (long long)step_, kExitRequeue);
        log::info(line);
        return stop();
      }
    }
    if (early) {
      log::info("early stop: " + early_stop_text(pos_, cfg_) + "; " + best_link(io.run_dir) + " names " +
                checkpoint_name(pos_.best_step));
      return 0;
    }
  }
  return 0;
}

}  // namespace ddp
