#pragma once
// Loops over the elements of an image tensor (B, C, H, W) that know each element's
// channel without an integer division per element, in NCHW, in a channel-blocked
// layout (B, ceil(C/BS), H, W, BS) or channels-last (B, H, W, C). A 64-bit division
// per element costs more than the arithmetic around it: batch norm's passes with
// `(e / hw) % C` took 38% of the small ResNet's run on the host (perf, one rank).

#include <cfloat>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "model/elements.hpp"
#include "model/tensor.hpp"

namespace ddp {

// Threads of a team in the element loops and NCHW plane sums: on a GPU each is a warp
// of vector lanes, and a block of one warp caps an H100 SM at 32 resident blocks,
// half the threads it can hold; so a block there holds element_team_size() warps
// (8, or DDP_ELEMENT_WARPS=n), each taking its own pixels or planes. On the host a
// team is one thread. Results do not depend on it: every element is its own.
int element_team_size();

// The element loops' teams: element_team_size() threads, each with up to 32 vector
// lanes (a warp on a GPU).
using ElementTeam = Kokkos::TeamPolicy<ExecSpace, LaunchHint>;

// body(team, p) for every p in [0, n), a team thread each, whose vector lanes the body
// uses (Kokkos::ThreadVectorRange); element_team_size() of them in a team.
template <class Body>
void for_each_team_thread(const char* label, std::int64_t n, Body body) {
  const int lanes = ElementTeam::vector_length_max() < 32 ? ElementTeam::vector_length_max() : 32;
  const std::int64_t T = element_team_size();
  Kokkos::parallel_for(
      label, ElementTeam((n + T - 1) / T, int(T), lanes),
      KOKKOS_LAMBDA(const ElementTeam::member_type& team) {
        const std::int64_t p0 = team.league_rank() * T, p1 = p0 + T < n ? p0 + T : n;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, p0, p1), [&](std::int64_t p) { body(team, p); });
      });
}

// The sum over j in [0, n) of f(j) (a double), by one team thread over its vector
// lanes, in an order fixed by n alone: on the host in 8 running sums (lane j % 8),
// added in a fixed tree at the end, a loop the compiler vectorises (a running sum in
// one register is a chain of dependent adds: 4 cycles an element); on the device by
// Kokkos's reduction over the lanes. A row's statistics (layer norm, attention's
// softmax) on the host took 3 ns an element so.
template <class F>
KOKKOS_INLINE_FUNCTION double lane_sum(const ElementTeam::member_type& team, std::int64_t n, const F& f) {
#if defined(__CUDA_ARCH__)
  double s = 0.0;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(team, n), [&](std::int64_t j, double& acc) { acc += f(j); }, s);
  return s;
#else
  (void)team;
  double lane[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) lane[l] += f(j + l);
  for (int l = 0; j + l < n; ++l) lane[l] += f(j + l);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
#endif
}

// The largest f(j) over j in [0, n), n >= 1, by one team thread as lane_sum: on the
// host in 16 running maxima, a loop the compiler vectorises. From the lowest finite
// float, as Kokkos's Max on the device: NaNs are passed over, and all -inf gives
// -FLT_MAX, on both.
template <class F>
KOKKOS_INLINE_FUNCTION float lane_max(const ElementTeam::member_type& team, std::int64_t n, const F& f) {
#if defined(__CUDA_ARCH__)
  float m = -FLT_MAX;
  Kokkos::parallel_reduce(
      Kokkos::ThreadVectorRange(team, n), [&](std::int64_t j, float& acc) { acc = f(j) > acc ? f(j) : acc; },
      Kokkos::Max<float>(m));
  return m;
#else
  (void)team;
  float lane[16];
  for (int l = 0; l < 16; ++l) lane[l] = -FLT_MAX;
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int l = 0; l < 16; ++l) lane[l] = f(j + l) > lane[l] ? f(j + l) : lane[l];
  for (int l = 0; j + l < n; ++l) lane[l] = f(j + l) > lane[l] ? f(j + l) : lane[l];
  float m = lane[0];
  for (int l = 1; l < 16; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
#endif
}

