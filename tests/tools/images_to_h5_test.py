#!/usr/bin/env python3
"""tools/images_to_h5 on a small ImageFolder tree written here, the shards read back.

usage: images_to_h5_test.py PATH/TO/tools/images_to_h5

The tree: three classes whose folder names sort differently from the order they
are made in (and with an upper-case one), PNG and JPEG files of several sizes and
aspect ratios (portrait, landscape, smaller than the side), a grey-scale and an
RGBA PNG, an upper-case extension, a nested folder, a file that is not an image.
Every stored image must equal, byte for byte, PIL's decode -> RGB -> bilinear
resize of the shorter side -> centre crop computed here (and torchvision's
ImageFolder + Resize + CenterCrop where torchvision imports). Then the failures:
a truncated JPEG and random bytes named .png (one error line naming the file,
exit status 1, no traceback, no shard left), and the other one-line errors.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
from PIL import Image

SIDE, SHARD, WORKERS = 24, 4, 2
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run(tool, *args):
    p = subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def make_tree(root):
    """Writes the tree; returns the expected [(path, class index)] in ImageFolder order."""
    rng = np.random.default_rng(23)

    def smooth(h, w, c):
        # a smooth image plus a little noise: JPEG keeps it recognisable, resize has work to do
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([np.sin(xx / (3 + k) + yy / (5 + k) + k) for k in range(c)], axis=-1)
        img = 127.5 + 100 * base + rng.normal(0, 10, size=(h, w, c))
        return np.clip(img, 0, 255).astype(np.uint8)

    files = {  # made in this order; ImageFolder sorts classes: "Moth" < "ant" < "zebra"
        "zebra": [("b.png", "RGB", 50, 80), ("a.jpg", "RGB", 120, 64), ("c.PNG", "RGB", 31, 29)],
        "ant": [("grey.png", "L", 97, 40), ("rgba.png", "RGBA", 70, 45), ("sub/deep.jpeg", "RGB", 40, 40)],
        "Moth": [("x.JPG", "RGB", 33, 60), ("y.png", "RGB", 17, 19), ("z.bmp", "RGB", 26, 90)],
    }
    for cls, entries in files.items():
        for name, mode, h, w in entries:
            path = os.path.join(root, cls, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
            arr = smooth(h, w, channels)
            img = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)
            img.save(path, format={"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP"}[name.rsplit(".", 1)[1].lower()])
    with open(os.path.join(root, "ant", "notes.txt"), "w") as f:
        f.write("not an image\n")
    order = []
    for index, cls in enumerate(sorted(files)):
        # sorted(os.walk(...)), files sorted within each folder
        names = sorted(n for n, *_ in files[cls] if "/" not in n) + sorted(n for n, *_ in files[cls] if "/" in n)
        order += [(os.path.join(root, cls, n), index) for n in names]
    return sorted(files), order


def expected(path):
    """PIL's decode -> RGB -> resize shorter side to SIDE (bilinear) -> centre crop, as torchvision."""
    with Image.open(path) as img:
        img = img.convert("RGB")
    w, h = img.size
    if w <= h:
        size = (SIDE, int(SIDE * h / w))
    else:
        size = (int(SIDE * w / h), SIDE)
    img = img.resize(size, Image.BILINEAR)
    top, left = int(round((size[1] - SIDE) / 2.0)), int(round((size[0] - SIDE) / 2.0))
    return np.asarray(img.crop((left, top, left + SIDE, top + SIDE)))


def read_shards(out):
    paths = sorted(glob.glob(os.path.join(out, "train_*.h5")))
    xs, ys, info = [], [], []
    for p in paths:
        with h5py.File(p, "r") as f:
            xs.append(f["x"][...])
            ys.append(f["y"][...])
            names = [n.decode() if isinstance(n, bytes) else n for n in f.attrs["class_names"]]
            info.append(dict(path=p, n=len(f["y"]), layout=f["x"].attrs.get("layout"), format=f.attrs.get("format"),
                             version=f.attrs.get("version"), class_names=names, xdtype=f["x"].dtype,
                             ydtype=f["y"].dtype, chunks=f["x"].chunks, compression=f["x"].compression))
    return np.concatenate(xs), np.concatenate(ys), info


