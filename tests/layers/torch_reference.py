#!/usr/bin/env python3
"""PyTorch's numbers for the layers, for tests/layers/torch_compare_test.cpp.

usage: torch_reference.py OUT.h5

One group per case, named after it, with attributes `spec` (our layer spec),
`training` (0/1) and `in_shape`; datasets x, dy (the upstream gradient), y, dx,
param.<name> (the parameters, as given to both sides), grad.<name>, and
buffer.<name> for the module's buffers after the forward (BatchNorm running
statistics). Groups /model (a CNN), /seq_model (linear, layernorm and gelu on
(B, T, d) samples) and /attention_model (layernorm, causal self-attention, linear)
hold a whole nn.Sequential: its state_dict keys in order
(attributes param_names, buffer_names), its parameters, x, dy, y and parameter
gradients. Everything is float64 in the file; the computation is float32.
"""
import os
import sys

import h5py
import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from torch_bench import BasicBlock, Bottleneck  # noqa: E402  torchvision's blocks, as ddp_train's

torch.manual_seed(0)
torch.set_num_threads(1)


def randomise(module):
    # Non-default parameters and running statistics, so nothing passes by accident.
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.empty_like(p).uniform_(-0.5, 0.5) + (1.0 if name.endswith("weight") and p.dim() == 1 else 0.0))
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.empty_like(b).uniform_(-0.5, 0.5))
            elif name.endswith("running_var"):
                b.copy_(torch.empty_like(b).uniform_(0.5, 1.5))
            elif name.endswith("num_batches_tracked"):
                b.fill_(3)


class SelfAttention(nn.MultiheadAttention):
    """attention(heads[, causal]): nn.MultiheadAttention(d, heads, bias=True,
    batch_first=True) called as self-attention, q = k = v = x, with the causal mask
    (-inf above the diagonal) as attn_mask when causal; its parameters keep their names
    (in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias)."""

    def __init__(self, d, heads, causal=False):
        super().__init__(d, heads, bias=True, batch_first=True)
        self.causal = causal

    def forward(self, x):
        T = x.shape[1]
        mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1) if self.causal else None
        return super().forward(x, x, x, attn_mask=mask, need_weights=False)[0]


class PosEmbedding(nn.Module):
    """pos_embedding(T): learned positions, y = x + weight[:T'] on (B, T', d), weight
    (T, d) as nn.Embedding(T, d)'s (GPT-2's wpe)."""

    def __init__(self, positions, d):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(positions, d))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class Block(nn.Module):
    """transformer_block(heads[, mlp=r][, causal][, tanh][, eps=e]): the pre-norm block
    in torchvision's EncoderBlock names (ln_1, self_attention, ln_2, mlp.0, mlp.3),
    dropout 0."""

    def __init__(self, d, heads, mlp=4, causal=False, tanh=False, eps=1e-5):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d, eps=eps)
        self.self_attention = SelfAttention(d, heads, causal=causal)
        self.ln_2 = nn.LayerNorm(d, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(d, mlp * d), nn.GELU(approximate="tanh" if tanh else "none"),
                                 nn.Dropout(0.0), nn.Linear(mlp * d, d), nn.Dropout(0.0))

    def forward(self, x):
        x = x + self.self_attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PatchEmbed(nn.Module):
    """patch_embed(p, d): torchvision's conv_proj, then (B, d, h, w) -> (B, h w, d) as
    VisionTransformer._process_input; its parameters named weight and bias."""

    def __init__(self, channels, d, p):
        super().__init__()
        conv = nn.Conv2d(channels, d, p, stride=p)
        self.weight, self.bias, self.p = conv.weight, conv.bias, p

    def forward(self, x):
        x = nn.functional.conv2d(x, self.weight, self.bias, stride=self.p)
        return x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)