// fn(b, c, i, e) for every element e of a (B, C, H, W) tensor of BS-channel blocks
// (BS = 1: NCHW), hw = H * W: batch b, channel c (padding channels c >= C included),
// pixel i of the plane. NCHW: a team thread per (b, c) plane, its vector lanes over
// the plane; blocked: a thread per (b, block) walking its pixels, the block's BS
// channels innermost (contiguous).
template <int BS, class Fn>
void for_each_element(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw, Fn fn) {
  if constexpr (BS == 1) {
    for_each_team_thread(
        label, B * C, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t p) {
          const std::int64_t b = p / C, c = p - b * C;
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, hw),
                               [&](std::int64_t i) { fn(b, c, i, p * hw + i); });
        });
  } else {
    const std::int64_t CB = (C + BS - 1) / BS;
    Kokkos::parallel_for(
        label, Range(0, B * CB), KOKKOS_LAMBDA(std::int64_t p) {
          const std::int64_t b = p / CB, c0 = (p - b * CB) * BS;
          for (std::int64_t i = 0; i < hw; ++i)
            for (int l = 0; l < BS; ++l) fn(b, c0 + l, i, (p * hw + i) * BS + l);
        });
  }
}

// fn(b, c, i, e) for every element e of a (B, H, W, C) tensor: a team thread per
// pixel (b, i), its vector lanes over the channels (contiguous, so a GPU warp reads
// them in one transaction).
template <class Fn>
void for_each_element_nhwc(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw, Fn fn) {
  for_each_team_thread(
      label, B * hw, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t q) {
        const std::int64_t b = q / hw, i = q - b * hw, base = q * C;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, C),
                             [&](std::int64_t c) { fn(b, c, i, base + c); });
      });
}

// fn(q, c0) for every pixel q of n channels-last pixels of C channels and every group
// of V channels c0..c0+V-1 (V = 1, or 8 with C a multiple of 8). V = 1: a team
// thread per pixel, its vector lanes over the channels (for_each_element_nhwc's
// threads); V = 8: a thread per (pixel, group), adjacent threads adjacent groups, so
// that a pixel of few groups still fills a warp.
template <int V, class Fn>
void for_each_pixel_group(const char* label, std::int64_t n, std::int64_t C, Fn fn) {
  if constexpr (V == 1) {
    for_each_element_nhwc(
        label, n, C, 1,
        KOKKOS_LAMBDA(std::int64_t q, std::int64_t c, std::int64_t, std::int64_t) { fn(q, c); });
  } else {
    const std::int64_t G = C / V, threads = n * G;
    const bool index32 = threads <= std::int64_t(UINT32_MAX);  // a 32-bit division per thread
    Kokkos::parallel_for(
        label, Range(0, threads), KOKKOS_LAMBDA(std::int64_t p) {
          const std::int64_t q = index32 ? std::int64_t(std::uint32_t(p) / std::uint32_t(G)) : p / G;
          fn(q, (p - q * G) * V);
        });
  }
}

// The same for a tensor in `layout`.
template <class Fn>
void for_each_element(const char* label, Layout layout, std::int64_t B, std::int64_t C, std::int64_t hw,
                      Fn fn) {
  switch (layout) {
    case Layout::nhwc:
      return for_each_element_nhwc(label, B, C, hw, fn);
    case Layout::nChw8c:
      return for_each_element<8>(label, B, C, hw, fn);
    case Layout::nChw16c:
      return for_each_element<16>(label, B, C, hw, fn);
    case Layout::nchw:
      return for_each_element<1>(label, B, C, hw, fn);
  }
}

// Values a thread of the channel sums reads before it adds them (the NHWC pixels of
// a run, a column's rows), and a thread of the element maps before it computes:
// loads in flight at once (on a GPU one load a thread at a time, waited for before
// the next, leaves the memory idle), added or computed in the same order as one at a
// time.
constexpr int kLoadsAhead = 8;

// An input that an element map's operation does not take (reads as 0, unused).
struct NoInput {
  struct Pack {};
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t) const { return 0.0f; }
  KOKKOS_INLINE_FUNCTION Pack load8(std::int64_t) const { return {}; }
  KOKKOS_INLINE_FUNCTION float lane(const Pack&, int) const { return 0.0f; }
  bool aligned() const { return true; }
};

// Whether the element maps and the channels-last channel sums read and write 8
// elements a load where they can (map_vectors, plane_sums_nhwc_vectors): yes unless
// DDP_ELEMENT_VECTORS=0 (one element a load, for measuring the two against each
// other); the results are the same either way, bit for bit. set_element_vectors
// overrides the variable (tests).
bool element_vectors();
void set_element_vectors(bool on);

