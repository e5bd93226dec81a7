#pragma once
// A tensor's elements whatever their type. Activations are fp32 but where the model
// keeps them in the narrow type of train.precision (bf16 or fp16) between the layers
// of residual blocks on the GPU (ResBlock::set_types), as PyTorch's AMP
// does: half the bytes for every pass over them, and no casts around the narrow
// convolutions that read and write that type anyway. A narrow tensor packs two
// elements into each float of its buffer. Kernels read and write elements through
// the accessors below, in fp32; the narrowing rounds to nearest, ties to even, as
// round_bf16 / round_fp16 (model/precision.hpp) and the CUDA casts do.

#include <cstdint>

#include "model/tensor.hpp"

namespace ddp {

// A float's bits and back (a union: Kokkos 3.4 has no bit_cast; nvcc and GCC
// define reading the other member).
KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float x) {
  union {
    float f;
    std::uint32_t u;
  } v{x};
  return v.u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  union {
    std::uint32_t u;
    float f;
  } v{u};
  return v.f;
}

// from_bf16 and from_fp16, which a kernel applies to every narrow value it reads,
// and to_bf16 have no branch: each case's bits computed, then one chosen, which the
// compiler does without branching. from_fp16's branches (and NarrowElements' choice
// between the two, around them) split a GPU thread's code after each load, so a
// thread that reads a run of values (batch norm's sums) waited for each load before
// it issued the next, in bf16 too (sm_90 SASS of the GPU build: each LDG followed by
// branches; the fp32 kernels' 8 loads back to back).

// bf16: the float's upper half, rounded; NaN stays a (quiet) NaN; inf rounds to
// itself (its lower half is 0), a finite value may carry into inf, as it should.
KOKKOS_INLINE_FUNCTION std::uint16_t to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  const std::uint32_t r = nan ? (u | 0x00400000u) : u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(r >> 16);
}
KOKKOS_INLINE_FUNCTION float from_bf16(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

// fp16 (IEEE binary16): beyond 65504 (from 65520 on, which ties to the next power)
// inf, below 2^-14 its subnormals (multiples of 2^-24), up to 2^-25 signed zero.
KOKKOS_INLINE_FUNCTION std::uint16_t to_fp16(float x) {
  const std::uint32_t u = float_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  const std::uint32_t e = a >> 23;
  if (e < 113) {  // a subnormal fp16: the value in units of 2^-24, to nearest even
    if (e < 102) return static_cast<std::uint16_t>(sign);
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u, s = 126 - e, half = 1u << (s - 1);
    std::uint32_t r = m >> s;
    const std::uint32_t rest = m & ((1u << s) - 1u);
    if (rest > half || (rest == half && (r & 1u))) ++r;  // 0x400 is the smallest normal
    return static_cast<std::uint16_t>(sign | r);
  }
  const std::uint32_t rounded = a + 0x0fffu + ((a >> 13) & 1u);  // 10 mantissa bits, may carry
  return static_cast<std::uint16_t>(sign | ((rounded >> 13) - (112u << 10)));
}
// Exact (every fp16 is a float): a subnormal or zero is m 2^-24, inf and NaN keep
// their sign and payload, a normal is rebiased.
KOKKOS_INLINE_FUNCTION float from_fp16(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16, em = h & 0x7fffu, e = em >> 10;
  const std::uint32_t small = float_bits(float(h & 0x3ffu) * 5.9604644775390625e-08f);
  const std::uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13), normal = (em << 13) + (112u << 23);
  return bits_float(sign | (e == 0 ? small : e == 31 ? special : normal));
}

// A loop over a pack's lanes or a thread's loads, unrolled on the GPU, so that the
// packs and the arrays indexed by the loop stay in registers (nvcc left them in local
// memory otherwise: 64 to 256 bytes of stack in the narrow vector kernels); the host
// compiler needs no word.
#if defined(__CUDA_ARCH__)
#define DDP_UNROLL _Pragma("unroll")
#else
#define DDP_UNROLL
#endif

