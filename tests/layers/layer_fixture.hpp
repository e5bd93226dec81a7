#pragma once
// A layer bound to its own parameter, gradient and buffer blocks, as the model
// would bind it, for the layer tests.

#include <memory>
#include <string>
#include <vector>

#include "../model/grad_check.hpp"
#include "model/elements.hpp"
#include "model/layer_registry.hpp"

namespace ddp::test {

// The elements of t as floats on the host, whatever its type (narrow ones widened).
inline std::vector<float> values(const Tensor& t) {
  Tensor wide;
  convert_type(t, wide, Precision::fp32, "test::values");
  return to_host(wide.data, t.storage_numel());
}

struct BoundLayer {
  std::unique_ptr<Layer> layer;
  Shape in_sample, out_sample;
  View1 params, grads, buffers;
  std::int64_t n = 0, nbuf = 0;

  BoundLayer(const std::string& spec, const Shape& in) : layer(make_layer(spec)), in_sample(in) {
    out_sample = layer->output_shape(in);
    for (const auto& p : layer->parameter_specs()) n += shape_numel(p.shape);
    for (const auto& b : layer->buffer_specs()) nbuf += shape_numel(b.shape);
    params = View1("test::params", n);
    grads = View1("test::grads", n);
    buffers = View1("test::buffers", nbuf);
    layer->bind(params.data(), grads.data());
    layer->bind_buffers(buffers.data());
    Rng rng(1);
    layer->init(rng);
  }

  Shape batch_shape(std::int64_t B, const Shape& sample) const {
    Shape s = {B};
    s.insert(s.end(), sample.begin(), sample.end());
    return s;
  }
};

}  // namespace ddp::test
