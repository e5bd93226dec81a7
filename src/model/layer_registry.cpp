// The one table of layer kinds. A new kind is one row: its name, its usage as
// shown to the user, its positional argument count, the options it accepts
// (`key=value`, or a bare flag such as `sync`) and a factory that validates them.
#include "model/layer_registry.hpp"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>

#include "comm/check.hpp"
#include "model/activation.hpp"
#include "model/attention.hpp"
#include "model/batchnorm.hpp"
#include "model/conv2d.hpp"
#include "model/dropout.hpp"
#include "model/embedding.hpp"
#include "model/flatten.hpp"
#include "model/gelu.hpp"
#include "model/layernorm.hpp"
#include "model/linear.hpp"
#include "model/pool.hpp"
#include "model/resblock.hpp"
#include "model/transformer_block.hpp"
#include "model/vit.hpp"

namespace ddp {

namespace {

using Args = std::vector<std::string>;               // positional arguments, whitespace removed
using Options = std::map<std::string, std::string>;  // "stride" -> "2"; a bare flag "sync" -> "true"

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

bool bool_arg(const std::string& arg, const char* what) {
  if (arg == "true" || arg == "t" || arg == ".true." || arg == "1") return true;
  if (arg == "false" || arg == "f" || arg == ".false." || arg == "0") return false;
  throw InputError(std::string(what) + " must be true or false, got '" + arg + "'");
}

// The option `key` as an integer >= lo, or `fallback` when absent.
std::int64_t int_option(const Options& o, const char* key, std::int64_t fallback, std::int64_t lo) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  std::int64_t v = int_arg(it->second, key);
  if (v < lo) throw InputError(std::string(key) + " must be >= " + std::to_string(lo));
  return v;
}

bool bool_option(const Options& o, const char* key, bool fallback) {
  auto it = o.find(key);
  return it == o.end() ? fallback : bool_arg(it->second, key);
}

// An initialisation's std=s (> 0), 1 when absent.
float stddev_option(const Options& o) {
  auto it = o.find("std");
  if (it == o.end()) return 1.0f;
  const double s = float_arg(it->second, "std");
  if (!(s > 0.0)) throw InputError("std must be > 0");
  return static_cast<float>(s);
}

std::int64_t positive(const std::string& arg, const char* what) {
  std::int64_t v = int_arg(arg, what);
  if (v < 1) throw InputError(std::string(what) + " must be >= 1");
  return v;
}

// maxpool / avgpool: PyTorch allows padding up to half the kernel.
std::unique_ptr<Layer> pool(Pool2d::Op op, const Args& a, const Options& o) {
  const std::int64_t k = positive(a[0], "kernel size"), pad = int_option(o, "pad", 0, 0);
  if (2 * pad > k) throw InputError("pad must be at most half the kernel size (" + std::to_string(k) + ")");
  return std::make_unique<Pool2d>(op, k, int_option(o, "stride", k, 1), pad);
}

// resblock / bottleneck: the options both take.
std::unique_ptr<Layer> residual_block(ResBlock::Kind kind, std::int64_t channels, const Options& o) {
  return std::make_unique<ResBlock>(kind, channels, int_option(o, "stride", 1, 1),
                                    bool_option(o, "zero_init", false), bool_option(o, "sync", false));
}

struct LayerRow {
  const char* name;     // "linear"
  const char* usage;    // "linear(n)"
  std::size_t nargs;    // positional arguments
  const char* options;  // "stride,pad,bias": accepted key=value options
  const char* flags;    // "sync": options that may be given bare, meaning true
  std::unique_ptr<Layer> (*make)(const Args& args, const Options& options);
};

const LayerRow kLayers[] = {
    {"linear", "linear(n[, bias=false][, tied])", 1, "bias,tied", "tied",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       std::int64_t n = int_arg(a[0], "out features");
       if (n < 1) throw InputError("out features must be >= 1");
       return std::make_unique<Linear>(n, bool_option(o, "bias", true), bool_option(o, "tied", false));
     }},
    {"relu", "relu", 0, "", "",
     [](const Args&, const Options&) -> std::unique_ptr<Layer> { return std::make_unique<ReLU>(); }},
    {"tanh", "tanh", 0, "", "",
     [](const Args&, const Options&) -> std::unique_ptr<Layer> { return std::make_unique<Tanh>(); }},
    {"flatten", "flatten", 0, "", "",
     [](const Args&, const Options&) -> std::unique_ptr<Layer> { return std::make_unique<Flatten>(); }},
    {"dropout", "dropout(p)", 1, "", "",
     [](const Args& a, const Options&) -> std::unique_ptr<Layer> {
       double p = float_arg(a[0], "p");
       if (!(p >= 0.0 && p < 1.0)) throw InputError("p must be in [0, 1)");
       return std::make_unique<Dropout>(static_cast<float>(p));
     }},
    {"conv2d", "conv2d(out, k[, stride=s][, pad=p][, bias=false])", 2, "stride,pad,bias", "",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       std::int64_t out = positive(a[0], "out channels"), k = positive(a[1], "kernel size");
       return std::make_unique<Conv2d>(out, k, int_option(o, "stride", 1, 1), int_option(o, "pad", 0, 0),
                                       bool_option(o, "bias", true));
     }},
    {"maxpool", "maxpool(k[, stride=s][, pad=p])", 1, "stride,pad", "",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> { return pool(Pool2d::Max, a, o); }},
    {"avgpool", "avgpool(k[, stride=s][, pad=p])", 1, "stride,pad", "",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> { return pool(Pool2d::Avg, a, o); }},
    {"globalavgpool", "globalavgpool", 0, "", "",
     [](const Args&, const Options&) -> std::unique_ptr<Layer> { return std::make_unique<GlobalAvgPool>(); }},
    {"batchnorm2d", "batchnorm2d[(sync)]", 0, "sync", "sync",
     [](const Args&, const Options& o) -> std::unique_ptr<Layer> {
       return std::make_unique<BatchNorm2d>(bool_option(o, "sync", false));
     }},
    {"resblock", "resblock(channels[, stride=s][, zero_init][, sync])", 1, "stride,zero_init,sync",
     "zero_init,sync",
     [](const Args& a, const Options& o) {
       return residual_block(ResBlock::Basic, positive(a[0], "channels"), o);
     }},
    {"bottleneck", "bottleneck(width[, stride=s][, zero_init][, sync])", 1, "stride,zero_init,sync",
     "zero_init,sync",
     [](const Args& a, const Options& o) {
       return residual_block(ResBlock::Bottleneck, positive(a[0], "width"), o);
     }},
    {"gelu", "gelu[(tanh)]", 0, "tanh", "tanh",
     [](const Args&, const Options& o) -> std::unique_ptr<Layer> {
       return std::make_unique<Gelu>(bool_option(o, "tanh", false));
     }},
    {"layernorm", "layernorm[(eps=e)]", 0, "eps", "",
     [](const Args&, const Options& o) -> std::unique_ptr<Layer> {
       auto it = o.find("eps");
       const float eps = it == o.end() ? 1e-5f : static_cast<float>(float_arg(it->second, "eps"));
       if (!(eps > 0.0f)) throw InputError("eps must be > 0");  // as a float: 1e-50 is 0
       return std::make_unique<LayerNorm>(eps);
     }},
    {"attention", "attention(heads[, causal][, block=N][, fused])", 1, "causal,dropout,block,fused",
     "causal,fused",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       auto it = o.find("dropout");
       if (it != o.end() && float_arg(it->second, "dropout") != 0.0)
         throw InputError("attention: dropout=" + it->second +
                          " is not yet supported (attention runs with dropout 0)");
       return std::make_unique<Attention>(positive(a[0], "heads"), bool_option(o, "causal", false),
                                          int_option(o, "block", Attention::kAutoBlock, 0),
                                          bool_option(o, "fused", false));
     }},
    {"transformer_block", "transformer_block(heads[, mlp=4][, causal][, tanh][, eps=e][, block=N][, fused])",
     1, "mlp,causal,tanh,eps,dropout,block,fused", "causal,tanh,fused",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       auto it = o.find("dropout");
       if (it != o.end() && float_arg(it->second, "dropout") != 0.0)
         throw InputError("transformer_block: dropout=" + it->second +
                          " is not yet supported (the block runs with dropout 0)");
       it = o.find("eps");
       const float eps = it == o.end() ? 1e-5f : static_cast<float>(float_arg(it->second, "eps"));
       if (!(eps > 0.0f)) throw InputError("eps must be > 0");
       return std::make_unique<TransformerBlock>(
           positive(a[0], "heads"), int_option(o, "mlp", 4, 1), bool_option(o, "causal", false),
           bool_option(o, "tanh", false), eps, int_option(o, "block", Attention::kAutoBlock, 0),
           bool_option(o, "fused", false));
     }},
    {"embedding", "embedding(vocab, d[, std=s])", 2, "std", "",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       const std::int64_t vocab = positive(a[0], "vocab"), d = positive(a[1], "d");
       if (vocab > (std::int64_t(1) << 24))
         throw InputError("vocab must be at most 16777216 (token ids travel as exact floats)");
       return std::make_unique<Embedding>(vocab, d, stddev_option(o));
     }},
    {"pos_embedding", "pos_embedding(positions[, std=s])", 1, "std", "",
     [](const Args& a, const Options& o) -> std::unique_ptr<Layer> {
       return std::make_unique<PosEmbedding>(positive(a[0], "positions"), stddev_option(o));
     }},
    {"patch_embed", "patch_embed(p, d)", 2, "", "",
     [](const Args& a, const Options&) -> std::unique_ptr<Layer> {
       return std::make_unique<PatchEmbed>(positive(a[0], "patch size"), positive(a[1], "d"));
     }},
    {"class_token", "class_token", 0, "", "",
     [](const Args&, const Options&) -> std::unique_ptr<Layer> { return std::make_unique<ClassToken>(); }},
    {"token_pool", "token_pool[(mean)]", 0, "mean", "mean",
     [](const Args&, const Options& o) -> std::unique_ptr<Layer> {
       return std::make_unique<TokenPool>(bool_option(o, "mean", false));
     }},
};

