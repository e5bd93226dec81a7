// One training step of three small models (an MLP, a CNN, a ResNet) on this build's
// compute backend, against the numbers the CPU build (oneDNN) wrote for the same
// weights and batch: the GPU build's check that cuBLAS, cuDNN and the Kokkos kernels
// on the device train as the host does. The reference file is committed
// (tests/gpu/step_reference.h5) and the CPU build checks on every run that it still
// reproduces it, so the file cannot go stale.
//
//   step_compare write FILE   the reference, from this build (the CPU build)
//   step_compare check FILE   compare; exit 0 when every tensor is within tolerance,
//                             1 when not, 77 in the GPU build without a device
//
// A step: forward (training) at batch 8, cross-entropy, backward, one SGD step with
// momentum and weight decay. Compared, each as max |got - ref| / max |ref| over the
// tensor: the logits, the mean loss, every parameter's gradient, every parameter and
// buffer (BatchNorm's running statistics) after the step.
// Tolerances: fp32 1e-5 (fp32 products both sides, no TF32: only the summation order
// differs; measured on an H100: 3.4e-6 at worst). bf16 2e-2: both sides round the
// operands to bf16 and sum in fp32, but an activation that differs in its last fp32
// bits can round to the neighbouring bf16 value (2^-8 apart) and move a relu or a
// max-pool's choice (measured: 2.8e-3 at worst; with cuDNN's own bf16 kernels,
// DDP_CUDNN_NARROW=1, which store bf16 outputs, 0.19).
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "comm/check.hpp"
#include "model/backend.hpp"
#include "model/loss.hpp"
#include "model/model.hpp"
#include "model/rng.hpp"
#include "train/config.hpp"
#include "train/optimizer.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include "cuda/device.hpp"
#endif

namespace ddp {
namespace {

struct Case {
  const char* name;
  std::vector<std::string> layers;
  Shape sample;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"mlp", {"flatten", "linear(32)", "relu", "linear(10)"}, {1, 28, 28}},
      {"cnn",
       {"conv2d(8, 3, pad=1)", "relu", "maxpool(2)", "conv2d(16, 3, pad=1)", "relu", "maxpool(2)", "flatten",
        "linear(10)"},
       {1, 28, 28}},
      {"resnet",
       {"conv2d(8, 3, pad=1, bias=false)", "batchnorm2d", "relu", "resblock(8)", "resblock(16, stride=2)",
        "globalavgpool", "flatten", "linear(10)"},
       {3, 16, 16}},
  };
  return c;
}

constexpr std::int64_t kBatch = 8;
constexpr std::uint64_t kSeed = 12345;

std::vector<float> to_host(const View1& v, std::int64_t n) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + n);
}

// Everything a step produced, by name ("logits", "grad/layers.0.weight", ...).
using Tensors = std::vector<std::pair<std::string, std::vector<float>>>;

Tensors run_step(const Case& c, Precision precision) {
  Model model(c.layers, c.sample, kSeed);
  model.set_precision(precision);
  // The batch: U(0, 1) pixels and labels from the counter-based generator, the same
  // numbers on any machine.
  const std::int64_t n = kBatch * shape_numel(c.sample);
  std::vector<float> x_host(std::size_t(n), 0.0f);
  for (std::int64_t i = 0; i < n; ++i) x_host[std::size_t(i)] = u01(hash64(kSeed + 1, std::uint64_t(i)));
  Tensor x{View1("step::x", std::size_t(n)), {kBatch}};
  for (auto d : c.sample) x.shape.push_back(d);
  Kokkos::deep_copy(x.data, Kokkos::View<const float*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                x_host.data(), x_host.size()));
  LabelView labels("step::labels", kBatch);
  auto labels_host = Kokkos::create_mirror_view(labels);
  for (std::int64_t b = 0; b < kBatch; ++b)
    labels_host(b) = std::int32_t(hash64(kSeed + 2, std::uint64_t(b)) % 10);
  Kokkos::deep_copy(labels, labels_host);

  model.zero_grad();
  const Tensor& out = model.forward(x, /*training=*/true);
  View1 loss("step::loss", kBatch), correct("step::correct", kBatch), targets;
  loss_forward(LossKind::CrossEntropy, out, labels, targets, loss, correct);
  Tensor dout;
  loss_backward(LossKind::CrossEntropy, out, labels, targets, 1.0f / float(kBatch), dout);
  Tensors t;
  t.push_back({"logits", to_host(out.data, out.numel())});
  const std::vector<float> losses = to_host(loss, kBatch);
  double mean = 0.0;
  for (float l : losses) mean += l;
  t.push_back({"loss", {float(mean / double(kBatch))}});
  model.backward(dout);

  TrainConfig cfg;
  cfg.optimizer = "sgd";
  cfg.momentum = 0.9;
  cfg.weight_decay = 5e-4;
  auto optimizer = make_optimizer(cfg, std::size_t(model.num_parameters()));
  optimizer->step(model.parameters(), model.gradients(), 0.1, 1.0f);

  const std::vector<float> grads = to_host(model.gradients(), model.num_parameters());
  const std::vector<float> params = to_host(model.parameters(), model.num_parameters());
  for (const Model::ParamEntry& p : model.parameter_table()) {
    t.push_back({"grad/" + p.name, {grads.begin() + p.offset, grads.begin() + p.offset + p.size}});
    t.push_back({"param_after/" + p.name, {params.begin() + p.offset, params.begin() + p.offset + p.size}});
  }
  const std::vector<float> buffers = to_host(model.buffers(), std::int64_t(model.buffers().extent(0)));
  for (const Model::ParamEntry& b : model.buffer_table())
    t.push_back(
        {"buffer_after/" + b.name, {buffers.begin() + b.offset, buffers.begin() + b.offset + b.size}});
  return t;
}

