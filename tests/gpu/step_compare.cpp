// One training step of four small models (an MLP, a CNN, BasicBlock and Bottleneck
// ResNets) on this build's
// compute backend, against the numbers the CPU build (oneDNN) wrote for the same
// weights and batch: the GPU build's check that cuBLAS, cuDNN and the Kokkos kernels
// on the device train as the host does. The reference file is committed
// (tests/gpu/step_reference.h5) and the CPU build checks on every run that it still
// reproduces it, so the file cannot go stale.
//
//   step_compare write FILE [CASE...]   the reference, from this build (the CPU build)
//   step_compare check FILE [CASE...]   compare; exit 0 when every tensor is within
//                                       tolerance, 1 when not, 77 in the GPU build
//                                       without a device
//   step_compare check --tf32 FILE ...  fp32 on TF32 tensor cores (train.tf32): the fp32
//                                       steps only, to the bf16 yardstick below; 77
//                                       where the backend has no TF32 (the CPU build)
//   step_compare list                   every case, one line each: name, sample shape
//                                       (C,H,W) and layers (';'-separated), tab-separated
//                                       (tests/gpu/torch_amp_gap.py builds them in PyTorch)
// CASE: the committed cases by default; resnet50_224 (ResNet-50 at 224x224, too large
// to commit) only when named.
//
// A step: forward (training) at batch 8, cross-entropy, backward, one SGD step with
// momentum and weight decay. Compared, each as max |got - ref| / max |ref| over the
// tensor: the logits, the mean loss, every parameter's gradient, every parameter and
// buffer (BatchNorm's running statistics) after the step.
// Tolerances: fp32 1e-5 (fp32 products both sides, no TF32: only the summation order
// differs; measured on an H100: 3.4e-6 at worst). bf16 2e-2: both sides round the
// operands to bf16 and sum in fp32, but an activation that differs in its last fp32
// bits can round to the neighbouring bf16 value (2^-8 apart) and move a relu or a
// max-pool's choice (measured: 2.8e-3 at worst). With cuDNN's own bf16 kernels
// (unless DDP_CUDNN_NARROW=0), which store bf16 outputs (0.19 in one tensor, measured in NCHW
// on an H100), a model with convolutions is held to twice PyTorch's own bf16-against-
// fp32 gap on it (Case::amp_forward, amp_step; tests/gpu/torch_amp_gap.py). fp32 on
// TF32 tensor cores (--tf32) is held to the same: TF32 rounds the operands to a 10-bit
// mantissa where bf16 rounds them to 7, and keeps the outputs fp32 where AMP rounds
// them too, so its step lies nearer the fp32 one than AMP's does.
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

// How a case's step is checked in one precision.
//   per_tensor: every tensor within the tolerance, as max |got - ref| / max |ref|.
//   whole_step: the forward (logits, loss) tensor by tensor, the rest on the whole step,
//     sqrt(sum |got - ref|^2 / sum |ref|^2) over every tensor: for a net deep enough that
//     a rounding moves some pre-ReLU values across zero, which moves a visible share of
//     a few weights' gradients (tests/checkpoint/resnet50_step.py measured 1e-2 in
//     single tensors between two correct float32 steps of ResNet-50).
//   skip: not run.
enum class Check { per_tensor, whole_step, skip };

struct Case {
  const char* name;
  std::vector<std::string> layers;
  Shape sample;
  Check fp32 = Check::per_tensor, bf16 = Check::per_tensor;
  // For a model with convolutions: how far PyTorch's own bf16 step (autocast) lies
  // from its fp32 step, the forward (logits, loss) and the whole step (L2), the worst
  // of 5 seeds (tests/gpu/torch_amp_gap.py, PyTorch 1.13 CPU autocast, 2026-11-26).
  double amp_forward = 0, amp_step = 0;
};

Check check_of(const Case& c, Precision p) { return p == Precision::fp32 ? c.fp32 : c.bf16; }

// ResNet-50 v1.5 (inputs/resnet50.nml's layers) for `classes` classes.
std::vector<std::string> resnet50_layers(int classes) {
  std::vector<std::string> l = {"conv2d(64, 7, stride=2, pad=3, bias=false)", "batchnorm2d", "relu",
                                "maxpool(3, stride=2, pad=1)"};
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0, width = 64; stage < 4; ++stage, width *= 2)
    for (int b = 0; b < blocks[stage]; ++b)
      l.push_back("bottleneck(" + std::to_string(width) + (stage > 0 && b == 0 ? ", stride=2)" : ")"));
  for (const char* tail : {"globalavgpool", "flatten"}) l.push_back(tail);
  l.push_back("linear(" + std::to_string(classes) + ")");
  return l;
}

