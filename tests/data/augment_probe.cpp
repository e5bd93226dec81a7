// ImageTransform::apply on given boxes, for tests/data/augment_torchvision.py: the
// kernel's floats against torchvision's functional transforms on fixed parameters.
//
// usage: augment_probe C H W NHWC OUT_H OUT_W N IN.u8 BOXES.i32 OUT.f32 [MEAN... STD...]
//   IN.u8: (N, stored...) uint8; BOXES.i32: (N, 5) top, left, height, width, flip;
//   OUT.f32: (N, C, OUT_H, OUT_W) float32, written.

#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "train/augment.hpp"

namespace {
template <class T>
std::vector<T> read_all(const char* path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * sizeof(T)))) {
    std::fprintf(stderr, "augment_probe: cannot read %zu values from %s\n", n, path);
    std::exit(2);
  }
  return v;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 11) {
    std::fprintf(stderr,
                 "usage: augment_probe C H W NHWC OUT_H OUT_W N IN.u8 BOXES.i32 OUT.f32 [MEAN... STD...]\n");
    return 2;
  }
  const auto num = [&](int i) { return std::int64_t(std::atoll(argv[i])); };
  const ddp::ImageShape in{num(1), num(2), num(3), num(4) != 0};
  const std::int64_t oh = num(5), ow = num(6), n = num(7);
  std::vector<double> normalize;
  for (int i = 11; i < argc; ++i) normalize.push_back(std::atof(argv[i]));
  Kokkos::ScopeGuard kokkos(argc, argv);
  const auto x = read_all<std::uint8_t>(argv[8], std::size_t(n * in.numel()));
  const auto boxes = read_all<ddp::SampleBox>(argv[9], std::size_t(n));
  const ddp::ImageTransform t(ddp::AugmentSpec{}, normalize, in.c, oh, ow, 0);
  Kokkos::View<std::uint8_t*> x_dev("augment_probe.x", x.size());
  Kokkos::View<ddp::SampleBox*> boxes_dev("augment_probe.boxes", boxes.size());
  Kokkos::View<float*> out_dev("augment_probe.out", std::size_t(n * t.output_numel()));
  Kokkos::deep_copy(x_dev, Kokkos::View<const std::uint8_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                               x.data(), x.size()));
  Kokkos::deep_copy(boxes_dev,
                    Kokkos::View<const ddp::SampleBox*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                        boxes.data(), boxes.size()));
  t.apply(in, x_dev.data(), boxes_dev.data(), n, out_dev.data());
  auto out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out_dev);
  std::ofstream o(argv[10], std::ios::binary);
  o.write(reinterpret_cast<const char*>(out.data()), std::streamsize(out.size() * sizeof(float)));
  return o ? 0 : 1;
}