class ClassToken(nn.Module):
    """class_token: torchvision's class_token (1, 1, d) before the tokens."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, 1, d))

    def forward(self, x):
        return torch.cat([self.weight.expand(x.shape[0], -1, -1), x], dim=1)


class TokenPool(nn.Module):
    """token_pool[(mean)]: x[:, 0] (ViT's head reads the class token), or the mean."""

    def __init__(self, mean=False):
        super().__init__()
        self.mean = mean

    def forward(self, x):
        return x.mean(dim=1) if self.mean else x[:, 0]


def vit_as_layers(tv, layers):
    """torchvision's VisionTransformer's state_dict in the layer list's names (patch_embed,
    class_token, pos_embedding, the blocks, layernorm, token_pool, linear): its mapping."""
    L = len(tv.encoder.layers)
    out = {}
    for k, v in tv.state_dict().items():
        if k.startswith("conv_proj."):
            out["0." + k[len("conv_proj."):]] = v
        elif k == "class_token":
            out["1.weight"] = v
        elif k == "encoder.pos_embedding":
            out["2.weight"] = v[0]
        elif k.startswith("encoder.layers.encoder_layer_"):
            i, rest = k[len("encoder.layers.encoder_layer_"):].split(".", 1)
            out[f"{3 + int(i)}.{rest}"] = v
        elif k.startswith("encoder.ln."):
            out[f"{3 + L}." + k[len("encoder.ln."):]] = v
        elif k.startswith("heads.head."):
            out[f"{5 + L}." + k[len("heads.head."):]] = v
        else:
            raise KeyError(k)
    layers.load_state_dict(out, strict=True)


def token_case(f, name, spec, module, B, T, vocab):
    """A layer fed token ids (embedding): x the ids as floats, no dx."""
    randomise(module)
    g = f.create_group(name)
    g.attrs["spec"] = spec
    g.attrs["training"] = 1
    g.attrs["in_shape"] = np.array([T], dtype=np.int64)
    for k, p in module.named_parameters():
        g["param." + k] = p.detach().double().numpy()
    ids = torch.randint(0, vocab, (B, T))
    ids[0, :3] = ids[0, 0]  # a repeated id: its gradient rows add up
    y = module(ids)
    dy = torch.randn_like(y)
    y.backward(dy)
    g["x"] = ids.double().numpy()
    g["dy"], g["y"] = dy.double().numpy(), y.detach().double().numpy()
    for k, p in module.named_parameters():
        g["grad." + k] = p.grad.double().numpy()


def case(f, name, spec, module, in_shape, training=True, x_scale=1.0, x_shift=0.0):
    randomise(module)
    module.train(training)
    g = f.create_group(name)
    g.attrs["spec"] = spec
    g.attrs["training"] = int(training)
    g.attrs["in_shape"] = np.array(in_shape[1:], dtype=np.int64)
    for k, p in module.named_parameters():
        g["param." + k] = p.detach().double().numpy()
    for k, b in module.named_buffers():
        g["buffer_before." + k] = b.detach().double().numpy()
    x = (x_scale * torch.randn(*in_shape) + x_shift).requires_grad_()
    y = module(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    g["x"] = x.detach().double().numpy()
    g["dy"] = dy.double().numpy()
    g["y"] = y.detach().double().numpy()
    g["dx"] = x.grad.double().numpy()
    for k, p in module.named_parameters():
        g["grad." + k] = p.grad.double().numpy()
    for k, b in module.named_buffers():
        g["buffer." + k] = b.detach().double().numpy()


def float64_case(f, name, src, module):
    """Case `src`'s inputs and parameters through `module` in float64: the exact
    numbers, for a case where float32's own rounding (PyTorch's) is what differs."""
    s, g = f[src], f.create_group(name)
    for k, v in s.attrs.items():
        g.attrs[k] = v
    module = module.double()
    with torch.no_grad():
        for k, p in module.named_parameters():
            p.copy_(torch.from_numpy(s["param." + k][...]))
    x = torch.from_numpy(s["x"][...]).requires_grad_()
    y = module(x)
    y.backward(torch.from_numpy(s["dy"][...]))
    for k in ["x", "dy"] + ["param." + k for k, _ in module.named_parameters()]:
        g[k] = s[k][...]
    g["y"], g["dx"] = y.detach().numpy(), x.grad.numpy()
    for k, p in module.named_parameters():
        g["grad." + k] = p.grad.numpy()


def model_group(f, name, net, in_shape, vocab=0):
    """A model-level test's nn.Sequential: the spec list of the C++ test. vocab > 0:
    x is token ids in [0, vocab) (given to ddp_train as floats)."""
    randomise(net)
    net.train()
    g = f.create_group(name)
    g.attrs["param_names"] = [k for k, _ in net.named_parameters()]
    g.attrs["buffer_names"] = [k for k, _ in net.named_buffers()]
    for k, v in net.state_dict().items():
        g["state." + k] = v.double().numpy()
    x = torch.randint(0, vocab, in_shape) if vocab else torch.randn(*in_shape)
    y = net(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    g["x"], g["dy"], g["y"] = x.double().numpy(), dy.double().numpy(), y.detach().double().numpy()
    for k, p in net.named_parameters():
        g["grad." + k] = p.grad.double().numpy()
    for k, v in net.state_dict().items():
        g["state_after." + k] = v.double().numpy()


def main():
    with h5py.File(sys.argv[1], "w") as f:
        case(f, "conv_stride_pad", "conv2d(6, 3, stride=2, pad=1)", nn.Conv2d(4, 6, 3, stride=2, padding=1), (3, 4, 9, 8))
        case(f, "conv_valid", "conv2d(5, 5)", nn.Conv2d(3, 5, 5), (2, 3, 12, 11))
        case(f, "conv_nobias", "conv2d(4, 3, pad=1, bias=false)", nn.Conv2d(2, 4, 3, padding=1, bias=False), (2, 2, 7, 7))
        case(f, "conv_1x1_stride", "conv2d(8, 1, stride=2, bias=false)", nn.Conv2d(4, 8, 1, stride=2, bias=False), (2, 4, 9, 9))
        case(f, "maxpool2", "maxpool(2)", nn.MaxPool2d(2), (2, 3, 8, 9))
        case(f, "maxpool3s2", "maxpool(3, stride=2)", nn.MaxPool2d(3, stride=2), (2, 3, 9, 8))
        case(f, "maxpool3s2p1", "maxpool(3, stride=2, pad=1)", nn.MaxPool2d(3, stride=2, padding=1), (2, 3, 9, 8))
        case(f, "avgpool2", "avgpool(2)", nn.AvgPool2d(2), (2, 3, 8, 9))
        case(f, "avgpool3s2p1", "avgpool(3, stride=2, pad=1)", nn.AvgPool2d(3, stride=2, padding=1), (2, 3, 9, 8))
        case(f, "avgpool3s2", "avgpool(3, stride=2)", nn.AvgPool2d(3, stride=2), (2, 3, 9, 8))
        case(f, "globalavgpool", "globalavgpool", nn.AdaptiveAvgPool2d(1), (3, 5, 4, 6))
        case(f, "batchnorm_train", "batchnorm2d", nn.BatchNorm2d(5), (4, 5, 6, 7))
        case(f, "batchnorm_eval", "batchnorm2d", nn.BatchNorm2d(5), (4, 5, 6, 7), training=False)
        case(f, "resblock_identity", "resblock(6)", BasicBlock(6, 6), (3, 6, 8, 8))
        case(f, "resblock_projection", "resblock(8, stride=2)", BasicBlock(4, 8, stride=2), (3, 4, 9, 9))
        case(f, "resblock_identity_small", "resblock(3)", BasicBlock(3, 3), (3, 3, 5, 5))
        case(f, "resblock_widen", "resblock(8)", BasicBlock(4, 8), (2, 4, 6, 6))
        case(f, "bottleneck_identity", "bottleneck(4)", Bottleneck(16, 4), (3, 16, 7, 7))
        case(f, "bottleneck_projection", "bottleneck(4, stride=2)", Bottleneck(8, 4, stride=2), (3, 8, 9, 9))
        case(f, "bottleneck_widen", "bottleneck(8)", Bottleneck(16, 8), (2, 16, 6, 6))
        case(f, "bottleneck_wide", "bottleneck(128)", Bottleneck(512, 128), (8, 512, 8, 8))
        model_group(f, "model", nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            BasicBlock(8, 16, stride=2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)), (4, 3, 12, 12))
        # The transformer's layers, after the CNN's cases (so these draw the random numbers
        # they always drew): on (B, T, d) and flat (B, d) samples, gelu's x spread to +-9
        # so that the tails of erf and tanh count.
        gelu, gelu_tanh = nn.GELU(), nn.GELU(approximate="tanh")
        case(f, "gelu_seq", "gelu", gelu, (3, 5, 7), x_scale=3.0)
        case(f, "gelu_flat", "gelu", gelu, (4, 33), x_scale=3.0)
        case(f, "gelu_image", "gelu", gelu, (2, 3, 4, 5), x_scale=3.0)
        case(f, "gelu_tanh_seq", "gelu(tanh)", gelu_tanh, (3, 5, 7), x_scale=3.0)
        case(f, "gelu_tanh_flat", "gelu(tanh)", gelu_tanh, (4, 33), x_scale=3.0)
        case(f, "layernorm_seq", "layernorm", nn.LayerNorm(16), (3, 5, 16))
        case(f, "layernorm_flat", "layernorm", nn.LayerNorm(10), (4, 10))
        # rows far from 0 against their spread: the variance without cancellation
        case(f, "layernorm_offset", "layernorm", nn.LayerNorm(24), (2, 6, 24), x_scale=0.1, x_shift=10.0)
        float64_case(f, "layernorm_offset_f64", "layernorm_offset", nn.LayerNorm(24))
        case(f, "layernorm_eps", "layernorm(eps=1e-6)", nn.LayerNorm(12, eps=1e-6), (2, 7, 12))
        case(f, "layernorm_gpt2", "layernorm", nn.LayerNorm(768), (2, 16, 768))
        case(f, "linear_seq", "linear(6)", nn.Linear(5, 6), (3, 4, 5))
        # GPT-2's MLP shape, C -> 4C -> C, between layer norms, a linear -> relu (fused in
        # ddp_train's model) on the tokens, then a classifier.
        model_group(f, "seq_model", nn.Sequential(
            nn.LayerNorm(8), nn.Linear(8, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 8), nn.LayerNorm(8),
            nn.GELU(), nn.Linear(8, 12), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 12, 5)), (4, 6, 8))
        # Self-attention, after the cases above (their random numbers stay theirs): a
        # sample (T, d) in and out, d = heads x head size; one token; one head; a wider
        # causal case of 32 tokens and head size 16 (x scaled so that the scores stay
        # in softmax's working range, not saturated).
        case(f, "attention_t5_d8_h2", "attention(2)", SelfAttention(8, 2), (3, 5, 8))
        case(f, "attention_causal_t7_d12_h3", "attention(3, causal)", SelfAttention(12, 3, causal=True), (2, 7, 12))
        case(f, "attention_t1", "attention(2)", SelfAttention(8, 2), (4, 1, 8))
        case(f, "attention_causal_t1", "attention(2, causal)", SelfAttention(8, 2, causal=True), (3, 1, 8))
        case(f, "attention_h1", "attention(1)", SelfAttention(8, 1), (2, 6, 8))
        case(f, "attention_causal_h1", "attention(1, causal)", SelfAttention(6, 1, causal=True), (2, 5, 6))
        case(f, "attention_causal_t32_d64_h4", "attention(4, causal)", SelfAttention(64, 4, causal=True),
             (2, 32, 64), x_scale=0.25)
        # A pre-norm attention on (B, T, d): layernorm (the first layer: no dx), causal
        # attention, a linear on the tokens; its names are nn.Sequential's.
        model_group(f, "attention_model", nn.Sequential(
            nn.LayerNorm(8), SelfAttention(8, 2, causal=True), nn.Linear(8, 6)), (4, 5, 8))

        # Token and position embeddings, the transformer block; after the cases above.
        token_case(f, "embedding_v11_d6", "embedding(11, 6)", nn.Embedding(11, 6), 3, 7, 11)
        case(f, "pos_embedding_short", "pos_embedding(9)", PosEmbedding(9, 6), (3, 7, 6))
        case(f, "pos_embedding_full", "pos_embedding(5)", PosEmbedding(5, 4), (2, 5, 4))
        case(f, "block_vit", "transformer_block(2)", Block(8, 2), (3, 5, 8), x_scale=0.5)
        case(f, "block_gpt2", "transformer_block(4, causal, tanh)", Block(16, 4, causal=True, tanh=True),
             (2, 9, 16), x_scale=0.5)
        case(f, "block_mlp2_eps", "transformer_block(2, mlp=2, eps=1e-6)", Block(12, 2, mlp=2, eps=1e-6),
             (2, 6, 12), x_scale=0.5)
        # A nanoGPT-shaped language model on token ids: embedding, positions, two causal
        # blocks, the final layer norm, the head.
        model_group(f, "gpt_model", nn.Sequential(
            nn.Embedding(13, 16), PosEmbedding(8, 16), Block(16, 2, causal=True, tanh=True),
            Block(16, 2, causal=True, tanh=True), nn.LayerNorm(16), nn.Linear(16, 13)), (3, 8), vocab=13)
        # GPT-2's tied head, after the cases above: the head's weight IS the embedding's
        # (nanoGPT: transformer.wte.weight = lm_head.weight), without bias; named_parameters
        # lists the table once, as 0.weight, its gradient both uses' sum.
        tied = nn.Sequential(nn.Embedding(13, 16), PosEmbedding(8, 16), Block(16, 2, causal=True, tanh=True),
                             nn.LayerNorm(16), nn.Linear(16, 13, bias=False))
        tied[4].weight = tied[0].weight
        model_group(f, "gpt_tied", tied, (3, 8), vocab=13)
        case(f, "linear_nobias_seq", "linear(6, bias=false)", nn.Linear(5, 6, bias=False), (3, 4, 5))
        # A vision transformer's layers, after the cases above: patches of 4 (a 2 x 3 grid) and
        # of 3 over 2 channels, the class token, both poolings.
        case(f, "patch_embed_p4", "patch_embed(4, 6)", PatchEmbed(3, 6, 4), (2, 3, 8, 12))
        case(f, "patch_embed_p3", "patch_embed(3, 5)", PatchEmbed(2, 5, 3), (3, 2, 9, 6))
        case(f, "class_token", "class_token", ClassToken(6), (3, 4, 6))
        case(f, "token_pool_class", "token_pool", TokenPool(), (3, 5, 6))
        case(f, "token_pool_mean", "token_pool(mean)", TokenPool(mean=True), (3, 5, 6))
        # torchvision's VisionTransformer (2 blocks of width 8, 2 heads, patches of 4 on 8 x 8
        # images, 5 classes) is this layer list: its weights through vit_as_layers give the
        # same logits (checked here), and the list is then the model ddp_train's is held to.
        from torchvision.models.vision_transformer import VisionTransformer
        tv = VisionTransformer(image_size=8, patch_size=4, num_layers=2, num_heads=2, hidden_dim=8, mlp_dim=32,
                               num_classes=5)
        randomise(tv)
        vit = nn.Sequential(PatchEmbed(3, 8, 4), ClassToken(8), PosEmbedding(5, 8), Block(8, 2, eps=1e-6),
                            Block(8, 2, eps=1e-6), nn.LayerNorm(8, eps=1e-6), TokenPool(), nn.Linear(8, 5))
        vit_as_layers(tv, vit)
        probe = torch.randn(3, 3, 8, 8)
        with torch.no_grad():
            err = (tv(probe) - vit(probe)).abs().max().item()
        assert err < 1e-5, f"the layer list is not torchvision's VisionTransformer: {err}"
        model_group(f, "vit_model", vit, (3, 3, 8, 8))
        # Attention's block path (query rows a block, P recomputed in backward), after the
        # cases above: blocks that do not divide T (7 = 3 + 3 + 1, 5 = 2 + 2 + 1), a
        # single block of all T, and the wider causal shape in blocks of 8.
        case(f, "attention_block3_causal_t7", "attention(3, causal, block=3)", SelfAttention(12, 3, causal=True),
             (2, 7, 12))
        case(f, "attention_block2_t5", "attention(2, block=2)", SelfAttention(8, 2), (3, 5, 8))
        case(f, "attention_block_all_t6", "attention(2, causal, block=6)", SelfAttention(8, 2, causal=True),
             (2, 6, 8))
        case(f, "attention_block8_causal_t32", "attention(4, causal, block=8)", SelfAttention(64, 4, causal=True),
             (2, 32, 64), x_scale=0.25)
        case(f, "block_gpt2_block4", "transformer_block(4, causal, tanh, block=4)",
             Block(16, 4, causal=True, tanh=True), (2, 9, 16), x_scale=0.5)


if __name__ == "__main__":
    main()
