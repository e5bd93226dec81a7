#pragma once
// batchnorm2d[(sync)]: PyTorch's nn.BatchNorm2d (affine, momentum 0.1, eps 1e-5,
// track_running_stats) on (B, C, H, W). Training normalises with the batch's mean and
// biased variance and updates running_mean / running_var (unbiased) /
// num_batches_tracked, the layer's buffers; eval uses the running statistics.
// 'sync' is nn.SyncBatchNorm: the per-channel sums of forward (count, sum, sum of
// squares) and of backward (sum dy, sum dy*xhat) are all-reduced over the ranks of
// the communicator, so W ranks with B samples each normalise as one batch of W*B.
// Parameter gradients stay per-rank sums (the trainer reduces them like any other).
// Any layout: NCHW, or the blocked layout of the convolutions around it, which the
// model keeps through it (y and dx in x's layout).
// Where the backend has a library batch norm and it is asked for (DDP_CUDNN_BATCHNORM=1
// in the GPU build: cuDNN's, model/backend.hpp), a training forward on narrow
// channels-last x, not synchronised, runs in it, and so does the backward of that
// forward; eval and everything else runs the kernels here.

#include "model/elements.hpp"
#include "model/layer.hpp"

namespace ddp {

struct BatchNormStats;         // batchnorm.cpp
struct BatchNormBackwardThen;  // batchnorm.cpp

// The per-channel map of a batch norm's last forward, y = (x - mean) invstd gamma +
// beta, for a kernel that applies it in a pass of its own (ResBlock's output). K:
// ChannelValues (model/elements.hpp), or ChannelValues8 for a thread's 8 channels
// (at8, in map_vectors).
template <class K>
struct BatchNormAffineOf {
  K mean, invstd, gamma, beta;  // (Cp), zero past C
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c, float x) const {
    return (x - mean(c)) * invstd(c) * gamma(c) + beta(c);
  }
  KOKKOS_INLINE_FUNCTION BatchNormAffineOf<ChannelValues8> at8(std::int64_t c0) const {
    return {mean.at8(c0), invstd.at8(c0), gamma.at8(c0), beta.at8(c0)};
  }
  bool aligned() const { return mean.aligned() && invstd.aligned() && gamma.aligned() && beta.aligned(); }
};
using BatchNormAffine = BatchNormAffineOf<ChannelValues>;

