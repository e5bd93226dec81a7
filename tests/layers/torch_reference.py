#!/usr/bin/env python3
"""PyTorch's numbers for the CNN layers, for tests/layers/torch_compare_test.cpp.

usage: torch_reference.py OUT.h5

One group per case, named after it, with attributes `spec` (our layer spec),
`training` (0/1) and `in_shape`; datasets x, dy (the upstream gradient), y, dx,
param.<name> (the parameters, as given to both sides), grad.<name>, and
buffer.<name> for the module's buffers after the forward (BatchNorm running
statistics). Group /model holds a whole nn.Sequential: its state_dict keys in order
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


def case(f, name, spec, module, in_shape, training=True):
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
    x = torch.randn(*in_shape, requires_grad=True)
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


def model_group(f):
    """The model-level test's nn.Sequential: the spec list of the C++ test."""
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2), BasicBlock(8, 16, stride=2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    randomise(net)
    net.train()
    g = f.create_group("model")
    g.attrs["param_names"] = [k for k, _ in net.named_parameters()]
    g.attrs["buffer_names"] = [k for k, _ in net.named_buffers()]
    for k, v in net.state_dict().items():
        g["state." + k] = v.double().numpy()
    x = torch.randn(4, 3, 12, 12)
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
        model_group(f)


if __name__ == "__main__":
    main()
