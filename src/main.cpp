// ddp_train: data-parallel training on MPI ranks.
//   context -> command line -> config -> data -> model -> trainer
#include "comm/communicator.hpp"  // collectives between ranks
#include "comm/context.hpp"       // MPI + Kokkos lifetime, ranks
#include "io/metrics.hpp"         // metrics.jsonl
#include "train/setup.hpp"        // input file, data sets, model, run directory
#include "train/trainer.hpp"      // the DDP loop

int main(int argc, char** argv) {
  ddp::Context ctx(argc, argv);
  const ddp::CommandLine cli = ddp::parse_command_line(ctx, argc, argv);
  if (cli.exit_now) return cli.exit_code;
  const ddp::Config cfg = ddp::load_config(ctx, cli);
  ddp::prepare_run_dir(ctx, cfg);
  ddp::Data data = ddp::open_data(ctx, cfg);
  ddp::ModelSetup net = ddp::build_model(ctx, cfg, data);
  auto comm = ddp::make_mpi_communicator(ctx.world());
  ddp::Trainer trainer(cfg, *comm, *net.model, net.loss, *data.train, data.val.get(), data.prefetch_batches);
  ddp::MetricsWriter metrics(cfg.io.run_dir, ctx.rank() == 0);
  trainer.fit(&metrics);
  return 0;
}