def check_good_run(tool, tmp):
    src, out = os.path.join(tmp, "src"), os.path.join(tmp, "out")
    classes, order = make_tree(src)
    rc, stdout, stderr = run(tool, src, out, "--side", str(SIDE), "--shard-size", str(SHARD), "--workers", str(WORKERS))
    check(rc == 0, f"good run: exit status {rc}\n{stderr}")
    if rc != 0:
        return
    check("\r" not in stderr, "progress: a '\\r' bar written to a pipe")
    check("100%" in stderr, "progress: no final 100% line")
    n = len(order)
    x, y, info = read_shards(out)
    check([os.path.basename(i["path"]) for i in info] == ["train_000.h5", "train_001.h5", "train_002.h5"],
          f"shard names {[os.path.basename(i['path']) for i in info]}")
    check([i["n"] for i in info] == [SHARD, SHARD, n - 2 * SHARD], f"shard split {[i['n'] for i in info]}")
    check(x.shape == (n, SIDE, SIDE, 3) and x.dtype == np.uint8, f"x {x.shape} {x.dtype}")
    check(y.dtype == np.int64 and y.tolist() == [c for _, c in order], f"labels {y.tolist()}")
    for i in info:
        check(i["layout"] == "NHWC", f"{i['path']}: layout {i['layout']!r}")
        check(i["format"] == "ddp_train.shard" and i["version"] == 1, f"{i['path']}: format {i['format']!r} {i['version']!r}")
        check(i["class_names"] == classes, f"{i['path']}: class_names {i['class_names']}")
        check(i["chunks"] is None and i["compression"] is None, f"{i['path']}: /x chunked or compressed")
    check(not glob.glob(os.path.join(out, "*.tmp")), "temporary files left")
    for k, (path, _) in enumerate(order):
        check(np.array_equal(x[k], expected(path)), f"image {k} ({path}) differs from PIL's transform computed here")

    # torchvision itself, where it is installed: the reference the tool follows.
    try:
        from torchvision import datasets, transforms
    except ImportError:
        print("torchvision not importable: compared with the transform computed here only")
    else:
        ds = datasets.ImageFolder(src, transform=transforms.Compose([transforms.Resize(SIDE),
                                                                     transforms.CenterCrop(SIDE)]))
        check(ds.classes == classes, f"torchvision classes {ds.classes}")
        check([p for p, _ in ds.samples] == [p for p, _ in order], "torchvision's file order differs")
        for k in range(len(ds)):
            img, label = ds[k]
            check(label == y[k] and np.array_equal(np.asarray(img), x[k]), f"image {k} differs from torchvision's")
        print(f"torchvision: {len(ds)} images identical")

    # NCHW: the same pixels, transposed; layout says so.
    out2 = os.path.join(tmp, "out_nchw")
    rc, _, stderr = run(tool, src, out2, "--side", str(SIDE), "--shard-size", "100", "--workers", "1",
                        "--layout", "NCHW", "--prefix", "val")
    check(rc == 0, f"NCHW run: exit status {rc}\n{stderr}")
    if rc == 0:
        with h5py.File(os.path.join(out2, "val_000.h5"), "r") as f:
            check(f["x"].attrs["layout"] == "NCHW", "NCHW run: layout attribute")
            check(np.array_equal(f["x"][...], x.transpose(0, 3, 1, 2)), "NCHW run: not the NHWC images transposed")
    print(f"good run: {n} images in {len(info)} shards checked")


def check_one_error(tool, what, args, culprit=None):
    rc, stdout, stderr = run(tool, *args)
    lines = [l for l in stderr.splitlines() if l.startswith("images_to_h5: error:")]
    check(rc == 1, f"{what}: exit status {rc}, expected 1")
    check(len(lines) == 1, f"{what}: {len(lines)} error lines\n{stderr}")
    check("Traceback" not in stderr, f"{what}: a traceback\n{stderr}")
    if culprit is not None and lines:
        check(culprit in lines[0], f"{what}: the error line does not name {culprit}: {lines[0]}")
    print(f"{what}: {lines[0] if lines else stderr.strip()}")
    return lines


def check_corrupt(tool, tmp, name, content):
    src = os.path.join(tmp, "bad_" + name.replace(".", "_"))
    out = os.path.join(tmp, "out_" + name.replace(".", "_"))
    make_tree(src)
    bad = os.path.join(src, "zebra", name)  # last class, last file: earlier shards are complete when it fails
    with open(bad, "wb") as f:
        f.write(content)
    lines = check_one_error(tool, f"corrupt {name}", [src, out, "--side", str(SIDE), "--shard-size", str(SHARD),
                                                      "--workers", str(WORKERS)], bad)
    if lines:
        check(": cannot decode: " in lines[0], f"corrupt {name}: not 'cannot decode': {lines[0]}")
    left = sorted(os.listdir(out)) if os.path.isdir(out) else []
    check(left == [], f"corrupt {name}: files left in OUT_DIR: {left}")


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        check_good_run(tool, tmp)

        with open(os.path.join(tmp, "src", "zebra", "a.jpg"), "rb") as f:
            jpeg = f.read()
        check_corrupt(tool, tmp, "zz_truncated.jpg", jpeg[:len(jpeg) // 2])
        check_corrupt(tool, tmp, "zz_random.png", np.random.default_rng(1).bytes(3000))

        out = os.path.join(tmp, "o")
        check_one_error(tool, "missing SRC_DIR", [os.path.join(tmp, "nowhere"), out], "nowhere")
        os.makedirs(os.path.join(tmp, "flat"))
        Image.new("RGB", (8, 8)).save(os.path.join(tmp, "flat", "a.png"))
        check_one_error(tool, "no class folders", [os.path.join(tmp, "flat"), out], "flat")
        os.makedirs(os.path.join(tmp, "src", "empty_class"))
        with open(os.path.join(tmp, "src", "empty_class", "readme.txt"), "w") as f:
            f.write("no images here\n")
        check_one_error(tool, "class without images", [os.path.join(tmp, "src"), out], "empty_class")
        shutil.rmtree(os.path.join(tmp, "src", "empty_class"))
        blocker = os.path.join(tmp, "a_file")
        with open(blocker, "w") as f:
            f.write("x")
        check_one_error(tool, "OUT_DIR not writable", [os.path.join(tmp, "src"), os.path.join(blocker, "out")], blocker)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
