#include "train/checkpointing.hpp"

#include <Kokkos_Core.hpp>

namespace ddp {

RunInput run_input(const Config& cfg) {
  return RunInput{cfg.to_namelist(), cfg.source_path, cfg.source_text};
}

ResumeOptions resume_options(const IoConfig& io) {
  return ResumeOptions{io.resume, io.run_dir, io.init_from, io.allow_data_change};
}

OptimizerSnapshot snapshot_of(Optimizer& optimizer) {
  OptimizerSnapshot snap{optimizer.name(), optimizer.steps(), {}};
  for (auto& [name, view] : optimizer.state()) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
    snap.state.emplace_back(name, std::vector<float>(host.data(), host.data() + host.extent(0)));
  }
  return snap;
}

std::string save_checkpoint(const std::string& run_dir, int keep, const Model& model, Optimizer& optimizer,
                            const TrainingState& state, const Config& cfg, const DataFingerprint* data) {
  return save_checkpoint(run_dir, keep, model, snapshot_of(optimizer), state, run_input(cfg), data);
}

std::optional<Checkpoint> find_start_checkpoint(MPI_Comm comm, const Config& cfg, const Model& model,
                                                const std::string& optimizer, bool* weights_only,
                                                const DataFingerprint* data,
                                                const std::vector<std::int64_t>* shares, bool values) {
  return find_start_checkpoint(comm, resume_options(cfg.io), model, optimizer, weights_only, data, shares,
                               values);
}

}  // namespace ddp