// Cases run only when named on the command line: their references are too large to
// commit (ResNet-50: 25.6 M parameters, some 400 MB of tensors per precision pair), so
// a GPU session writes one with the CPU build and checks the GPU build against it.
const std::vector<Case>& named_cases() {
  // The CPU build's AMX and AVX2 kernels, both correct, at resnet50_224: fp32 logits
  // 1.6e-5 apart, the whole step 1.2e-2; bf16 logits 4.3e-2 and the whole step 0.69
  // apart: at initialisation one bf16 step of ResNet-50 is no reference for another's.
  static const std::vector<Case> c = {
      {"resnet50_224", resnet50_layers(1000), {3, 224, 224}, Check::whole_step, Check::skip}};
  return c;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"mlp", {"flatten", "linear(32)", "relu", "linear(10)"}, {1, 28, 28}},
      {"cnn",
       {"conv2d(8, 3, pad=1)", "relu", "maxpool(2)", "conv2d(16, 3, pad=1)", "relu", "maxpool(2)", "flatten",
        "linear(10)"},
       {1, 28, 28},
       Check::per_tensor,
       Check::per_tensor,
       0.0214,
       0.014},
      {"resnet",
       {"conv2d(8, 3, pad=1, bias=false)", "batchnorm2d", "relu", "resblock(8)", "resblock(16, stride=2)",
        "globalavgpool", "flatten", "linear(10)"},
       {3, 16, 16},
       Check::per_tensor,
       Check::per_tensor,
       0.013,
       0.0144},
      {"bottleneck",
       {"conv2d(16, 7, stride=2, pad=3, bias=false)", "batchnorm2d", "relu", "maxpool(3, stride=2, pad=1)",
        "bottleneck(8)", "bottleneck(8, stride=2)", "globalavgpool", "flatten", "linear(10)"},
       {3, 32, 32},
       // bf16: the sanitizer build (-O1) moved single gradients by up to 4.1e-2 from
       // the -O2 build's reference (the whole step by 2.5e-3), by rounding activations
       // to the other bf16 neighbour.
       Check::per_tensor,
       Check::whole_step,
       0.0514,
       0.0986},
  };
  return c;
}

// The committed cases, or those named (committed or not); nullptr-free.
std::vector<Case> select_cases(const std::vector<std::string>& names) {
  if (names.empty()) return cases();
  std::vector<Case> chosen;
  for (const std::string& n : names) {
    bool found = false;
    for (const auto* list : {&cases(), &named_cases()})
      for (const Case& c : *list)
        if (n == c.name) {
          chosen.push_back(c);
          found = true;
        }
    DDP_REQUIRE(found, "step_compare: no case '" << n << "'");
  }
  return chosen;
}

