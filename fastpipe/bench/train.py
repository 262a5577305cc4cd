"""Training suite (the headline): how much faster a training step goes with fastpipe, and where the time goes.

For each model (ResNet-style, MobileNetV2-style) and data set (CIFAR-like, ImageNet-like, generated as
``.npy`` with labels the images really encode, so the loss can fall; and ImageNet from JPEG: a folder of
JPEG files of those images, decoded with RandomResizedCrop + flip + normalise every step), three rows
with the same model
(same seed), steps, optimizer (SGD with momentum) and precision (bf16 autocast on GPU, fp32 on CPU),
record order (one seeded sampler for both loaders), each row repeated (3 times by default) in
rotating order and its median repetition kept:

- **stock**: ``DataLoader(num_workers=N, pin_memory=<on GPU>, persistent_workers=True)`` over a map-style
  dataset reading the ``.npy`` files through ``np.load(mmap_mode="r")``, ``nn`` modules, and the batch
  mirrored and normalised on the device, as a careful user writes it;
- **fastpipe**: ``fastpipe.Loader`` with ``CropMirrorNormalize`` (in the reader threads on CPU, in one
  kernel with ``device="cuda"``) and the model through ``fastpipe.nn.fuse`` (in training mode it fuses
  only chains without a training BatchNorm: the count is reported);
- **synthetic**: the same loop on one batch already on the device, no loading at all: the limit.

The JPEG case feeds stock with ``torchvision.datasets.ImageFolder`` + a v2 pipeline on PIL images through
DataLoader, and fastpipe with the very same dataset object handed to ``fastpipe.Loader`` (the one-line
switch: it reads the folder itself and fuses the pipeline into the decode).

Reported per row: images/s over the timed steps (after warm-up), mean step time, data wait (the share of
the time the loop spends getting its next batch ready: waiting in ``next()``, and for stock the copy to
the device and the normalisation), device busy (NVML's GPU utilisation; on CPU the share not spent on
data), CPU seconds per step of the whole process tree (DataLoader's worker processes included), peak
memory (CUDA's allocator on GPU, the main process's RSS on CPU), the loss over the first and last steps,
and ratios: fastpipe / stock and each row / synthetic. The suite also checks that both loaders train:
the loss falls below ``LOSS_FALLS`` of its start and the two final losses agree within ``LOSS_AGREES``
of the starting loss: they see the same records in the same order (one seeded sampler), with
different random flips.
"""

import argparse
import contextlib
import itertools
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from fastpipe.bench import models as _models
from fastpipe.bench.baselines import MemmapSampleDataset
from fastpipe.monitor import Monitor, _rss_bytes

