#!/usr/bin/env python3
"""Every ready input file in inputs/ passes `ddp_train --check` (the input, its data
files and its model), as a user runs it, on data of the shape it names: the
Fashion-MNIST and regression inputs on the suite's shards, the synthetic-image ones on
the suite's 64x64 set, the ImageNet-class ones (image_size 224) on a few synthetic
256x256 images of 1000 classes made here, the language models on a few synthetic
tokens made here (tools/make_markov_tokens). The ResNets' parameter counts equal
torchvision's resnet<depth>(num_classes=<classes>), counted by torchvision where the
given python has it, else its published counts.

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
    checked_resnets = 0
    for path in inputs:
        name = os.path.basename(path)
        text = open(path).read()
        overrides = []
        if "data/markov/" in text and not os.path.exists("data/markov"):  # the language models' tokens
            tool = os.path.join(source, "tools", "make_markov_tokens")
            q = subprocess.run([sys.executable, tool, "data/markov", "--vocab", "16", "--order", "2", "--train",
                                "20000", "--val", "2000", "--seq-len", "64"], capture_output=True, text=True,
                               timeout=120)
            if q.returncode != 0:
                fail(f"make_markov_tokens: {q.stdout}{q.stderr}")
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
        print(line, flush=True)
    if checked_resnets < 4:
        fail(f"only {checked_resnets} ResNet inputs compared with torchvision")
    print(f"PASS: {len(inputs)} inputs")


main()