// "stride,pad" contains "pad"
bool listed(const char* list, const std::string& word) {
  std::string l = std::string(",") + list + ",";
  return !word.empty() && l.find("," + word + ",") != std::string::npos;
}

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
    // Positional arguments first, then options: key=value, or a bare flag.
    Args positional;
    Options options;
    for (const std::string& arg : args) {
      std::size_t eq = arg.find('=');
      std::string key = eq == std::string::npos ? arg : arg.substr(0, eq);
      if (eq != std::string::npos || listed(row.flags, key)) {
        if (!listed(row.options, key))
          throw InputError(name + " has no option '" + key + "'; usage: " + row.usage);
        if (options.count(key)) throw InputError(name + ": option '" + key + "' given twice");
        options[key] = eq == std::string::npos ? "true" : arg.substr(eq + 1);
      } else if (!options.empty()) {
        throw InputError(name + ": positional argument '" + arg + "' after an option; usage: " + row.usage);
      } else {
        positional.push_back(arg);
      }
    }
    if (positional.size() != row.nargs)
      throw InputError(name + " takes " + std::to_string(row.nargs) + " argument" +
                       (row.nargs == 1 ? "" : "s") + ", got " + std::to_string(positional.size()) +
                       "; usage: " + row.usage);
    return row.make(positional, options);
  }
  throw InputError("unknown layer; known: " + known_layers());
}

}  // namespace ddp