// Where batch norm's backward takes its fused relu's mask from: its output y (> 0),
// read as a third input (the default), or under DDP_BN_RELU_MASK=input its input x,
// bn(x) > 0 computed again: a third fewer bytes read, but each thread loads gamma and
// beta too (for measuring the two against each other). The same gradients but where
// a narrow output rounded a positive value to 0. set_bn_relu_mask_from_input
// overrides the variable (tests).
bool bn_relu_mask_from_input();
void set_bn_relu_mask_from_input(bool on);

template <class E>
constexpr bool is_narrow_elements = false;
template <class T>
constexpr bool is_narrow_elements<NarrowElements<T>> = true;

// op(c, a[, b[, d]]): the inputs that are there.
template <class Bi, class Di, class Op>
KOKKOS_INLINE_FUNCTION auto apply_map(const Op& op, std::int64_t c, float a, float b, float d) {
  if constexpr (!std::is_same_v<Di, NoInput>)
    return op(c, a, b, d);
  else if constexpr (!std::is_same_v<Bi, NoInput>)
    return op(c, a, b);
  else
    return op(c, a);
}

// out(e) = op(c, a(e)[, b(e)[, d(e)]]) for every e in [0, n), in runs: a thread
// reads kLoadsAhead elements of each input, all before it computes the first
// result, then stores its results. C > 0: the elements of a channels-last (B, H, W,
// C) tensor, a thread per run of kLoadsAhead pixels of one channel c (adjacent
// threads read adjacent channels, the channel's own values loaded once); C = 0: any
// n elements taken flat, c = 0, a thread's elements as far apart as there are
// threads. Each element is computed as one at a time would be: the same floats.
// Why: ResNet-50's bf16 residual-block passes (bn_add_relu, add_shortcut_grad, the
// relu's backward) moved 0.8 to 1.2 TB/s on an H100, a third of its memory's speed
// (bytes from the layer shapes over their times in a counted step); their threads
// took one element at a time, a 2-byte load of each input, which by the code's shape
// left few bytes in flight (the likely reason, not measured apart).
template <class Op, class Out, class A, class Bi, class Di>
void map_runs(const char* label, std::int64_t n, std::int64_t C, Op op, Out out, A a, Bi b, Di d) {
  constexpr int L = kLoadsAhead;
  const std::int64_t threads = C == 0 ? (n + L - 1) / L : (n / C + L - 1) / L * C;
  const bool index32 = threads <= std::int64_t(UINT32_MAX);  // a 32-bit division per thread
  Kokkos::parallel_for(
      label, Range(0, threads), KOKKOS_LAMBDA(std::int64_t p) {
        std::int64_t base = p, stride = threads, c = 0;
        if (C > 0) {
          const std::int64_t r = index32 ? std::int64_t(std::uint32_t(p) / std::uint32_t(C)) : p / C;
          c = p - r * C;
          base = r * L * C + c;
          stride = C;
        }
        if (base + (L - 1) * stride < n) {
          float va[L], vb[L], vd[L], res[L];
          for (int u = 0; u < L; ++u) {
            const std::int64_t e = base + u * stride;
            va[u] = a(e);
            vb[u] = b(e);
            vd[u] = d(e);
          }
          for (int u = 0; u < L; ++u) res[u] = apply_map<Bi, Di>(op, c, va[u], vb[u], vd[u]);
          for (int u = 0; u < L; ++u) out.set(base + u * stride, res[u]);
        } else {
          for (std::int64_t e = base; e < n; e += stride)
            out.set(e, apply_map<Bi, Di>(op, c, a(e), b(e), d(e)));
        }
      });
}

// Pixels (or flat packs) of 8 elements a thread of map_vectors and
// plane_sums_nhwc_vectors loads before it computes: 16-byte loads in flight at once.
constexpr int kVectorLoads = 4;

// An operation with per-channel constants that can load 8 channels' values together
// (op.at8(c0): elements.hpp's ChannelValues), such as batch norm's passes.
template <class Op, class = void>
constexpr bool has_at8 = false;
template <class Op>
constexpr bool has_at8<Op, std::void_t<decltype(std::declval<const Op&>().at8(std::int64_t()))>> = true;

