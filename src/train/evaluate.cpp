#include "train/evaluate.hpp"

#include <cstdio>
#include <string>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "comm/watchdog.hpp"
#include "io/metrics.hpp"
#include "train/checkpointing.hpp"
#include "train/setup.hpp"
#include "train/trainer.hpp"
#include "train/trainer_internal.hpp"

namespace ddp {

namespace {

// Why there is nothing to evaluate. Only 'auto' without a usable checkpoint in the run
// directory, or 'never', come here, and only with io.init_from empty: a path named
// there or in io.resume either loads or is an error line of its own first.
std::string no_checkpoint(const IoConfig& io) {
  const std::string where = io.resume == "never"
                                ? "io.resume = 'never'"
                                : "io.run_dir '" + io.run_dir + "' holds no usable checkpoint";
  return "--evaluate: no checkpoint to evaluate: " + where +
         " and io.init_from is empty; name one with io.resume=<checkpoint.h5> or "
         "io.init_from=<checkpoint.h5>";
}

}  // namespace

int evaluate_run(const Context& ctx, const Config& cfg) {
  if (cfg.data.val_files.empty())
    fatal_all(ctx.world(),
              "--evaluate measures the validation set, and data.val_files is empty: set it to the shards to "
              "evaluate (data.val_files=<glob>)");
  log::info(input_banner(ctx, cfg, "--evaluate"));
  Data data = open_data(ctx, cfg, /*training=*/false);
  ModelSetup net = build_model(ctx, cfg, data);
  auto comm = make_communicator(ctx, cfg);
  // Weights alone (no optimizer named: any optimizer's checkpoint), not checked
  // against the training data: an evaluation trains on nothing.
  bool weights_only = false;
  const auto ck = find_start_checkpoint(ctx.world(), cfg, *net.model, "", &weights_only, nullptr);
  if (!ck) fatal_all(ctx.world(), no_checkpoint(cfg.io));
  Trainer trainer(cfg, *comm, *net.model, net.loss, *data.train, data.val.get(), data.prefetch_batches,
                  Trainer::Use::evaluation);
  trainer.load_weights(*ck);

  const double t0 = trainer_detail::now();
  const ValStats v = trainer.validate(*data.val);
  const double seconds = trainer_detail::now() - t0;
  watchdog::set_phase(Phase::done);
  if (ctx.rank() != 0) return 0;

  const bool classify = net.loss == LossKind::CrossEntropy;
  const bool trained = ck->state.step > 0;  // a ddp_train checkpoint, not an imported file
  char line[512];
  int len = std::snprintf(line, sizeof line, "evaluation of %s", ck->path.c_str());
  // TrainingState::epoch: epochs done at an epoch's end, else the 0-based one in progress.
  const bool epoch_end = ck->state.consumed == 0;
  if (trained && epoch_end)
    len += std::snprintf(line + len, sizeof line - len, " (epoch %lld, step %lld)",
                         (long long)ck->state.epoch, (long long)ck->state.step);
  else if (trained)
    len += std::snprintf(line + len, sizeof line - len, " (step %lld, in epoch %lld)",
                         (long long)ck->state.step, (long long)ck->state.epoch + 1);
  std::snprintf(line + len, sizeof line - len, " on %lld samples:%s  time %.2f s", (long long)v.count,
                validation_text(v, classify).c_str() + 1, seconds);  // one space after the colon
  log::info(line);

  MetricRecord r = {{"checkpoint", ck->path}};
  if (trained && epoch_end) r.push_back({"epoch", (long long)ck->state.epoch});
  if (trained) r.push_back({"step", (long long)ck->state.step});
  append_validation(r, v, classify);
  r.push_back({"val_seconds", seconds});
  r.push_back({"world_size", (long long)ctx.size()});
  log::info("evaluation: " + to_json_line(r));
  return 0;
}

}  // namespace ddp
