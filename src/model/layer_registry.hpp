#pragma once
// Layer specs as written in the input file: 'linear(256)', 'relu', 'tanh',
// 'flatten', 'dropout(0.5)'. Whitespace-tolerant and case-insensitive.

#include <memory>
#include <string>

#include "model/layer.hpp"

namespace ddp {

// Build the layer a spec names. Throws InputError with the reason only
// ("unknown layer; known: ..."); the model prefixes "model.layers(i) = '...': ".
std::unique_ptr<Layer> make_layer(const std::string& spec);

// The known specs, as shown in messages: "linear(n), relu, tanh, flatten, dropout(p)".
std::string known_layers();

}  // namespace ddp