// op for a map_vectors thread's channels c0..c0+7: its constants loaded once, 16 bytes
// a load, where it has at8 (never in a flat map: map_flat), else op itself.
template <class Op>
KOKKOS_INLINE_FUNCTION auto channel_lanes(const Op& op, std::int64_t c0) {
  if constexpr (has_at8<Op>)
    return op.at8(c0);
  else
    return op;
}

// Whether op's per-channel constants (if it loads them 8 at a time) allow it.
template <class Op>
bool op_aligned(const Op& op) {
  if constexpr (has_at8<Op>)
    return op.aligned();
  else
    return true;
}

// map_runs with 8 elements a load: a thread per run of kVectorLoads pixels and group
// of 8 channels c0..c0+7 (C > 0, a multiple of 8), or per kVectorLoads packs of 8
// flat elements as far apart as there are threads (C = 0, n a multiple of 8); every
// input of the run loaded before the first result is computed, each result stored 8
// at a time. Each element is computed as map_runs computes it: the same floats.
// Why: the narrow passes' threads loaded 2 bytes an element, 8 elements ahead: 16
// bytes in flight a thread and an input, in 8 load instructions, where one 16-byte
// load now carries a pixel's 8 channels (4 of them ahead: 64 bytes).
template <class Op, class Out, class A, class Bi, class Di>
void map_vectors(const char* label, std::int64_t n, std::int64_t C, Op op, Out out, A a, Bi b, Di d) {
  constexpr int L = kVectorLoads;
  const std::int64_t G = C / 8, threads = C == 0 ? (n / 8 + L - 1) / L : (n / C + L - 1) / L * G;
  const bool index32 = threads <= std::int64_t(UINT32_MAX);
  // An operation with at8 goes by channel (map_flat refuses it): lane l's channel is
  // c0 + l, known so where the compiler indexes the constants it loaded (as c0 + l or
  // 0 by C, it kept them in local memory, indexed at run time).
  constexpr bool by_channel = has_at8<Op>;
  Kokkos::parallel_for(
      label, Range(0, threads), KOKKOS_LAMBDA(std::int64_t p) {
        std::int64_t base = p * 8, stride = threads * 8, c0 = 0;
        if (C > 0) {
          const std::int64_t r = index32 ? std::int64_t(std::uint32_t(p) / std::uint32_t(G)) : p / G;
          c0 = (p - r * G) * 8;
          base = r * L * C + c0;
          stride = C;
        }
        // op for channels c0..c0+7 (its constants loaded here, where it loads them 8
        // at a time); a pack's 8 results into res.
        const auto lanes_op = channel_lanes(op, c0);
        const auto compute = [&](const typename A::Pack& pa, const typename Bi::Pack& pb,
                                 const typename Di::Pack& pd, float* res) {
          DDP_UNROLL for (int l = 0; l < 8; ++l) {
            const std::int64_t c = by_channel || C > 0 ? c0 + l : 0;
            res[l] = apply_map<Bi, Di>(lanes_op, c, a.lane(pa, l), b.lane(pb, l), d.lane(pd, l));
          }
        };
        if (base + (L - 1) * stride < n) {
          typename A::Pack pa[L];
          typename Bi::Pack pb[L];
          typename Di::Pack pd[L];
          DDP_UNROLL for (int u = 0; u < L; ++u) {
            const std::int64_t e = base + u * stride;
            pa[u] = a.load8(e);
            pb[u] = b.load8(e);
            pd[u] = d.load8(e);
          }
          // Every result before the first store: with a store between two pixels the
          // compiler loads op's per-channel constants (where channel_lanes left them in
          // memory) again for the next, as the store might have changed them.
          float res[L][8];
          DDP_UNROLL for (int u = 0; u < L; ++u) compute(pa[u], pb[u], pd[u], res[u]);
          DDP_UNROLL for (int u = 0; u < L; ++u) out.set8(base + u * stride, res[u]);
        } else {
          for (std::int64_t e = base; e < n; e += stride) {
            float res[8];
            compute(a.load8(e), b.load8(e), d.load8(e), res);
            out.set8(e, res);
          }
        }
      });
}

// Whether map_vectors can take a map of n elements (C channels-last, or 0: flat).
template <class Op, class Out, class A, class Bi, class Di>
bool vectors_fit(std::int64_t n, std::int64_t C, const Op& op, const Out& out, const A& a, const Bi& b,
                 const Di& d) {
  return element_vectors() && (C > 0 ? C % 8 == 0 : n % 8 == 0) && op_aligned(op) && out.aligned() &&
         a.aligned() && b.aligned() && d.aligned();
}

