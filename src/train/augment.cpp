#include "train/augment.hpp"

#include <cmath>
#include <stdexcept>

#include "comm/check.hpp"
#include "io/namelist.hpp"
#include "io/shard_check.hpp"
#include "io/shard_dataset.hpp"
#include "model/rng.hpp"
#include "model/tensor.hpp"
#include "train/config.hpp"

namespace ddp {

constexpr int kMaxNormalizeChannels = 16;

// data.normalize's means and stds, captured by value in Augment::apply's kernel (at
// namespace scope, outside the unnamed one: CUDA's extended lambdas may not capture a
// function-local type, and a kernel's template arguments no type of internal linkage).
struct ChannelNorm {
  float mean[kMaxNormalizeChannels];
  float std[kMaxNormalizeChannels];
};

namespace {

double number(const std::string& item, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    throw InputError("'" + item + "': '" + text + "' is not a number");
  return v;
}

// "a=1,2, b=3" -> {{"a", {"1", "2"}}, {"b", {"3"}}}; a value before any key is keyed "".
std::vector<std::pair<std::string, std::vector<std::string>>> arguments(const std::string& item,
                                                                        const std::string& text) {
  std::vector<std::pair<std::string, std::vector<std::string>>> args;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string piece = nml::trim(text.substr(at, comma - at));
    const auto eq = piece.find('=');
    if (eq != std::string::npos) {
      args.push_back({nml::trim(piece.substr(0, eq)), {}});
      piece = nml::trim(piece.substr(eq + 1));
    } else if (args.empty()) {
      args.push_back({"", {}});
    }
    if (piece.empty()) throw InputError("'" + item + "': an empty argument");
    args.back().second.push_back(piece);
    at = comma + 1;
  }
  return args;
}

// Two numbers lo <= hi, both > 0.
void pair_of(const std::string& item, const std::string& key, const std::vector<std::string>& v,
             double out[2]) {
  if (v.size() != 2)
    throw InputError("'" + item + "': " + key + " takes two numbers (lo, hi), got " +
                     std::to_string(v.size()));
  out[0] = number(item, v[0]);
  out[1] = number(item, v[1]);
  if (!(out[0] > 0) || out[0] > out[1]) throw InputError("'" + item + "': " + key + " needs 0 < lo <= hi");
}

// Uniform in [0, 1) with 53 bits, for the host's draws.
double uniform(std::uint64_t key, std::uint64_t counter) {
  return double(hash64(key, counter) >> 11) * (1.0 / 9007199254740992.0);
}
// Uniform integer in [0, n).
std::int64_t below(std::uint64_t key, std::uint64_t counter, std::int64_t n) {
  return std::int64_t((hash64(key, counter) >> 32) * std::uint64_t(n) >> 32);
}

// Python's round() of an exact half goes to the even neighbour; so does nearbyint in
// the default rounding mode (torchvision's centre crop and RandomResizedCrop round so).
std::int64_t round_even(double x) { return std::int64_t(std::nearbyint(x)); }

// A stored pixel, zero outside the image (crop padding).
KOKKOS_INLINE_FUNCTION float pixel(const std::uint8_t* img, std::int64_t c, std::int64_t y, std::int64_t x,
                                   std::int64_t C, std::int64_t H, std::int64_t W, bool nhwc) {
  if (y < 0 || y >= H || x < 0 || x >= W) return 0.0f;
  return float(nhwc ? img[(y * W + x) * C + c] : img[(c * H + y) * W + x]);
}

}  // namespace

