// The data path alone, at ImageNet size: how fast the streaming loader (prefetch
// thread, one hyperslab read per shard and batch) delivers uint8 batches, and what
// the image transform's kernel (Augment::apply) costs per batch. Prints numbers; no
// model, no collectives but the timing barriers.
//
//   mpirun -np 2 build/loader_bench 'DIR/train_*.h5' [--batch 256] [--prefetch 4]
//          [--epochs 1] [--shuffle 1] [--preload 0] [--image-size 224] [--repeats 10]
//
// Loader: every rank reads its DistributedSampler share of one epoch (shuffled by
// default, as training reads it), uint8 as stored, streamed from the shards or, with
// --preload 1, from the set held in memory (data.mode = 'preload', the time to load
// it not counted); images/s and MB/s are summed over the ranks, from the slowest
// rank's time. Transform: one batch, already in memory,
// converted `repeats` times per setting (fenced), per rank while the others do the same.

#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/batch_loader.hpp"
#include "io/sampler.hpp"
#include "io/shard_dataset.hpp"
#include "train/augment.hpp"

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  std::string pattern;
  std::int64_t batch = 256, image_size = 0, repeats = 10;
  int prefetch = 4, epochs = 1;
  bool shuffle = true, preload = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : 0; };
    if (a == "--batch")
      batch = value();
    else if (a == "--prefetch")
      prefetch = int(value());
    else if (a == "--epochs")
      epochs = int(value());
    else if (a == "--shuffle")
      shuffle = value() != 0;
    else if (a == "--preload")
      preload = value() != 0;
    else if (a == "--image-size")
      image_size = value();
    else if (a == "--repeats")
      repeats = value();
    else
      pattern = a;
  }
  if (pattern.empty()) {
    if (rank == 0)
      std::fprintf(stderr, "usage: loader_bench 'SHARDS_*.h5' [--batch 256] [--prefetch 4] ...\n");
    MPI_Finalize();
    return 2;
  }
  if (provided < MPI_THREAD_MULTIPLE && prefetch > 0) {
    if (rank == 0) std::printf("MPI gives no MPI_THREAD_MULTIPLE: reading without prefetch\n");
    prefetch = 0;
  }
  Kokkos::initialize(argc, argv);
  {
    ddp::ShardDataset ds(MPI_COMM_WORLD, {pattern}, "shards");
    if (preload) ds.preload();
    const ddp::ImageShape in = ddp::image_shape(ds);
    const double mb = double(ds.sample_numel()) / 1e6;  // per image, stored
    if (rank == 0)
      std::printf(
          "loader_bench: %d rank(s), %lld images (%lld x %lld x %lld uint8 %s, %.3f MB each) in %zu "
          "shard(s), batch %lld, prefetch %d, %s, %s\n",
          world, (long long)ds.size(), (long long)in.h, (long long)in.w, (long long)in.c,
          in.nhwc ? "NHWC" : "NCHW", mb, ds.files().size(), (long long)batch, prefetch,
          shuffle ? "shuffled" : "in file order", preload ? "preloaded" : "streamed");

    // 1. The loader alone: next() as fast as it hands batches out.
    ddp::Batch b;
    for (int e = 0; e < epochs; ++e) {
      auto idx = ddp::epoch_indices(ds.size(), world, rank, shuffle, 0, false, e, 0);
      const std::int64_t n = std::int64_t(idx.size());
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now();
      ddp::BatchLoader loader(ds, std::move(idx), batch, prefetch, /*keep_uint8=*/true);
      while (loader.next(b)) {
      }
      const double mine = now() - t0, slowest = max_over_ranks(mine);
      const double images = double(n) * world;
      if (rank == 0)
        std::printf(
            "epoch %d: %.0f images in %.3f s (slowest rank): %.0f images/s, %.0f MB/s over %d rank(s); "
            "rank 0 waited %.3f s in next()\n",
            e + 1, images, slowest, images / slowest, images * mb / slowest, world, loader.wait_seconds());
    }

    // 2. The transform's kernel alone, on one batch already in the compute space.
    const std::int64_t n = batch;
    auto idx = ddp::epoch_indices(ds.size(), world, rank, shuffle, 0, false, 0, 0);
    idx.resize(std::size_t(n));
    ddp::BatchLoader one(ds, idx, n, 0, /*keep_uint8=*/true);
    one.next(b);
    Kokkos::View<std::uint8_t*> x("loader_bench.x", b.x_uint8.size());
    Kokkos::deep_copy(x, Kokkos::View<const std::uint8_t*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                             b.x_uint8.data(), b.x_uint8.size()));
    const std::int64_t side = image_size > 0 ? image_size : in.h;
    struct Setting {
      const char* name;
      std::vector<std::string> augment;
      bool normalize;
      bool training;
    };
    const std::vector<Setting> settings = {
        {"x/255 only (no augmentation, no normalize)", {}, false, true},
        {"flip + crop(pad=4) + normalize", {"flip", "crop(pad=4)"}, true, true},
        {"random_resized_crop(scale=0.08,1) + flip + normalize",
         {"random_resized_crop(scale=0.08,1)", "flip"},
         true,
         true},
        {"validation: centre crop + normalize", {}, true, false},
    };
    for (const Setting& s : settings) {
      std::vector<double> norm;
      if (s.normalize)
        for (std::int64_t k = 0; k < 2 * in.c; ++k) norm.push_back(k < in.c ? 0.45 : 0.225);
      const ddp::ImageTransform t(ddp::parse_augment(s.augment), norm, in.c, side, side, 0);
      std::vector<ddp::SampleBox> boxes_host(static_cast<std::size_t>(n));
      const double tb = now();
      for (std::int64_t i = 0; i < n; ++i)
        boxes_host[std::size_t(i)] = t.box(in, 0, b.index[std::size_t(i)], s.training);
      const double box_s = now() - tb;
      Kokkos::View<ddp::SampleBox*> boxes("loader_bench.boxes", std::size_t(n));
      Kokkos::deep_copy(boxes,
                        Kokkos::View<const ddp::SampleBox*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                            boxes_host.data(), boxes_host.size()));
      Kokkos::View<float*> out("loader_bench.out", std::size_t(n * t.output_numel()));
      t.apply(in, x.data(), boxes.data(), n, out.data());  // warm-up: first touch of out
      Kokkos::fence();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = now();
      for (std::int64_t r = 0; r < repeats; ++r) t.apply(in, x.data(), boxes.data(), n, out.data());
      Kokkos::fence();
      const double per_batch = max_over_ranks((now() - t0) / double(repeats));
      if (rank == 0)
        std::printf(
            "Augment::apply, %s: %.2f ms per batch of %lld -> (%lld, %lld, %lld) (%.0f images/s per rank); "
            "drawing the boxes on the host %.3f ms\n",
            s.name, 1e3 * per_batch, (long long)n, (long long)in.c, (long long)side, (long long)side,
            double(n) / per_batch, 1e3 * box_s);
    }
  }
  Kokkos::finalize();
  MPI_Finalize();
  return 0;
}
