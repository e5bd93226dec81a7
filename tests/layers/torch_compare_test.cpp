// The layers, a small CNN and small sequence models (linear, layernorm, gelu,
// self-attention on (B, T, d)) against PyTorch 1.13 on the same inputs and parameters:
// forward outputs, input gradients, parameter gradients and BatchNorm running
// statistics. The numbers come from torch_reference.py (a CTest fixture) in the HDF5
// file named by DDP_TORCH_REFERENCE. Tolerance: the largest error relative to the
// largest reference value, max|ours - torch| / max|torch| <= 1e-5 (float32 on both
// sides, different summation orders).

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <map>

#include "comm/check.hpp"
#include "layer_fixture.hpp"
#include "model/model.hpp"

namespace ddp {
namespace {

using test::from_host;
using test::make_tensor;
using test::to_host;

constexpr double kTol = 1e-5;

class Reference {
 public:
  Reference() {
    const char* path = std::getenv("DDP_TORCH_REFERENCE");
    if (!path) path = "torch_reference.h5";
    file_ = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  }
  ~Reference() {
    if (file_ >= 0) H5Fclose(file_);
  }
  bool ok() const { return file_ >= 0; }
  bool has(const std::string& path) const { return H5Lexists(file_, path.c_str(), H5P_DEFAULT) > 0; }

  std::vector<float> floats(const std::string& path) const {
    hid_t d = H5_CHECK(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
    hid_t s = H5_CHECK(H5Dget_space(d));
    std::vector<double> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(s)));
    H5_CHECK(H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()));
    H5Sclose(s);
    H5Dclose(d);
    return std::vector<float>(v.begin(), v.end());
  }
  Shape shape(const std::string& path) const {
    hid_t d = H5_CHECK(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
    hid_t s = H5_CHECK(H5Dget_space(d));
    hsize_t dims[8];
    int rank = H5_CHECK(H5Sget_simple_extent_dims(s, dims, nullptr));
    H5Sclose(s);
    H5Dclose(d);
    return Shape(dims, dims + rank);
  }
  // Variable-length string attribute(s) of an object, as h5py writes them.
  std::vector<std::string> strings(const std::string& obj, const char* name) const {
    hid_t a = H5_CHECK(H5Aopen_by_name(file_, obj.c_str(), name, H5P_DEFAULT, H5P_DEFAULT));
    hid_t s = H5_CHECK(H5Aget_space(a));
    std::size_t n = static_cast<std::size_t>(H5Sget_simple_extent_npoints(s));
    if (n == 0) {  // an empty list (a model without buffers): nothing to read
      H5Sclose(s);
      H5Aclose(a);
      return {};
    }
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    std::vector<char*> raw(n);
    H5_CHECK(H5Aread(a, t, raw.data()));
    std::vector<std::string> out(raw.begin(), raw.end());
    H5Dvlen_reclaim(t, s, H5P_DEFAULT, raw.data());
    H5Tclose(t);
    H5Sclose(s);
    H5Aclose(a);
    return out;
  }
  long long integer(const std::string& obj, const char* name) const {
    hid_t a = H5_CHECK(H5Aopen_by_name(file_, obj.c_str(), name, H5P_DEFAULT, H5P_DEFAULT));
    long long v = 0;
    H5_CHECK(H5Aread(a, H5T_NATIVE_LLONG, &v));
    H5Aclose(a);
    return v;
  }
  std::vector<long long> integers(const std::string& obj, const char* name) const {
    hid_t a = H5_CHECK(H5Aopen_by_name(file_, obj.c_str(), name, H5P_DEFAULT, H5P_DEFAULT));
    hid_t s = H5_CHECK(H5Aget_space(a));
    std::vector<long long> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(s)));
    H5_CHECK(H5Aread(a, H5T_NATIVE_LLONG, v.data()));
    H5Sclose(s);
    H5Aclose(a);
    return v;
  }

 private:
  hid_t file_ = -1;
};

