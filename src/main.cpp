// ddp_train: data-parallel training on MPI ranks.
//   context -> command line -> config -> data -> model -> trainer
#include "comm/context.hpp"   // MPI + Kokkos lifetime, ranks, the fatal path for uncaught exceptions
#include "comm/watchdog.hpp"  // comm.timeout_s: a collective that never completes names the missing ranks
#include "io/metrics.hpp"     // metrics.jsonl
#include "io/tensorboard_writer.hpp"  // <run_dir>/tb: TensorBoard scalars
#include "train/command_line.hpp"     // options; --help, --version, --keys, --man print and exit
#include "train/evaluate.hpp"         // --evaluate: a checkpoint's validation metrics
#include "train/setup.hpp"            // input file, data sets, model, run directory, checkpoint to start from
#include "train/signals.hpp"          // SIGUSR1/SIGTERM: checkpoint and exit 75 for requeue
#include "train/trainer.hpp"          // the DDP loop

// No try/catch: an exception nobody catches reaches the terminate handler that
// Context installs, un-unwound, and ends the job in one line (comm/check.cpp says why).
int main(int argc, char** argv) {
  ddp::install_preemption_handlers();  // first: every thread, MPI's too, inherits the blocked signals
  ddp::Context ctx(argc, argv, ddp::Context::Start::mpi_only);
  const ddp::CommandLine cli = ddp::parse_command_line(ctx, argc, argv);
  if (cli.exit_now) return cli.exit_code;  // before Kokkos: --help needs no GPU
  ctx.start_kokkos(argc, argv);            // the rank's GPU; --kokkos-* options
  const ddp::Config cfg = ddp::load_config(ctx, cli);
  if (cli.check) return ddp::check_run(ctx, cfg);
  ddp::Watchdog watchdog(ctx.world(), cfg.comm.timeout_s, ctx.thread_multiple());  // names a rank that hangs
  if (cli.evaluate) return ddp::evaluate_run(ctx, cfg);  // a checkpoint, no training
  const ddp::RunDirLock run_dir_lock = ddp::prepare_run_dir(ctx, cfg);             // one run at a time in it
  ddp::Data data = ddp::open_data(ctx, cfg);
  ddp::ModelSetup net = ddp::build_model(ctx, cfg, data);
  auto comm = ddp::make_communicator(ctx, cfg);
  ddp::Trainer trainer(cfg, *comm, *net.model, net.loss, *data.train, data.val.get(), data.prefetch_batches);
  ddp::start_from_checkpoint(ctx, cfg, *net.model, data, trainer);
  ddp::MetricsWriter metrics(cfg.io.run_dir, ctx.rank() == 0, trainer.step());  // records after it set aside
  ddp::TensorBoardWriter tb(cfg.io.run_dir, ctx.rank() == 0 && cfg.io.tensorboard, trainer.step());
  const int code = trainer.fit(&metrics, &tb);  // 0, or 75 (EX_TEMPFAIL) after a preemption: requeue
  ddp::watchdog::set_phase(ddp::Phase::done);   // what is left: closing the data files, freeing
  return code;
}
