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


def torchvision_count(python, depth, classes):
    if python:
        code = (f"import torchvision; m = torchvision.models.resnet{depth}(num_classes={classes}); "
                "print(sum(p.numel() for p in m.parameters()))")
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        if p.returncode == 0:
            return int(p.stdout.strip()), "torchvision"
    if (depth, classes) not in PUBLISHED:
        fail(f"no torchvision here and no published count for resnet{depth} of {classes} classes")
    return PUBLISHED[(depth, classes)], "torchvision's published count"


def vit_b16_count(python):
    if python:
        code = ("import torchvision; m = torchvision.models.vit_b_16(); "
                "print(sum(p.numel() for p in m.parameters()))")
        p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        if p.returncode == 0:
            return int(p.stdout.strip()), "torchvision"
    return VIT_B16, "torchvision's published count"


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
    checked_resnets, checked_vit, checked_gpt2 = 0, False, False
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
            want, source_of = torchvision_count(torch_python, int(depth.group(1)), int(classes[0]))
            if int(total.group(1)) != want:
                fail(f"{name}: {int(total.group(1)):,} parameters, {source_of}: {want:,}")
            line += f" = {source_of} resnet{depth.group(1)}(num_classes={classes[0]})"
            checked_resnets += 1
        if name == "gpt2_124m.nml":  # GPT-2's published count, the vocabulary padded from 50257 to 50304
            want = GPT2_124M + (50304 - 50257) * 768
            if int(total.group(1)) != want:
                fail(f"{name}: {int(total.group(1)):,} parameters, GPT-2 124M's with the padded vocabulary: {want:,}")
            line += f" = GPT-2 124M's {GPT2_124M:,} with 47 more embedding rows"
            checked_gpt2 = True
        if name == "vit_b16.nml":  # torchvision's vit_b_16() at 1000 classes
            want, source_of = vit_b16_count(torch_python)
            if int(total.group(1)) != want:
                fail(f"{name}: {int(total.group(1)):,} parameters, {source_of}: {want:,}")
            line += f" = {source_of} vit_b_16()"
            checked_vit = True
        print(line, flush=True)
    if not checked_gpt2:
        fail("gpt2_124m.nml was not compared with GPT-2's count")
    if not checked_vit:
        fail("vit_b16.nml was not compared with torchvision")
    if checked_resnets < 4:
        fail(f"only {checked_resnets} ResNet inputs compared with torchvision")
    print(f"PASS: {len(inputs)} inputs")


main()
