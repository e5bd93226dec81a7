// The DDP step after backward (train/trainer.hpp): the gradients reduced over the
// ranks, the step's health and flags agreed on in one all-reduce, the optimizer step
// or its skip; and the one line that ends a run whose step went non-finite.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "comm/check.hpp"
#include "comm/fault_injection.hpp"
#include "comm/log.hpp"
#include "comm/trace.hpp"
#include "comm/watchdog.hpp"
#include "train/clip.hpp"
#include "train/guards.hpp"
#include "train/schedule.hpp"
#include "train/signals.hpp"
#include "train/trainer.hpp"
#include "train/trainer_internal.hpp"

namespace ddp {

using trainer_detail::now;

namespace {

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
// step's loss sum acc(2) is not finite, into `count`: one reduction, so one wait for
// the device per step. (With the loss read apart, two waits, the MLP on one H100 ran
// at a median 181,300 samples/s against 191,843 before the check; with one, 191,265.)
// Queued, not waited for, on a GPU: the host waits in the communicator's wait_device.
constexpr std::int64_t kLossNonfinite = std::int64_t(1) << 48;
template <class Count>
void count_step_nonfinite(const View1& grads, const Kokkos::View<double[3]>& acc, const Count& count_out) {
  const std::size_t n = grads.extent(0);
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
      count_out);
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

void Trainer::reduce_gradients() {
  View1 grads = model_.gradients();
  const trace::Span span(reducer_ ? "all-reduce wait" : "all-reduce", "comm");
  if (reducer_) {
    reducer_->finish();  // the buckets started during backward; waits for the rest
  } else if (cfg_.comm.zero == 2) {
    comm_.reduce_scatter_shares(grads.data(), shares_.bounds);
  } else {
    comm_.allreduce_sum(grads.data(), std::size_t(model_.num_parameters()));
  }
  if (span.on()) Kokkos::fence();
}

Trainer::Agreed Trainer::agree_on_step(double inv) {
  View1 grads = model_.gradients();
  const std::int64_t n = model_.num_parameters();
  // The step's health: the all-reduce spreads an inf or NaN of any rank's gradients to
  // every rank; a rank's loss sum is its own. With the preemption and time flags,
  // and rank 0's checkpoint writer's state, agreed in one all-reduce, so every rank
  // takes the same decision.
  // A reducer that counted the non-finite sums as it made them leaves only the loss.
  // ZeRO stage 2: a rank holds the sums of its share only; it counts there, and the
  // counts are added in the flags' all-reduce below.
  const bool scattered = cfg_.comm.zero == 2;
  const Shares::Part mine = scattered ? shares_.part(comm_.rank()) : Shares::Part{0, n};
  const std::int64_t summed = reducer_ ? reducer_->nonfinite_sums() : -1;
  count_step_nonfinite(
      summed >= 0 ? View1()
      : scattered
          ? View1(Kokkos::subview(grads, std::make_pair(std::size_t(mine.begin), std::size_t(mine.end))))
          : grads,
      loss_acc_, step_nonfinite_);
  // The host's first wait on the step's collectives: a rank that never sends its
  // gradients is named here, by the watchdog, on NCCL as on MPI.
  comm_.wait_device("the step's gradient reduction (NCCL, on the device)");
  ExecSpace().fence();  // the compute stream's kernels alone: NCCL's are done
  const std::int64_t bad = step_nonfinite_() + (summed >= 0 ? summed : 0);
  grads_nonfinite_ = bad % kLossNonfinite;
  loss_nonfinite_ = bad >= kLossNonfinite;
  // train.clip_grad_norm: the total norm of the averaged gradients (g * inv), here so
  // that a non-finite norm counts as a non-finite gradient (stop, skip, or fp16's
  // backoff). Summed by blocks (train/clip.hpp): every rank holding the reduced
  // gradients sums them all, the same bits with no collective; at stage 2 each sums
  // its share's blocks, and the flags' all-reduce below carries them (one rank's sum
  // plus zeros: exact).
  const bool clip = cfg_.train.clip_grad_norm > 0.0;
  std::vector<double> blocks;
  if (clip) blocks = grad_block_sums(grads, mine.begin, mine.end, float(inv), clip_sums_);
  const double minutes = cfg_.io.checkpoint_every_minutes;
  constexpr std::size_t kFlags = 6;
  std::vector<double> flags = {
      grads_nonfinite_ > 0 ? 1.0 : 0.0,
      loss_nonfinite_ ? 1.0 : 0.0,
      preemption_signal() != 0 ? 1.0 : 0.0,
      comm_.rank() == 0 && minutes > 0 && now() - last_checkpoint_time_ >= minutes * 60.0 ? 1.0 : 0.0,
      double(grads_nonfinite_),
      comm_.rank() == 0 ? double(background_.state()) : 0.0};
  if (clip && scattered) {
    flags.resize(kFlags + std::size_t((n + kShareAlign - 1) / kShareAlign), 0.0);
    std::copy(blocks.begin(), blocks.end(),
              flags.begin() + std::ptrdiff_t(kFlags + mine.begin / kShareAlign));
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
  a.written = BackgroundCheckpoint::State(int(flags[5]));
  a.stepped = !a.nonfinite;
  return a;
}

void Trainer::take_step(double step_scale, EpochStats& stats) {
  // Clipping folds into the optimizer's one multiply, g * float(inv * coef), where
  // PyTorch rounds twice, float(float(g * inv) * coef): at most an ulp of the
  // gradient apart (6e-8 relative), below the 1e-6 its comparison asks, and no pass
  // over the buffer. A coefficient of 1 leaves the scale, and the step, bitwise as
  // without clipping.
  if (cfg_.train.clip_grad_norm > 0.0) {
    const double coef = clip_coefficient(grad_norm_, cfg_.train.clip_grad_norm);
    step_scale = step_scale * coef;
    stats.grad_norm_sum += grad_norm_;
    ++stats.grad_norm_steps;
    stats.clipped_steps += coef < 1.0;
  }
  const double lr = learning_rate(cfg_.train, pos_.lr_step, steps_per_epoch_, pos_.plateau_lr);
  optimizer_->step(model_.parameters(), model_.gradients(), lr, float(step_scale));
  // ZeRO: each rank updated its share; every rank needs every share for the next step.
  // On one node through the reducer's shared window, else the communicator.
  if (cfg_.comm.zero > 0) {
    float* params = model_.parameters().data();
    if (!(reducer_ && reducer_->allgather_shares(params, shares_.bounds)))
      comm_.allgather_shares(params, shares_.bounds);
  }
}

Trainer::Agreed Trainer::reduce_and_step(std::int64_t samples_per_rank, bool reduced, EpochStats& stats) {
  // Gradients hold per-sample sums; after the all-reduce they are divided by the
  // global sample count of this step, so W ranks with batch B match one rank with
  // batch W*B (every rank has the same batch sizes: the sampler pads).
  const double t0 = now();
  if (!reduced) reduce_gradients();
  const double t1 = now();
  std::optional<trace::Span> checks(std::in_place, "step checks", "step");
  stats.comm_seconds += t1 - t0;
  // Gradients hold per-sample sums (times fp16's loss scale): g * inv is the averaged,
  // unscaled gradient PyTorch holds after backward (and GradScaler's unscale_).
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const double inv = 1.0 / (double(samples_per_rank) * comm_.size() * loss_scale);
  Agreed a = agree_on_step(inv);
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
    take_step(inv, stats);
  } else if (++stats.skipped_steps == 1 && !scaler_ && comm_.rank() == 0) {
    log::warn("step " + std::to_string(step_ + 1) + " of epoch " + std::to_string(pos_.epoch + 1) +
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

std::string Trainer::data_changed() {
  std::string problem;
  if (comm_.rank() == 0) {
    const watchdog::During looking(Phase::data);  // a stat(2) a file; the others wait for it
    if (!train_.preloaded()) problem = train_.changed_in_place();
    if (problem.empty() && val_ && !val_->preloaded()) problem = val_->changed_in_place();
  }
  double changed = problem.empty() ? 0.0 : 1.0;
  comm_.allreduce_sum_host_waiting(&changed, 1);
  if (changed > 0 && problem.empty()) problem = "rank 0 found a data file written over in place";
  return problem;
}

std::string Trainer::unsafe_to_save() {
  if (std::string changed = data_changed(); !changed.empty()) return changed;
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

}  // namespace ddp
