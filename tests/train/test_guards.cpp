// The run's guards (src/train/guards.hpp): non-finite values counted, and the
// parameter hashes that find a rank whose weights differ, by one ulp, anywhere.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "train/guards.hpp"

namespace {

using ddp::Model;
using ddp::View1;

View1 device_copy(const std::vector<float>& v) {
  View1 out("test::values", v.size());
  auto host = Kokkos::create_mirror_view(out);
  for (std::size_t i = 0; i < v.size(); ++i) host(i) = v[i];
  Kokkos::deep_copy(out, host);
  return out;
}

float next_up(float x) { return std::nextafter(x, std::numeric_limits<float>::infinity()); }

Model small_model(std::uint64_t seed) { return Model({"linear(5)", "relu", "linear(3)"}, {4}, seed); }

// Sets parameter i of `model` to v on this rank (host round trip).
void set_parameter(Model& model, std::size_t i, float v) {
  auto host = Kokkos::create_mirror_view(model.parameters());
  Kokkos::deep_copy(host, model.parameters());
  host(i) = v;
  Kokkos::deep_copy(model.parameters(), host);
}

float get_parameter(const Model& model, std::size_t i) {
  auto host = Kokkos::create_mirror_view(model.parameters());
  Kokkos::deep_copy(host, model.parameters());
  return host(i);
}

TEST(Guards, CountsInfAndNanOnly) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float tiny = std::numeric_limits<float>::denorm_min(), big = std::numeric_limits<float>::max();
  EXPECT_EQ(ddp::count_nonfinite(device_copy({1.0f, -0.0f, tiny, big, -big})), 0);
  EXPECT_EQ(ddp::count_nonfinite(device_copy({1.0f, nan, inf, 2.0f, -inf, -nan})), 4);
  EXPECT_EQ(ddp::count_nonfinite(device_copy({})), 0);
}

TEST(Guards, HashesSeeOneUlpAndPositionAndSign) {
  const Model model = small_model(7);
  const auto& table = model.parameter_table();
  ASSERT_EQ(table.size(), 4u);
  const std::vector<std::uint64_t> base = ddp::tensor_hashes(model.parameters(), table);
  // The same bits, another buffer: the same hashes.
  Model same = small_model(7);
  EXPECT_EQ(ddp::tensor_hashes(same.parameters(), table), base);

  // One ulp in the middle of layers.0.weight: that tensor's hash only.
  Model moved = small_model(7);
  const std::size_t at = std::size_t(table[0].offset + 7);
  set_parameter(moved, at, next_up(get_parameter(moved, at)));
  std::vector<std::uint64_t> h = ddp::tensor_hashes(moved.parameters(), table);
  EXPECT_NE(h[0], base[0]);
  for (std::size_t t = 1; t < table.size(); ++t) EXPECT_EQ(h[t], base[t]) << table[t].name;

  // Two elements swapped: the same multiset of values, another tensor.
  Model swapped = small_model(7);
  const std::size_t a = std::size_t(table[2].offset), b = a + 1;
  const float va = get_parameter(swapped, a), vb = get_parameter(swapped, b);
  ASSERT_NE(va, vb);
  set_parameter(swapped, a, vb);
  set_parameter(swapped, b, va);
  h = ddp::tensor_hashes(swapped.parameters(), table);
  EXPECT_NE(h[2], base[2]);

  // 0.0 and -0.0 compare equal but are other bits: replicas must be bitwise equal.
  Model zero = small_model(7), negative_zero = small_model(7);
  set_parameter(zero, a, 0.0f);
  set_parameter(negative_zero, a, -0.0f);
  EXPECT_NE(ddp::tensor_hashes(zero.parameters(), table)[2],
            ddp::tensor_hashes(negative_zero.parameters(), table)[2]);
}

TEST(Guards, EqualReplicasAgree) {
  const Model model = small_model(3);
  EXPECT_EQ(ddp::parameters_disagree(MPI_COMM_WORLD, model, 10), "");
}

// The highest rank moves one parameter of layers.2.bias by one ulp: every rank gets
// the same line, naming that rank and that tensor.
TEST(Guards, NamesTheRankThatDiffers) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  Model model = small_model(3);
  if (rank == size - 1) ddp::perturb_one_parameter(model);
  const std::string line = ddp::parameters_disagree(MPI_COMM_WORLD, model, 42);
  const std::string head =
      "parameters differ between ranks at step 42: layers.2.bias (the only one of 4 tensors that differs) ";
  // Two ranks: no majority tells which one is right.
  const std::string who = size == 2   ? "differs with no majority: rank 0 vs rank 1;"
                          : size == 3 ? "on rank 2 differs from ranks 0,1;"
                                      : "on rank " + std::to_string(size - 1) + " differs from ranks 0-" +
                                            std::to_string(size - 2) + ";";
  EXPECT_EQ(line.rfind(head + who, 0), 0u) << line;
}

}  // namespace
