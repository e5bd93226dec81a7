// The one table of layer kinds. A new kind (conv2d, pool, batchnorm) is one row:
// its name, its usage as shown to the user, its argument count and a factory that
// validates the arguments.
#include "model/layer_registry.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "comm/check.hpp"
#include "model/activation.hpp"
#include "model/dropout.hpp"
#include "model/flatten.hpp"
#include "model/linear.hpp"

namespace ddp {

namespace {

using Args = std::vector<std::string>;  // the spec's arguments, whitespace removed

std::int64_t int_arg(const std::string& arg, const char* what) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(arg.c_str(), &end, 10);
  if (arg.empty() || *end != '\0' || errno == ERANGE)
    throw InputError(std::string(what) + " must be an integer, got '" + arg + "'");
  return v;
}

double float_arg(const std::string& arg, const char* what) {
  char* end = nullptr;
  double v = std::strtod(arg.c_str(), &end);
  if (arg.empty() || *end != '\0' || !std::isfinite(v))
    throw InputError(std::string(what) + " must be a number, got '" + arg + "'");
  return v;
}

struct LayerRow {
  const char* name;   // "linear"
  const char* usage;  // "linear(n)"
  std::size_t nargs;
  std::unique_ptr<Layer> (*make)(const Args& args);
};

const LayerRow kLayers[] = {
    {"linear", "linear(n)", 1,
     [](const Args& a) -> std::unique_ptr<Layer> {
       std::int64_t n = int_arg(a[0], "out features");
       if (n < 1) throw InputError("out features must be >= 1");
       return std::make_unique<Linear>(n);
     }},
    {"relu", "relu", 0, [](const Args&) -> std::unique_ptr<Layer> { return std::make_unique<ReLU>(); }},
    {"tanh", "tanh", 0, [](const Args&) -> std::unique_ptr<Layer> { return std::make_unique<Tanh>(); }},
    {"flatten", "flatten", 0,
     [](const Args&) -> std::unique_ptr<Layer> { return std::make_unique<Flatten>(); }},
    {"dropout", "dropout(p)", 1,
     [](const Args& a) -> std::unique_ptr<Layer> {
       double p = float_arg(a[0], "p");
       if (!(p >= 0.0 && p < 1.0)) throw InputError("p must be in [0, 1)");
       return std::make_unique<Dropout>(static_cast<float>(p));
     }},
};

}  // namespace

std::string known_layers() {
  std::string s;
  for (const LayerRow& row : kLayers) s += (s.empty() ? "" : ", ") + std::string(row.usage);
  return s;
}

std::unique_ptr<Layer> make_layer(const std::string& spec) {
  // "  Linear ( 256 ) " -> name "linear", args {"256"}
  std::string s;
  for (char c : spec)
    if (!std::isspace(static_cast<unsigned char>(c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string name = s.substr(0, s.find('('));
  Args args;
  if (name.size() < s.size()) {
    if (s.back() != ')' || s.find('(', name.size() + 1) != std::string::npos || s.find(')') != s.size() - 1)
      throw InputError("malformed layer spec; expected name or name(arguments)");
    std::string inner = s.substr(name.size() + 1, s.size() - name.size() - 2);
    for (std::size_t start = 0; !inner.empty();) {
      std::size_t comma = inner.find(',', start);
      args.push_back(inner.substr(start, comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  for (const LayerRow& row : kLayers) {
    if (name != row.name) continue;
    if (args.size() != row.nargs)
      throw InputError(name + " takes " + std::to_string(row.nargs) + " argument" +
                       (row.nargs == 1 ? "" : "s") + ", got " + std::to_string(args.size()) +
                       "; usage: " + row.usage);
    return row.make(args);
  }
  throw InputError("unknown layer; known: " + known_layers());
}

}  // namespace ddp