// "/mlp/fp32/grad/layers.1.weight": groups made on the way.
void write_dataset(hid_t file, const std::string& path, const std::vector<float>& v) {
  hid_t lcpl = H5_CHECK(H5Pcreate(H5P_LINK_CREATE));
  H5_CHECK(H5Pset_create_intermediate_group(lcpl, 1));
  const hsize_t dims[1] = {hsize_t(v.size())};
  hid_t space = H5_CHECK(H5Screate_simple(1, dims, nullptr));
  hid_t d = H5_CHECK(H5Dcreate2(file, path.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT));
  H5_CHECK(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
  H5Dclose(d);
  H5Sclose(space);
  H5Pclose(lcpl);
}

bool read_dataset(hid_t file, const std::string& path, std::vector<float>* v) {
  if (H5Lexists(file, path.c_str(), H5P_DEFAULT) <= 0) return false;
  hid_t d = H5_CHECK(H5Dopen2(file, path.c_str(), H5P_DEFAULT));
  hid_t space = H5_CHECK(H5Dget_space(d));
  v->resize(std::size_t(H5Sget_simple_extent_npoints(space)));
  H5_CHECK(H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v->data()));
  H5Sclose(space);
  H5Dclose(d);
  return true;
}

const Precision kPrecisions[] = {Precision::fp32, Precision::bf16};

int write(const std::string& path) {
  hid_t file = H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  for (const Case& c : cases())
    for (Precision p : kPrecisions)
      for (const auto& [name, values] : run_step(c, p))
        write_dataset(file, std::string("/") + c.name + "/" + precision_name(p) + "/" + name, values);
  H5Fclose(file);
  std::printf("wrote %s with %s\n", path.c_str(), compute_backend().name().c_str());
  return 0;
}

int check(const std::string& path) {
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    std::printf("FAILED: cannot open %s\n", path.c_str());
    return 1;
  }
  std::printf("step_compare on %s against %s\n", compute_backend().name().c_str(), path.c_str());
  int failures = 0;
  for (const Case& c : cases())
    for (Precision p : kPrecisions) {
      const double tol = p == Precision::fp32 ? 1e-5 : 2e-2;
      double worst = 0.0;
      std::string worst_name;
      for (const auto& [name, got] : run_step(c, p)) {
        const std::string where = std::string("/") + c.name + "/" + precision_name(p) + "/" + name;
        std::vector<float> ref;
        if (!read_dataset(file, where, &ref) || ref.size() != got.size()) {
          std::printf("FAILED: %s missing from the reference or of another size\n", where.c_str());
          ++failures;
          continue;
        }
        double diff = 0.0, scale = 0.0;
        for (std::size_t i = 0; i < ref.size(); ++i) {
          diff = std::max(diff, std::fabs(double(got[i]) - double(ref[i])));
          scale = std::max(scale, std::fabs(double(ref[i])));
        }
        const double err = scale > 0 ? diff / scale : diff;
        const bool ok = err <= tol;  // false for NaN
        if (!ok) {
          std::printf("FAILED: %-44s rel err %.3g > %.1g\n", where.c_str(), err, tol);
          ++failures;
        }
        if (!(err <= worst)) {
          worst = err;
          worst_name = name;
        }
      }
      std::printf("%-7s %-5s worst rel err %.3g (%s), tolerance %.0e\n", c.name, precision_name(p), worst,
                  worst_name.c_str(), tol);
    }
  H5Fclose(file);
  std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: step_compare write|check FILE\n");
    return 2;
  }
#if defined(KOKKOS_ENABLE_CUDA)
  std::string why;
  if (ddp::cuda::device_count(&why) == 0) {
    std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
#endif
  MPI_Init(&argc, &argv);
  Kokkos::initialize(argc, argv);
  int rc = 0;
  {
    const std::string mode = argv[1], path = argv[2];
    rc = mode == "write" ? ddp::write(path) : ddp::check(path);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
