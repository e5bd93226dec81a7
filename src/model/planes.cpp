#include "model/planes.hpp"

#include <cstdlib>
#include <string>

#include "comm/check.hpp"
#include "model/elements.hpp"

namespace ddp {

int element_team_size() {
  if constexpr (Kokkos::SpaceAccessibility<ExecSpace, Kokkos::HostSpace>::accessible) {
    return 1;  // the host's teams are one thread (Kokkos::Serial takes no more)
  } else {
    static const int warps = [] {
      const char* v = std::getenv("DDP_ELEMENT_WARPS");
      if (!v || !*v) return 8;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      if (*end != '\0' || n < 1 || n > 16)
        throw InputError(
            std::string("DDP_ELEMENT_WARPS='") + v +
            "': the warps a block of the GPU's element loops holds, a whole number from 1 to 16");
      return int(n);
    }();
    return warps;
  }
}

namespace {
// A switch's environment variable: whether it is set to `on`; unset or empty, or
// `off`, it is not; any other value is an input error naming both and what they do.
bool switched_on(const char* name, const char* off, const char* on, const std::string& what) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  const std::string s(v);
  if (s != off && s != on) throw InputError(std::string(name) + "='" + s + "': " + what);
  return s == on;
}

// -1: not set by set_element_vectors (set_bn_relu_mask_from_input), the variable decides.
int vectors_override = -1, mask_override = -1;
}  // namespace

bool element_vectors() {
  if (vectors_override >= 0) return vectors_override == 1;
  static const bool on =
      !switched_on("DDP_ELEMENT_VECTORS", "1", "0",
                   "1 (the element-wise kernels load 8 elements at a time where they can, the default) or 0 "
                   "(one at a time)");
  return on;
}

void set_element_vectors(bool on) { vectors_override = on ? 1 : 0; }

bool bn_relu_mask_from_input() {
  if (mask_override >= 0) return mask_override == 1;
  static const bool from_input =
      switched_on("DDP_BN_RELU_MASK", "output", "input",
                  "'output' (batch norm's backward reads its output for its relu's mask, the default) or "
                  "'input' (it computes bn(x) > 0 again from its input)");
  return from_input;
}

void set_bn_relu_mask_from_input(bool on) { mask_override = on ? 1 : 0; }

namespace {
template <bool Narrow>
void move_elements(const Tensor& src, Tensor& dst, const char* label) {
  const std::int64_t B = src.batch(), C = src.shape[1], hw = src.shape[2] * src.shape[3];
  // src's element (b, c, i): ((b * CBs + c / BSs) * hw + i) * BSs + c % BSs, or in
  // NHWC (b * hw + i) * C + c
  const int bs = channel_block(src.layout), shift = bs == 16 ? 4 : bs == 8 ? 3 : 0;
  const std::int64_t cbs = (C + bs - 1) / bs;
  const bool from_nhwc = src.layout == Layout::nhwc;
  const auto s = elements<Narrow>(src);
  const auto d = elements<Narrow>(dst);
  for_each_element(
      label, dst.layout, B, C, hw,
      KOKKOS_LAMBDA(std::int64_t b, std::int64_t c, std::int64_t i, std::int64_t e) {
        const std::int64_t at =
            from_nhwc ? (b * hw + i) * C + c : ((b * cbs + (c >> shift)) * hw + i) * bs + (c & (bs - 1));
        d.set(e, c < C ? s(at) : 0.0f);
      });
}

template <bool NarrowDst, bool NarrowSrc>
void add_flat(const Tensor& src, Tensor& dst, const char* label) {
  const auto d = elements<NarrowDst>(dst);
  map_flat(
      label, dst.storage_numel(), KOKKOS_LAMBDA(std::int64_t, float de, float se) { return de + se; }, d, d,
      elements<NarrowSrc>(src));
}
}  // namespace

void add_elements(const char* label, const Tensor& src, Tensor& dst) {
  DDP_REQUIRE(src.shape == dst.shape && src.layout == dst.layout,
              label << ": adding a tensor of another shape or layout");
  const bool narrow_dst = dst.type != Precision::fp32, narrow_src = src.type != Precision::fp32;
  if (narrow_dst)
    narrow_src ? add_flat<true, true>(src, dst, label) : add_flat<true, false>(src, dst, label);
  else
    narrow_src ? add_flat<false, true>(src, dst, label) : add_flat<false, false>(src, dst, label);
}

void convert_layout(const Tensor& src, Tensor& dst, Layout to, const char* label) {
  const Shape sample(src.shape.begin() + 1, src.shape.end());
  resize(dst, src.batch(), sample, label, to, src.type);
  if (src.type == Precision::fp32)
    move_elements<false>(src, dst, label);
  else
    move_elements<true>(src, dst, label);
}

}  // namespace ddp