// Eight consecutive elements' storage, loaded and stored whole: 16-byte words (one
// for narrow elements, two for fp32; data aligned to 16 bytes and the first element's
// index a multiple of 8). The element maps and the channels-last channel sums read
// 8 channels of a pixel (or 8 flat elements) so where they can: one load instruction
// for 8 narrow values where the one-element loads took 8 of 2 bytes each.
struct alignas(16) Floats8 {
  float v[8];
};
struct alignas(16) Halves8 {
  std::uint16_t h[8];
};
// Whether p may be read and written 16 bytes at a time.
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// A per-channel constant of an element map's operation (batch norm's mean, 1/std,
// gamma, beta, ...), k(c) read from memory; at8(c0) gives channels c0..c0+7 (c0 a
// multiple of 8, the data 16-byte aligned: aligned()) in two 16-byte loads, as
// ChannelValues8, for map_vectors' threads (model/planes.hpp). Why: their
// operations read each constant 4 bytes at a time, a lane at a time, and adjacent
// threads take adjacent groups of 8 channels, so that each such load of a warp
// touched up to 8 lines of L1 for one float a thread: 120 of them beside 15 16-byte
// loads of data in batch norm's bf16 backward (sm_90 SASS of the GPU build).
// ChannelValues8(c): channel c's value, c in c0..c0+7 (its lane c % 8).
struct ChannelValues8 {
  Floats8 v;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c) const { return v.v[c & 7]; }
};
struct ChannelValues {
  const float* data;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t c) const { return data[c]; }
  KOKKOS_INLINE_FUNCTION ChannelValues8 at8(std::int64_t c0) const {
    return {*reinterpret_cast<const Floats8*>(data + c0)};
  }
  bool aligned() const { return aligned16(data); }
};

// The elements of a tensor (index e of its storage, as the layout lays them out)
// as floats, through one of two accessors whose kind the kernels take as a template
// argument, so that an fp32 loop stays a plain loop over floats (an accessor testing
// the type at every access ran a small ResNet on the host about a fifth slower in
// two alternated runs, where the host never stores a narrow tensor).
// T: const or not; set(e, v) only where not.
// load8(e) reads the 8 elements from e (a multiple of 8) as a pack, lane(pack, l) is
// its element l as a float, set8(e, v) stores 8 floats there; aligned() says whether
// the data allow them (16-byte aligned).
template <class T>
struct Fp32Elements {
  T* data;
  using Pack = Floats8;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t e) const { return data[e]; }
  KOKKOS_INLINE_FUNCTION void set(std::int64_t e, float v) const { data[e] = v; }
  KOKKOS_INLINE_FUNCTION Pack load8(std::int64_t e) const { return *reinterpret_cast<const Pack*>(data + e); }
  KOKKOS_INLINE_FUNCTION float lane(const Pack& p, int l) const { return p.v[l]; }
  KOKKOS_INLINE_FUNCTION void set8(std::int64_t e, const float* v) const {
    Pack p;
    DDP_UNROLL for (int l = 0; l < 8; ++l) p.v[l] = v[l];
    *reinterpret_cast<Pack*>(data + e) = p;
  }
  bool aligned() const { return aligned16(data); }
};

// bf16 or fp16 elements (fp16 chosen per tensor: both take the same kernels);
// set(e, v) stores v rounded.
template <class T>
struct NarrowElements {
  T* data;
  bool fp16;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t e) const {
    const std::uint16_t h = data[e];
    return fp16 ? from_fp16(h) : from_bf16(h);
  }
  KOKKOS_INLINE_FUNCTION void set(std::int64_t e, float v) const { data[e] = fp16 ? to_fp16(v) : to_bf16(v); }
  using Pack = Halves8;
  KOKKOS_INLINE_FUNCTION Pack load8(std::int64_t e) const { return *reinterpret_cast<const Pack*>(data + e); }
  KOKKOS_INLINE_FUNCTION float lane(const Pack& p, int l) const {
    return fp16 ? from_fp16(p.h[l]) : from_bf16(p.h[l]);
  }
  KOKKOS_INLINE_FUNCTION void set8(std::int64_t e, const float* v) const {
    Pack p;
    DDP_UNROLL for (int l = 0; l < 8; ++l) p.h[l] = fp16 ? to_fp16(v[l]) : to_bf16(v[l]);
    *reinterpret_cast<Pack*>(data + e) = p;
  }
  bool aligned() const { return aligned16(data); }
};

// t's elements through the accessor of kind Narrow (t's type must be of that kind:
// the caller chose it by t.type).
template <bool Narrow>
auto elements(const Tensor& t) {
  if constexpr (Narrow)
    return NarrowElements<const std::uint16_t>{reinterpret_cast<const std::uint16_t*>(t.data.data()),
                                               t.type == Precision::fp16};
  else
    return Fp32Elements<const float>{t.data.data()};
}
template <bool Narrow>
auto elements(Tensor& t) {
  if constexpr (Narrow)
    return NarrowElements<std::uint16_t>{reinterpret_cast<std::uint16_t*>(t.data.data()),
                                         t.type == Precision::fp16};
  else
    return Fp32Elements<float>{t.data.data()};
}

// dst = src's elements in type `to` (src's shape and layout; rounded where narrower):
// the widening and narrowing around kernels that take fp32 only.
void convert_type(const Tensor& src, Tensor& dst, Precision to, const char* label);

}  // namespace ddp
