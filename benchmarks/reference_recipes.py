"""torchvision's own classification reference (references/classification/train.py), run unchanged but for
its two ``torch.utils.data.DataLoader(`` lines, which become ``fastpipe.Loader(``: every recipe flag, with
DataLoader and with fastpipe, at equal seeds, on a small generated ImageFolder of JPEGs, on the CPU.

The reference is torchvision's release as Debian's pytorch-vision source package carries it (its upstream
tarball, checked against its SHA-256), downloaded once into --cache (it is not part of this repository).
The script runs as a user runs it (``python train.py --data-path ... --device cpu ...``) under a launcher
that only seeds torch, random and numpy first (the reference sets no seed).

    python benchmarks/reference_recipes.py                      # every configuration, 3 epochs each
    python benchmarks/reference_recipes.py --configs defaults,bicubic --epochs 1

Prints, and writes as markdown to --out: per configuration, the last epoch's training loss and the final
Acc@1 of each loader, and the median epoch time of each (from the reference's own progress lines), with
fastpipe's speedup.
"""

import argparse
import hashlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

import numpy as np

TARBALL = "http://deb.debian.org/debian/pool/main/p/pytorch-vision/pytorch-vision_0.21.0.orig.tar.gz"
SHA256 = "0a4a967bbb7f9810f792cd0289a07fb98c8fb5d1303fae8b63e3a6b05d720058"
MEMBER = "vision-0.21.0/references/classification/"
SWITCH = ("torch.utils.data.DataLoader(", "__import__('fastpipe').Loader(")

# The configurations: name -> the reference's flags.
CONFIGS = {
    "defaults": [],
    "ta_wide+erase": ["--auto-augment", "ta_wide", "--random-erase", "0.1"],
    "ra": ["--auto-augment", "ra"],
    "autoaugment": ["--auto-augment", "imagenet"],
    "augmix": ["--auto-augment", "augmix"],
    "mixup+cutmix": ["--mixup-alpha", "0.2", "--cutmix-alpha", "1.0"],
    "bicubic": ["--interpolation", "bicubic"],
    "bicubic+ta_wide": ["--interpolation", "bicubic", "--auto-augment", "ta_wide"],
    "v2": ["--use-v2"],
    "v2+ta_wide+erase": ["--use-v2", "--auto-augment", "ta_wide", "--random-erase", "0.1"],
    "tensor": ["--backend", "tensor"],
    "tensor+v2+bicubic": ["--backend", "tensor", "--use-v2", "--interpolation", "bicubic"],
    "176/232/224": ["--train-crop-size", "176", "--val-resize-size", "232", "--val-crop-size", "224"],
    "test-only": ["--test-only"],  # from the "defaults" run's checkpoint
}
# `python train.py ...` with torch, random and numpy seeded first (and the script's folder first on sys.path,
# as python puts it there). The reference saves its argparse.Namespace in its checkpoints and loads them with
# weights_only=True, which torch >= 2.6 refuses for a Namespace (with DataLoader too): allowed here.
LAUNCH = ("import argparse, os, random, runpy, sys, numpy, torch; seed = int(sys.argv[1]); random.seed(seed); "
          "numpy.random.seed(seed); torch.manual_seed(seed); sys.argv = sys.argv[2:]; "
          "torch.serialization.add_safe_globals([argparse.Namespace]); "
          "sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0]))); "
          "runpy.run_path(sys.argv[0], run_name='__main__')")


def fetch_reference(cache):
    """The reference's folder, downloaded and unpacked once into `cache`."""
    folder = os.path.join(cache, MEMBER)
    if os.path.exists(os.path.join(folder, "train.py")):
        return folder
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, os.path.basename(TARBALL))
    if not os.path.exists(path):
        with urllib.request.urlopen(TARBALL, timeout=60) as r, open(path + ".part", "wb") as f:
            shutil.copyfileobj(r, f)
        os.replace(path + ".part", path)
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != SHA256:
        os.remove(path)
        raise RuntimeError(f"{TARBALL}: SHA-256 {digest}, expected {SHA256}")
    with tarfile.open(path) as t:
        t.extractall(cache, members=[m for m in t.getmembers() if m.name.startswith(MEMBER)], filter="data")
    return folder


def switched_copy(reference, where, loader):
    """The reference folder copied to `where`; for "fastpipe" its train.py's DataLoader lines switched
    (and nothing else: the count of switched lines is checked)."""
    shutil.copytree(reference, where, dirs_exist_ok=True)
    if loader == "fastpipe":
        path = os.path.join(where, "train.py")
        with open(path) as f:
            text = f.read()
        if text.count(SWITCH[0]) != 2:
            raise RuntimeError(f"expected two DataLoader lines in {path}, found {text.count(SWITCH[0])}")
        with open(path, "w") as f:
            f.write(text.replace(*SWITCH))
    return os.path.join(where, "train.py")


