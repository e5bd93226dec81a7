// SyncBatchNorm across ranks: W ranks holding B samples each give the outputs,
// summed parameter gradients and running statistics of one rank holding all W*B.

#include <gtest/gtest.h>
#include <mpi.h>

#include "comm/communicator.hpp"
#include "comm/compute_communicator.hpp"
#include "conv_stats.hpp"
#include "layer_fixture.hpp"
#include "model/model.hpp"

namespace ddp {
namespace {

using test::make_tensor;
using test::random_values;
using test::to_host;

// conv_sums: the rank's model on a backend whose convolutions write the sums of their
// output (conv_stats.hpp), which the residual block's batch norms then all-reduce
// instead of their own, and the data gradient after bn1 brings that batch norm's backward
// sums, which it all-reduces likewise; the one-rank answer takes its own. Whether they
// did: into *made and *dgrads.
void expect_ranks_equal_one_big_batch(bool conv_sums, int* made = nullptr, int* dgrads = nullptr) {
  std::unique_ptr<Communicator> comm = make_compute_communicator(MPI_COMM_WORLD);
  const int W = comm->size(), r = comm->rank();
  const std::int64_t B = 3;
  const Shape sample = {2, 5, 5};
  const std::int64_t per_sample = shape_numel(sample);
  const std::vector<std::string> specs = {
      "conv2d(4, 3, pad=1)", "batchnorm2d(sync)", "relu",     "resblock(4, sync)",
      "globalavgpool",       "flatten",           "linear(3)"};
  // Every rank builds the same global batch and its one-rank answer.
  const std::vector<float> x_all = random_values(W * B * per_sample, 5), dy_all = random_values(W * B * 3, 6);
  Model full(specs, sample, 7);
  const Tensor& y_full_t = full.forward(make_tensor({W * B, 2, 5, 5}, x_all), true);
  std::vector<float> y_full = to_host(y_full_t.data, y_full_t.numel());
  full.backward(make_tensor({W * B, 3}, dy_all));
  std::vector<float> g_full = to_host(full.gradients(), full.num_parameters());
  std::vector<float> buf_full = to_host(full.buffers(), full.buffers().extent(0));

  // This rank's share, statistics synchronised through the communicator.
  std::unique_ptr<test::UseStatsBackend> stats;
  if (conv_sums) stats = std::make_unique<test::UseStatsBackend>(test::StatsMode::Emulate);
  Model m(specs, sample, 7);
  m.set_communicator(comm.get());
  std::vector<float> x_mine(x_all.begin() + r * B * per_sample, x_all.begin() + (r + 1) * B * per_sample);
  std::vector<float> dy_mine(dy_all.begin() + r * B * 3, dy_all.begin() + (r + 1) * B * 3);
  const Tensor& y_t = m.forward(make_tensor({B, 2, 5, 5}, x_mine), true);
  std::vector<float> y = to_host(y_t.data, y_t.numel());
  m.backward(make_tensor({B, 3}, dy_mine));
  // What the trainer does with gradients, where they live (device memory on a GPU).
  comm->allreduce_sum(m.gradients().data(), std::size_t(m.num_parameters()));
  std::vector<float> g = to_host(m.gradients(), m.num_parameters());
  std::vector<float> buf = to_host(m.buffers(), m.buffers().extent(0));

  double worst = 0;
  for (std::int64_t i = 0; i < B * 3; ++i) {
    EXPECT_NEAR(y[i], y_full[r * B * 3 + i], 1e-5) << "y[" << i << "]";
    worst = std::max(worst, std::fabs(double(y[i]) - y_full[r * B * 3 + i]));
  }
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], g_full[i], 1e-5 * (1 + std::fabs(g_full[i]))) << "grad[" << i << "]";
    worst = std::max(worst, std::fabs(double(g[i]) - g_full[i]));
  }
  for (std::size_t i = 0; i < buf.size(); ++i)
    EXPECT_NEAR(buf[i], buf_full[i], 1e-5) << "buffer[" << i << "]";
  if (r == 0)
    std::cout << "  " << W << " ranks vs 1" << (conv_sums ? ", the block's sums from its convolutions" : "")
              << ": max abs difference " << worst << "\n";
  if (made) *made = stats ? stats->calls().made : 0;
  if (dgrads) *dgrads = stats ? stats->calls().dgrads : 0;

  // Without a communicator the same layers normalise per rank: the outputs differ.
  if (W > 1 && !conv_sums) {
    Model plain(specs, sample, 7);
    const Tensor& yp = plain.forward(make_tensor({B, 2, 5, 5}, x_mine), true);
    std::vector<float> y_plain = to_host(yp.data, yp.numel());
    double diff = 0;
    for (std::int64_t i = 0; i < B * 3; ++i) diff = std::max(diff, std::fabs(double(y_plain[i]) - y[i]));
    EXPECT_GT(diff, 1e-4);
  }
}

TEST(SyncBatchNorm, RanksTogetherEqualOneBigBatch) { expect_ranks_equal_one_big_batch(false); }

// The residual block's batch norms on its convolutions' sums (ConvKernels::
// forward_stats), all-reduced with the count, and bn1's backward on the sums conv2's
// data gradient wrote (ConvKernels::backward_data_sums): the same one big batch. In the
// CPU build, whose oneDNN has no such pass, the sums of the test's stand-in.
TEST(SyncBatchNorm, RanksTogetherEqualOneBigBatchOnTheConvolutionsSums) {
  if (compute_backend().device_memory()) GTEST_SKIP() << "the stand-in sums on the host";
  int made = 0, dgrads = 0;
  expect_ranks_equal_one_big_batch(true, &made, &dgrads);
  EXPECT_EQ(made, 2) << "the block's two convolutions did not write the sums";
  EXPECT_EQ(dgrads, 1) << "conv2's data gradient did not bring bn1's backward sums";
}

}  // namespace
}  // namespace ddp
