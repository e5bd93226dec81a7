// ddp_bench: how fast a training step runs, and how close to the machine's floor.
//
//   mpirun -np W ddp_bench input.nml [group.key=value ...]
//
// Trains train.epochs (default here: 1) epochs of the input exactly as ddp_train
// does (same data path, same trainer), with no checkpoints; with train.epochs > 1 the
// first epoch warms up (cuDNN's plans and algorithm searches, first allocations and
// touches) and is neither timed nor counted. Then it measures in the
// same run the floor of one step: the GEMMs and convolutions that step made, timed
// alone at the same shapes, plus one all-reduce of the gradient bytes. Prints
// samples/s, the per-step split, the floor and the efficiency floor/actual, and a
// JSON line for scripts.
//
// DDP_BENCH_ALLREDUCE=1: only the all-reduce, at sizes from 4 KB to 64 MB, and its
// alpha-beta fit (bench_allreduce below), then exit: what tools/scaling_model reads.
//
// DDP_LAUNCH_COUNT=1: also counts what the epoch dispatched (Kokkos kernels, deep
// copies, GEMM/convolution calls; model/kernel_trace.hpp) and prints it per step;
// DDP_LAUNCH_COUNT=names adds the Kokkos kernels per step by label;
// DDP_LAUNCH_COUNT=times also times each of them and, in the GPU build, each cuBLAS
// and cuDNN call and each of the build's own CUDA kernels; prints them by label, the
// longest first, and the rest of the step: what runs outside them (the host, copies,
// collectives; on the CPU also the oneDNN calls, the floor's part of it).
// Then the same by kind of work (convolution forward, batch norm, element-wise, ...),
// the kinds `tools/torch_bench.py --profile` sorts PyTorch's kernels into.
// Kokkos fences around every kernel while it counts: take the times from a run
// without it, or from the same run with DDP_LAUNCH_COUNT=after, which counts (as 1
// does) in one more epoch after the timed ones, untimed: the times are then the
// uncounted run's (tools/bench_gpu takes both from one run so).
// DDP_LAUNCH_COUNT=device, in the GPU build: times as `times` does, but on the
// device, by CUDA events around each kernel and call, with Kokkos's fences off, so
// the counted step runs as an uncounted one does without graphs and what is outside
// the kernels is the device idle (or copying, or in NCCL on a stream of its own). Run
// it with train.cuda_graph = off: nothing is captured while a count runs, but a graph
// captured in the warm-up epoch replays as one launch. In the CPU build it times as
// `times` does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "comm/context.hpp"
#include "comm/host_memory.hpp"
#include "comm/log.hpp"
#include "comm/watchdog.hpp"
#include "io/metrics.hpp"
#include "model/backend.hpp"
#include "model/kernel_trace.hpp"
#include "train/setup.hpp"
#include "train/trainer.hpp"
#if defined(KOKKOS_ENABLE_CUDA)  // defined by the Kokkos headers above
#include "cuda/device.hpp"
#endif