class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(bool sync, float momentum = 0.1f, float eps = 1e-5f)
      : sync_(sync), momentum_(momentum), eps_(eps) {}

  // init() sets gamma to 0 instead of 1: torchvision's zero_init_residual for the last
  // batch norm of a residual branch, so each block starts as its shortcut.
  void set_zero_gamma(bool on) { zero_gamma_ = on; }
  // The relu after it, in the same passes: forward writes relu(bn(x)) and backward
  // takes dy through the mask y > 0 (y: this layer's, rectified, output; or bn(x) > 0
  // under DDP_BN_RELU_MASK=input: planes.hpp). For a relu that hands its passes over
  // (Model::fuse_layers) and for ResBlock's branch.
  void fuse_relu() { fused_relu_ = true; }
  // Forward without its pass over the elements: the batch's (training) or the
  // running statistics, the running update, and affine() for them.
  void statistics(const Tensor& x, bool training);
  // A training forward's statistics from the sums the convolution before it wrote as
  // it wrote x (Conv2d::forward_with_sums: 2C floats, each channel's sum of x over this
  // rank's batch, then of x^2) instead of a pass of its own over x; synchronised, they
  // are all-reduced with the count first, as its own are.
  void statistics_from_sums(const Tensor& x, const float* sums);
  // A training forward (its relu fused or not) on those statistics, outside the library.
  void forward_from_sums(const Tensor& x, const float* sums, Tensor& y);
  // y = bn(x), rectified where fused, on the statistics taken (statistics,
  // statistics_from_sums): the pass a forward makes after them.
  void normalise_taken(const Tensor& x, Tensor& y) { write_normalised(x, y); }
  // The map of the statistics taken as y = x scale + shift, into `to` (2C floats of the
  // device's memory: scale = gamma invstd, then shift = beta - mean scale), for a
  // convolution that applies it, and the fused relu, to its input on the way in
  // (Conv2d::forward_after).
  void scale_shift(float* to) const;
  // backward of a fused relu's forward whose output was never written (a convolution
  // after it applied both on its way in): dy through the mask bn(x) > 0, computed again
  // from x, as under DDP_BN_RELU_MASK=input.
  void backward_unwritten(const Tensor& x, const Tensor& dy, Tensor& dx);
  // That backward where the convolution after it took its output's gradient through the
  // relu's mask and summed it in the same pass (Conv2d::backward_after with its sums): g
  // the masked gradient, sums (2C floats) each channel's sum of g over this rank's batch,
  // then of g (x - mean); synchronised, they are all-reduced as its own are. One pass,
  // over x and g, for dx.
  void backward_from_sums(const Tensor& x, const Tensor& g, const float* sums, Tensor& dx);
  // The batch's mean of the last training forward (C floats of the device's memory).
  const float* batch_mean() const { return mean_.data(); }
  // Whether the last forward normalised by the batch's statistics (training).
  bool normalised_by_batch() const { return normalised_by_batch_; }
  BatchNormAffine affine() const {
    return {{mean_.data()}, {invstd_.data()}, {gamma_.data()}, {beta_.data()}};
  }
  // The library batch norm its training passes take where they can (null: none,
  // the kernels here throughout). Unset: the backend's, where it has one and it is
  // asked for (ComputeBackend::batch_norm_in_library). Tests and bn_bench set it to
  // compare the two.
  void set_library_kernels(BatchNormKernels* kernels) {
    library_set_ = true;
    library_ = kernels;
  }
  // Whether a training forward on x runs in the library.
  bool library_runs(const Tensor& x) const;
  bool library_runs(Layout layout, Precision type) const;  // for an x of that layout and type
  // The memory plan's: whether a training forward on x of `layout` and `type` will
  // run in the library (library_runs, with the layer's sync for the communicator the
  // trainer sets after the plan), and the floats of what it keeps there for its
  // backward at `batch` (its reserve; `add`: the shortcut's forward_add_relu), 0 where
  // it will not.
  bool library_would_run(Layout layout, Precision type) const;
  std::int64_t library_reserve_floats(std::int64_t batch, Layout layout, Precision type, bool add) const;
  // A training forward y = relu(bn(x) + z) in the library (ResBlock's output, its
  // shortcut z), where library_runs(x): z and y of x's layout and type.
  void forward_add_relu(const Tensor& x, const Tensor& z, Tensor& y);
  // Its backward: dx, and dz = dy through y's mask (the shortcut's gradient), sized
  // by the caller like dy.
  void backward_add_relu(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor& dz);

  std::string kind() const override { return "batchnorm2d"; }
  Shape output_shape(const Shape& in_sample) override;
  std::vector<ParamSpec> parameter_specs() const override;
  void bind(float* params, float* grads) override;
  std::vector<ParamSpec> buffer_specs() const override;
  void bind_buffers(float* buffers) override;
  void init(Rng& rng) override;
  void set_communicator(Communicator* comm) override { comm_ = sync_ ? comm : nullptr; }
  std::string graph_obstacle() const override {
    return comm_ ? "batchnorm2d(sync) reads the ranks' sample count on the host in every forward" : "";
  }
  void forward(const Tensor& x, Tensor& y, bool training) override;
  void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) override;
  // The bodies of statistics, forward's pass and backward, for x (and y, dx) fp32 or
  // narrow (Narrow), dy so or not (NarrowDy); Relu: dy through the fused relu's mask.
  // Public only because CUDA's extended lambdas may not live in private members.
  template <bool Narrow>
  void statistics_of(const Tensor& x, bool training);
  template <bool Narrow>
  void normalise(const Tensor& x, Tensor& y);
  template <bool Relu, bool Narrow, bool NarrowDy, class... Y>
  void backward_passes(const Tensor& x, const Tensor& dy, Tensor& dx, Y... y);
  template <bool Narrow, bool NarrowG>
  void backward_apply(const Tensor& x, const Tensor& g, const float* sums, Tensor& dx);

 private:
  // Sum `sums` (n doubles, default memory space) over the ranks, when synchronised.
  void allreduce(Kokkos::View<double*> sums, std::size_t n);
  void reserve_partial(Layout layout, std::int64_t B);
  // Synchronised, backward's sums (2C, this rank's in sums_) all-reduced and the means of
  // dy and dy xhat from them (1/N of them); else nothing (the means are there already).
  void backward_means_over_ranks(float inv_n);
  // What backward does per channel with its sums (this rank's parameter gradients, and
  // the means where means_here: no all-reduce first).
  BatchNormBackwardThen backward_then(bool means_here) const;
  // The per-channel map from the batch's sums to the statistics (mean_, invstd_, the
  // affine parameters, the running update) for count_ values a channel.
  BatchNormStats batch_stats() const;
  // From this rank's sums of x and x^2 in sums_ (2C) over `count` values a channel: the
  // sums and counts all-reduced, then the statistics.
  void statistics_over_ranks(std::int64_t count);
  // y = bn(x) (rectified where fused) on the statistics taken
  void write_normalised(const Tensor& x, Tensor& y);
  // The training forward and its backward in the library, with z (and dz) where the
  // output adds it.
  BatchNormKernels* library() const;
  BatchNormPass library_pass(std::int64_t B, Precision type, bool add) const;
  void library_forward(const Tensor& x, const Tensor* z, Tensor& y);
  void library_backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, Tensor* dz);

  bool sync_;
  bool zero_gamma_ = false;
  bool fused_relu_ = false;
  float momentum_, eps_;
  Communicator* comm_ = nullptr;
  std::int64_t c_ = 0, hw_ = 0;
  Shape sample_;                                 // (C, H, W)
  float* weight_ = nullptr;                      // (C) gamma
  float* bias_ = nullptr;                        // (C) beta
  float* dweight_ = nullptr;                     // (C)
  float* dbias_ = nullptr;                       // (C)
  float* running_mean_ = nullptr;                // (C)
  float* running_var_ = nullptr;                 // (C)
  float* batches_tracked_ = nullptr;             // () PyTorch's int64 num_batches_tracked, kept as a float
  bool normalised_by_batch_ = false;             // the last forward used batch statistics (training)
  Kokkos::View<double*>::HostMirror sums_host_;  // sums_ on the host: the count
  Kokkos::View<double*> sums_;     // (2C + 1) forward: sum x, sum x^2, count; backward: sum dy, sum dy xhat
  Kokkos::View<double*> partial_;  // (2, B, Cp) per-plane sums (model/planes.hpp)
  // (Cp: C padded to a block, zeros past C) of the last forward: mean, 1/std and the
  // affine parameters; of the last backward: mean of dy, of dy * xhat
  Kokkos::View<float*> mean_, invstd_, gamma_, beta_, mean_dy_, mean_dy_xhat_;
  std::int64_t count_ = 0;               // samples per channel in the last forward, over all ranks
  bool library_set_ = false;             // set_library_kernels
  BatchNormKernels* library_ = nullptr;  // what it set
  bool library_forward_ = false;         // the last forward ran in the library
  bool library_added_ = false;           // and added a shortcut
  Kokkos::View<char*> reserve_;          // what the library's forward keeps for its backward
  std::size_t reserve_used_ = 0;         // bytes of it the last library forward used
  Tensor dy_cast_;                       // dy in x's type, where it comes in another
};

}  // namespace ddp
