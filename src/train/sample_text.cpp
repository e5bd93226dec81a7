#include "train/sample_text.hpp"

#include <algorithm>
#include <cmath>

#include "comm/check.hpp"
#include "io/batch_loader.hpp"
#include "model/rng.hpp"

namespace ddp {

namespace {
// The next token from one position's logits (V): the most likely at temperature 0,
// else drawn by inverting the CDF of softmax(logits / temperature) at u in [0, 1).
std::int32_t draw(const std::vector<float>& logits, double temperature, double u) {
  const auto top = std::max_element(logits.begin(), logits.end());
  if (temperature <= 0.0) return std::int32_t(top - logits.begin());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (std::size_t v = 0; v < p.size(); ++v) sum += p[v] = std::exp((double(logits[v]) - *top) / temperature);
  double c = 0.0;
  for (std::size_t v = 0; v < p.size(); ++v)
    if ((c += p[v] / sum) > u) return std::int32_t(v);
  return std::int32_t(top - logits.begin());  // u at the top of [0, 1) by rounding
}
}  // namespace

TextSample sample_tokens(Model& model, ShardDataset& val, std::int64_t n, double temperature,
                         std::uint64_t seed, Tensor& x) {
  DDP_REQUIRE(val.tokens() && val.size() > 0, "sample_tokens: needs a validation set of token windows");
  const Shape& in = model.input_shape();
  const Shape& out = model.output_shape();
  DDP_REQUIRE(in.size() == 1 && out.size() == 2 && out[0] == in[0],
              "sample_tokens: the model does not map (T) tokens to (T, V) logits");
  const std::int64_t T = in[0], V = out[1];
  TextSample s;
  {
    BatchLoader loader(val, {0}, 1, 0);
    Batch first;
    DDP_REQUIRE(loader.next(first) && std::int64_t(first.x.size()) == T, "sample_tokens: no first window");
    for (std::int64_t t = 0; t < std::max<std::int64_t>(1, T / 2); ++t)
      s.prompt.push_back(std::int32_t(first.x[t]));
  }
  std::vector<std::int32_t> text = s.prompt;
  resize(x, 1, {T}, "sample_tokens::x");
  auto x_host = Kokkos::create_mirror_view(Kokkos::subview(x.data, std::make_pair(std::int64_t(0), T)));
  std::vector<float> logits(std::size_t(V), 0.0f);
  Rng rng(seed);
  for (std::int64_t k = 0; k < n; ++k) {
    // The T most recent tokens, then zeros; the logits at the last token's position.
    const std::int64_t start = std::max<std::int64_t>(0, std::int64_t(text.size()) - T);
    const std::int64_t len = std::int64_t(text.size()) - start;
    for (std::int64_t t = 0; t < T; ++t) x_host(t) = t < len ? float(text[std::size_t(start + t)]) : 0.0f;
    Kokkos::deep_copy(Kokkos::subview(x.data, std::make_pair(std::int64_t(0), T)), x_host);
    const Tensor& y = model.forward(x, /*training=*/false);
    auto row = Kokkos::subview(y.data, std::make_pair((len - 1) * V, len * V));
    auto row_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row);
    std::copy(row_host.data(), row_host.data() + V, logits.begin());
    const std::int32_t next = draw(logits, temperature, rng.uniform());
    text.push_back(next);
    s.continuation.push_back(next);
  }
  return s;
}

std::string decode(const std::vector<std::int32_t>& ids, const std::vector<std::string>& vocab) {
  std::string text;
  for (std::int32_t id : ids)
    text +=
        id >= 0 && std::size_t(id) < vocab.size() ? vocab[std::size_t(id)] : "<" + std::to_string(id) + ">";
  return text;
}

std::string escaped(const std::string& text) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += char(c);
    }
  }
  return out;
}

}  // namespace ddp