// Whether the element maps go in runs: always on a GPU; on the host for narrow
// elements only (the host's fp32 passes keep their loops, made for its caches; it
// keeps narrow tensors in the tests alone, which thus run the runs).
template <class... E>
constexpr bool maps_in_runs() {
  return !Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible ||
         (is_narrow_elements<E> || ...);
}

// out(e) = op(c, a(e)[, b(e)[, d(e)]]) for every element e of a (B, C, H, W) tensor
// in `layout` (c its channel; padding channels of a blocked layout included): the
// inputs and out accessors of model/elements.hpp, of tensors in that layout. In
// runs for channels-last (map_runs), else for_each_element.
template <class Op, class Out, class A, class Bi = NoInput, class Di = NoInput>
void map_elements(const char* label, Layout layout, std::int64_t B, std::int64_t C, std::int64_t hw, Op op,
                  Out out, A a, Bi b = {}, Di d = {}) {
  if (layout == Layout::nhwc && maps_in_runs<Out, A, Bi, Di>()) {
    if (vectors_fit(B * hw * C, C, op, out, a, b, d))
      return map_vectors(label, B * hw * C, C, op, out, a, b, d);
    return map_runs(label, B * hw * C, C, op, out, a, b, d);
  }
  for_each_element(
      label, layout, B, C, hw, KOKKOS_LAMBDA(std::int64_t, std::int64_t c, std::int64_t, std::int64_t e) {
        out.set(e, apply_map<Bi, Di>(op, c, a(e), b(e), d(e)));
      });
}

// out(e) = op(0, a(e)[, b(e)[, d(e)]]) for the n elements of tensors of one shape and
// layout, taken flat (an operation of the element alone).
template <class Op, class Out, class A, class Bi = NoInput, class Di = NoInput>
void map_flat(const char* label, std::int64_t n, Op op, Out out, A a, Bi b = {}, Di d = {}) {
  static_assert(!has_at8<Op>, "map_flat: an operation of per-channel constants needs map_elements");
  if (maps_in_runs<Out, A, Bi, Di>()) {
    if (vectors_fit(n, 0, op, out, a, b, d)) return map_vectors(label, n, 0, op, out, a, b, d);
    return map_runs(label, n, 0, op, out, a, b, d);
  }
  Kokkos::parallel_for(
      label, Range(0, n),
      KOKKOS_LAMBDA(std::int64_t e) { out.set(e, apply_map<Bi, Di>(op, 0, a(e), b(e), d(e))); });
}

// Per-plane sums of two functions of the elements, in double: partial(b * Cp + c) =
// sum over plane (b, c) of f(c, a(e)[, b(e)[, d(e)]]) (the inputs that are there, as
// in map_elements), partial((B + b) * Cp + c) that of g, for every channel c < Cp (C
// rounded up to a block; padding channels included). The order of each sum is fixed,
// so runs repeat bit for bit. partial holds at least 2 B Cp.
template <int BS, class F, class G, class A, class Bi, class Di>
void plane_sums(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw,
                Kokkos::View<double*> partial, F f, G g, A a, Bi bi, Di di) {
  const std::int64_t CB = (C + BS - 1) / BS, Cp = CB * BS;
  if constexpr (BS == 1) {
    for_each_team_thread(
        label, B * C, KOKKOS_LAMBDA(const ElementTeam::member_type& team, std::int64_t p) {
          const std::int64_t c = p % C, base = p * hw;
          double sf = 0.0, sg = 0.0;
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, hw),
              [&](std::int64_t i, double& v) {
                const std::int64_t e = base + i;
                v += apply_map<Bi, Di>(f, c, a(e), bi(e), di(e));
              },
              sf);
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(team, hw),
              [&](std::int64_t i, double& v) {
                const std::int64_t e = base + i;
                v += apply_map<Bi, Di>(g, c, a(e), bi(e), di(e));
              },
              sg);
          Kokkos::single(Kokkos::PerThread(team), [&] {
            partial(p) = sf;
            partial(B * Cp + p) = sg;
          });
        });
  } else {
    Kokkos::parallel_for(
        label, Range(0, B * CB), KOKKOS_LAMBDA(std::int64_t p) {
          const std::int64_t c0 = p % CB * BS;
          double sf[BS] = {}, sg[BS] = {};
          for (std::int64_t i = 0; i < hw; ++i)
            for (int l = 0; l < BS; ++l) {
              const std::int64_t e = (p * hw + i) * BS + l;
              const float va = a(e), vb = bi(e), vd = di(e);
              sf[l] += apply_map<Bi, Di>(f, c0 + l, va, vb, vd);
              sg[l] += apply_map<Bi, Di>(g, c0 + l, va, vb, vd);
            }
          for (int l = 0; l < BS; ++l) {
            partial(p * BS + l) = sf[l];
            partial(B * Cp + p * BS + l) = sg[l];
          }
        });
  }
}

