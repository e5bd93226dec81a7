#include "train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <utility>

#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/json.hpp"
#include "comm/log.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"
#include "io/sampler.hpp"
#include "model/rng.hpp"
#include "train/clip.hpp"
#include "train/guards.hpp"
#include "train/schedule.hpp"
#include "train/signals.hpp"

namespace ddp {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// acc(2) += the sum of loss[0..n) in double, in index order, on the device: the
// host reads it once per step, with the step's non-finite check after the gradient
// all-reduce, so the micro-batches' kernels queue without waiting for the GPU.
void accumulate_loss(const View1& loss, std::int64_t n, const Kokkos::View<double[3]>& acc) {
  Kokkos::parallel_for(
      "Trainer::accumulate_loss", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int) {
        double s = 0.0;
        for (std::int64_t i = 0; i < n; ++i) s += double(loss(i));
        acc(2) += s;
      });
}

// The step's sum acc(2) joins the epoch's and the window's when the step was taken;
// a skipped step's (maybe inf or NaN) is dropped.
void close_step_loss(const Kokkos::View<double[3]>& acc, bool taken) {
  Kokkos::parallel_for(
      "Trainer::close_step_loss", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int) {
        if (taken) {
          acc(0) += acc(2);
          acc(1) += acc(2);
        }
        acc(2) = 0.0;
      });
}

// The non-finite values of the reduced gradients, plus kLossNonfinite when the
// step's loss sum acc(2) is not finite: one reduction, so one wait for the device
// per step. (With the loss read apart, two waits, the MLP on one H100 ran at a
// median 181,300 samples/s against 191,843 before the check; with one, 191,265.)
constexpr std::int64_t kLossNonfinite = std::int64_t(1) << 48;
std::int64_t count_step_nonfinite(const View1& grads, const Kokkos::View<double[3]>& acc) {
  const std::size_t n = grads.extent(0);
  std::int64_t bad = 0;
  // x - x is 0 for a finite x and NaN for inf or NaN; no <cmath> on the device. A
  // team per chunk of gradients, its vector lanes over them, so that the host's loop
  // vectorises: a reduction over single elements ran scalar, 0.3 ms of the MLP's 3.5
  // ms step (io.trace, 2 ranks on the AVX2 EPYC). Small chunks on a GPU, for blocks.
  using Team = Kokkos::TeamPolicy<ExecSpace>;
#if defined(KOKKOS_ENABLE_CUDA)
  constexpr std::size_t kChunk = 256;
#else
  constexpr std::size_t kChunk = 4096;
#endif
  const int lanes = Team::vector_length_max() < 32 ? Team::vector_length_max() : 32;
  // At least one team: it checks the loss, with no gradients to count in a model without parameters.
  Kokkos::parallel_reduce(
      "Trainer::count_step_nonfinite", Team(n > 0 ? int((n + kChunk - 1) / kChunk) : 1, 1, lanes),
      KOKKOS_LAMBDA(const Team::member_type& team, std::int64_t& count) {
        const std::size_t begin = team.league_rank() * kChunk, end = begin + kChunk < n ? begin + kChunk : n;
        std::int64_t chunk = 0;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(team, begin, end),
            [&](std::size_t i, std::int64_t& c) {
              const float g = grads(i);
              c += !(g - g == 0.0f);
            },
            chunk);
        Kokkos::single(Kokkos::PerTeam(team), [&] {
          count += chunk;
          const double loss = acc(2);
          if (team.league_rank() == 0 && !(loss - loss == 0.0)) count += kLossNonfinite;
        });
      },
      bad);
  return bad;
}

// Test hook (DDP_INJECT_FAULT=nan_gradient): v(0) = NaN, on the device.
void poison_first(const View1& v) {
  Kokkos::parallel_for(
      "Trainer::poison_first", Kokkos::RangePolicy<ExecSpace>(0, 1), KOKKOS_LAMBDA(int) {
        const float zero = v(0) * 0.0f;
        v(0) = zero / zero;  // 0/0: NaN without <cmath> on the device
      });
}

// (epoch, window, step) sums so far; resets the window's when asked.
std::array<double, 3> read_loss(const Kokkos::View<double[3]>& acc, bool reset_window) {
  auto host = Kokkos::create_mirror_view(acc);
  Kokkos::deep_copy(host, acc);
  // Read before the reset: on the host the mirror is `acc` itself.
  const std::array<double, 3> sums = {host(0), host(1), host(2)};
  if (reset_window) {
    host(1) = 0.0;
    Kokkos::deep_copy(acc, host);
  }
  return sums;
}

// "a.h5 rows 3, 9; b.h5 row 4 (global samples 3, 9, 44)": at most 8 samples named.
std::string samples_text(const ShardDataset& data, const std::vector<std::int64_t>& global) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> by_file;
  std::string ids;
  const std::size_t shown = std::min<std::size_t>(global.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) {
    auto [path, row] = data.locate(global[i]);
    if (by_file.empty() || by_file.back().first != path) by_file.push_back({path, {}});
    by_file.back().second.push_back(row);
    ids += (i ? ", " : "") + std::to_string(global[i]);
  }
  std::string out;
  for (const auto& [path, rows] : by_file) {
    out += (out.empty() ? "" : "; ") + path + (rows.size() == 1 ? " row " : " rows ");
    for (std::size_t i = 0; i < rows.size(); ++i) out += (i ? ", " : "") + std::to_string(rows[i]);
  }
  out += " (global sample" + std::string(shown == 1 ? " " : "s ") + ids + ")";
  if (global.size() > shown) out += " and " + std::to_string(global.size() - shown) + " more";
  return out;
}

}  // namespace

