#!/usr/bin/env python3
"""Every ready input file in inputs/ passes `ddp_train --check` (the input, its data
files and its model), as a user runs it, on data of the shape it names: the
Fashion-MNIST and regression inputs on the suite's shards, the synthetic-image ones on
the suite's 64x64 set, the ImageNet-class ones (image_size 224) on a few synthetic
256x256 images of 1000 classes made here, the language models on a few synthetic
tokens made here (tools/make_markov_tokens). The ResNets' parameter counts equal
torchvision's resnet<depth>(num_classes=<classes>), and ViT-B/16's its vit_b_16(),
counted by torchvision where the given python has it, else its published counts.

usage: ready_inputs.py SOURCE_DIR MAKE_SYNTHETIC_IMAGES [--torch-python PY] -- LAUNCH...
  LAUNCH: the command that runs ddp_train on one rank (mpiexec -n 1 .../ddp_train)
(run in the test directory, where data/fashion-mnist, data/regression and
data/synthetic64 are)
"""
import glob
import json
import os
import re
import subprocess
import sys

# torchvision's counts, where no torchvision is at hand (torchvision.models.resnetN(),
# 1000 classes; resnet50 with 10 classes for resnet50_tiny).
PUBLISHED = {(18, 1000): 11689512, (50, 1000): 25557032, (101, 1000): 44549160, (50, 10): 23528522}
VIT_B16 = 86567656  # torchvision.models.vit_b_16(), 1000 classes
GPT2_124M = 124439808  # Hugging Face's GPT2LMHeadModel("gpt2"): vocabulary 50257, the head tied
IMAGENET = "data/ready_inputs224"


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def torchvision_counts(python, models):
    """torchvision's parameter count of each model named (("resnet", depth, classes) or
    ("vit_b_16",)), all in one process of the given python (importing torchvision is
    most of its time); where it has none, the published counts. {model: (count, source)}."""
    if python:
        code = ("import json, sys, torchvision; counts = []\n"
                "for m in json.loads(sys.argv[1]):\n"
                "    net = torchvision.models.vit_b_16() if m[0] == 'vit_b_16' else "
                "getattr(torchvision.models, f'resnet{m[1]}')(num_classes=m[2])\n"
                "    counts.append(sum(p.numel() for p in net.parameters()))\n"
                "print(json.dumps(counts))")
        p = subprocess.run([python, "-c", code, json.dumps(models)], capture_output=True, text=True, timeout=240)
        if p.returncode == 0:
            return {tuple(m): (c, "torchvision") for m, c in zip(models, json.loads(p.stdout))}
    counts = {}
    for m in models:
        if m[0] == "vit_b_16":
            counts[tuple(m)] = (VIT_B16, "torchvision's published count")
        elif (m[1], m[2]) in PUBLISHED:
            counts[tuple(m)] = (PUBLISHED[(m[1], m[2])], "torchvision's published count")
        else:
            fail(f"no torchvision here and no published count for resnet{m[1]} of {m[2]} classes")
    return counts


def main():
    args = sys.argv[1:]
    split = args.index("--")
    opts, launch = args[:split], args[split + 1:]
    source, make_images = opts[0], opts[1]
    torch_python = opts[opts.index("--torch-python") + 1] if "--torch-python" in opts else ""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

    p = subprocess.run([sys.executable, make_images, IMAGENET, "--side", "256", "--classes", "1000", "--train", "8",
                        "--val", "8", "--seed", "5"], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"make_synthetic_images: {p.stdout}{p.stderr}")

    inputs = sorted(glob.glob(os.path.join(source, "inputs", "*.nml")))
    if len(inputs) < 8:
        fail(f"only {len(inputs)} inputs in {source}/inputs")
    checked_gpt2 = False
    compared = []  # (name, its count, line so far, the torchvision model it equals)
    for path in inputs:
        name = os.path.basename(path)
        text = open(path).read()
        overrides = []
        if ("data/markov/" in text or "data/fineweb10B/" in text) and not os.path.exists("data/markov"):  # tokens
            tool = os.path.join(source, "tools", "make_markov_tokens")
            q = subprocess.run([sys.executable, tool, "data/markov", "--vocab", "16", "--order", "2", "--train",
                                "20000", "--val", "2000", "--seq-len", "64"], capture_output=True, text=True,
                               timeout=120)
            if q.returncode != 0:
                fail(f"make_markov_tokens: {q.stdout}{q.stderr}")
        if "data/fineweb10B/" in text:  # GPT-2's: the few synthetic tokens (vocabulary 16, below the model's)
            overrides = ["data.train_files=data/markov/train_*.h5", "data.val_files=data/markov/val_*.h5",
                         "train.batch_size=2"]
        if "data/imagenet/" in text:  # the ImageNet-class inputs: the few images made above, a batch of them
            overrides = [f"data.train_files={IMAGENET}/train_*.h5", f"data.val_files={IMAGENET}/val_*.h5",
                         "train.batch_size=8"]
        cmd = [*launch, "--check", path, f"io.run_dir=runs/ready_inputs/{name}", *overrides]
        print("$ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        out = p.stdout
        if p.returncode != 0 or "check passed" not in out:
            print(out[-4000:])
            fail(f"{name}: --check exited {p.returncode}")
        total = re.search(r"^total parameters: ([0-9]+)$", out, re.M)
        if not total:
            fail(f"{name}: no 'total parameters' line")
        line = f"{name}: check passed, {int(total.group(1)):,} parameters"
        depth = re.match(r"resnet([0-9]+)", name)
        if depth:
            classes = re.findall(r"linear\(([0-9]+)\)", text)
            if len(classes) != 1:
                fail(f"{name}: expected one linear(classes) layer, found {classes}")
            compared.append((name, int(total.group(1)), line, ("resnet", int(depth.group(1)), int(classes[0]))))
            continue
        if name == "gpt2_124m.nml":  # GPT-2's published count, the vocabulary padded from 50257 to 50304
            want = GPT2_124M + (50304 - 50257) * 768
            if int(total.group(1)) != want:
                fail(f"{name}: {int(total.group(1)):,} parameters, GPT-2 124M's with the padded vocabulary: {want:,}")
            line += f" = GPT-2 124M's {GPT2_124M:,} with 47 more embedding rows"
            checked_gpt2 = True
        if name == "vit_b16.nml":  # torchvision's vit_b_16() at 1000 classes
            compared.append((name, int(total.group(1)), line, ("vit_b_16",)))
            continue
        print(line, flush=True)
    counts = torchvision_counts(torch_python, [list(m) for _, _, _, m in compared])
    for name, count, line, model in compared:
        want, source_of = counts[model]
        if count != want:
            fail(f"{name}: {count:,} parameters, {source_of}: {want:,}")
        what = "vit_b_16()" if model[0] == "vit_b_16" else f"resnet{model[1]}(num_classes={model[2]})"
        print(f"{line} = {source_of} {what}", flush=True)
    if not checked_gpt2:
        fail("gpt2_124m.nml was not compared with GPT-2's count")
    if not any(m[0] == "vit_b_16" for _, _, _, m in compared):
        fail("vit_b16.nml was not compared with torchvision")
    resnets = sum(m[0] == "resnet" for _, _, _, m in compared)
    if resnets < 4:
        fail(f"only {resnets} ResNet inputs compared with torchvision")
    print(f"PASS: {len(inputs)} inputs")


main()