// max|ours - ref| / max(max|ref|, floor), checked against tol and printed for the record.
void compare(const std::string& what, const std::vector<float>& ours, const std::vector<float>& ref,
             double floor = 0.0, double tol = kTol) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::fabs(double(ours[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  const double rel = std::max(scale, floor) > 0 ? err / std::max(scale, floor) : err;
  std::cout << "  " << std::left << std::setw(48) << what << " max rel err " << std::scientific
            << std::setprecision(2) << rel << std::defaultfloat << "\n";
  EXPECT_LE(rel, tol) << what << ": max abs err " << err << ", max |torch| " << scale;
}

// tol: kTol, or tighter against a float64 reference
void compare_case(const std::string& name, double tol = kTol) {
  const Reference ref;
  ASSERT_TRUE(ref.ok()) << "cannot open the reference file (DDP_TORCH_REFERENCE)";
  const std::string g = "/" + name + "/";
  const std::string spec = ref.strings("/" + name, "spec")[0];
  const bool training = ref.integer("/" + name, "training") != 0;
  std::vector<long long> in = ref.integers("/" + name, "in_shape");
  test::BoundLayer b(spec, Shape(in.begin(), in.end()));

  // Parameters and buffers by their PyTorch names, in our order.
  std::vector<float> params, buffers;
  for (const auto& p : b.layer->parameter_specs()) {
    std::vector<float> v = ref.floats(g + "param." + p.suffix);
    params.insert(params.end(), v.begin(), v.end());
  }
  for (const auto& s : b.layer->buffer_specs()) {
    std::vector<float> v = ref.floats(g + "buffer_before." + s.suffix);
    buffers.insert(buffers.end(), v.begin(), v.end());
  }
  if (b.n) from_host(b.params, params);
  if (b.nbuf) from_host(b.buffers, buffers);

  Tensor x = make_tensor(ref.shape(g + "x"), ref.floats(g + "x")), y, dx;
  b.layer->forward(x, y, training);
  ASSERT_EQ(y.shape, ref.shape(g + "y"));
  compare(name + " y", to_host(y.data, y.numel()), ref.floats(g + "y"), 0.0, tol);
  Tensor dy = make_tensor(y.shape, ref.floats(g + "dy"));
  b.layer->backward(x, y, dy, dx);
  if (ref.has(g + "dx"))  // token ids (embedding) have none
    compare(name + " dx", to_host(dx.data, dx.numel()), ref.floats(g + "dx"), 0.0, tol);
  std::vector<float> grads = to_host(b.grads, b.n), bufs = to_host(b.buffers, b.nbuf);
  std::int64_t at = 0;
  for (const auto& p : b.layer->parameter_specs()) {
    std::int64_t n = shape_numel(p.shape);
    compare(name + " grad " + p.suffix, std::vector<float>(grads.begin() + at, grads.begin() + at + n),
            ref.floats(g + "grad." + p.suffix), 0.0, tol);
    at += n;
  }
  at = 0;
  for (const auto& s : b.layer->buffer_specs()) {
    std::int64_t n = shape_numel(s.shape);
    compare(name + " " + s.suffix, std::vector<float>(bufs.begin() + at, bufs.begin() + at + n),
            ref.floats(g + "buffer." + s.suffix));
    at += n;
  }
}

TEST(TorchCompare, Conv2dStridePad) { compare_case("conv_stride_pad"); }
TEST(TorchCompare, Conv2dValid) { compare_case("conv_valid"); }
TEST(TorchCompare, Conv2dNoBias) { compare_case("conv_nobias"); }
TEST(TorchCompare, Conv2d1x1Stride) { compare_case("conv_1x1_stride"); }
TEST(TorchCompare, MaxPool) { compare_case("maxpool2"); }
TEST(TorchCompare, MaxPoolOverlapping) { compare_case("maxpool3s2"); }
TEST(TorchCompare, MaxPoolPadded) { compare_case("maxpool3s2p1"); }
TEST(TorchCompare, AvgPool) { compare_case("avgpool2"); }
TEST(TorchCompare, AvgPoolPadded) { compare_case("avgpool3s2p1"); }
TEST(TorchCompare, AvgPoolOverlapping) { compare_case("avgpool3s2"); }
TEST(TorchCompare, GlobalAvgPool) { compare_case("globalavgpool"); }
TEST(TorchCompare, BatchNormTraining) { compare_case("batchnorm_train"); }
TEST(TorchCompare, BatchNormEval) { compare_case("batchnorm_eval"); }
TEST(TorchCompare, ResBlockIdentity) { compare_case("resblock_identity"); }
TEST(TorchCompare, ResBlockProjection) { compare_case("resblock_projection"); }
TEST(TorchCompare, ResBlockWiden) { compare_case("resblock_widen"); }
TEST(TorchCompare, ResBlockIdentitySmall) { compare_case("resblock_identity_small"); }
TEST(TorchCompare, BottleneckIdentity) { compare_case("bottleneck_identity"); }
TEST(TorchCompare, BottleneckProjection) { compare_case("bottleneck_projection"); }
TEST(TorchCompare, BottleneckWiden) { compare_case("bottleneck_widen"); }
TEST(TorchCompare, BottleneckWide) { compare_case("bottleneck_wide"); }
TEST(TorchCompare, GeluSequence) { compare_case("gelu_seq"); }
TEST(TorchCompare, GeluFlat) { compare_case("gelu_flat"); }
TEST(TorchCompare, GeluImage) { compare_case("gelu_image"); }
TEST(TorchCompare, GeluTanhSequence) { compare_case("gelu_tanh_seq"); }
TEST(TorchCompare, GeluTanhFlat) { compare_case("gelu_tanh_flat"); }
TEST(TorchCompare, LayerNormSequence) { compare_case("layernorm_seq"); }
TEST(TorchCompare, LayerNormFlat) { compare_case("layernorm_flat"); }
// Rows at 10 +- 0.1: PyTorch's float32 is 6e-6 off the exact (float64) numbers there
// (its float mean); ours, with the mean in two floats (layernorm.cpp's centred), is
// within 1e-6 of them.
TEST(TorchCompare, LayerNormOffsetRows) {
  compare_case("layernorm_offset");
  compare_case("layernorm_offset_f64", 1e-6);
}
TEST(TorchCompare, LayerNormEps) { compare_case("layernorm_eps"); }
TEST(TorchCompare, LayerNormGpt2Width) { compare_case("layernorm_gpt2"); }
TEST(TorchCompare, LinearSequence) { compare_case("linear_seq"); }
TEST(TorchCompare, LinearWithoutBias) { compare_case("linear_nobias_seq"); }
TEST(TorchCompare, AttentionT5D8H2) { compare_case("attention_t5_d8_h2"); }
TEST(TorchCompare, AttentionCausalT7D12H3) { compare_case("attention_causal_t7_d12_h3"); }
TEST(TorchCompare, AttentionOneToken) { compare_case("attention_t1"); }
TEST(TorchCompare, AttentionCausalOneToken) { compare_case("attention_causal_t1"); }
TEST(TorchCompare, AttentionOneHead) { compare_case("attention_h1"); }
TEST(TorchCompare, AttentionCausalOneHead) { compare_case("attention_causal_h1"); }
TEST(TorchCompare, AttentionCausalT32D64H4) { compare_case("attention_causal_t32_d64_h4"); }
// A repeated id in the batch: its rows of dy add up in its row of the table's gradient.
TEST(TorchCompare, Embedding) { compare_case("embedding_v11_d6"); }
// Fewer tokens than positions (rows 7, 8 without gradient), and all of them.
TEST(TorchCompare, PosEmbeddingShort) { compare_case("pos_embedding_short"); }
TEST(TorchCompare, PosEmbeddingFull) { compare_case("pos_embedding_full"); }
TEST(TorchCompare, TransformerBlockVit) { compare_case("block_vit"); }
TEST(TorchCompare, TransformerBlockGpt2) { compare_case("block_gpt2"); }
TEST(TorchCompare, TransformerBlockMlp2Eps) { compare_case("block_mlp2_eps"); }
// A vision transformer's layers: patches in row order, the class token first (its
// gradient summed over the batch), the class token's or the mean's pooling.
TEST(TorchCompare, PatchEmbed4) { compare_case("patch_embed_p4"); }
TEST(TorchCompare, PatchEmbed3TwoChannels) { compare_case("patch_embed_p3"); }
TEST(TorchCompare, ClassToken) { compare_case("class_token"); }
TEST(TorchCompare, TokenPoolClass) { compare_case("token_pool_class"); }
TEST(TorchCompare, TokenPoolMean) { compare_case("token_pool_mean"); }
// attention's block path (attention.hpp)
TEST(TorchCompare, AttentionBlocksOf3CausalT7) { compare_case("attention_block3_causal_t7"); }
TEST(TorchCompare, AttentionBlocksOf2T5) { compare_case("attention_block2_t5"); }
TEST(TorchCompare, AttentionOneBlockOfAllT6) { compare_case("attention_block_all_t6"); }
TEST(TorchCompare, AttentionBlocksOf8CausalT32D64H4) { compare_case("attention_block8_causal_t32"); }
TEST(TorchCompare, TransformerBlockGpt2BlocksOf4) { compare_case("block_gpt2_block4"); }

// A whole model (group /<group> of the reference): our names are exactly the
// nn.Sequential's state_dict keys (with the "layers." prefix of the checkpoint), and
// one training step matches. floors: per parameter name, the scale below which its
// gradient's error is measured against that floor instead (compare's floor).
void compare_model(const std::string& group, const std::vector<std::string>& specs, const Shape& sample,
                   const std::map<std::string, double>& floors = {}) {
  const Reference ref;
  ASSERT_TRUE(ref.ok());
  const std::string g = "/" + group;
  Model m(specs, sample, 0);
  std::vector<std::string> names, buffer_names;
  for (const auto& e : m.parameter_table()) names.push_back(e.name);
  for (const auto& e : m.buffer_table()) buffer_names.push_back(e.name);
  std::vector<std::string> torch_names, torch_buffer_names;
  for (const std::string& s : ref.strings(g, "param_names")) torch_names.push_back("layers." + s);
  for (const std::string& s : ref.strings(g, "buffer_names")) torch_buffer_names.push_back("layers." + s);
  EXPECT_EQ(names, torch_names);
  EXPECT_EQ(buffer_names, torch_buffer_names);
  ASSERT_EQ(names, torch_names);

  // Load parameters and buffers by name ("layers.4.conv1.weight" <- "state.4.conv1.weight").
  auto key = [&](const std::string& name) { return g + "/state." + name.substr(7); };
  std::vector<float> params = to_host(m.parameters(), m.num_parameters());
  std::vector<float> bufs = to_host(m.buffers(), m.buffers().extent(0));
  for (const auto& e : m.parameter_table()) {
    ASSERT_EQ(ref.shape(key(e.name)), e.shape) << e.name;
    std::vector<float> v = ref.floats(key(e.name));
    std::copy(v.begin(), v.end(), params.begin() + e.offset);
  }
  for (const auto& e : m.buffer_table()) {
    std::vector<float> v = ref.floats(key(e.name));
    std::copy(v.begin(), v.end(), bufs.begin() + e.offset);
  }
  from_host(m.parameters(), params);
  from_host(m.buffers(), bufs);

  Tensor x = make_tensor(ref.shape(g + "/x"), ref.floats(g + "/x"));
  const Tensor& y = m.forward(x, true);
  compare(group + " y", to_host(y.data, y.numel()), ref.floats(g + "/y"));
  m.zero_grad();
  m.backward(make_tensor(y.shape, ref.floats(g + "/dy")));
  std::vector<float> grads = to_host(m.gradients(), m.num_parameters());
  for (const auto& e : m.parameter_table()) {
    const auto floor = floors.find(e.name);
    compare(group + " grad " + e.name,
            std::vector<float>(grads.begin() + e.offset, grads.begin() + e.offset + e.size),
            ref.floats(g + "/grad." + e.name.substr(7)), floor == floors.end() ? 0.0 : floor->second);
  }
  bufs = to_host(m.buffers(), m.buffers().extent(0));
  for (const auto& e : m.buffer_table())
    compare(group + " " + e.name,
            std::vector<float>(bufs.begin() + e.offset, bufs.begin() + e.offset + e.size),
            ref.floats(g + "/state_after." + e.name.substr(7)));
}

TEST(TorchCompare, ModelNamesAndStep) {
  // The bias of a conv followed by batchnorm has a zero gradient: both sides hold
  // rounding noise (~1e-6), compared on the scale of the other gradients.
  compare_model("model",
                {"conv2d(8,3,pad=1)", "batchnorm2d", "relu", "maxpool(2)", "resblock(16,stride=2)",
                 "globalavgpool", "flatten", "linear(10)"},
                {3, 12, 12}, {{"layers.0.bias", 0.1}});
}

// GPT-2's MLP between layer norms on (B, T, d) samples: linear on the last dimension
// (with a relu fused after one), layernorm's names, both gelus, and the first layer (a
// layernorm) without dx.
TEST(TorchCompare, SequenceModelNamesAndStep) {
  compare_model("seq_model",
                {"layernorm", "linear(32)", "gelu(tanh)", "linear(8)", "layernorm", "gelu", "linear(12)",
                 "relu", "flatten", "linear(5)"},
                {6, 8});
}

// Pre-norm causal self-attention on (B, T, d): nn.MultiheadAttention's names inside
// the nn.Sequential (layers.1.in_proj_weight, ...), attention's dx into the layernorm.
TEST(TorchCompare, AttentionModelNamesAndStep) {
  compare_model("attention_model", {"layernorm", "attention(2, causal)", "linear(6)"}, {5, 8});
}

// A nanoGPT-shaped language model on token ids: the block's names under the
// nn.Sequential's (layers.2.self_attention.in_proj_weight, layers.2.mlp.0.weight, ...),
// the embedding first (no dx), positions, two causal blocks, the head on every token.
TEST(TorchCompare, GptModelNamesAndStep) {
  compare_model("gpt_model",
                {"embedding(13, 16)", "pos_embedding(8)", "transformer_block(2, causal, tanh)",
                 "transformer_block(2, causal, tanh)", "layernorm", "linear(13)"},
                {8});
}

// torchvision's VisionTransformer as a layer list (the reference checks the two give
// the same logits): patches, class token, positions, two blocks with ViT's eps, the
// final layer norm, the class token's features, the head.
TEST(TorchCompare, VitModelNamesAndStep) {
  compare_model("vit_model",
                {"patch_embed(4, 8)", "class_token", "pos_embedding(5)", "transformer_block(2, eps=1e-6)",
                 "transformer_block(2, eps=1e-6)", "layernorm(eps=1e-6)", "token_pool", "linear(5)"},
                {3, 8, 8});
}

// GPT-2's tied head: linear(13, bias=false, tied) has no tensor of its own; the
// embedding's table (layers.0.weight, the one name PyTorch's named_parameters gives the
// shared tensor) is its weight, and the table's gradient is the head's part plus the
// embedding's.
TEST(TorchCompare, GptTiedHeadNamesAndStep) {
  compare_model("gpt_tied",
                {"embedding(13, 16)", "pos_embedding(8)", "transformer_block(2, causal, tanh)", "layernorm",
                 "linear(13, bias=false, tied)"},
                {8});
}

}  // namespace
}  // namespace ddp