AugmentSpec parse_augment(const std::vector<std::string>& items) {
  AugmentSpec spec;
  const std::string expected =
      "; expected 'flip', 'crop(pad=N)' or 'random_resized_crop(scale=lo,hi[, ratio=lo,hi])'";
  std::vector<std::string> seen;
  for (const std::string& raw : items) {
    const std::string item = nml::trim(raw);
    const auto open = item.find('(');
    const std::string name = nml::trim(item.substr(0, open));
    std::string inside;
    if (open != std::string::npos) {
      if (item.back() != ')') throw InputError("'" + item + "': no closing ')'" + expected);
      inside = nml::trim(item.substr(open + 1, item.size() - open - 2));
    }
    for (const std::string& s : seen)
      if (s == name) throw InputError("'" + item + "': " + name + " is given twice");
    if (name == "flip") {
      if (!inside.empty()) throw InputError("'" + item + "': flip takes no arguments" + expected);
      spec.flip = true;
    } else if (name == "crop") {
      spec.crop_pad = 0;
      if (!inside.empty())
        for (const auto& [key, values] : arguments(item, inside)) {
          if ((key != "pad" && !key.empty()) || values.size() != 1)
            throw InputError("'" + item + "': crop takes one argument, pad=N" + expected);
          const double p = number(item, values[0]);
          if (p < 0 || p != std::floor(p) || p > 1e6)
            throw InputError("'" + item + "': pad must be an integer >= 0");
          spec.crop_pad = std::int64_t(p);
        }
    } else if (name == "random_resized_crop") {
      spec.resized_crop = true;
      if (!inside.empty())
        for (const auto& [key, values] : arguments(item, inside)) {
          if (key == "scale" || key.empty()) {
            pair_of(item, "scale", values, spec.scale);
            if (spec.scale[1] > 1) throw InputError("'" + item + "': scale must lie in (0, 1]");
          } else if (key == "ratio") {
            pair_of(item, "ratio", values, spec.ratio);
          } else {
            throw InputError("'" + item + "': unknown argument '" + key +
                             "'; expected scale=lo,hi or ratio=lo,hi");
          }
        }
    } else {
      throw InputError("'" + item + "': unknown augmentation '" + name + "'" + expected);
    }
    seen.push_back(name);
  }
  if (spec.crop_pad >= 0 && spec.resized_crop)
    throw InputError("'crop' and 'random_resized_crop' do not combine: choose one");
  return spec;
}

ImageTransform::ImageTransform(const AugmentSpec& spec, const std::vector<double>& normalize, std::int64_t c,
                               std::int64_t out_h, std::int64_t out_w, std::uint64_t seed)
    : spec_(spec), c_(c), out_h_(out_h), out_w_(out_w), key_(hash64(seed, 0x617567ull /* "aug" */)) {
  if (!normalize.empty()) {
    if (std::int64_t(normalize.size()) != 2 * c)
      throw std::invalid_argument("ImageTransform: normalize needs 2 * channels values");
    if (c > kMaxNormalizeChannels)
      throw InputError("data.normalize: at most " + std::to_string(kMaxNormalizeChannels) +
                       " channels, the images have " + std::to_string(c));
    for (std::int64_t i = 0; i < c; ++i) {
      mean_.push_back(float(normalize[std::size_t(i)]));
      std_.push_back(float(normalize[std::size_t(c + i)]));
    }
  }
}

SampleBox ImageTransform::box(const ImageShape& in, std::int64_t epoch, std::int64_t index,
                              bool training) const {
  SampleBox b;
  b.height = std::int32_t(out_h_);
  b.width = std::int32_t(out_w_);
  // torchvision's CenterCrop: int(round((H - OH) / 2)).
  b.top = std::int32_t(round_even(double(in.h - out_h_) / 2.0));
  b.left = std::int32_t(round_even(double(in.w - out_w_) / 2.0));
  if (!training) return b;
  const std::uint64_t key = hash64(hash64(key_, std::uint64_t(epoch)), std::uint64_t(index));
  // Counters: 0 flip, 1-2 crop, 3 + 4t .. 6 + 4t the resized crop's try t.
  if (spec_.flip) b.flip = uniform(key, 0) < 0.5 ? 1 : 0;
  if (spec_.crop_pad >= 0) {
    // RandomCrop(size, padding=p): a window of the padded image, any position.
    const std::int64_t p = spec_.crop_pad;
    b.top = std::int32_t(below(key, 1, in.h + 2 * p - out_h_ + 1) - p);
    b.left = std::int32_t(below(key, 2, in.w + 2 * p - out_w_ + 1) - p);
  } else if (spec_.resized_crop) {
    // RandomResizedCrop.get_params: 10 tries, then the centre crop of the clamped ratio.
    const double area = double(in.h) * double(in.w);
    const double log_lo = std::log(spec_.ratio[0]), log_hi = std::log(spec_.ratio[1]);
    for (std::uint64_t t = 0; t < 10; ++t) {
      const std::uint64_t k = 3 + 4 * t;
      const double target = area * (spec_.scale[0] + (spec_.scale[1] - spec_.scale[0]) * uniform(key, k));
      const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform(key, k + 1));
      const std::int64_t w = round_even(std::sqrt(target * aspect));
      const std::int64_t h = round_even(std::sqrt(target / aspect));
      if (0 < w && w <= in.w && 0 < h && h <= in.h) {
        b.top = std::int32_t(below(key, k + 2, in.h - h + 1));
        b.left = std::int32_t(below(key, k + 3, in.w - w + 1));
        b.height = std::int32_t(h);
        b.width = std::int32_t(w);
        return b;
      }
    }
    const double in_ratio = double(in.w) / double(in.h);
    std::int64_t w = in.w, h = in.h;
    if (in_ratio < spec_.ratio[0])
      h = round_even(double(w) / spec_.ratio[0]);
    else if (in_ratio > spec_.ratio[1])
      w = round_even(double(h) * spec_.ratio[1]);
    b.top = std::int32_t((in.h - h) / 2);
    b.left = std::int32_t((in.w - w) / 2);
    b.height = std::int32_t(h);
    b.width = std::int32_t(w);
  }
  return b;
}

