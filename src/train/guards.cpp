#include "train/guards.hpp"

#include <algorithm>
#include <map>

#include "comm/check.hpp"
#include "comm/log.hpp"
#include "comm/watchdog.hpp"
#include "model/rng.hpp"

namespace ddp {

std::int64_t count_nonfinite(ConstView1 v) {
  std::int64_t bad = 0;
  Kokkos::parallel_reduce(
      "guards::count_nonfinite", Range(0, v.extent(0)),
      KOKKOS_LAMBDA(std::size_t i, std::int64_t & acc) {
        const float x = v(i);
        // x - x is 0 for a finite x and NaN for inf or NaN; no <cmath> on the device.
        if (!(x - x == 0.0f)) ++acc;
      },
      bad);
  return bad;
}

std::vector<std::uint64_t> tensor_hashes(ConstView1 flat, const std::vector<Model::ParamEntry>& table) {
  std::vector<std::uint64_t> hashes;
  hashes.reserve(table.size());
  for (const Model::ParamEntry& e : table) {
    const std::int64_t offset = e.offset;
    std::uint64_t h = 0;
    // A sum (mod 2^64) of one hash per (position, bits): any reduction order gives
    // the same value, so a CPU and a GPU rank holding the same tensor agree.
    Kokkos::parallel_reduce(
        "guards::tensor_hash", Range(0, std::size_t(e.size)),
        KOKKOS_LAMBDA(std::size_t i, std::uint64_t & acc) {
          union {
            float f;
            std::uint32_t u;
          } bits;
          bits.f = flat(std::size_t(offset) + i);
          acc += hash64(std::uint64_t(bits.u), std::uint64_t(i));
        },
        h);
    hashes.push_back(h);
  }
  return hashes;
}

std::string parameters_disagree(MPI_Comm comm, const Model& model, std::int64_t step) {
  const std::vector<Model::ParamEntry>& table = model.parameter_table();
  const std::vector<std::uint64_t> mine = tensor_hashes(model.parameters(), table);
  const std::size_t n = mine.size();
  // min of h and min of ~h (= ~max of h), one all-reduce: equal everywhere iff min == max.
  std::vector<std::uint64_t> lows(2 * n);
  for (std::size_t t = 0; t < n; ++t) {
    lows[t] = mine[t];
    lows[n + t] = ~mine[t];
  }
  {
    watchdog::Collective guard("the parameter consistency check (MPI_Allreduce)");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, lows.data(), int(2 * n), MPI_UINT64_T, MPI_MIN, comm));
  }
  std::vector<std::size_t> differing;
  for (std::size_t t = 0; t < n; ++t)
    if (lows[t] != ~lows[n + t]) differing.push_back(t);
  if (differing.empty()) return "";

  // Every rank knows; name who holds what of the first differing tensor.
  int size = 1;
  MPI_Comm_size(comm, &size);
  const std::size_t first = differing.front();
  std::vector<std::uint64_t> all(std::size_t(size), 0);
  {
    watchdog::Collective guard("the parameter consistency check (MPI_Allgather)");
    MPI_CHECK(MPI_Allgather(&mine[first], 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm));
  }
  std::map<std::uint64_t, std::vector<int>> holders;
  for (int r = 0; r < size; ++r) holders[all[std::size_t(r)]].push_back(r);
  std::vector<std::vector<int>> groups;  // ranks by the version they hold, most held first
  for (auto& [h, ranks] : holders) groups.push_back(ranks);
  std::stable_sort(groups.begin(), groups.end(), [](const auto& x, const auto& y) {
    return x.size() > y.size() || (x.size() == y.size() && x[0] < y[0]);
  });
  auto ranks = [](const std::vector<int>& r) {
    return (r.size() == 1 ? "rank " : "ranks ") + log::ranks_text(r);
  };
  std::string who;
  if (groups[0].size() > groups[1].size()) {  // a majority: the others differ from it
    std::vector<int> odd;
    for (std::size_t g = 1; g < groups.size(); ++g) odd.insert(odd.end(), groups[g].begin(), groups[g].end());
    std::sort(odd.begin(), odd.end());
    who = "on " + ranks(odd) + " differs from " + ranks(groups[0]);
  } else {  // no majority to tell which is right
    who = "differs with no majority:";
    for (std::size_t g = 0; g < groups.size(); ++g) who += (g ? " vs " : " ") + ranks(groups[g]);
  }
  const std::string count = differing.size() == 1
                                ? "the only one of " + std::to_string(n) + " tensors that differs"
                                : "the first of " + std::to_string(differing.size()) + " tensors, of " +
                                      std::to_string(n) + ", that differ";
  std::string msg =
      "parameters differ between ranks at step " + std::to_string(step) + ": " + table[first].name + " (" +
      count + ") " + who +
      "; every rank should hold bitwise the same weights (a faulty node, or a non-deterministic "
      "update): the run stops before training or saving diverged replicas";
  return msg;
}

void perturb_one_parameter(Model& model) {
  const Model::ParamEntry& last = model.parameter_table().back();
  View1 params = model.parameters();
  const std::size_t at = std::size_t(last.offset);
  Kokkos::parallel_for(
      "guards::perturb_one_parameter", Range(0, 1), KOKKOS_LAMBDA(std::size_t) {
        union {
          float f;
          std::uint32_t u;
        } bits;
        bits.f = params(at);
        bits.u += 1;  // the next float away from zero (for 0: the smallest subnormal)
        params(at) = bits.f;
      });
  Kokkos::fence();
}

}  // namespace ddp