namespace ddp {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The kernels of one forward + backward at batch B, each timed alone: seconds per step.
double kernel_floor(Model& model, std::int64_t B, const Shape& sample, int repeats, std::size_t* count,
                    double* flops) {
  Tensor x;
  x.shape = {B};
  for (auto d : sample) x.shape.push_back(d);
  x.data = View1("bench::x", std::size_t(B * shape_numel(sample)));
  Kokkos::deep_copy(x.data, 0.5f);
  kernel_trace::start();
  const Tensor& out = model.forward(x, /*training=*/true);
  Tensor dout;
  dout.shape = out.shape;
  dout.data = View1("bench::dout", out.data.extent(0));
  Kokkos::deep_copy(dout.data, 1e-3f);
  model.backward(dout);
  std::vector<kernel_trace::Kernel> kernels = kernel_trace::stop();
  *count = kernels.size();
  *flops = 0.0;
  for (const auto& k : kernels) *flops += k.flops;
  for (auto& k : kernels) k.replay();  // warm caches and lazy initialisation
  // On a GPU the replays are queued: the clock stops when the device is done.
  compute_backend().synchronize();
  // `repeats` times, or fewer (3 at least) where they add up to 5 s: a GPT-2-sized
  // step on a CPU takes seconds.
  std::vector<double> times;
  double spent = 0.0;
  for (int r = 0; r < repeats && (r < 3 || spent < 5.0); ++r) {
    const double t0 = now();
    for (auto& k : kernels) k.replay();
    compute_backend().synchronize();
    times.push_back(now() - t0);
    spent += times.back();
  }
  return median(times);
}

// One all-reduce of n floats the way the run reduces its gradients: through the
// communicator's bucket reducer, one bucket (MPI on host memory, shared memory where
// comm.shared_memory applies, NCCL in the GPU build), or its plain all-reduce where
// there is none (comm.overlap = 'none'; MPI on device memory): seconds (median of
// `repeats`).
double allreduce_floor(Communicator& comm, const CommConfig& cc, MPI_Comm world, std::size_t n, int repeats) {
  if (comm.size() == 1) return 0.0;
  View1 buf("bench::allreduce", n);
  Kokkos::deep_copy(buf, 1.0f);
  std::unique_ptr<BucketReducer> reducer;
  if (cc.overlap != "none")
    reducer =
        comm.make_bucket_reducer(buf.data(), {Bucket{0, std::int64_t(n)}}, cc.overlap, cc.shared_memory, {});
  if (reducer) reducer->take_gradients();  // where the trainer's gradients are then, as there
  std::vector<double> times;
  for (int r = 0; r < repeats + 2; ++r) {
    MPI_Barrier(world);
    const double t0 = now();
    if (reducer) {
      reducer->mark_ready(0);
      reducer->finish();
    } else {
      comm.allreduce_sum(buf.data(), n);
    }
    Kokkos::fence();  // the GPU build queues it on the compute stream's order
    double t = now() - t0, slowest = 0.0;
    MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, world);
    if (r >= 2) times.push_back(slowest);
  }
  return median(times);
}

// DDP_BENCH_ALLREDUCE=1: nccl-tests' all_reduce_perf for the run's own path. The
// all-reduce of 1 Ki to 16 Mi floats (4 KB to 64 MB), each as allreduce_floor times
// it (the communicator's bucket reducer, one bucket), on rank 0 a line per size with
// its time, algorithm bandwidth (bytes / time) and bus bandwidth (that times
// 2 (W - 1) / W, what each rank's links carry in a ring), then a JSON line that
// tools/scaling_model reads: the times by size, and the alpha-beta fit (alpha the
// median time of the three smallest sizes, busbw from the largest:
// t(n) = alpha + n 2 (W - 1) / W / busbw).
void bench_allreduce(Communicator& comm, const CommConfig& cc, MPI_Comm world) {
  const int W = comm.size();
  const double ring = 2.0 * (W - 1) / std::max(W, 1);
  std::vector<std::pair<double, double>> points;  // (bytes, seconds)
  log::info("allreduce   " + std::to_string(W) +
            " ranks, the run's path (comm.backend, overlap, shared_memory)");
  log::info("allreduce      bytes    time_us   algbw_GB/s   busbw_GB/s");
  for (std::size_t n = 1024; n <= (std::size_t(1) << 24); n *= 4) {
    const double t = allreduce_floor(comm, cc, world, n, 20), bytes = 4.0 * double(n);
    points.emplace_back(bytes, t);
    char line[160];
    std::snprintf(line, sizeof line, "allreduce %10.0f %10.1f %12.3f %12.3f", bytes, t * 1e6,
                  t > 0 ? bytes / t / 1e9 : 0.0, t > 0 ? bytes * ring / t / 1e9 : 0.0);
    log::info(line);
  }
  std::vector<double> small = {points[0].second, points[1].second, points[2].second};
  std::sort(small.begin(), small.end());
  const double alpha = small[1], big = points.back().first, tb = points.back().second;
  const double busbw = tb > alpha ? big * ring / (tb - alpha) : 0.0;
  std::string bytes, seconds;
  for (const auto& [b, t] : points) {
    bytes += (bytes.empty() ? "" : ", ") + std::to_string(std::int64_t(b));
    char v[32];
    std::snprintf(v, sizeof v, "%.9f", t);
    seconds += (seconds.empty() ? "" : ", ") + std::string(v);
  }
  char fit[120];
  std::snprintf(fit, sizeof fit, "\"alpha_us\": %.3f, \"busbw_gbs\": %.4f", alpha * 1e6, busbw / 1e9);
  log::info("allreduce_json: {\"world_size\": " + std::to_string(W) + ", " + fit + ", \"bytes\": [" + bytes +
            "], \"seconds\": [" + seconds + "]}");
}