void ImageTransform::apply(const ImageShape& in, const std::uint8_t* x, const SampleBox* boxes,
                           std::int64_t n, float* out) const {
  ChannelNorm norm{};
  const bool normalize = !mean_.empty();
  for (std::size_t i = 0; i < mean_.size(); ++i) {
    norm.mean[i] = mean_[i];
    norm.std[i] = std_[i];
  }
  const std::int64_t C = c_, OH = out_h_, OW = out_w_;
  const std::int64_t H = in.h, W = in.w, numel = in.numel();
  const bool nhwc = in.nhwc;
  // One team per output row (s, c, oy): the row's box, source row and weights are
  // worked out once, and the team's threads take its columns (consecutive outputs,
  // coalesced on a GPU; a plain loop on the host). A flat range with the index split
  // per element spent most of its time in 64-bit divisions: 513 ms against 61-82 ms per
  // batch of 256 at 224 (Xeon, one rank's core).
  using Team = Kokkos::TeamPolicy<ExecSpace>::member_type;
  Kokkos::parallel_for(
      "Augment::apply", Kokkos::TeamPolicy<ExecSpace>(n * C * OH, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Team& team) {
        // row = (s * C + c) * OH + oy: the output (n, C, OH, OW) in order.
        const std::int64_t row = team.league_rank();
        const std::int64_t oy = row % OH;
        const std::int64_t c = (row / OH) % C;
        const std::int64_t s = row / (OH * C);
        const SampleBox b = boxes[s];
        const std::uint8_t* img = x + s * numel;
        float* dst = out + row * OW;
        const float mean = normalize ? norm.mean[c] : 0.0f, sd = normalize ? norm.std[c] : 1.0f;
        if (b.height == OH && b.width == OW) {
          const std::int64_t y = b.top + oy;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(team, OW), [&](const std::int64_t ox) {
            const std::int64_t bx = b.flip ? OW - 1 - ox : ox;  // flip after the crop: mirror the output
            float v = pixel(img, c, y, b.left + bx, C, H, W, nhwc) / 255.0f;  // a division: ToTensor's floats
            if (normalize) v = (v - mean) / sd;
            dst[ox] = v;
          });
          return;
        }
        // PyTorch's upsample_bilinear2d, align_corners=False: source index
        // max(scale * (dst + 0.5) - 0.5, 0), the lower/right neighbour clamped to the box.
        const float sh = float(b.height) / float(OH), sw = float(b.width) / float(OW);
        float fy = sh * (float(oy) + 0.5f) - 0.5f;
        fy = fy < 0.0f ? 0.0f : fy;
        const std::int64_t y0 = std::int64_t(fy);
        const std::int64_t y1 = y0 + (y0 < b.height - 1 ? 1 : 0);
        const float ly1 = fy - float(y0), ly0 = 1.0f - ly1;
        // A resized box lies inside its image (only random_resized_crop resizes), so
        // the four taps need no bounds: rows y0, y1 of the box, (x, c) within a row.
        const std::int64_t ys = nhwc ? W * C : W, xs = nhwc ? C : 1;
        const std::uint8_t* plane = img + (nhwc ? c : c * H * W) + b.left * xs;
        const std::uint8_t* r0 = plane + (b.top + y0) * ys;
        const std::uint8_t* r1 = plane + (b.top + y1) * ys;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, OW), [&](const std::int64_t ox) {
          const std::int64_t bx = b.flip ? OW - 1 - ox : ox;
          float fx = sw * (float(bx) + 0.5f) - 0.5f;
          fx = fx < 0.0f ? 0.0f : fx;
          const std::int64_t x0 = std::int64_t(fx);
          const std::int64_t x1 = x0 + (x0 < b.width - 1 ? 1 : 0);
          const float lx1 = fx - float(x0), lx0 = 1.0f - lx1;
          float v = ly0 * (lx0 * float(r0[x0 * xs]) + lx1 * float(r0[x1 * xs])) +
                    ly1 * (lx0 * float(r1[x0 * xs]) + lx1 * float(r1[x1 * xs]));
          v = v / 255.0f;
          if (normalize) v = (v - mean) / sd;
          dst[ox] = v;
        });
      });
}

