#!/usr/bin/env python3
"""The image transform's kernel (train/augment.hpp, through tests/data/augment_probe)
against torchvision 0.14's functional transforms on fixed parameters:

- flip: F.hflip, bitwise;
- crop(pad=p): F.pad(fill=0) then F.crop at the drawn window, bitwise;
- the centre crop of evaluation: F.center_crop, bitwise (odd margins: Python's round);
- random_resized_crop's resize: F.resized_crop(antialias=False) and
  torch.nn.functional.interpolate(mode='bilinear', align_corners=False,
  antialias=False) on the crop box, in float on the uint8 values, within 4e-6 on
  the [0, 1] scale (1/1000 of a uint8 level): the same weighted sum of the four
  neighbours, but the source index scale * (dst + 0.5) - 0.5 is rounded differently
  (a fused multiply-add here), which moves the weights by a few ulps of the index
  (1.4e-6 seen on a Xeon);
- normalize: F.normalize after ToTensor's x/255, bitwise;
- NHWC and NCHW input: the same floats.

usage: augment_torchvision.py AUGMENT_PROBE
"""
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as nnf
import torchvision.transforms.functional as F

probe = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="augment_tv_")
atexit.register(shutil.rmtree, tmp, ignore_errors=True)
rng = np.random.default_rng(2024)
failures = []


def run_probe(images_nchw, boxes, out_h, out_w, nhwc=False, normalize=()):
    """images_nchw: (N, C, H, W) uint8; boxes: (N, 5) top, left, height, width, flip."""
    n, c, h, w = images_nchw.shape
    stored = images_nchw.transpose(0, 2, 3, 1) if nhwc else images_nchw
    x_path, b_path, o_path = (os.path.join(tmp, f) for f in ("x.u8", "boxes.i32", "out.f32"))
    np.ascontiguousarray(stored, dtype=np.uint8).tofile(x_path)
    np.asarray(boxes, dtype=np.int32).tofile(b_path)
    cmd = [probe, str(c), str(h), str(w), "1" if nhwc else "0", str(out_h), str(out_w), str(n), x_path, b_path,
           o_path] + [repr(float(v)) for v in normalize]
    subprocess.run(cmd, check=True)
    return np.fromfile(o_path, dtype=np.float32).reshape(n, c, out_h, out_w)


def to_tensor(u8):  # torchvision's ToTensor on a CHW uint8 tensor: a division by 255
    return u8.float().div(255)


def check(name, got, want, tol=0.0):
    want = want.numpy() if isinstance(want, torch.Tensor) else want
    err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    ok = np.array_equal(got, want) if tol == 0 else err <= tol
    print(f"{name}: max |diff| {err:.3g} ({'bitwise' if tol == 0 else f'tolerance {tol:g}'}) "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append(name)


C, H, W = 3, 37, 45
imgs = rng.integers(0, 256, size=(6, C, H, W), dtype=np.uint8)
timgs = torch.from_numpy(imgs)

# flip and crop(pad=4): windows of the zero-padded image, corners and middle, half flipped.
S, P = 32, 4
boxes = [(-4, -4, S, S, 0), (-4, -4, S, S, 1), (H + P - S, W + P - S, S, S, 1), (3, 7, S, S, 0),
         (0, 9, S, S, 1), (-2, W + P - S, S, S, 0)]
got = run_probe(imgs, boxes, S, S)
for nhwc in (True,):
    check("crop(pad=4)+flip NHWC == NCHW", run_probe(imgs, boxes, S, S, nhwc=nhwc), got)
for i, (top, left, h, w, flip) in enumerate(boxes):
    want = F.crop(F.pad(timgs[i], [P, P, P, P], fill=0), top + P, left + P, h, w)
    if flip:
        want = F.hflip(want)
    check(f"crop(pad=4) window ({top},{left}) flip {flip} vs F.pad+F.crop{'+F.hflip' if flip else ''}", got[i],
          to_tensor(want))

# The centre crop of evaluation: odd margins round half to even, as torchvision does.
for oh, ow in ((32, 32), (36, 44), (35, 40)):
    top, left = int(round((H - oh) / 2.0)), int(round((W - ow) / 2.0))
    got = run_probe(imgs[:2], [(top, left, oh, ow, 0)] * 2, oh, ow)
    check(f"centre crop {oh}x{ow} vs F.center_crop", got, to_tensor(F.center_crop(timgs[:2], [oh, ow])))

# random_resized_crop's resize of fixed boxes, down and up.
S = 24
boxes = [(2, 3, 30, 40, 0), (0, 0, H, W, 1), (10, 5, 11, 17, 0), (5, 20, 24, 24, 0), (1, 1, 7, 9, 1),
         (20, 30, 17, 15, 0)]
got = run_probe(imgs, boxes, S, S)
check("random_resized_crop NHWC == NCHW", run_probe(imgs, boxes, S, S, nhwc=True), got)
for i, (top, left, h, w, flip) in enumerate(boxes):
    crop = timgs[i, :, top:top + h, left:left + w].float()
    want = nnf.interpolate(crop[None], size=(S, S), mode="bilinear", align_corners=False, antialias=False)[0]
    tv = F.resized_crop(timgs[i].float(), top, left, h, w, [S, S], antialias=False)
    if flip:
        want, tv = F.hflip(want), F.hflip(tv)
    check(f"box ({top},{left},{h},{w}) flip {flip} vs interpolate(bilinear)", got[i], want / 255, tol=4e-6)
    check(f"box ({top},{left},{h},{w}) flip {flip} vs F.resized_crop", got[i], tv / 255, tol=4e-6)

# normalize after ToTensor.
mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
got = run_probe(imgs, [(0, 0, H, W, 0)] * len(imgs), H, W, normalize=mean + std)
check("normalize vs F.normalize", got, F.normalize(to_tensor(timgs), mean, std))

if failures:
    print("FAILED: " + "; ".join(failures))
    sys.exit(1)
print("all comparisons passed")