// Pixels per row of the NHWC channel sums' partial sums: a run of one image's plane.
constexpr std::int64_t kNhwcRun = 32;
// Runs of kNhwcRun pixels in a plane of hw pixels (the last one may be shorter).
constexpr std::int64_t nhwc_runs(std::int64_t hw) { return (hw + kNhwcRun - 1) / kNhwcRun; }

// The NHWC plane_sums: a row of partial sums per run of kNhwcRun pixels of one image
// (row b * runs + run), a thread per (row, channel) walking its pixels, kLoadsAhead at
// a time: adjacent threads read adjacent channels, and a batch of few large images
// still makes enough threads. partial holds at least 2 rows C.
template <class F, class G, class A, class Bi, class Di>
void plane_sums_nhwc(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw,
                     Kokkos::View<double*> partial, F f, G g, A a, Bi bi, Di di) {
  const std::int64_t runs = nhwc_runs(hw), rows = B * runs;
  Kokkos::parallel_for(
      label, Range(0, rows * C), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t r = p / C, c = p - r * C, b = r / runs, i0 = (r - b * runs) * kNhwcRun,
                           i1 = i0 + kNhwcRun < hw ? i0 + kNhwcRun : hw;
        double sf = 0.0, sg = 0.0;
        std::int64_t i = i0;
        for (; i + kLoadsAhead <= i1; i += kLoadsAhead) {
          double vf[kLoadsAhead], vg[kLoadsAhead];
          for (int u = 0; u < kLoadsAhead; ++u) {
            const std::int64_t e = (b * hw + i + u) * C + c;
            const float va = a(e), vb = bi(e), vd = di(e);
            vf[u] = apply_map<Bi, Di>(f, c, va, vb, vd);
            vg[u] = apply_map<Bi, Di>(g, c, va, vb, vd);
          }
          for (int u = 0; u < kLoadsAhead; ++u) {
            sf += vf[u];
            sg += vg[u];
          }
        }
        for (; i < i1; ++i) {
          const std::int64_t e = (b * hw + i) * C + c;
          const float va = a(e), vb = bi(e), vd = di(e);
          sf += apply_map<Bi, Di>(f, c, va, vb, vd);
          sg += apply_map<Bi, Di>(g, c, va, vb, vd);
        }
        partial(p) = sf;
        partial(rows * C + p) = sg;
      });
}

