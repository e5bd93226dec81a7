#include "model/elements.hpp"

namespace ddp {

namespace {
template <bool NarrowFrom, bool NarrowTo>
void convert(const Tensor& src, Tensor& dst, const char* label) {
  const auto from = elements<NarrowFrom>(src);
  const auto into = elements<NarrowTo>(dst);
  Kokkos::parallel_for(
      label, Range(0, src.storage_numel()), KOKKOS_LAMBDA(std::int64_t e) { into.set(e, from(e)); });
}
}  // namespace

void convert_type(const Tensor& src, Tensor& dst, Precision to, const char* label) {
  resize_like(dst, src, to, label);
  const bool narrow_from = src.type != Precision::fp32, narrow_to = to != Precision::fp32;
  if (narrow_from && narrow_to)
    convert<true, true>(src, dst, label);
  else if (narrow_from)
    convert<true, false>(src, dst, label);
  else if (narrow_to)
    convert<false, true>(src, dst, label);
  else
    convert<false, false>(src, dst, label);
}

}  // namespace ddp
