#pragma once
// The rank's image transform: a batch of uint8 images as stored ((B, C, H, W) or
// (B, H, W, C)) becomes the model's (B, C, OH, OW) floats in ONE kernel over the
// default execution space ("Augment::apply"), so on a GPU only uint8 crosses PCIe.
// Per output element: layout to NCHW, the sample's crop (zero outside the stored
// image, as torchvision's padding), bilinear resize of its box when the box is not
// the output's size, horizontal flip, x/255 (a division: ToTensor's floats), then
// (x - mean[c]) / std[c] (Normalize) when asked for.
//
// Each sample's parameters (its SampleBox) are drawn on the host from a counter-based
// hash of (train.seed, epoch, global sample index) alone, so a sample is augmented
// the same way on any number of ranks, in any batch, before and after a resume.
// Training draws data.augment; validation (and training without a resizing item)
// takes the centre crop of the output's size, as torchvision's eval transform.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

class ShardDataset;
struct DataConfig;

// data.augment, parsed. Items combine, except the two crops.
struct AugmentSpec {
  bool flip = false;           // 'flip': RandomHorizontalFlip(p=0.5)
  std::int64_t crop_pad = -1;  // 'crop(pad=p)': RandomCrop(size, padding=p), zero fill; -1: none
  bool resized_crop = false;   // 'random_resized_crop(scale=lo,hi[, ratio=lo,hi])'
  double scale[2] = {0.08, 1.0};
  double ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
};

// Throws InputError "'item': what is wrong; expected ..." for an unknown or
// malformed item (the caller prefixes the key).
AugmentSpec parse_augment(const std::vector<std::string>& items);

// A stored image: channels, sides, layout. Non-image uint8 data (N, d...) is (1, 1, d).
struct ImageShape {
  std::int64_t c = 1, h = 1, w = 1;
  bool nhwc = false;
  std::int64_t numel() const { return c * h * w; }
};

// Where output sample i comes from: rows [top, top + height) and columns [left,
// left + width) of its stored image, resized to the output (bilinear,
// align_corners=False, no antialias) when the box is not the output's size, then
// mirrored left-right when flip is 1. A box of the output's size may reach past the
// image (crop padding: zero there); a resized box lies inside it.
struct SampleBox {
  std::int32_t top = 0, left = 0, height = 0, width = 0, flip = 0;
};

class ImageTransform {
 public:
  // Output (c, out_h, out_w). normalize: empty, or c means then c stds (std > 0).
  // Throws InputError for an output larger than a stored side (checked per data set
  // in check()), std::invalid_argument for a normalize of the wrong length.
  ImageTransform(const AugmentSpec& spec, const std::vector<double>& normalize, std::int64_t c,
                 std::int64_t out_h, std::int64_t out_w, std::uint64_t seed);

  std::vector<std::int64_t> output_shape() const { return {c_, out_h_, out_w_}; }  // (C, OH, OW)
  std::int64_t output_numel() const { return c_ * out_h_ * out_w_; }
  const AugmentSpec& spec() const { return spec_; }

  // The sample's box: a pure function of (seed, epoch, index) when training,
  // the centre crop otherwise.
  SampleBox box(const ImageShape& in, std::int64_t epoch, std::int64_t index, bool training) const;

  // x: (n, stored...) uint8, boxes: (n), out: (n, C, OH, OW) float, all in the
  // default execution space's memory. Asynchronous on a device.
  void apply(const ImageShape& in, const std::uint8_t* x, const SampleBox* boxes, std::int64_t n,
             float* out) const;

 private:
  AugmentSpec spec_;
  std::int64_t c_, out_h_, out_w_;
  std::uint64_t key_;
  std::vector<float> mean_, std_;  // (C) each; empty: no normalize
};

// The data set's stored images (non-image uint8 data: (1, 1, numel)).
ImageShape image_shape(const ShardDataset& ds);

// The run's transform from data.image_size, data.augment and data.normalize, checked
// against the shards: nullptr for float32 data (where those keys are an error).
// Throws InputError naming the key and the value: an output side larger than a
// stored side, normalize values that do not fit the channels, keys for non-images.
std::unique_ptr<ImageTransform> make_image_transform(const DataConfig& cfg, std::uint64_t seed,
                                                     const ShardDataset& train, const ShardDataset* val);

// One sample of the model's input: the transform's output for images, else /x's
// sample shape.
std::vector<std::int64_t> model_input_shape(const ShardDataset& train, const ImageTransform* t);

}  // namespace ddp