ImageShape image_shape(const ShardDataset& ds) {
  const auto& shape = ds.sample_shape();
  if (shape.size() == 3) return {shape[0], shape[1], shape[2], ds.nhwc()};
  return {1, 1, ds.sample_numel(), false};
}

std::unique_ptr<ImageTransform> make_image_transform(const DataConfig& cfg, std::uint64_t seed,
                                                     const ShardDataset& train, const ShardDataset* val) {
  const auto join = [](const std::vector<std::string>& items) {
    std::string s;
    for (const auto& i : items) s += (s.empty() ? "'" : ", '") + i + "'";
    return s;
  };
  const bool asked = cfg.image_size > 0 || !cfg.augment.empty() || !cfg.normalize.empty();
  const std::string key = !cfg.augment.empty() ? "data.augment = " + join(cfg.augment)
                          : cfg.image_size > 0 ? "data.image_size = " + std::to_string(cfg.image_size)
                                               : "data.normalize";
  for (const ShardDataset* ds : {&train, val}) {
    if (!ds) continue;
    if (asked && !ds->x_is_uint8())
      throw InputError(key + ": needs uint8 images, but " + ds->what() + " (" + ds->files().front() +
                       ") holds float32 /x; images go into shards as uint8");
    if (asked && ds->sample_shape().size() != 3)
      throw InputError(key + ": needs images (N, C, H, W) or (N, H, W, C), but " + ds->what() + " (" +
                       ds->files().front() + ") has /x of sample shape " +
                       shard::shape_str(ds->sample_shape()));
  }
  if (!train.x_is_uint8()) return nullptr;
  const ImageShape in = image_shape(train);
  const std::int64_t out_h = cfg.image_size > 0 ? cfg.image_size : in.h;
  const std::int64_t out_w = cfg.image_size > 0 ? cfg.image_size : in.w;
  for (const ShardDataset* ds : {&train, val}) {
    if (!ds) continue;
    const ImageShape s = image_shape(*ds);
    const std::string stored = shard::shape_str({s.c, s.h, s.w});
    if (s.c != in.c)
      throw InputError(ds->what() + ": images of " + std::to_string(s.c) + " channels " + stored +
                       " but the training images have " + std::to_string(in.c));
    if (out_h > s.h || out_w > s.w)
      throw InputError((cfg.image_size > 0 ? "data.image_size = " + std::to_string(cfg.image_size)
                                           : std::string("the training images' side")) +
                       " is larger than the stored images of " + ds->what() + ", (C,H,W) = " + stored +
                       "; crops and resizes take at most the stored side");
  }
  if (!cfg.normalize.empty() && std::int64_t(cfg.normalize.size()) != 2 * in.c)
    throw InputError("data.normalize: " + std::to_string(cfg.normalize.size()) + " values for images of " +
                     std::to_string(in.c) + " channel" + (in.c == 1 ? "" : "s") + "; expected " +
                     std::to_string(2 * in.c) + " (" + std::to_string(in.c) + " means, then " +
                     std::to_string(in.c) + " stds)");
  return std::make_unique<ImageTransform>(parse_augment(cfg.augment), cfg.normalize, in.c, out_h, out_w,
                                          seed);
}

std::vector<std::int64_t> model_input_shape(const ShardDataset& train, const ImageTransform* t) {
  return t && train.sample_shape().size() == 3 ? t->output_shape() : train.sample_shape();
}

}  // namespace ddp