// `step_compare list`: name, sample shape and layers of every case, tab-separated.
int list_cases() {
  for (const auto* list : {&cases(), &named_cases()})
    for (const Case& c : *list) {
      std::string shape, layers;
      for (std::int64_t d : c.sample) shape += (shape.empty() ? "" : ",") + std::to_string(d);
      for (const std::string& l : c.layers) layers += (layers.empty() ? "" : ";") + l;
      std::printf("%s\t%s\t%s\n", c.name, shape.c_str(), layers.c_str());
    }
  return 0;
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

int write(const std::string& path, const std::vector<Case>& chosen) {
  hid_t file = H5_CHECK(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  for (const Case& c : chosen)
    for (Precision p : kPrecisions)
      if (check_of(c, p) != Check::skip)
        for (const auto& [name, values] : run_step(c, p))
          write_dataset(file, std::string("/") + c.name + "/" + precision_name(p) + "/" + name, values);
  H5Fclose(file);
  std::printf("wrote %s with %s\n", path.c_str(), compute_backend().name().c_str());
  return 0;
}

int check(const std::string& path, const std::vector<Case>& chosen, bool tf32) {
  if (tf32) {
    const std::string why = compute_backend().allow_tf32(true);
    if (!why.empty()) {
      std::printf("skipped: no TF32 here: %s\n", why.c_str());
      return 77;
    }
  }
  hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) {
    std::printf("FAILED: cannot open %s\n", path.c_str());
    return 1;
  }
  std::printf("step_compare on %s against %s\n", compute_backend().name().c_str(), path.c_str());
  int failures = 0;
  for (const Case& c : chosen)
    for (Precision p : kPrecisions) {
      const Check how = check_of(c, p);
      if (how == Check::skip || (tf32 && p != Precision::fp32)) continue;
      // bf16 on cuDNN's own bf16 convolutions (the GPU build, unless DDP_CUDNN_NARROW=0): they
      // store their outputs in bf16, as PyTorch's autocast does, so the step is held to
      // twice how far PyTorch's own bf16 step lies from its fp32 one, the forward tensor
      // by tensor and the rest on the whole step.
      const bool amp_like =
          c.amp_step > 0 &&
          (tf32 || (p != Precision::fp32 && compute_backend().narrow_convolution_results(p)));
      const bool exact_fp32 = p == Precision::fp32 && !tf32;  // fp32 products on both sides
      const bool whole_step = how == Check::whole_step || amp_like;
      // A whole-step fp32 case's forward: 1e-4 (AMX against AVX2 at resnet50_224: 1.6e-5).
      const double tol = amp_like ? 2 * c.amp_forward : exact_fp32 ? (whole_step ? 1e-4 : 1e-5) : 2e-2;
      // fp32: 4x what two CPU kernels' steps of ResNet-50 differ; bf16: 8x what the
      // sanitizer build's step of the bottleneck case differs from the reference (2.5e-3).
      const double step_tol = amp_like ? 2 * c.amp_step : exact_fp32 ? 5e-2 : 2e-2;
      double worst = 0.0, diff2 = 0.0, ref2 = 0.0;
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
          const double d = double(got[i]) - double(ref[i]);
          diff = std::max(diff, std::fabs(d));
          scale = std::max(scale, std::fabs(double(ref[i])));
          diff2 += d * d;
          ref2 += double(ref[i]) * double(ref[i]);
        }
        const double err = scale > 0 ? diff / scale : diff;
        // A whole-step case still holds its forward (logits, loss) tensor by tensor: a
        // flipped ReLU moves the forward only by the value near zero it flipped.
        const bool forward = name == "logits" || name == "loss";
        const bool ok = (whole_step && !forward) || err <= tol;  // false for NaN
        if (!ok) {
          std::printf("FAILED: %-44s rel err %.3g > %.2g\n", where.c_str(), err, tol);
          ++failures;
        }
        if (!(err <= worst)) {
          worst = err;
          worst_name = name;
        }
      }
      const double step_err = std::sqrt(diff2 / ref2);
      if (whole_step) {
        std::printf("%-12s %-5s whole step rel err (L2) %.3g, tolerance %.2g%s; worst tensor %.3g (%s)\n",
                    c.name, precision_name(p), step_err, step_tol, amp_like ? " (2x PyTorch AMP's)" : "",
                    worst, worst_name.c_str());
        if (!(step_err <= step_tol)) {
          std::printf("FAILED: %s %s whole step rel err %.3g > %.2g\n", c.name, precision_name(p), step_err,
                      step_tol);
          ++failures;
        }
      } else {
        std::printf("%-12s %-5s worst rel err %.3g (%s), tolerance %.0e\n", c.name, precision_name(p), worst,
                    worst_name.c_str(), tol);
      }
    }
  H5Fclose(file);
  std::printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures ? 1 : 0;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "list") == 0) return ddp::list_cases();
  const bool tf32 = argc >= 3 && std::strcmp(argv[1], "check") == 0 && std::strcmp(argv[2], "--tf32") == 0;
  const int file_arg = tf32 ? 3 : 2;
  if (argc <= file_arg || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr,
                 "usage: step_compare write|check FILE [CASE ...]  (default: the committed cases; "
                 "also resnet50_224)\n       step_compare check --tf32 FILE [CASE ...]\n"
                 "       step_compare list\n");
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
    const std::string mode = argv[1], path = argv[file_arg];
    const std::vector<ddp::Case> chosen =
        ddp::select_cases(std::vector<std::string>(argv + file_arg + 1, argv + argc));
    rc = mode == "write" ? ddp::write(path, chosen) : ddp::check(path, chosen, tf32);
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