// plane_sums_nhwc with 8 channels a load (C a multiple of 8): a thread per (row,
// group of 8 channels c0..c0+7), kVectorLoads pixels' 16-byte loads of each input in
// flight before it adds them; each channel's values added in the same order as
// plane_sums_nhwc adds them, so the partial sums are the same, bit for bit. f's and
// g's per-channel constants are loaded once, 8 channels a load where they have at8
// (channel_lanes).
template <class F, class G, class A, class Bi, class Di>
void plane_sums_nhwc_vectors(const char* label, std::int64_t B, std::int64_t C, std::int64_t hw,
                             Kokkos::View<double*> partial, F f, G g, A a, Bi bi, Di di) {
  constexpr int L = kVectorLoads;
  const std::int64_t runs = nhwc_runs(hw), rows = B * runs, G8 = C / 8;
  Kokkos::parallel_for(
      label, Range(0, rows * G8), KOKKOS_LAMBDA(std::int64_t p) {
        const std::int64_t r = p / G8, c0 = (p - r * G8) * 8, b = r / runs, i0 = (r - b * runs) * kNhwcRun,
                           i1 = i0 + kNhwcRun < hw ? i0 + kNhwcRun : hw;
        double sf[8] = {}, sg[8] = {};
        const auto f8 = channel_lanes(f, c0);  // their constants loaded once, as map_vectors does
        const auto g8 = channel_lanes(g, c0);
        const auto add = [&](const typename A::Pack& pa, const typename Bi::Pack& pb,
                             const typename Di::Pack& pd) {
          DDP_UNROLL for (int l = 0; l < 8; ++l) {
            const float va = a.lane(pa, l), vb = bi.lane(pb, l), vd = di.lane(pd, l);
            sf[l] += apply_map<Bi, Di>(f8, c0 + l, va, vb, vd);
            sg[l] += apply_map<Bi, Di>(g8, c0 + l, va, vb, vd);
          }
        };
        std::int64_t i = i0;
        for (; i + L <= i1; i += L) {
          typename A::Pack pa[L];
          typename Bi::Pack pb[L];
          typename Di::Pack pd[L];
          DDP_UNROLL for (int u = 0; u < L; ++u) {
            const std::int64_t e = (b * hw + i + u) * C + c0;
            pa[u] = a.load8(e);
            pb[u] = bi.load8(e);
            pd[u] = di.load8(e);
          }
          DDP_UNROLL for (int u = 0; u < L; ++u) add(pa[u], pb[u], pd[u]);
        }
        for (; i < i1; ++i) {
          const std::int64_t e = (b * hw + i) * C + c0;
          add(a.load8(e), bi.load8(e), di.load8(e));
        }
        DDP_UNROLL for (int l = 0; l < 8; ++l) {
          partial(r * C + c0 + l) = sf[l];
          partial(rows * C + r * C + c0 + l) = sg[l];
        }
      });
}

// Rows of partial sums per channel that channel_sums makes: one per image, or in
// NHWC one per run of kNhwcRun pixels of an image.
constexpr std::int64_t partial_rows(Layout layout, std::int64_t B, std::int64_t hw) {
  return layout == Layout::nhwc ? B * nhwc_runs(hw) : B;
}

// channel_sums adds each channel's column of rows in one thread where it has at most
// kDirectRows rows. A longer column (NHWC's row per run of pixels makes up to a
// hundred thousand for a batch of large images) is first added in stretches of
// kStretchRows rows, a thread per (stretch, channel), into rows after the first
// ones, and those rows again while they are more: a tree whose every thread adds at
// most kDirectRows rows in order. (A thread per channel adding a column, and then
// stretches of its square root, were chains of hundreds of reads on an H100.)
constexpr std::int64_t kDirectRows = 64;
constexpr std::int64_t kStretchRows = 32;
// The rows of the next level of stretch sums for a column of `rows` (0: added directly).
constexpr std::int64_t stretches(std::int64_t rows) {
  return rows <= kDirectRows ? 0 : (rows + kStretchRows - 1) / kStretchRows;
}
// The rows of every level of stretch sums for a column of `rows`.
constexpr std::int64_t stretch_levels_rows(std::int64_t rows) {
  std::int64_t n = 0;
  for (std::int64_t k = stretches(rows); k > 0; k = stretches(k)) n += k;
  return n;
}

// Rows [r0, r1) of channel c's column of partial sums (f's rows from row f0, g's
// from g0; rows of Cp) added in order to sf and sg, kLoadsAhead rows read at a time.
KOKKOS_INLINE_FUNCTION void add_rows(const Kokkos::View<double*>& partial, std::int64_t Cp, std::int64_t c,
                                     std::int64_t f0, std::int64_t g0, std::int64_t r0, std::int64_t r1,
                                     double& sf, double& sg) {
  std::int64_t r = r0;
  for (; r + kLoadsAhead <= r1; r += kLoadsAhead) {
    double vf[kLoadsAhead], vg[kLoadsAhead];
    for (int u = 0; u < kLoadsAhead; ++u) {
      vf[u] = partial((f0 + r + u) * Cp + c);
      vg[u] = partial((g0 + r + u) * Cp + c);
    }
    for (int u = 0; u < kLoadsAhead; ++u) {
      sf += vf[u];
      sg += vg[u];
    }
  }
  for (; r < r1; ++r) {
    sf += partial((f0 + r) * Cp + c);
    sg += partial((g0 + r) * Cp + c);
  }
}

// No work after a channel's sums (a channel_sums' `then` where there is none).
struct NoThen {
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t, double, double) const {}
};

