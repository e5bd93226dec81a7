#pragma once
// AdamW's step on the host (optimizer.cpp's adamw_update in a CPU build): the same
// arithmetic as its per-element device kernel, element by element, in loops the
// compiler vectorises.

#include <cstddef>
#include <cstdint>

namespace ddp {

// Over the n elements of p, g, m, v: p *= decay (1 where decays[i] is 0; decays may be
// null: decay everywhere), then torch.optim.AdamW's update with g * scale.
void adamw_update_host(float* p, const float* g, float scale, float* m, float* v, std::size_t n, float decay,
                       const std::uint8_t* decays, float beta1, float beta2, float one_minus_beta1,
                       float one_minus_beta2, float step_size, float bias_correction2_sqrt, float eps);

}  // namespace ddp
