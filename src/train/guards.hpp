#pragma once
// Checks that keep a run from training on, or saving, a state it should not:
//
// - non-finite values (train.nonfinite): counted in one reduction over a buffer
//   (the all-reduced gradients at every step, the parameters before a checkpoint);
//   the trainer agrees on the count with the step's flags and stops or skips;
// - parameters that differ between ranks (comm.check_every): in data parallelism
//   every rank applies the same update to the same weights, so they stay bitwise
//   equal; a rank that drifts (a bit flip, a non-deterministic kernel, a bug) trains
//   a different model silently. A 64-bit hash per parameter tensor, all-reduced as
//   min and max, finds it; the ranks and the first differing tensor are named.

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.hpp"
#include "model/tensor.hpp"

namespace ddp {

// inf and NaN among v(0..n); this rank only. A Kokkos reduction, read back.
std::int64_t count_nonfinite(ConstView1 v);

// One hash per entry of `table` over the float bits of `flat`, by position: equal
// tensors give equal hashes on every rank and every backend (the sum of per-element
// hashes does not depend on the reduction order); one ulp anywhere changes it.
std::vector<std::uint64_t> tensor_hashes(ConstView1 flat, const std::vector<Model::ParamEntry>& table);

// Collective over `comm`. "" when every rank holds the same parameters; otherwise,
// on every rank, the one line that says where they differ, e.g.
//   parameters differ between ranks at step 1234: layers.2.weight (the first of 1
//   differing tensors of 6) on rank 3 differs from ranks 0-2; ...
// for the caller to end the run with (fatal_all) once its threads are stopped.
std::string parameters_disagree(MPI_Comm comm, const Model& model, std::int64_t step);

// Test hook (DDP_INJECT_FAULT=perturb@rank<r>:step<s>): moves the first element of
// the last parameter tensor by one ulp, on this rank only.
void perturb_one_parameter(Model& model);

}  // namespace ddp
