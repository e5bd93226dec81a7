#pragma once
// Layer specs as written in the input file: 'linear(256)', 'relu', 'conv2d(32, 3, pad=1)',
// 'maxpool(2)', 'batchnorm2d(sync)', 'resblock(64, stride=2)'. Whitespace-tolerant and
// case-insensitive; options (key=value) follow the positional arguments.

#include <memory>
#include <string>

#include "model/layer.hpp"

namespace ddp {

// Build the layer a spec names. Throws InputError with the reason only
// ("unknown layer; known: ..."); the model prefixes "model.layers(i) = '...': ".
std::unique_ptr<Layer> make_layer(const std::string& spec);

// The known specs, as shown in messages: "linear(n), relu, tanh, flatten, dropout(p), conv2d(...".
std::string known_layers();

}  // namespace ddp