__all__ = ["add_arguments", "run", "DATASETS", "ensure_data", "tree_cpu_seconds"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NUM_CLASSES = 10
LOSS_FALLS = 0.9  # the final loss is below 90% of the first steps' loss
LOSS_AGREES = 0.25  # fastpipe's and stock's final losses within 25% of the first steps' loss

# Per data set: image size, records, and (GPU, CPU) batch size. The records wrap into further epochs.
DATASETS = {
    "cifar": {"size": 32, "records": (65536, 8192), "batch": (512, 64)},
    "imagenet": {"size": 224, "records": (8192, 1024), "batch": (256, 16)},
    "imagenet_jpeg": {"size": 224, "records": (8192, 1024), "batch": (256, 16), "jpeg": True},
}
JPEG_SCALE = (0.35, 1.0)  # RandomResizedCrop's area range in the JPEG case: crops keep enough of the class
QUICK = {"records": 96, "batch": 8, "steps": 4, "warmup": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(_models.MODELS), help="comma-separated: resnet, mobilenet_v2")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated: cifar, imagenet, imagenet_jpeg")
    p.add_argument("--steps", type=int, default=None, help="timed steps per row (default 100 GPU, 30 CPU)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 20 GPU, 3 CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="default: per data set, GPU or CPU")
    p.add_argument("--width", type=float, default=None, help="model width (default 1.0 GPU, 0.25 CPU)")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader num_workers and fastpipe's readers (default: min(8, CPUs))")
    p.add_argument("--train-device", default=None, help="cuda when available, else cpu")
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions of each row, in rotating order; the median is kept (default 3, quick 1)")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--seed", type=int, default=0)


def _options(args):
    device = torch.device(args.train_device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    quick = args.quick
    return {
        "device": device,
        "gpu": gpu,
        "quick": quick,
        "steps": args.steps or (QUICK["steps"] if quick else 100 if gpu else 30),
        "warmup": args.warmup if args.warmup is not None else (QUICK["warmup"] if quick else 20 if gpu else 3),
        "width": args.width or (1.0 if gpu else 0.25),
        "workers": args.workers if args.workers is not None else min(8, os.cpu_count() or 1),
        "batch": args.batch_size,
        "reps": args.reps or (1 if quick else 3),
        "seed": args.seed,
        "lr": args.lr,
        "data_dir": os.path.join(args.data_dir, "quick") if quick else args.data_dir,
    }


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def ensure_data(directory, name, records, size, seed=0):
    """``<directory>/train_<name>_<size>/{image,label}.npy``: uint8 (N, 3, size, size) images that are
    one of ten fixed coarse random patterns plus noise, and the pattern's index as the int64 label.
    Reused when present with the right shape (and format version: the directory name's ``v2``)."""
    out = os.path.join(directory, f"train_{name}_{size}_v2")
    paths = {"image": os.path.join(out, "image.npy"), "label": os.path.join(out, "label.npy")}
    try:
        ok = np.load(paths["image"], mmap_mode="r").shape == (records, 3, size, size) and (
            np.load(paths["label"], mmap_mode="r").shape == (records,))
    except (OSError, ValueError):
        ok = False
    if ok:
        return paths
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Coarse 8x8 colour layouts scaled up (as classes of real images differ), plus pixel noise.
    coarse = rng.integers(0, 256, (NUM_CLASSES, 3, 8, 8), dtype=np.uint16)
    cell = -(-size // 8)
    patterns = coarse.repeat(cell, axis=2).repeat(cell, axis=3)[:, :, :size, :size]
    labels = rng.integers(0, NUM_CLASSES, records).astype(np.int64)
    images = np.lib.format.open_memmap(paths["image"] + ".tmp", mode="w+", dtype=np.uint8,
                                       shape=(records, 3, size, size))
    chunk = max(1, (32 << 20) // (3 * size * size))  # bounded memory
    for i in range(0, records, chunk):
        lab = labels[i:i + chunk]
        noise = rng.integers(0, 256, (len(lab), 3, size, size), dtype=np.uint8)
        images[i:i + chunk] = ((patterns[lab] * 3 + noise) // 4).astype(np.uint8)
    images.flush()
    del images
    os.replace(paths["image"] + ".tmp", paths["image"])
    np.save(paths["label"], labels)
    return paths


def ensure_jpeg_data(directory, records, size, seed=0):
    """``<directory>/train_jpeg_<size>_v1/<class>/<i>.jpg``: the classes' coarse random patterns plus noise
    (as ensure_data's), 1.1-1.6x the output size with random aspect, JPEG quality 90, in an ImageFolder
    tree. Reused when its marker file (written last) is there."""
    from PIL import Image

    out = os.path.join(directory, f"train_jpeg_{size}_v1")
    done = os.path.join(out, f".complete-{records}")
    if os.path.exists(done):
        return {"root": out}
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (NUM_CLASSES, 8, 8, 3), dtype=np.uint8)
    for i in range(records):
        label = int(rng.integers(NUM_CLASSES))
        h, w = (int(size * rng.uniform(1.1, 1.6)) for _ in range(2))
        pattern = np.asarray(Image.fromarray(coarse[label]).resize((w, h), Image.NEAREST), np.uint16)
        noise = rng.integers(0, 256, (h, w, 3), dtype=np.uint16)
        path = os.path.join(out, f"class{label}", f"{i:06d}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Image.fromarray(((pattern * 3 + noise) // 4).astype(np.uint8)).save(path, quality=90)
    open(done, "w").close()
    return {"root": out}


def _jpeg_dataset(paths, size):
    """torchvision's ImageFolder with a standard training pipeline on PIL images."""
    import torchvision
    from torchvision.transforms import v2

    pipeline = v2.Compose([v2.RandomResizedCrop(size, scale=JPEG_SCALE), v2.RandomHorizontalFlip(), v2.ToImage(),
                           v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    return torchvision.datasets.ImageFolder(paths["root"], transform=pipeline)


class EpochPermutation(torch.utils.data.Sampler):
    """A seeded permutation per epoch, the order both loaders use: their losses then compare step for
    step (only their random flips differ). Loader forwards set_epoch itself; DataLoader's loop calls it."""

    def __init__(self, n, seed):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self):
        return self.n


def _forever(loader, sampler=None):
    """Batches across epoch boundaries (the timed steps may outlast one epoch)."""
    for epoch in itertools.count():
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader


# ------------------------------------------------------------------------------------------------
# The three ways to feed the same training loop: each yields (x, y) ready for the model
# ------------------------------------------------------------------------------------------------
def _stats(device):
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    return mean, std


def stock_batches(paths, o, batch):
    gpu = o["gpu"]
    if "root" in paths:
        yield from stock_jpeg_batches(paths, o, batch)
        return
    dataset = MemmapSampleDataset(paths["image"], paths["label"])
    sampler = EpochPermutation(len(dataset), o["seed"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True,
                                         num_workers=o["workers"], pin_memory=gpu,
                                         persistent_workers=o["workers"] > 0)
    mean, std = _stats(o["device"])
    fmt = torch.channels_last if gpu else torch.contiguous_format
    for images, labels in _forever(loader, sampler):
        x = images.to(o["device"], non_blocking=True).float().div_(255)
        flip = torch.rand(x.shape[0], device=x.device) < 0.5  # mirror with probability 0.5, as fastpipe's
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x).sub_(mean).div_(std)
        yield x.contiguous(memory_format=fmt), labels.to(o["device"], non_blocking=True)


def stock_jpeg_batches(paths, o, batch):
    dataset = _jpeg_dataset(paths, o["size"])
    sampler = EpochPermutation(len(dataset), o["seed"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True,
                                         num_workers=o["workers"], pin_memory=o["gpu"],
                                         persistent_workers=o["workers"] > 0)
    fmt = torch.channels_last if o["gpu"] else torch.contiguous_format
    for images, labels in _forever(loader, sampler):
        yield (images.to(o["device"], non_blocking=True).contiguous(memory_format=fmt),
               labels.to(o["device"], non_blocking=True))


def fastpipe_jpeg_batches(paths, o, batch):
    import fastpipe

    dataset = _jpeg_dataset(paths, o["size"])  # the same torchvision object: the one-line switch
    loader = fastpipe.Loader(dataset, batch_size=batch, sampler=EpochPermutation(len(dataset), o["seed"]),
                             drop_last=True, seed=o["seed"], num_workers=o["workers"],
                             device=str(o["device"]) if o["gpu"] else "cpu")
    fmt = torch.channels_last if o["gpu"] else torch.contiguous_format
    for x, y in _forever(loader):
        yield x.contiguous(memory_format=fmt), y


def fastpipe_batches(paths, o, batch):
    import fastpipe
    from fastpipe.transforms import CropMirrorNormalize

    if "root" in paths:
        yield from fastpipe_jpeg_batches(paths, o, batch)
        return
    gpu = o["gpu"]
    cmn = CropMirrorNormalize(MEAN, STD, mirror=0.5, in_layout="CHW", layout="NHWC" if gpu else "NCHW",
                              out_dtype=torch.bfloat16 if gpu else torch.float32)
    dataset = fastpipe.NpyDataset(paths)
    loader = fastpipe.Loader(dataset, batch_size=batch, sampler=EpochPermutation(len(dataset), o["seed"]),
                             drop_last=True, seed=o["seed"], num_workers=o["workers"],
                             device=str(o["device"]) if gpu else "cpu", transforms={"image": cmn})
    for b in _forever(loader):
        x = b["image"].permute(0, 3, 1, 2) if gpu else b["image"]  # NHWC data: a channels_last NCHW view
        yield x, b["label"]


def synthetic_batches(paths, o, batch):
    """One batch, made once, already on the device: the loop never waits for data."""
    if "root" in paths:
        dataset = _jpeg_dataset(paths, o["size"])
        x, y = next(iter(torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True)))
        x = x.to(o["device"]).contiguous(memory_format=torch.channels_last if o["gpu"] else torch.contiguous_format)
        y = y.to(o["device"])
        while True:
            yield x, y
    mean, std = _stats(o["device"])
    images = torch.from_numpy(np.load(paths["image"], mmap_mode="r")[:batch].copy())
    x = images.to(o["device"]).float().div_(255).sub_(mean).div_(std)
    x = x.contiguous(memory_format=torch.channels_last) if o["gpu"] else x
    y = torch.from_numpy(np.load(paths["label"])[:batch].copy()).to(o["device"])
    while True:
        yield x, y


FEEDS = {"stock": stock_batches, "fastpipe": fastpipe_batches, "synthetic": synthetic_batches}


# ------------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------------
def tree_cpu_seconds():
    """User + system CPU seconds of this process and all its descendants (DataLoader's workers)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [os.getpid()]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [child for child, p in parent.items() if p == pid]
    return total


def train_row(feed, model, o, paths, batch):
    """Runs warm-up + timed steps of `model` fed by `feed`; returns the row's measurements."""
    device = o["device"]
    gpu = o["gpu"]
    sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"], momentum=0.9)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()
    batches = FEEDS[feed](paths, o, batch)
    losses, wait, steps, warmup = [], 0.0, o["steps"], o["warmup"]
    monitor = None
    with contextlib.ExitStack() as stack:
        for i in range(warmup + steps):
            if i == warmup:  # the timed part starts: workers running, kernels chosen, caches warm
                sync()
                if gpu:
                    torch.cuda.reset_peak_memory_stats(device)
                monitor = stack.enter_context(Monitor(interval=0.05))
                wait, cpu0, t0 = 0.0, tree_cpu_seconds(), time.perf_counter()
            tw = time.perf_counter()
            x, y = next(batches)
            wait += time.perf_counter() - tw
            with autocast:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        sync()
        seconds = time.perf_counter() - t0
        cpu = tree_cpu_seconds() - cpu0
    batches.close()  # stops the loader (DataLoader's workers, fastpipe's readers)
    losses = torch.stack(losses).float().cpu().tolist()
    k = max(1, len(losses) // 4)  # a quarter of the steps: one step's loss is noisy
    summary = monitor.summary()
    row = {
        "feed": feed,
        "images_per_s": steps * batch / seconds,
        "step_ms": 1e3 * seconds / steps,
        "data_wait_pct": 100.0 * wait / seconds,
        "device_busy_pct": summary.get("gpu_busy_pct") if gpu else 100.0 * (1 - wait / seconds),
        "cpu_s_per_step": cpu / steps,
        "peak_mem_bytes": torch.cuda.max_memory_allocated(device) if gpu else summary.get("rss_max", _rss_bytes()),
        "loss_first": statistics.fmean(losses[:k]),
        "loss_last": statistics.fmean(losses[-k:]),
    }
    if summary:
        row["monitor"] = {key: v for key, v in summary.items() if not isinstance(v, (list, dict))}
    return row


def _model(name, o, size, fastpipe_row):
    torch.manual_seed(o["seed"])  # the same initial weights in every row
    model = _models.MODELS[name](NUM_CLASSES, size, o["width"]).to(o["device"])
    if o["gpu"]:
        model = model.to(memory_format=torch.channels_last)
    fused = 0
    if fastpipe_row:
        import fastpipe.nn as fnn

        model = fnn.fuse(model)
        fused = len(model.fuse_report.fused)
    return model.train(), fused


def run_case(model_name, data_name, o):
    spec = DATASETS[data_name]
    which = 0 if o["gpu"] else 1
    records = QUICK["records"] if o["quick"] else spec["records"][which]
    batch = o["batch"] or (QUICK["batch"] if o["quick"] else spec["batch"][which])
    if spec.get("jpeg"):
        paths = ensure_jpeg_data(o["data_dir"], records, spec["size"], o["seed"])
    else:
        paths = ensure_data(o["data_dir"], data_name, records, spec["size"], o["seed"])
    o = {**o, "size": spec["size"]}
    runs = {feed: [] for feed in FEEDS}
    for rep in range(o["reps"]):  # rotating order: a slow spell of a noisy machine hits every feed alike
        for feed in list(FEEDS)[rep % len(FEEDS):] + list(FEEDS)[:rep % len(FEEDS)]:
            model, fused = _model(model_name, o, spec["size"], feed == "fastpipe")
            runs[feed].append({**train_row(feed, model, o, paths, batch), "fused_chains": fused})
            del model
    rows = {}
    for feed, reps in runs.items():  # each feed's median repetition by images/s, with every repetition's
        reps.sort(key=lambda r: r["images_per_s"])
        rows[feed] = {**reps[(len(reps) - 1) // 2], "images_per_s_reps": [r["images_per_s"] for r in reps]}
    limit, stock = rows["synthetic"]["images_per_s"], rows["stock"]["images_per_s"]
    for r in rows.values():
        r["of_synthetic"] = r["images_per_s"] / limit
    first = rows["stock"]["loss_first"]
    # A smoke run's few steps cannot show learning: its check is not made (None).
    trains = None if o["quick"] else all(rows[f]["loss_last"] < LOSS_FALLS * first for f in ("stock", "fastpipe"))
    agree = None if o["quick"] else (
        abs(rows["fastpipe"]["loss_last"] - rows["stock"]["loss_last"]) <= LOSS_AGREES * first)
    return {
        "model": model_name,
        "dataset": data_name,
        "image_size": spec["size"],
        "batch": batch,
        "records": records,
        "rows": rows,
        "fastpipe_over_stock": rows["fastpipe"]["images_per_s"] / stock,
        "loss_falls": trains,
        "losses_agree": agree,
    }


def _fmt_bytes(n):
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def _check(case):
    return {None: "not checked (quick)", True: "both train"}.get(
        case["loss_falls"] and case["losses_agree"], "FAILED")


def report(cases, o, out):
    """The tables: one line per row, then per case the ratios and the training check."""
    headers = ["model", "data", "feed", "img/s", "step ms", "data wait %", "busy %", "CPU s/step", "peak mem",
               "loss first>last", "of synthetic"]
    rows = []
    for c in cases:
        for feed, r in c["rows"].items():
            rows.append([c["model"], c["dataset"], feed, f"{r['images_per_s']:.1f}", f"{r['step_ms']:.1f}",
                         f"{r['data_wait_pct']:.1f}",
                         "-" if r["device_busy_pct"] is None else f"{r['device_busy_pct']:.0f}",
                         f"{r['cpu_s_per_step']:.3f}", _fmt_bytes(r["peak_mem_bytes"]),
                         f"{r['loss_first']:.3f}>{r['loss_last']:.3f}", f"{r['of_synthetic']:.3f}"])
    where = f"{o['device']}, {'bf16 autocast' if o['gpu'] else 'fp32'}, {o['workers']} workers, width {o['width']}"
    out.table(headers, rows, title=f"training steps ({where}; {o['steps']} timed steps after {o['warmup']}; median of "
                                           f"{o['reps']} repetitions)")
    out.table(["model", "data", "batch", "fastpipe / stock", "fastpipe / synthetic", "stock / synthetic",
               "fused chains", "training check"],
              [[c["model"], c["dataset"], f"{c['batch']} x {c['image_size']}px", f"{c['fastpipe_over_stock']:.3f}x",
                f"{c['rows']['fastpipe']['of_synthetic']:.3f}", f"{c['rows']['stock']['of_synthetic']:.3f}",
                c["rows"]["fastpipe"]["fused_chains"], _check(c)] for c in cases],
              title="ratios (images/s)")
    out.note(f"Training check: each loader's final loss below {LOSS_FALLS:g}x the first steps' and the two "
             f"within {LOSS_AGREES:g}x the first steps' loss of each other. Data wait: the loop getting its next batch ready "
             f"(stock: next() + copy + normalise on the device; fastpipe: next()). Busy: NVML utilisation on "
             f"GPU, 100 - data wait on CPU.")
    out.bars("train", "Training images/s as a fraction of the synthetic-data limit",
             {feed: {f"{c['model']} {c['dataset']}": c["rows"][feed]["of_synthetic"] for c in cases}
              for feed in ("stock", "fastpipe")},
             "fraction of the synthetic-data limit", ref=1.0)


def geomean(values):
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def run(args, out):
    o = _options(args)
    todo = []
    for name, known, flag in ((args.datasets, DATASETS, "--datasets"), (args.models, _models.MODELS, "--models")):
        bad = [v for v in name.split(",") if v not in known]
        if bad:
            raise SystemExit(f"train {flag}: unknown {bad}; choose from {','.join(known)}")
    datasets = args.datasets.split(",")
    if any(DATASETS[d].get("jpeg") for d in datasets):
        try:
            import torchvision  # noqa: F401  (the JPEG case's stock row)
        except ImportError:
            datasets = [d for d in datasets if not DATASETS[d].get("jpeg")]
            out.note("The JPEG case is skipped: its stock row needs torchvision, which is not installed.")
    todo = [(m, d) for d in datasets for m in args.models.split(",")]
    cases = []
    for m, d in out.progress(todo, desc="train", unit="case"):
        cases.append(run_case(m, d, o))
        out.checkpoint({"cases": cases})
    report(cases, o, out)
    summary = {
        "geomean_fastpipe_over_stock": geomean([c["fastpipe_over_stock"] for c in cases]),
        "geomean_fastpipe_of_synthetic": geomean([c["rows"]["fastpipe"]["of_synthetic"] for c in cases]),
        "geomean_stock_of_synthetic": geomean([c["rows"]["stock"]["of_synthetic"] for c in cases]),
        "all_train": None if o["quick"] else all(c["loss_falls"] and c["losses_agree"] for c in cases),
    }
    out.note(f"geomean: fastpipe / stock {summary['geomean_fastpipe_over_stock']:.3f}x, fastpipe / synthetic "
             f"{summary['geomean_fastpipe_of_synthetic']:.3f}, stock / synthetic "
             f"{summary['geomean_stock_of_synthetic']:.3f}")
    options = {k: (str(v) if k == "device" else v) for k, v in o.items()}
    headline = [f"{c['model']} {c['dataset']}: fastpipe {c['fastpipe_over_stock']:.2f}x stock, "
                f"{c['rows']['fastpipe']['of_synthetic']:.2f} of the synthetic-data limit (stock "
                f"{c['rows']['stock']['of_synthetic']:.2f}); training check: {_check(c)}" for c in cases]
    return {"options": options, "cases": cases, "summary": summary, "headline": headline}