Trainer::Trainer(const Config& cfg, Communicator& comm, Model& model, LossKind loss, ShardDataset& train,
                 ShardDataset* val, int prefetch_batches)
    : cfg_(cfg),
      comm_(comm),
      model_(model),
      loss_kind_(loss),
      train_(train),
      val_(val),
      prefetch_(prefetch_batches),
      transform_(make_image_transform(cfg.data, std::uint64_t(cfg.train.seed), train, val)),
      stage_(cfg.train.batch_size, shape_numel(model_input_shape(train, transform_.get())),
             train.has_class_labels(), train.target_numel(),
             transform_ ? std::max(train.sample_numel(), val ? val->sample_numel() : 0) : 0) {
  const std::int64_t n_params = model_.num_parameters();
  std::vector<ParamRange> no_decay;  // train.decay_norm_and_bias = F: batch norms' gamma and beta, biases
  if (!cfg_.train.decay_norm_and_bias)
    for (const Model::ParamEntry& e : model_.parameter_table())
      if (e.shape.size() == 1) no_decay.push_back({e.offset, e.size});
  // comm.zero >= 1: this rank keeps optimizer state for its share of the flat buffer.
  if (cfg_.comm.zero > 0) shares_ = Shares::split(n_params, comm_.size());
  const ParamRange owned = cfg_.comm.zero > 0
                               ? ParamRange{shares_.begin(comm_.rank()), shares_.size(comm_.rank())}
                               : ParamRange{0, -1};
  optimizer_ = make_optimizer(cfg_.train, std::size_t(n_params), no_decay, owned);

  const Precision precision = parse_precision(cfg_.train.precision);
  model_.set_precision(precision);
  if (precision == Precision::fp16) {
    LossScalerOptions o;
    o.init_scale = cfg_.train.loss_scale;
    o.growth_interval = cfg_.train.loss_scale_growth_interval;
    scaler_ = std::make_unique<LossScaler>(o);
  }

  // Every rank starts from rank 0's weights, as DDP does at construction.
  comm_.broadcast(model_.parameters().data(), std::size_t(n_params), 0);
  model_.set_communicator(&comm_);  // SyncBatchNorm's statistics
  if (cfg_.comm.overlap != "none" && comm_.size() > 1) {
    std::vector<std::pair<std::int64_t, std::int64_t>> tensors;
    for (const Model::ParamEntry& p : model_.parameter_table()) tensors.push_back({p.offset, p.size});
    reducer_ = comm_.make_bucket_reducer(
        model_.gradients().data(), plan_buckets(tensors, cfg_.comm.bucket_mb, cfg_.comm.first_bucket_mb),
        cfg_.comm.overlap, cfg_.comm.shared_memory,
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
  log::info("memory per rank: " + memory_plan().text(cfg_.train.batch_size));
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

  const DistributedSampler sampler(train_.size(), comm_.size(), comm_.rank(), cfg_.data.shuffle,
                                   std::uint64_t(cfg_.train.seed), cfg_.data.drop_last);
  const std::int64_t B = cfg_.train.batch_size;
  const std::int64_t batches = (sampler.num_samples() + B - 1) / B;
  steps_per_epoch_ = (batches + cfg_.train.accumulation_steps - 1) / cfg_.train.accumulation_steps;
  epoch_positions_ = sampler.total_size();
  eta_ = RunEta(cfg_.train.epochs, epoch_positions_, val_ ? val_->size() : 0);

  loss_ = View1("Trainer::loss", std::size_t(B));
  loss_acc_ = Kokkos::View<double[3]>("Trainer::loss_acc");
  correct_ = View1("Trainer::correct", std::size_t(B));
  dout_.data = View1("Trainer::dout", std::size_t(B * shape_numel(model_.output_shape())));
  if (cfg_.io.trace) open_trace();
}

std::string MemoryPlan::text(std::int64_t batch) const {
  const auto bytes = [](std::int64_t b) {
    char t[64];
    std::snprintf(t, sizeof t, "%.2f MB (%lld B)", double(b) / (1024.0 * 1024.0), (long long)b);
    return std::string(t);
  };
  return "parameters " + bytes(parameters) + ", gradients " + bytes(gradients) + ", optimizer state " +
         bytes(optimizer_state) + ", activations " + bytes(activations) + " (planned at batch " +
         std::to_string(batch) + ": layer outputs and the gradients between layers), in all " +
         bytes(total());
}

MemoryPlan Trainer::memory_plan() const {
  MemoryPlan m;
  m.parameters = m.gradients = 4 * model_.num_parameters();
  for (const auto& state : optimizer_->state()) m.optimizer_state += 4 * std::int64_t(state.second.extent(0));
  m.activations = 4 * model_.activation_floats(cfg_.train.batch_size);
  return m;
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
  const std::string meta =
      "\"world_size\": " + std::to_string(comm_.size()) + ", \"host\": " + json_string(host) +
      ", \"backend\": " + json_string(cfg_.comm.backend) +
      ", \"overlap\": " + json_string(cfg_.comm.overlap) +
      ", \"batch_size\": " + std::to_string(cfg_.train.batch_size) +
      ", \"precision\": " + json_string(cfg_.train.precision) + ", \"layers\": [" + layers + "]";
  trace::open(comm_.mpi_comm(), path, cfg_.io.trace_steps[0], cfg_.io.trace_steps[1],
              "rank " + std::to_string(comm_.rank()) + " (" + host + ")", meta);
  if (!reducer_) return;
  // A bucket's row says which tensors it carries, "all-reduce bucket 0: layers.6.bias
  // (40 B)", "all-reduce bucket 1: layers.0-4 (1.27 MB)": buckets are contiguous
  // ranges of whole tensors.
  const auto& table = model_.parameter_table();
  const auto& buckets = reducer_->buckets();
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<const Model::ParamEntry*> in;
    for (const Model::ParamEntry& p : table)
      if (p.offset >= buckets[b].begin && p.offset < buckets[b].end) in.push_back(&p);
    if (in.empty()) continue;
    const auto layer = [](const std::string& name) { return name.substr(0, name.rfind('.')); };  // "layers.4"
    const std::string first = layer(in.front()->name), last = layer(in.back()->name);
    std::string tensors = in.size() == 1  ? in.front()->name
                          : first == last ? first
                                          : first + "-" + last.substr(last.find('.') + 1);
    const double bytes = double(buckets[b].end - buckets[b].begin) * 4.0;
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

Trainer::Agreed Trainer::reduce_and_step(std::int64_t samples_per_rank, EpochStats& stats) {
  View1 grads = model_.gradients();
  const std::int64_t n = model_.num_parameters();
  // Gradients hold per-sample sums; after the all-reduce they are divided by the
  // global sample count of this step, so W ranks with batch B match one rank with
  // batch W*B (every rank has the same batch sizes: the sampler pads).
  const double t0 = now();
  {
    const trace::Span span(reducer_ ? "all-reduce wait" : "all-reduce", "comm");
    if (reducer_) {
      reducer_->finish();  // the buckets started during backward; waits for the rest
    } else if (cfg_.comm.zero == 2) {
      comm_.reduce_scatter_shares(grads.data(), shares_.bounds);
    } else {
      comm_.allreduce_sum(grads.data(), std::size_t(n));
    }
    if (span.on()) Kokkos::fence();
  }
  const double t1 = now();
  std::optional<trace::Span> checks(std::in_place, "step checks", "step");
  stats.comm_seconds += t1 - t0;
  // The step's health: the all-reduce spreads an inf or NaN of any rank's gradients to
  // every rank; a rank's loss sum is its own. With the preemption and time flags,
  // agreed in one all-reduce of four numbers, so every rank takes the same decision.
  // A reducer that counted the non-finite sums as it made them leaves only the loss.
  // ZeRO stage 2: a rank holds the sums of its share only; it counts there, and the
  // counts are added in the flags' all-reduce below.
  const bool scattered = cfg_.comm.zero == 2;
  const Shares::Part mine = scattered ? shares_.part(comm_.rank()) : Shares::Part{0, n};
  const std::int64_t summed = reducer_ ? reducer_->nonfinite_sums() : -1;
  const std::int64_t bad =
      summed >= 0 ? summed + count_step_nonfinite(View1(), loss_acc_)
                  : count_step_nonfinite(
                        scattered ? View1(Kokkos::subview(grads, std::make_pair(std::size_t(mine.begin),
                                                                                std::size_t(mine.end))))
                                  : grads,
                        loss_acc_);
  grads_nonfinite_ = bad % kLossNonfinite;
  loss_nonfinite_ = bad >= kLossNonfinite;
  // Gradients hold per-sample sums (times fp16's loss scale): g * inv is the averaged,
  // unscaled gradient PyTorch holds after backward (and GradScaler's unscale_).
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const double inv = 1.0 / (double(samples_per_rank) * comm_.size() * loss_scale);
  // train.clip_grad_norm: the total norm of those gradients, here so that a non-finite
  // norm counts as a non-finite gradient (stop, skip, or fp16's backoff). Summed by
  // blocks (train/clip.hpp): every rank holding the reduced gradients sums them all,
  // the same bits with no collective; at stage 2 each sums its share's blocks, and
  // the flags' all-reduce below carries them (one rank's sum plus zeros: exact).
  const bool clip = cfg_.train.clip_grad_norm > 0.0;
  std::vector<double> blocks;
  if (clip) blocks = grad_block_sums(grads, mine.begin, mine.end, float(inv));
  const double minutes = cfg_.io.checkpoint_every_minutes;
  constexpr std::size_t kFlags = 5;
  std::vector<double> flags = {
      grads_nonfinite_ > 0 ? 1.0 : 0.0, loss_nonfinite_ ? 1.0 : 0.0, preemption_signal() != 0 ? 1.0 : 0.0,
      comm_.rank() == 0 && minutes > 0 && now() - last_checkpoint_time_ >= minutes * 60.0 ? 1.0 : 0.0,
      double(grads_nonfinite_)};
  if (clip && scattered) {
    flags.resize(kFlags + std::size_t((n + kShareAlign - 1) / kShareAlign), 0.0);
    std::copy(blocks.begin(), blocks.end(), flags.begin() + std::ptrdiff_t(kFlags + mine.begin / kShareAlign));
  }
  comm_.allreduce_sum_host(flags.data(), flags.size());
  if (scattered && summed < 0) grads_nonfinite_ = std::int64_t(flags[4]);  // every share's count
  if (clip) {
    if (scattered) blocks.assign(flags.begin() + kFlags, flags.end());
    grad_norm_ = std::sqrt(sum_in_order(blocks));
  }
  norm_nonfinite_ = clip && !std::isfinite(grad_norm_);
  Agreed a;
  a.nonfinite = flags[0] > 0 || flags[1] > 0 || norm_nonfinite_;
  a.preempt = flags[2] > 0;
  a.time_due = flags[3] > 0;
  a.stepped = !a.nonfinite;
  checks.reset();
  const trace::Span span("optimizer", "optimizer");
  // fp16: the loss gradient was multiplied by the scale; an overflow is the loss
  // scaler's to handle: skip and halve. fp32, bf16: train.nonfinite.
  if (scaler_) {
    scaler_->update(a.nonfinite);
  } else if (a.nonfinite) {
    // Skipping helps only while the weights are finite (the same on every rank).
    params_nonfinite_ = cfg_.train.nonfinite == "skip" ? count_nonfinite(model_.parameters()) : 0;
    a.stop = cfg_.train.nonfinite == "stop" || params_nonfinite_ > 0;
    if (a.stop) return a;  // run_epoch ends the run once its loader is stopped
  }
  if (a.stepped) {
    // Clipping folds into the optimizer's one multiply, g * float(inv * coef), where
    // PyTorch rounds twice, float(float(g * inv) * coef): at most an ulp of the
    // gradient apart (6e-8 relative), below the 1e-6 its comparison asks, and no pass
    // over the buffer. A coefficient of 1 leaves the scale, and the step, bitwise as
    // without clipping.
    double step_scale = inv;
    if (clip) {
      const double coef = clip_coefficient(grad_norm_, cfg_.train.clip_grad_norm);
      step_scale = inv * coef;
      stats.grad_norm_sum += grad_norm_;
      ++stats.grad_norm_steps;
      stats.clipped_steps += coef < 1.0;
    }
    const double lr = learning_rate(cfg_.train, pos_.lr_step, steps_per_epoch_);
    optimizer_->step(model_.parameters(), grads, lr, float(step_scale));
    // ZeRO: each rank updated its share; every rank needs every share for the next step.
    // On one node through the reducer's shared window, else the communicator.
    if (cfg_.comm.zero > 0) {
      float* params = model_.parameters().data();
      if (!(reducer_ && reducer_->allgather_shares(params, shares_.bounds)))
        comm_.allgather_shares(params, shares_.bounds);
    }
  } else {
    if (++stats.skipped_steps == 1 && !scaler_ && comm_.rank() == 0)
      log::warn(
          "step " + std::to_string(step_ + 1) + " of epoch " + std::to_string(pos_.epoch + 1) +
          " skipped: a non-finite loss or gradient (train.nonfinite = 'skip'); the epoch line counts the "
          "skipped steps");
  }
  close_step_loss(loss_acc_, a.stepped);
  if (span.on()) Kokkos::fence();
  step_indices_.clear();
  stats.optimizer_seconds += now() - t1;
  ++step_;
  pos_.step = step_;
  ++pos_.lr_step;
  watchdog::set_step(step_);
  if (inject_fault(FaultSite::parameters, step_)) perturb_one_parameter(model_);  // tests only
  return a;
}

void Trainer::stop_nonfinite() {
  const MPI_Comm comm = comm_.mpi_comm();
  const std::string where =
      "at step " + std::to_string(step_ + 1) + " of epoch " + std::to_string(pos_.epoch + 1);
  const std::string tail =
      "; stopped without writing a checkpoint (train.nonfinite = 'stop'; 'skip' skips such steps)";
  if (params_nonfinite_ > 0)  // 'skip', and the weights themselves went non-finite: the same on every rank
    fatal_all(comm, "non-finite loss or gradient " + where + " and " + std::to_string(params_nonfinite_) +
                        " non-finite parameters: skipping steps cannot recover (lower train.lr); stopped "
                        "without writing a checkpoint");
  // A batch with non-finite inputs (or float targets) is the cause: read this rank's
  // samples of the step again and name those.
  const std::int64_t n = std::int64_t(step_indices_.size());
  const std::int64_t numel = train_.sample_numel(), tnumel = train_.target_numel();
  std::vector<float> x(std::size_t(n * numel)),
      targets(train_.has_class_labels() ? 0 : std::size_t(n * tnumel));
  train_.read(step_indices_.data(), n, x.data(), nullptr, targets.empty() ? nullptr : targets.data());
  std::vector<std::int64_t> bad_inputs;
  for (std::int64_t i = 0; i < n; ++i) {
    bool bad = false;
    for (std::int64_t k = 0; k < numel && !bad; ++k) bad = !std::isfinite(x[std::size_t(i * numel + k)]);
    for (std::int64_t k = 0; k < tnumel && !bad && !targets.empty(); ++k)
      bad = !std::isfinite(targets[std::size_t(i * tnumel + k)]);
    if (bad) bad_inputs.push_back(step_indices_[std::size_t(i)]);
  }
  fatal_if_any(comm, !bad_inputs.empty(),
               "non-finite loss " + where + ": the batch holds non-finite inputs: " +
                   (bad_inputs.empty() ? "" : samples_text(train_, bad_inputs)) + tail);
  // Finite inputs and a non-finite loss: the model has diverged.
  fatal_if_any(comm, loss_nonfinite_,
               "non-finite loss " + where + " on finite inputs (the step's " + std::to_string(n) +
                   " samples of this rank): the model has diverged (lower train.lr, or add warm-up)" + tail);
  // train.clip_grad_norm: the norm is named too (non-finite exactly when some value is).
  char norm[48] = "";
  if (cfg_.train.clip_grad_norm > 0) std::snprintf(norm, sizeof norm, "; total gradient norm %g", grad_norm_);
  fatal_all(comm, "non-finite gradient " + where + " (" + std::to_string(grads_nonfinite_) + " values" +
                      norm + ") while every rank's loss is finite: the model has diverged (lower train.lr)" +
                      tail);
}

std::string Trainer::unsafe_to_save() {
  // Equal parameters first: then every rank counts the same non-finite values and
  // they agree without another collective.
  std::string problem = parameters_disagree(comm_.mpi_comm(), model_, step_);
  if (!problem.empty()) return problem;
  const std::int64_t bad = count_nonfinite(model_.parameters());
  if (bad > 0)
    return "the parameters hold " + std::to_string(bad) + " non-finite values at step " +
           std::to_string(step_) + ": no checkpoint written from them (the last one stays latest)";
  return "";
}

void Trainer::restore(const Checkpoint& ck, bool weights_only) {
  using HostIn = Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  Kokkos::deep_copy(model_.parameters(), HostIn(ck.parameters.data(), ck.parameters.size()));
  if (!ck.buffers.empty()) Kokkos::deep_copy(model_.buffers(), HostIn(ck.buffers.data(), ck.buffers.size()));
  if (weights_only) {
    log::info("initialised from " + ck.path + " (weights only; a new run)");
    return;
  }
  for (auto& state : optimizer_->state()) {
    const std::string& name = state.first;
    auto it = std::find_if(ck.optimizer_state.begin(), ck.optimizer_state.end(),
                           [&](const auto& e) { return e.first == name; });
    if (it == ck.optimizer_state.end()) DDP_FATAL("checkpoint " << ck.path << " has no /optimizer/" << name);
    // The file holds the whole state; under ZeRO this rank takes its share of it.
    const Optimizer::Range owned = optimizer_->owned();
    DDP_REQUIRE(std::int64_t(it->second.size()) >= owned.offset + owned.size,
                "checkpoint " << ck.path << ": /optimizer/" << name << " holds " << it->second.size()
                              << " values");
    Kokkos::deep_copy(state.second, HostIn(it->second.data() + owned.offset, std::size_t(owned.size)));
  }
  optimizer_->set_steps(ck.optimizer_steps);
  if (scaler_ && ck.state.loss_scale > 0)
    scaler_->restore(ck.state.loss_scale, int(ck.state.loss_scale_clean_steps));
  step_ = ck.state.step;
  pos_ = ck.state;
  pos_.world_size = comm_.size();
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

std::string Trainer::checkpoint() {
  std::string path, error;
  pos_.step = step_;
  pos_.world_size = comm_.size();
  pos_.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  pos_.loss_scale_clean_steps = scaler_ ? scaler_->clean_steps() : 0;
  const trace::Span span("checkpoint", "io");
  watchdog::set_phase(Phase::checkpoint);  // the other ranks wait for rank 0 in the agreement below
  // The file holds the whole optimizer state whatever the stage: under ZeRO rank 0
  // gathers the shares first (io/checkpoint.hpp, OptimizerSnapshot).
  const OptimizerSnapshot snapshot = optimizer_snapshot();
  if (comm_.rank() == 0) {
    try {
      path = save_checkpoint(cfg_.io.run_dir, cfg_.io.keep_checkpoints, model_, snapshot, pos_, cfg_,
                             &train_.fingerprint());
    } catch (const CheckpointWriteError& e) {
      error = e.what();
    }
  }
  // Only rank 0 knows whether it worked; a failure ends every rank together.
  double failed = error.empty() ? 0.0 : 1.0;
  comm_.allreduce_sum_host(&failed, 1);
  watchdog::set_phase(Phase::compute);
  if (failed > 0) throw CheckpointWriteError(error);  // fit() ends the job; only rank 0's has the text
  last_checkpoint_time_ = now();
  return path;
}

OptimizerSnapshot Trainer::optimizer_snapshot() {
  OptimizerSnapshot snap{optimizer_->name(), optimizer_->steps(), {}};
  const bool root = comm_.rank() == 0;
  const ShareCounts c =
      cfg_.comm.zero > 0 ? share_counts(shares_.bounds, 0, shares_.bounds.back()) : ShareCounts{};
  for (auto& [name, view] : optimizer_->state()) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    std::vector<float> mine(host.data(), host.data() + host.extent(0));
    if (cfg_.comm.zero == 0) {
      if (root) snap.state.emplace_back(name, std::move(mine));
      continue;
    }
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

EpochStats Trainer::train_epoch(std::int64_t epoch) {
  pos_.epoch = epoch;
  pos_.consumed = 0;
  pos_.epoch_loss_sum = 0.0;
  pos_.epoch_samples = 0.0;
  return run_epoch(false, nullptr);
}

EpochStats Trainer::run_epoch(bool checkpoints, Agreed* pending) {
  const std::int64_t epoch = pos_.epoch;
  const std::int64_t start = pos_.consumed;
  const int W = comm_.size();
  // Stopped before a run ends on an error: its prefetch thread must not be in HDF5
  // while the ranks leave through MPI_Finalize.
  auto loader = std::make_unique<BatchLoader>(
      train_,
      epoch_indices(train_.size(), W, comm_.rank(), cfg_.data.shuffle, std::uint64_t(pos_.seed),
                    cfg_.data.drop_last, epoch, start),
      cfg_.train.batch_size, prefetch_, /*keep_uint8=*/transform_ != nullptr);
  // The epoch and the global indices key each sample's draws: the same augmented
  // sample on any number of ranks and after a resume.
  const BatchTransform augment{transform_.get(), image_shape(train_), epoch, /*training=*/true};
  const BatchTransform* const bt = transform_ ? &augment : nullptr;
  const std::int64_t batches = loader->num_batches();
  const int accumulation = cfg_.train.accumulation_steps;

  // Debug trace: the global indices this rank trains, one per line, appended.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> trace(nullptr, std::fclose);
  if (cfg_.io.trace_samples) {
    const std::string path = cfg_.io.run_dir + "/samples_rank" + std::to_string(comm_.rank()) + "_epoch" +
                             std::to_string(epoch + 1) + ".txt";
    trace.reset(std::fopen(path.c_str(), "a"));
    if (!trace) DDP_FATAL("io.trace_samples: cannot open '" << path << "'");
  }
  // The epoch's training loss so far, from the checkpoint this run resumed from
  // (a global sum, counted once, on rank 0).
  const double prior_loss = comm_.rank() == 0 ? pos_.epoch_loss_sum : 0.0;
  const double prior_samples = comm_.rank() == 0 ? pos_.epoch_samples : 0.0;

  const double t0 = now();
  // The span since the last progress line (or the epoch's start): its samples/s, and
  // the rate behind the time left.
  double mark = t0;
  std::int64_t mark_consumed = start;
  Kokkos::deep_copy(loss_acc_, 0.0);
  // Samples trained (samples/s), and those of the steps taken (the loss's mean).
  std::int64_t samples = 0, loss_samples = 0, window_samples = 0, group_samples = 0;
  int micro = 0;
  bool stopped = false, nonfinite = false;
  std::string problem;  // a collective error found mid-epoch, reported once the loader is stopped
  Batch batch, next;
  model_.zero_grad();
  step_indices_.clear();
  EpochStats stats;
  // One batch ahead: batch b+1 is put before step b's kernels are queued, so on a GPU
  // its copy runs beside them; slot b is released once all of step b is queued.
  watchdog::set_phase(Phase::data);
  trace_step_start();
  int slot = -1, next_slot = -1;
  {
    const trace::Span span("data wait", "data");
    slot = loader->next(batch) ? stage_.put(batch, bt) : -1;
  }
  for (std::int64_t b = 0; slot >= 0; ++b, slot = next_slot, std::swap(batch, next)) {
    if (micro == 0 && b > 0) trace_step_start();
    use_inputs(slot, batch);
    watchdog::set_phase(Phase::data);
    {
      const trace::Span span("data wait", "data");
      next_slot = loader->next(next) ? stage_.put(next, bt) : -1;
    }
    watchdog::set_phase(Phase::compute);
    inject_fault(FaultSite::train_step, step_);  // tests only: DDP_INJECT_FAULT
    inject_step_delay();                          // tests only: DDP_TEST_STEP_DELAY_US
    const double t_forward = now();
    model_.reseed_dropout(hash64(dropout_key_, std::uint64_t(pos_.dropout_position++)));
    // One span after the other (emplace ends the previous one first); no heap on the hot path.
    std::optional<trace::Span> span(std::in_place, "forward", "forward");
    const Tensor& out = model_.forward(x_, /*training=*/true);
    span.emplace("loss", "forward");
    const float smoothing = static_cast<float>(cfg_.train.label_smoothing);
    loss_forward(loss_kind_, out, labels_, targets_, loss_, correct_, smoothing);
    accumulate_loss(loss_, batch.size, loss_acc_);
    const double t_backward = now();
    dout_.shape = out.shape;
    // Per-sample sums, scaled at the step; fp16 multiplies by the loss scale first.
    loss_backward(loss_kind_, out, labels_, targets_, scaler_ ? scaler_->scale() : 1.0f, dout_, smoothing);
    if (inject_fault(FaultSite::loss_gradient, step_)) poison_first(dout_.data);  // tests only
    if (span->on()) Kokkos::fence();
    span.emplace("backward", "backward");
    // Gradient accumulation: only the last micro-step of a group talks to the
    // other ranks; its buckets start as backward completes them.
    const bool last_micro = micro + 1 >= accumulation || b + 1 == batches;
    if (reducer_ && last_micro) {
      model_.backward(dout_, [this](std::int64_t offset) { reducer_->mark_ready(offset); });
    } else {
      model_.backward(dout_);
    }
    span.reset();
    stage_.release(slot);
    stats.forward_seconds += t_backward - t_forward;
    stats.backward_seconds += now() - t_backward;
    samples += batch.size;
    group_samples += batch.size;
    step_indices_.insert(step_indices_.end(), batch.index.begin(), batch.index.begin() + batch.size);
    if (trace)
      for (std::int64_t i = 0; i < batch.size; ++i)
        std::fprintf(trace.get(), "%lld\n", (long long)batch.index[i]);
    if (++micro < accumulation && b + 1 < batches) continue;
    Agreed a = reduce_and_step(group_samples, stats);
    if (a.stop) {
      nonfinite = true;
      break;
    }
    if (a.stepped) {
      loss_samples += group_samples;
      window_samples += group_samples;
    }
    model_.zero_grad();  // nothing to wait for: the next backward writes the gradients
    if (trace_step_begin_ >= 0 && trace::recording())
      trace::record(
          "step " + std::to_string(step_), "step", trace::kMainRow, trace_step_begin_, trace::now_ns(),
          "\"epoch\": " + std::to_string(epoch + 1) + ", \"samples\": " + std::to_string(group_samples));
    trace_step_begin_ = -1;
    group_samples = 0;
    micro = 0;
    // Every rank trains the same number of samples: positions of the global order done.
    pos_.consumed = start + samples * W;
    if (cfg_.comm.check_every > 0 && step_ % cfg_.comm.check_every == 0) {
      problem = parameters_disagree(comm_.mpi_comm(), model_, step_);
      if (!problem.empty()) break;
    }
    if (cfg_.train.log_every > 0 && step_ % cfg_.train.log_every == 0) {
      const double window_loss = read_loss(loss_acc_, /*reset_window=*/true)[1];
      const double t = now();
      const double span_rate = t > mark ? double(pos_.consumed - mark_consumed) / (t - mark) : 0.0;
      eta_.trained(t - mark, pos_.consumed - mark_consumed);
      mark = t;
      mark_consumed = pos_.consumed;
      const double fraction = std::clamp(double(pos_.consumed) / double(epoch_positions_), 0.0, 1.0);
      const double loss = window_loss / double(window_samples);
      const double lr = learning_rate(cfg_.train, pos_.lr_step - 1, steps_per_epoch_);
      // The last step's total gradient norm, before clipping (clip_grad_norm_'s value).
      char norm[40] = "";
      if (cfg_.train.clip_grad_norm > 0) std::snprintf(norm, sizeof norm, "  grad_norm %.4g", grad_norm_);
      char line[320];
      std::snprintf(line, sizeof line,
                    "  epoch %lld/%d %d%%  step %lld  loss %.4f (rank 0, last %lld samples)  lr %.4g%s  "
                    "samples/s %.0f  eta epoch %s, run %s",
                    (long long)epoch + 1, cfg_.train.epochs, int(std::floor(100.0 * fraction)),
                    (long long)step_, loss, (long long)window_samples, lr, norm, span_rate,
                    duration_text(eta_.epoch_left(epoch, pos_.consumed)).c_str(),
                    duration_text(eta_.run_left(epoch, pos_.consumed)).c_str());
      log::info(line);
      if (tb_) {
        tb_->scalar("train/loss", step_, loss);
        tb_->scalar("train/lr", step_, lr);
        if (cfg_.train.clip_grad_norm > 0) tb_->scalar("train/grad_norm", step_, grad_norm_);
        tb_->scalar("train/samples_per_s", step_, span_rate);
        tb_->flush();
      }
      window_samples = 0;
    }
    if (!checkpoints) continue;
    a.step_due = cfg_.io.checkpoint_every_steps > 0 && step_ % cfg_.io.checkpoint_every_steps == 0;
    if (b + 1 == batches) {  // the epoch's end: fit() checkpoints after validation
      *pending = a;
      break;
    }
    if (!(a.preempt || a.time_due || a.step_due)) continue;
    double partial[2] = {read_loss(loss_acc_, false)[0] + prior_loss, double(loss_samples) + prior_samples};
    comm_.allreduce_sum_host(partial, 2);
    pos_.epoch_loss_sum = partial[0];
    pos_.epoch_samples = partial[1];
    problem = unsafe_to_save();
    if (!problem.empty()) break;
    const std::string path = checkpoint();
    if (a.preempt) {
      stopped = true;
      char line[512];
      std::snprintf(line, sizeof line, "preempted: checkpoint %s written at step %lld; exit %d for requeue",
                    path.c_str(), (long long)step_, kExitRequeue);
      log::info(line);
      break;
    }
  }
  Kokkos::fence();  // a GPU may still be running the last step's kernels
  const double seconds = now() - t0;
  eta_.trained(t0 + seconds - mark, pos_.consumed - mark_consumed);
  stats.data_wait_seconds = loader->wait_seconds();
  loader.reset();
  if (nonfinite) stop_nonfinite();
  if (!problem.empty()) fatal_all(comm_.mpi_comm(), problem);

  double totals[3] = {read_loss(loss_acc_, false)[0] + prior_loss, double(loss_samples) + prior_samples,
                      double(samples)};
  comm_.allreduce_sum_host(totals, 3);
  stats.epoch = epoch + 1;
  stats.step = step_;
  stats.train_loss = totals[1] > 0 ? totals[0] / totals[1] : std::nan("");
  stats.train_seconds = seconds;
  stats.samples_per_s = totals[2] / seconds;
  stats.lr = learning_rate(cfg_.train, pos_.lr_step - 1, steps_per_epoch_);
  stats.loss_scale = scaler_ ? scaler_->scale() : 0.0;
  stats.complete = !stopped;
  if (!stopped) {
    pos_.epoch = epoch + 1;
    pos_.consumed = 0;
    pos_.epoch_loss_sum = 0.0;
    pos_.epoch_samples = 0.0;
  }
  return stats;
}

ValStats Trainer::validate(ShardDataset& data) {
  // The validation set is cut into chunks of batch_size consecutive samples and
  // chunk c goes to rank c % W. A sample is then always evaluated in the same
  // batch at the same position, whatever the number of ranks, and each chunk's
  // sum is formed in a fixed order: the metrics are bitwise identical for any W,
  // and no sample is padded or counted twice.
  watchdog::set_phase(Phase::validation);
  const trace::Span span("validation", "validation");
  const std::int64_t B = cfg_.train.batch_size;
  const std::int64_t n = data.size();
  const std::int64_t chunks = (n + B - 1) / B;
  std::vector<std::int64_t> indices;
  for (std::int64_t c = comm_.rank(); c < chunks; c += comm_.size())
    for (std::int64_t i = c * B; i < std::min(n, (c + 1) * B); ++i) indices.push_back(i);

  std::vector<double> chunk_sums(std::size_t(2 * chunks), 0.0);  // (loss, correct) per chunk
  BatchLoader loader(data, std::move(indices), B, prefetch_, /*keep_uint8=*/transform_ != nullptr);
  // Evaluation: the centre crop, no augmentation, the same normalize.
  const BatchTransform eval{transform_.get(), image_shape(data), 0, /*training=*/false};
  auto loss_host = Kokkos::create_mirror_view(loss_);
  auto correct_host = Kokkos::create_mirror_view(correct_);
  Batch batch;
  while (loader.next(batch)) {
    const int slot = stage_.put(batch, transform_ ? &eval : nullptr);
    use_inputs(slot, batch);
    const Tensor& out = model_.forward(x_, /*training=*/false);
    loss_forward(loss_kind_, out, labels_, targets_, loss_, correct_);
    stage_.release(slot);
    Kokkos::deep_copy(loss_host, loss_);
    Kokkos::deep_copy(correct_host, correct_);
    const std::size_t c = std::size_t(batch.index[0] / B);
    for (std::int64_t i = 0; i < batch.size; ++i) {
      chunk_sums[2 * c] += double(loss_host(i));
      chunk_sums[2 * c + 1] += double(correct_host(i));
    }
  }
  // Each chunk has one owner and zeros elsewhere, so the sum is exact.
  comm_.allreduce_sum_host(chunk_sums.data(), chunk_sums.size());
  ValStats stats;
  for (std::int64_t c = 0; c < chunks; ++c) {
    stats.loss_sum += chunk_sums[std::size_t(2 * c)];
    stats.correct += std::int64_t(chunk_sums[std::size_t(2 * c + 1)]);
  }
  stats.count = n;
  stats.loss = stats.loss_sum / double(n);
  stats.accuracy = double(stats.correct) / double(n);
  watchdog::set_phase(Phase::compute);
  return stats;
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
    if (classify) tb_->scalar("epoch/val_acc", step, v.accuracy);
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

int Trainer::fit_epochs(MetricsWriter* metrics) {
  const bool classify = loss_kind_ == LossKind::CrossEntropy;
  const IoConfig& io = cfg_.io;
  const bool scheduled =
      io.checkpoint_every > 0 || io.checkpoint_every_steps > 0 || io.checkpoint_every_minutes > 0;
  last_checkpoint_time_ = now();
  if (pos_.epoch >= cfg_.train.epochs) {
    log::info("nothing to train: the run is complete (epoch " + std::to_string(pos_.epoch) + " of " +
              std::to_string(cfg_.train.epochs) + ", step " + std::to_string(step_) +
              "); raise train.epochs to continue it, or set io.resume = 'never' for a new run");
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
    char line[256];
    int len = std::snprintf(line, sizeof line, "epoch %lld/%d  step %lld  train_loss %.4f",
                            (long long)e.epoch, cfg_.train.epochs, (long long)e.step, e.train_loss);
    if (val_) len += std::snprintf(line + len, sizeof line - len, "  val_loss %.4f", v.loss);
    if (val_ && classify) len += std::snprintf(line + len, sizeof line - len, "  val_acc %.4f", v.accuracy);
    len += std::snprintf(line + len, sizeof line - len, "  samples/s %.0f  time %.2f s", e.samples_per_s,
                         e.train_seconds + val_seconds);
    const bool skips = scaler_ || cfg_.train.nonfinite == "skip";
    if (scaler_) len += std::snprintf(line + len, sizeof line - len, "  loss_scale %g", e.loss_scale);
    if (skips)
      len += std::snprintf(line + len, sizeof line - len, "  skipped %lld", (long long)e.skipped_steps);
    const bool clip = cfg_.train.clip_grad_norm > 0;
    if (clip)
      len += std::snprintf(line + len, sizeof line - len, "  grad_norm %.4g  clipped %lld", e.grad_norm(),
                           (long long)e.clipped_steps);
    std::snprintf(line + len, sizeof line - len, "  eta run %s",
                  duration_text(eta_.run_left(pos_.epoch, pos_.consumed)).c_str());
    log::info(line);

    if (metrics) {
      MetricRecord r = {
          {"epoch", (long long)e.epoch}, {"step", (long long)e.step}, {"train_loss", e.train_loss}};
      if (val_) {
        r.push_back({"val_loss", v.loss});
        if (classify) r.push_back({"val_acc", v.accuracy});
        if (classify) r.push_back({"val_correct", (long long)v.correct});
        r.push_back({"val_count", (long long)v.count});
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
      if (skips) r.push_back({"skipped_steps", (long long)e.skipped_steps});
      if (clip) {
        r.push_back({"grad_norm", e.grad_norm()});
        r.push_back({"clipped_steps", (long long)e.clipped_steps});
      }
      metrics->write(r);
    }
    if (tb_) write_tensorboard(e, e.step - first_step, v, classify);

    // A signal that came during validation counts too.
    const Agreed now_flags = poll();
    const bool preempt = last_step.preempt || now_flags.preempt;
    const bool last = pos_.epoch >= cfg_.train.epochs;
    const bool due = scheduled && ((io.checkpoint_every > 0 && e.epoch % io.checkpoint_every == 0) ||
                                   last_step.step_due || last_step.time_due || now_flags.time_due || last);
    if (!due && !(preempt && !last)) continue;
    const std::string problem = unsafe_to_save();
    if (!problem.empty()) fatal_all(comm_.mpi_comm(), problem);
    const std::string path = checkpoint();
    if (preempt && !last) {
      std::snprintf(line, sizeof line, "preempted: checkpoint %s written at step %lld; exit %d for requeue",
                    path.c_str(), (long long)step_, kExitRequeue);
      log::info(line);
      return stop();
    }
  }
  return 0;
}

}  // namespace ddp