def make_dataset(root, classes, train_per_class, val_per_class, seed=0):
    """An ImageFolder of JPEGs (train/, val/) whose classes differ in colour and texture, at ImageNet-like
    sizes (shorter side 240-400), so that a few epochs learn something."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = os.path.join(root, split, f"class_{c:02d}")
            os.makedirs(folder, exist_ok=True)
            hue = np.array([np.cos(2 * np.pi * c / classes), np.cos(2 * np.pi * c / classes + 2),
                            np.cos(2 * np.pi * c / classes + 4)])
            for k in range(n):
                h, w = (int(v) for v in rng.integers(240, 401, 2))
                yy, xx = np.mgrid[0:h, 0:w] / 40.0
                stripes = np.sin(xx * (1 + c % 3) + yy * (c // 3)) * 60
                image = 128 + hue[None, None] * 70 + stripes[..., None] + rng.normal(0, 25, (h, w, 3))
                Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(
                    os.path.join(folder, f"{k:04d}.jpg"), quality=90)


def run(script, data, flags, out_dir, seed, epochs, args, log):
    """One run of the reference; returns (wall seconds, its output)."""
    cmd = [sys.executable, "-c", LAUNCH, str(seed), script, "--data-path", data, "--device", "cpu",
           "--model", args.model, "-b", str(args.batch_size), "-j", str(args.workers), "--epochs", str(epochs),
           "--lr", str(args.lr), "--print-freq", "1", "--output-dir", out_dir, *flags]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    wall = time.perf_counter() - start
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n\n" + p.stdout + "\n--- stderr ---\n" + p.stderr)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(flags) or 'defaults'} failed (exit {p.returncode}); log: {log}\n"
                           f"{p.stderr[-3000:]}")
    return wall, p.stdout


def parse(output):
    """(last epoch's mean training loss or None, last Acc@1, per-epoch seconds)."""
    losses = re.findall(r"Epoch: \[(\d+)\].*?loss: [0-9.]+ \(([0-9.]+)\)", output)
    acc = re.findall(r"Acc@1 ([0-9.]+)", output)
    # The epoch's time: its last progress line's mean step time (the metric logger's "time:", an average
    # over the epoch) times its steps; the "Total time" lines round to whole seconds.
    last_lines = {}
    for epoch, steps, mean in re.findall(r"Epoch: \[(\d+)\]\s+\[\s*\d+/(\d+)\].*?time: ([0-9.]+)", output):
        last_lines[int(epoch)] = int(steps) * float(mean)
    times = [last_lines[e] for e in sorted(last_lines)]
    last = float(losses[-1][1]) if losses else None
    return last, float(acc[-1]) if acc else None, times


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names (default: all)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--model", default="mobilenet_v3_small")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--workers", type=int, default=2, help="-j of both loaders: the machine's cores")
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--classes", type=int, default=10, help="at least 5: the reference reports top-5 accuracy")
    p.add_argument("--train-per-class", type=int, default=32)
    p.add_argument("--val-per-class", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/fastpipe/torchvision-references"))
    p.add_argument("--work", default=None, help="folder for data, copies, checkpoints and logs (default: temp)")
    p.add_argument("--loaders", default="DataLoader,fastpipe")
    p.add_argument("--out", default=None, help="markdown table path")
    args = p.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = set(names) - set(CONFIGS)
    if unknown:
        p.error(f"unknown configs {sorted(unknown)}; known: {', '.join(CONFIGS)}")
    loaders = args.loaders.split(",")
    work = args.work or tempfile.mkdtemp(prefix="fastpipe-recipes-")
    reference = fetch_reference(args.cache)
    data = os.path.join(work, "data")
    if not os.path.isdir(os.path.join(data, "val")):
        make_dataset(data, args.classes, args.train_per_class, args.val_per_class, args.seed)
    rows = []
    for name in names:
        row = {"config": name}
        for loader in loaders:
            script = switched_copy(reference, os.path.join(work, "code", loader), loader)
            out_dir = os.path.join(work, "out", loader, "defaults" if name == "test-only" else name)
            os.makedirs(out_dir, exist_ok=True)
            flags = list(CONFIGS[name])
            if name == "test-only":
                checkpoint = os.path.join(out_dir, "checkpoint.pth")
                if not os.path.exists(checkpoint):
                    run(script, data, [], out_dir, args.seed, 1, args, os.path.join(work, f"{loader}-ckpt.log"))
                flags += ["--resume", checkpoint]
            wall, output = run(script, data, flags, out_dir, args.seed, args.epochs, args,
                               os.path.join(work, f"{loader}-{name.replace('/', '_')}.log"))
            loss, acc, times = parse(output)
            row[loader] = dict(loss=loss, acc=acc, epoch_s=statistics.median(times) if times else None, wall=wall)
            print(f"{name:18s} {loader:10s} loss {loss} acc@1 {acc} epoch times {times} wall {wall:.1f} s",
                  flush=True)
        rows.append(row)
    table = ["| config | " + " | ".join(f"{l} loss / Acc@1 | {l} epoch s" for l in loaders)
             + (" | speedup |" if len(loaders) == 2 else " |"),
             "|---|" + "---|---|" * len(loaders) + ("---|" if len(loaders) == 2 else "")]
    for r in rows:
        cells = []
        for l in loaders:
            m = r[l]
            loss = "-" if m["loss"] is None else f"{m['loss']:.3f}"
            cells += [f"{loss} / {m['acc']:.1f}" if m["acc"] is not None else loss,
                      "-" if m["epoch_s"] is None else f"{m['epoch_s']:.1f}"]
        speed = ""
        if len(loaders) == 2:
            a, b = (r[l]["epoch_s"] for l in loaders)
            speed = f" {a / b:.2f}x |" if a and b else " - |"
        table.append(f"| {r['config']} | " + " | ".join(cells) + " |" + speed)
    text = "\n".join(table)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(f"logs and checkpoints: {work}")
    return rows


if __name__ == "__main__":
    main()