// DDP_LAUNCH_COUNT's modes: 1 counts, names adds the kernels by label, times their
// times (fenced), device their device times (the GPU build: CUDA events, unfenced);
// after counts as 1 does, in an extra epoch after the timed ones.
enum class Count { off, totals, names, times, device, after };

Count count_mode(const char* env) {
  if (!env || !*env || std::strcmp(env, "0") == 0) return Count::off;
  if (std::strcmp(env, "names") == 0) return Count::names;
  if (std::strcmp(env, "times") == 0) return Count::times;
  if (std::strcmp(env, "device") == 0) return Count::device;
  if (std::strcmp(env, "after") == 0) return Count::after;
  return Count::totals;
}

// The kind of work a kernel or call is, by its label: the kinds tools/torch_bench.py
// --profile sorts PyTorch's kernels into, so that the two steps' times sit side by side.
const char* kind_of(const std::string& label) {
  const auto has = [&label](const char* s) { return label.find(s) != std::string::npos; };
  if (has("conv forward")) return "convolution forward";
  if (has("conv backward data")) return "convolution backward data";
  if (has("conv backward filter")) return "convolution backward filter";
  // the pass after a GEMM where its epilogue is not the library's (model/gemm.cpp)
  if (has("gemm_epilogue::")) return "element-wise";
  if (has("gemm")) return "GEMM";
  if (has("BatchNorm2d::")) return "batch norm";
  if (has("Pool::")) return "pooling";
  if (has("CrossEntropy::") || has("MSE::") || has("Loss::") || has("_loss")) return "loss";
  if (has("SGD::") || has("AdamW::") || has("Optimizer::") || has("nonfinite") || has("LossScaler::"))
    return "optimizer";
  if (has("convert") || has("round_to") || has("transpose")) return "conversions and layout";
  if (has("Augment::") || has("InputStage::")) return "input";
  if (has("ReLU::") || has("Tanh::") || has("Dropout::") || has("ResBlock::add") || has("ResBlock::bn_add") ||
      has("Conv2d::add") || has("Linear::relu") || has("bias") || has("accumulate from") || has("Rng::"))
    return "element-wise";
  return "other";
}

// A timed count's kernels and calls by label, the longest first, per step (per = 1 /
// steps), then by kind, and what of the counted step `step_s` was outside them.
void print_kernel_times(const kernel_trace::Dispatches& dispatched, double per, double step_s) {
  std::vector<std::pair<double, std::string>> by_time;
  for (const auto& [label, seconds] : dispatched.kernel_seconds) by_time.emplace_back(seconds, label);
  for (const auto& [label, seconds] : dispatched.call_seconds) by_time.emplace_back(seconds, label);
  std::sort(by_time.rbegin(), by_time.rend());
  const double kokkos = dispatched.kernel_seconds_total() * per,
               calls = dispatched.call_seconds_total() * per;
  char line[480];
  std::snprintf(
      line, sizeof line,
      "  kernels     %.3f ms per step in Kokkos kernels, %.3f ms in cuBLAS/cuDNN calls and own CUDA "
      "kernels, %.3f ms outside them (%s) of the counted step's %.3f ms (%s); by label, longest first:",
      kokkos * 1e3, calls * 1e3, (step_s - kokkos - calls) * 1e3,
      dispatched.device_times ? "the device idle, or copying and in NCCL on streams of their own"
                              : "the host, copies, collectives; on a CPU the oneDNN calls",
      step_s * 1e3,
      dispatched.device_times ? "device times: CUDA events around each, nothing fenced"
                              : "fenced: each from the fence before it to the fence after");
  log::info(line);
  std::map<std::string, std::pair<double, double>> kinds;  // seconds and launches per kind
  for (const auto& [seconds, label] : by_time) {
    std::int64_t n = 0;  // how many: a Kokkos kernel's label, or a call's
    if (const auto k = dispatched.kernels.find(label); k != dispatched.kernels.end())
      n = k->second;
    else if (const auto c = dispatched.calls.find(label); c != dispatched.calls.end())
      n = c->second;
    std::snprintf(line, sizeof line, "              %9.3f ms %7.2f x  %s", seconds * per * 1e3,
                  double(n) * per, label.c_str());
    log::info(line);
    auto& kind = kinds[kind_of(label)];
    kind.first += seconds * per;
    kind.second += double(n) * per;
  }
  std::vector<std::pair<double, std::string>> by_kind;
  for (const auto& [kind, t] : kinds) by_kind.emplace_back(t.first, kind);
  std::sort(by_kind.rbegin(), by_kind.rend());
  log::info(
      "  kinds       the same per step by kind (as tools/torch_bench.py --profile sorts PyTorch's kernels):");
  for (const auto& [seconds, kind] : by_kind) {
    std::snprintf(line, sizeof line, "              %9.3f ms %7.2f x  %s", seconds * 1e3, kinds[kind].second,
                  kind.c_str());
    log::info(line);
  }
}