// sums(c) = sum of f(c, a(e)[, b(e)[, d(e)]]), sums(C + c) = that of g, over the
// elements e of channel c of a (B, C, H, W) tensor in `layout` (inputs a, b, d of that
// layout: model/elements.hpp's accessors, or NoInput): plane_sums, then each channel's
// rows added in order (in stretches first where they are many), and then(c, sum f,
// sum g) in the last kernel (the per-channel work that needs no other rank's sums:
// one launch fewer). The order is fixed: runs repeat bit for bit. partial holds at
// least partial_doubles(layout, B, C, hw). The kernels that add the rows are
// labelled rows_label, so that a launch count names them apart.
template <class F, class G, class Then, class A, class Bi = NoInput, class Di = NoInput>
void channel_sums(const char* label, const char* rows_label, Layout layout, std::int64_t B, std::int64_t C,
                  std::int64_t hw, Kokkos::View<double*> partial, Kokkos::View<double*> sums, F f, G g,
                  Then then, A a, Bi bi = {}, Di di = {}) {
  const int BS = channel_block(layout);
  const std::int64_t Cp = (C + BS - 1) / BS * BS, rows = partial_rows(layout, B, hw);
  switch (layout) {
    case Layout::nChw8c:
      plane_sums<8>(label, B, C, hw, partial, f, g, a, bi, di);
      break;
    case Layout::nChw16c:
      plane_sums<16>(label, B, C, hw, partial, f, g, a, bi, di);
      break;
    case Layout::nhwc:
      if (vectors_fit(B * hw * C, C, NoInput{}, NoInput{}, a, bi, di) && op_aligned(f) && op_aligned(g))
        plane_sums_nhwc_vectors(label, B, C, hw, partial, f, g, a, bi, di);
      else
        plane_sums_nhwc(label, B, C, hw, partial, f, g, a, bi, di);
      break;
    case Layout::nchw:
      plane_sums<1>(label, B, C, hw, partial, f, g, a, bi, di);
      break;
  }
  std::int64_t first = 0, n = rows;  // this level's rows: f's from row `first`, g's after them
  for (std::int64_t K = stretches(n); K > 0; K = stretches(n)) {
    const std::int64_t from = first, count = n, next = first + 2 * n;
    Kokkos::parallel_for(
        rows_label, Range(0, K * C), KOKKOS_LAMBDA(std::int64_t p) {
          const std::int64_t k = p / C, c = p - k * C, r0 = k * kStretchRows,
                             r1 = r0 + kStretchRows < count ? r0 + kStretchRows : count;
          double sf = 0.0, sg = 0.0;
          add_rows(partial, Cp, c, from, from + count, r0, r1, sf, sg);
          partial((next + k) * Cp + c) = sf;
          partial((next + K + k) * Cp + c) = sg;
        });
    first = next;
    n = K;
  }
  Kokkos::parallel_for(
      rows_label, Range(0, C), KOKKOS_LAMBDA(std::int64_t c) {
        double sf = 0.0, sg = 0.0;
        add_rows(partial, Cp, c, first, first + n, 0, n, sf, sg);
        sums(c) = sf;
        sums(C + c) = sg;
        then(c, sf, sg);
      });
}

// Cp: C rounded up to the largest channel block (16), the length of per-channel
// arrays that blocked kernels index with padding channels.
constexpr std::int64_t padded_channels(std::int64_t C) { return (C + 15) / 16 * 16; }

// The doubles channel_sums needs in `partial` for a (B, C, H, W) tensor in `layout`.
constexpr std::int64_t partial_doubles(Layout layout, std::int64_t B, std::int64_t C, std::int64_t hw) {
  const std::int64_t rows = partial_rows(layout, B, hw);
  return 2 * (rows + stretch_levels_rows(rows)) * padded_channels(C);
}

// dst += src, element by element, each in its own type (the sum rounded to dst's):
// tensors of one shape and layout, taken flat.
void add_elements(const char* label, const Tensor& src, Tensor& dst);

// dst = src, an image tensor (B, C, H, W), in layout `to` and src's type (a Kokkos
// reorder, for the layer that keeps a blocked layout inside but meets NCHW at its
// edge).
void convert_layout(const Tensor& src, Tensor& dst, Layout to, const char* label);

}  // namespace ddp
