#include "model/planes.hpp"

namespace ddp {

void convert_layout(const Tensor& src, Tensor& dst, Layout to, const char* label) {
  const Shape sample(src.shape.begin() + 1, src.shape.end());
  const std::int64_t B = src.batch(), C = src.shape[1], hw = src.shape[2] * src.shape[3];
  resize(dst, B, sample, label, to);
  // src's element (b, c, i): ((b * CBs + c / BSs) * hw + i) * BSs + c % BSs, or in
  // NHWC (b * hw + i) * C + c
  const int bs = channel_block(src.layout), shift = bs == 16 ? 4 : bs == 8 ? 3 : 0;
  const std::int64_t cbs = (C + bs - 1) / bs;
  const bool from_nhwc = src.layout == Layout::nhwc;
  ConstView1 s = src.data;
  View1 d = dst.data;
  for_each_element(
      label, to, B, C, hw, KOKKOS_LAMBDA(std::int64_t b, std::int64_t c, std::int64_t i, std::int64_t e) {
        const std::int64_t at =
            from_nhwc ? (b * hw + i) * C + c : ((b * cbs + (c >> shift)) * hw + i) * bs + (c & (bs - 1));
        d(e) = c < C ? s(at) : 0.0f;
      });
}

}  // namespace ddp