// The DDP_LAUNCH_COUNT line: what the counted epoch(s) dispatched, per step (per = 1 /
// steps), and with names, the Kokkos kernels by label; after: counted in an epoch of
// its own.
void print_launches(const kernel_trace::Dispatches& dispatched, double per, bool names, bool after) {
  char line[400], own[96] = "";
#if defined(KOKKOS_ENABLE_CUDA)
  std::snprintf(own, sizeof own, " + %.1f own CUDA kernels + %.1f CUDA graph launches",
                double(dispatched.cuda) * per, double(dispatched.graphs) * per);
#endif
  std::snprintf(
      line, sizeof line,
      "  launches    %.1f per step (rank 0): %.1f Kokkos kernels + %.1f deep copies + %.1f GEMM/conv "
      "calls%s (DDP_LAUNCH_COUNT: %s)",
      double(dispatched.total()) * per, double(dispatched.kokkos) * per, double(dispatched.copies) * per,
      double(dispatched.library) * per, own,
      after ? "counted in an extra epoch after the timed ones"
            : "fenced, the times above are not the uncounted run's");
  log::info(line);
  if (!names) return;
  for (const auto& [label, n] : dispatched.kernels) {
    std::snprintf(line, sizeof line, "              %6.2f  %s", double(n) * per, label.c_str());
    log::info(line);
  }
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  // Here, not at file scope: nvcc's generated code after this file calls ::log,
  // which a file-scope directive would make ambiguous with ddp::log.
  using namespace ddp;
  const Count mode = count_mode(std::getenv("DDP_LAUNCH_COUNT"));
  // Told before Kokkos starts: a device-timed count runs with Kokkos's tool fences off.
  const bool device_times = mode == Count::device && kernel_trace::unfence_kokkos_tools();
  Context ctx(argc, argv);
  CommandLine cli = parse_command_line(ctx, argc, argv);
  if (cli.exit_now) return cli.exit_code;
  // A benchmark trains one epoch from scratch and writes nothing but metrics;
  // the user's overrides come after these and win.
  cli.overrides.insert(cli.overrides.begin(), {"train.epochs=1", "io.checkpoint_every=0", "io.resume=never",
                                               "train.log_every=0", "io.run_dir=runs/bench"});
  const Config cfg = load_config(ctx, cli);
  Watchdog watchdog(ctx.world(), cfg.comm.timeout_s, ctx.thread_multiple());  // as ddp_train runs
  const RunDirLock run_dir_lock = prepare_run_dir(ctx, cfg);
  Data data = open_data(ctx, cfg);
  ModelSetup net = build_model(ctx, cfg, data);
  auto comm = make_communicator(ctx, cfg);
  if (const char* a = std::getenv("DDP_BENCH_ALLREDUCE"); a && std::string(a) == "1") {
    bench_allreduce(*comm, cfg.comm, ctx.world());
    return 0;
  }
  Trainer trainer(cfg, *comm, *net.model, net.loss, *data.train, nullptr, data.prefetch_batches);

  EpochStats e;
  double seconds = 0.0, wait = 0.0, fwd = 0.0, bwd = 0.0, com = 0.0, opt = 0.0, samples = 0.0;
  std::int64_t steps = 0;
  const bool count = mode != Count::off;
  const kernel_trace::Timing timing = device_times ? kernel_trace::Timing::device
                                      : mode == Count::times || mode == Count::device
                                          ? kernel_trace::Timing::fenced
                                          : kernel_trace::Timing::none;
  const int warmup = cfg.train.epochs > 1 ? 1 : 0;
  for (int epoch = 0; epoch < cfg.train.epochs; ++epoch) {
    if (count && mode != Count::after && epoch == warmup) kernel_trace::start_counting(timing);
    const std::int64_t before = trainer.step();
    e = trainer.train_epoch(epoch);
    if (epoch < warmup) continue;
    steps += trainer.step() - before;
    seconds += e.train_seconds;
    samples += e.samples_per_s * e.train_seconds;
    wait += e.data_wait_seconds, fwd += e.forward_seconds, bwd += e.backward_seconds;
    com += e.comm_seconds, opt += e.optimizer_seconds;
  }
  std::int64_t counted_steps = steps;
  if (mode == Count::after) {  // one more epoch, counted and not timed
    kernel_trace::start_counting();
    const std::int64_t before = trainer.step();
    trainer.train_epoch(cfg.train.epochs);
    counted_steps = trainer.step() - before;
  }
  const kernel_trace::Dispatches dispatched =
      count ? kernel_trace::stop_counting() : kernel_trace::Dispatches{};

  const std::int64_t B = cfg.train.batch_size;
  std::size_t n_kernels = 0;
  double flops = 0.0;
  const double kernels = kernel_floor(*net.model, B, data.train->sample_shape(), 20, &n_kernels, &flops);
  const std::size_t n_params = std::size_t(net.model->num_parameters());
  const double reduce = allreduce_floor(*comm, cfg.comm, ctx.world(), n_params, 20);
  // Every rank measured its own kernels; the slowest rank sets the pace.
  double kernels_max = kernels;
  MPI_Allreduce(MPI_IN_PLACE, &kernels_max, 1, MPI_DOUBLE, MPI_MAX, ctx.world());

  const double step = seconds / double(steps);
  const double floor_step = kernels_max * cfg.train.accumulation_steps + reduce;
  const double per_step = 1e3 / double(steps);
  const double other = seconds - wait - fwd - bwd - com - opt;
  // A language model's samples are windows of data.seq_len tokens.
  const double tokens_per_s = samples / seconds * double(cfg.data.seq_len);
  char tokens_text[64] = "";
  if (cfg.data.seq_len > 0) std::snprintf(tokens_text, sizeof tokens_text, " (tokens/s %.0f)", tokens_per_s);
  char text[1536];
  std::snprintf(
      text, sizeof text,
      "ddp_bench: %s, %d rank(s), batch %lld per rank, %lld steps%s\n"
      "  samples/s   %.*f%s\n"
      "  step        %.3f ms = data wait %.3f + forward %.3f + backward %.3f + exposed comm %.3f"
      " + optimizer %.3f + other %.3f\n"
      "  floor       %.3f ms = %zu GEMM/conv kernels %.3f (%.1f GFLOP/s) + all-reduce of %.2f MB %.3f\n"
      "  efficiency  %.2f (floor / actual)\n"
      "  model       %.1f GFLOP/s per rank in training (%.3g GFLOP per step: the GEMM/conv flops)\n"
      "  compute     %s; precision %s",
      cfg.source_path.c_str(), ctx.size(), (long long)B, (long long)steps,
      warmup ? " (after an untimed warm-up epoch)" : "", samples / seconds < 10.0 ? 3 : 0, samples / seconds,
      tokens_text, step * 1e3, wait * per_step, fwd * per_step, bwd * per_step, com * per_step,
      opt * per_step, other * per_step, floor_step * 1e3, n_kernels, kernels_max * 1e3,
      flops / kernels_max * 1e-9, double(n_params) * 4.0 / (1024.0 * 1024.0), reduce * 1e3, floor_step / step,
      flops * cfg.train.accumulation_steps / step * 1e-9, flops * cfg.train.accumulation_steps * 1e-9,
      compute_backend().name().c_str(), cfg.train.precision.c_str());
  log::info(text);
  const double per = 1.0 / double(counted_steps);
  if (count) print_launches(dispatched, per, mode == Count::names, mode == Count::after);
  if (timing != kernel_trace::Timing::none) print_kernel_times(dispatched, per, step);
  // Memory per rank: the trainer's plan beside what the process holds. The largest
  // rank's, as with the kernels: a job fits when its fullest rank does.
  const MemoryPlan plan = trainer.memory_plan();
  const auto [hwm, rss] = host_memory();  // bytes, -1 where unknown
  std::int64_t host[2] = {hwm, rss};
  MPI_Allreduce(MPI_IN_PLACE, host, 2, MPI_INT64_T, MPI_MAX, ctx.world());
  // The optimizer state each rank allocated (under ZeRO its share's): the largest and
  // the smallest over the ranks.
  std::int64_t state_max = plan.optimizer_state, state_min = plan.optimizer_state;
  MPI_Allreduce(MPI_IN_PLACE, &state_max, 1, MPI_INT64_T, MPI_MAX, ctx.world());
  MPI_Allreduce(MPI_IN_PLACE, &state_min, 1, MPI_INT64_T, MPI_MIN, ctx.world());
  char mem[768];
  std::snprintf(mem, sizeof mem,
                "  memory      per rank, planned: %s\n"
                "              measured: host VmHWM %.2f MB, VmRSS %.2f MB (largest rank); optimizer state "
                "allocated %.2f MB (largest rank) to %.2f MB (smallest), comm.zero = %d",
                plan.text(B).c_str(), double(host[0]) / (1024.0 * 1024.0),
                double(host[1]) / (1024.0 * 1024.0), double(state_max) / (1024.0 * 1024.0),
                double(state_min) / (1024.0 * 1024.0), cfg.comm.zero);
  log::info(mem);
  std::int64_t device_used = -1;
#if defined(KOKKOS_ENABLE_CUDA)
  // Every process's use of the rank's GPU (cudaMemGetInfo), the largest rank's: with a
  // GPU per rank, this run's allocations, caches and CUDA context.
  std::int64_t device_total = -1;
  cuda::device_memory(&device_used, &device_total);
  MPI_Allreduce(MPI_IN_PLACE, &device_used, 1, MPI_INT64_T, MPI_MAX, ctx.world());
  char dev[160];
  std::snprintf(dev, sizeof dev, "              device memory in use: %.2f MB of %.2f MB (largest rank)",
                double(device_used) / (1024.0 * 1024.0), double(device_total) / (1024.0 * 1024.0));
  log::info(dev);
#endif
  const MetricRecord json = {
      {"input", cfg.source_path},
      {"world_size", (long long)ctx.size()},
      {"batch_size", (long long)B},
      {"steps", (long long)steps},
      {"warmup_epochs", (long long)warmup},
      {"samples_per_s", samples / seconds},
      {"tokens_per_s", tokens_per_s},
      {"step_ms", step * 1e3},
      {"data_wait_ms", wait * per_step},
      {"forward_ms", fwd * per_step},
      {"backward_ms", bwd * per_step},
      {"exposed_comm_ms", com * per_step},
      {"optimizer_ms", opt * per_step},
      {"floor_kernels_ms", kernels_max * 1e3},
      {"floor_allreduce_ms", reduce * 1e3},
      {"floor_ms", floor_step * 1e3},
      {"efficiency", floor_step / step},
      {"model_gflops_per_s", flops * cfg.train.accumulation_steps / step * 1e-9},
      {"compute", compute_backend().name()},
      {"precision", cfg.train.precision},
      {"params_bytes", (long long)plan.parameters},
      {"grads_bytes", (long long)plan.gradients},
      {"zero", (long long)cfg.comm.zero},
      {"optimizer_state_bytes", (long long)plan.optimizer_state},
      {"optimizer_state_bytes_max", (long long)state_max},
      {"optimizer_state_bytes_min", (long long)state_min},
      {"activations_planned_bytes", (long long)plan.activations},
      {"host_hwm_bytes", (long long)host[0]},
      {"host_rss_bytes", (long long)host[1]},
      {"device_used_bytes", (long long)device_used},
      {"launches_per_step", count ? double(dispatched.total()) * per : -1.0},
      {"kokkos_kernels_per_step", count ? double(dispatched.kokkos) * per : -1.0},
      {"library_calls_per_step", count ? double(dispatched.library) * per : -1.0},
      {"kokkos_kernel_ms_per_step",
       timing != kernel_trace::Timing::none ? dispatched.kernel_seconds_total() * per * 1e3 : -1.0},
      {"call_ms_per_step",
       timing != kernel_trace::Timing::none ? dispatched.call_seconds_total() * per * 1e3 : -1.0},
      {"device_times", (long long)dispatched.device_times}};
  log::info("json: " + to_json_line(json));
  return 0;
}
