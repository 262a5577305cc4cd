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
and ratios: fastpipe / stock and each row / synthetic. The suite also checks that fastpipe trains as well
as stock (``training_check``): they see the same records in the same order (one seeded sampler) from the
same weights, each repetition with its own seed for the random flips and crops, and fastpipe's final loss
must agree with stock's within the noise those seeds show; a case where stock's loss does not fall either
is reported as inconclusive, not as a fastpipe failure.

Repetitions (each of every case): within the time budget (``--budget-minutes``, ``BUDGET_MINUTES["train"]``),
another while the slowest so far still fits, ``MIN_REPS`` to ``FULL_REPS``; ``--full`` runs ``FULL_REPS``.
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

from fastpipe.bench import BUDGET_MINUTES
from fastpipe.bench import common as bc
from fastpipe.bench import models as _models
from fastpipe.bench.baselines import MemmapSampleDataset
from fastpipe.monitor import Monitor, _rss_bytes

__all__ = ["add_arguments", "run", "DATASETS", "ensure_data", "tree_cpu_seconds"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NUM_CLASSES = 10
LOSS_FALLS = 0.9  # stock learns: its final loss is below 90% of its start (else the check is inconclusive)
LOSS_AGREES = 0.25  # fastpipe's final loss within noise of stock's, and never a tolerance under 25% of stock's drop
FULL_REPS = 3  # repetitions of every case (--full, and the most the budget chooses)
MIN_REPS = 2  # the fewest the budget chooses: the training check's noise needs two augmentation seeds

# Per data set: image size, records, and (GPU, CPU) batch size. The records wrap into further epochs.
DATASETS = {
    "cifar": {"size": 32, "records": (65536, 8192), "batch": (512, 64)},
    "imagenet": {"size": 224, "records": (8192, 1024), "batch": (256, 16)},
    # cpu_steps: the CPU run's timed steps where 30 are too few to learn. MobileNetV2 from random crops of the
    # JPEGs stays near its start for about 30 steps of 16 (2.4 -> 2.0-2.2, within the noise of the
    # augmentation seeds) and is at 1.2-1.7 after 60.
    "imagenet_jpeg": {"size": 224, "records": (8192, 1024), "batch": (256, 16), "jpeg": True, "cpu_steps": 60},
}
# SGD's learning rate per model (momentum 0.9), at the CPU's batches of 16-64. The data are easy (colours):
# at 0.02 ResNet's loss fell near 0 within 10 steps and then spiked back up at random steps (to 1-2), so its
# last steps' loss depended on where a spike fell (0.1 to 1.1 between augmentation seeds, with either
# loader); at 0.005 it settles (0.2 +- 0.03 on CIFAR-like). MobileNetV2 at 0.02 rose above its start for a
# while in most runs; at 0.01 it learns, and at 0.005 too slowly for the JPEG case.
LR = {"resnet": 0.005, "mobilenet_v2": 0.01}
GPU_LR = 0.02  # both models, at the GPU's batches of 256-512 (unchanged: not re-tuned without a GPU)
JPEG_SCALE = (0.35, 1.0)  # RandomResizedCrop's area range in the JPEG case: crops keep enough of the class
QUICK = {"records": 96, "batch": 8, "steps": 4, "warmup": 1}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", default=",".join(_models.MODELS), help="comma-separated: resnet, mobilenet_v2")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated: cifar, imagenet, imagenet_jpeg")
    p.add_argument("--steps", type=int, default=None,
                   help="timed steps per row (default 100 GPU; CPU 30, the JPEG case 60)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 20 GPU, 3 CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="default: per data set, GPU or CPU")
    p.add_argument("--width", type=float, default=None, help="model width (default 1.0 GPU, 0.25 CPU)")
    p.add_argument("--workers", type=int, default=None,
                   help="DataLoader num_workers and fastpipe's readers (default: min(8, CPUs))")
    p.add_argument("--train-device", default=None, help="cuda when available, else cpu")
    p.add_argument("--reps", type=int, default=None,
                   help=f"repetitions of each row, in rotating order; the median is kept (default: within the "
                        f"time budget, another while the slowest so far fits, {MIN_REPS} to {FULL_REPS}; "
                        f"--full {FULL_REPS}, --quick 1)")
    p.add_argument("--lr", type=float, default=None,
                   help="SGD learning rate (momentum 0.9; default on the CPU per model: "
                        + ", ".join(f"{m} {lr:g}" for m, lr in LR.items()) + f"; on a GPU {GPU_LR:g})")
    p.add_argument("--seed", type=int, default=0)


def _options(args):
    device = torch.device(args.train_device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    quick = args.quick
    return {
        "device": device,
        "gpu": gpu,
        "quick": quick,
        "steps": args.steps or (QUICK["steps"] if quick else 100 if gpu else 30),  # a data set's cpu_steps first
        "steps_given": args.steps is not None,
        "warmup": args.warmup if args.warmup is not None else (QUICK["warmup"] if quick else 20 if gpu else 3),
        "width": args.width or (1.0 if gpu else 0.25),
        "workers": args.workers if args.workers is not None else min(8, os.cpu_count() or 1),
        "batch": args.batch_size,
        "reps": args.reps or (1 if quick else FULL_REPS if args.full else None),  # None: from the budget
        "budget_minutes": None if (quick or args.full or args.reps) else (
            args.budget_minutes or BUDGET_MINUTES["train"]),
        "seed": args.seed,
        "lr": args.lr,
        "data_dir": os.path.join(args.data_dir, "quick") if quick else args.data_dir,
    }


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
# The classes' colours: the corners of an RGB cube and two points between them, at least 100 levels apart.
CLASS_COLOURS = [(r, g, b) for r in (56, 200) for g in (56, 200) for b in (56, 200)] + [(128, 128, 56),
                                                                                      (128, 128, 200)]


def class_layouts(rng):
    """The ten classes' coarse 8x8 RGB layouts (uint8, (10, 8, 8, 3)): each class has a colour of its own
    (CLASS_COLOURS) and its cells vary around it (+-40 levels). The colour survives any crop, flip and
    resize, so a small net learns the classes within the CPU run's steps even from random crops; the
    layout adds spatial structure."""
    base = np.array(CLASS_COLOURS[:NUM_CLASSES]).reshape(NUM_CLASSES, 1, 1, 3)
    cells = rng.integers(-40, 41, (NUM_CLASSES, 8, 8, 3))
    return np.clip(base + cells, 0, 255).astype(np.uint8)


def ensure_data(directory, name, records, size, seed=0):
    """``<directory>/train_<name>_<size>/{image,label}.npy``: uint8 (N, 3, size, size) images that are
    their class's coarse layout (``class_layouts``) plus noise, and the class as the int64 label.
    Reused when present with the right shape (and format version: the directory name's ``v4``)."""
    out = os.path.join(directory, f"train_{name}_{size}_v4")
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
    # The layouts scaled up (as classes of real images differ), plus pixel noise.
    coarse = class_layouts(rng).astype(np.uint16).transpose(0, 3, 1, 2)
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
    """``<directory>/train_jpeg_<size>_v3/<class>/<i>.jpg``: the classes' layouts plus noise (as
    ensure_data's), 1.1-1.6x the output size with random aspect, JPEG quality 90, in an ImageFolder
    tree. Reused when its marker file (written last) is there."""
    from PIL import Image

    out = os.path.join(directory, f"train_jpeg_{size}_v3")
    done = os.path.join(out, f".complete-{records}")
    if os.path.exists(done):
        return {"root": out}
    rng = np.random.default_rng(seed)
    coarse = class_layouts(rng)
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
                             drop_last=True, seed=o.get("aug_seed", o["seed"]), num_workers=o["workers"],
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
                             drop_last=True, seed=o.get("aug_seed", o["seed"]), num_workers=o["workers"],
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
    opt = torch.optim.SGD(model.parameters(), lr=o["lr"] or (GPU_LR if gpu else LR[o["model"]]), momentum=0.9)
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


def prepare_case(model_name, data_name, o):
    """A case's data (generated once) and sizes."""
    spec = DATASETS[data_name]
    which = 0 if o["gpu"] else 1
    records = QUICK["records"] if o["quick"] else spec["records"][which]
    batch = o["batch"] or (QUICK["batch"] if o["quick"] else spec["batch"][which])
    if spec.get("jpeg"):
        paths = ensure_jpeg_data(o["data_dir"], records, spec["size"], o["seed"])
    else:
        paths = ensure_data(o["data_dir"], data_name, records, spec["size"], o["seed"])
    steps = o["steps"] if o["steps_given"] or o["quick"] or o["gpu"] else spec.get("cpu_steps", o["steps"])
    return {"model": model_name, "dataset": data_name, "image_size": spec["size"], "batch": batch,
            "records": records, "steps": steps, "paths": paths, "runs": {feed: [] for feed in FEEDS}}


def augment_seed(o, rep):
    """The seed of repetition rep's random flips and crops (both loaders alike; the record order and the
    initial weights stay those of o["seed"]): the repetitions' losses then show how much the final loss
    moves with the augmentations' draws alone, the noise the training check compares with."""
    return o["seed"] + 1000 * rep


def run_rep(case, o, rep):
    """One repetition of a case: its three feeds, in an order rotated each repetition (a slow spell of a
    noisy machine hits every feed alike)."""
    oc = {**o, "size": case["image_size"], "aug_seed": augment_seed(o, rep), "model": case["model"],
          "steps": case["steps"]}
    for feed in list(FEEDS)[rep % len(FEEDS):] + list(FEEDS)[:rep % len(FEEDS)]:
        model, fused = _model(case["model"], oc, case["image_size"], feed == "fastpipe")
        torch.manual_seed(oc["aug_seed"])  # stock's flips (and its workers' crops) draw from torch's generator
        row = train_row(feed, model, oc, case["paths"], case["batch"])
        case["runs"][feed].append({**row, "fused_chains": fused, "aug_seed": oc["aug_seed"]})
        del model


def training_check(runs, quick):
    """Does fastpipe train as well as the stock loader? Both start from the same weights and see the same
    records in the same order; only the augmentations' random draws differ (and, per repetition, their
    seed). So:

    - ``stock_learns``: stock's final loss (median over repetitions) is below LOSS_FALLS of where it
      started: its first steps' loss, or chance (ln of the classes: an untrained classifier's loss) where
      that is higher, since a net that learns fast has learnt within its first quarter of steps already.
      If it is not, the case is too short or too hard to show learning, and a comparison of two losses
      that did not fall would say nothing about fastpipe: the check is "inconclusive", not a fastpipe
      failure (the data are made so that it learns: ``class_layouts``).
    - ``losses_agree``: fastpipe's final loss (median) is within ``tolerance`` of stock's: the larger of the
      noise (the widest range of either loader's final losses over the repetitions, whose augmentation
      seeds differ) and LOSS_AGREES of what stock's loss fell. A loader that fed wrong labels or pixels
      would keep its loss near the start, a whole stock drop away. That tells them apart only where
      stock's drop is larger than the noise: where it is not, the check is inconclusive too.

    A smoke run's few steps cannot show learning: nothing is checked (None)."""
    if quick:
        return {"status": None}
    med = {f: {k: statistics.median(r[k] for r in runs[f]) for k in ("loss_first", "loss_last")}
           for f in ("stock", "fastpipe")}
    start = {f: max(med[f]["loss_first"], math.log(NUM_CLASSES)) for f in med}
    stock_drop = start["stock"] - med["stock"]["loss_last"]
    fastpipe_drop = start["fastpipe"] - med["fastpipe"]["loss_last"]
    noise = max(max(r["loss_last"] for r in runs[f]) - min(r["loss_last"] for r in runs[f])
                for f in ("stock", "fastpipe"))
    tolerance = max(noise, LOSS_AGREES * max(stock_drop, 0.0))
    learns = med["stock"]["loss_last"] < LOSS_FALLS * start["stock"] and stock_drop > noise
    agree = abs(med["fastpipe"]["loss_last"] - med["stock"]["loss_last"]) <= tolerance
    status = ("as stock" if agree else "FAILED") if learns else "inconclusive"
    return {"status": status, "stock_learns": learns, "losses_agree": agree, "stock_start": start["stock"],
            "stock_drop": stock_drop,
            "fastpipe_drop": fastpipe_drop, "noise": noise, "tolerance": tolerance,
            "reps": min(len(runs["stock"]), len(runs["fastpipe"]))}


def summarize_case(case, o):
    runs = case["runs"]
    rows = {}
    for feed, reps in runs.items():  # each feed's median repetition by images/s (of two middle ones, the
        ordered = sorted(reps, key=lambda r: r["images_per_s"])  # faster: noise only slows), and every one's
        rows[feed] = {**ordered[len(ordered) // 2], "images_per_s_reps": [r["images_per_s"] for r in reps],
                      "loss_last_reps": [r["loss_last"] for r in reps]}
    limit, stock = rows["synthetic"]["images_per_s"], rows["stock"]["images_per_s"]
    for r in rows.values():
        r["of_synthetic"] = r["images_per_s"] / limit
    # Per repetition (the same repetition ran both, back to back): the noise of the ratio.
    ratios = [f["images_per_s"] / s["images_per_s"] for f, s in zip(runs["fastpipe"], runs["stock"])]
    check = training_check(runs, o["quick"])
    return {
        **{k: case[k] for k in ("model", "dataset", "image_size", "batch", "records", "steps")},
        "rows": rows,
        "fastpipe_over_stock": statistics.median(ratios),
        "fastpipe_over_stock_reps": ratios,
        "check": check,
        "loss_falls": check.get("stock_learns"),
        "losses_agree": check.get("losses_agree"),
    }


def _fmt_bytes(n):
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def _check(case):
    c = case["check"]
    if c["status"] is None:
        return "not checked (quick)"
    if c["status"] == "inconclusive":
        return "inconclusive: stock's loss did not fall"
    return f"{c['status']} ({_loss_pair(case)})"


def _loss_pair(case):
    """fastpipe's and stock's final losses and the tolerance, e.g. 'loss 0.41 vs 0.45 +- 0.12'."""
    c, rows = case["check"], case["rows"]
    f, s = (statistics.median(rows[k]["loss_last_reps"]) for k in ("fastpipe", "stock"))
    return f"loss {f:.2f} vs {s:.2f} +- {c['tolerance']:.2f}"


def _range(values, spec=".2f", unit=""):
    return f"{min(values):{spec}}-{max(values):{spec}}{unit}" if len(values) > 1 else "-"


def report(cases, o, out):
    """The tables: one line per row, then per case the ratios and the training check."""
    headers = ["model", "data", "feed", "img/s", "range", "step ms", "data wait %", "busy %", "CPU s/step", "peak mem",
               "loss first>last", "of synthetic"]
    rows = []
    for c in cases:
        for feed, r in c["rows"].items():
            rows.append([c["model"], c["dataset"], feed, f"{r['images_per_s']:.1f}", _range(r["images_per_s_reps"], ".1f"),
                         f"{r['step_ms']:.1f}", f"{r['data_wait_pct']:.1f}",
                         "-" if r["device_busy_pct"] is None else f"{r['device_busy_pct']:.0f}",
                         f"{r['cpu_s_per_step']:.3f}", _fmt_bytes(r["peak_mem_bytes"]),
                         f"{r['loss_first']:.3f}>{r['loss_last']:.3f}", f"{r['of_synthetic']:.3f}"])
    reps = min(len(r["images_per_s_reps"]) for c in cases for r in c["rows"].values())
    where = f"{o['device']}, {'bf16 autocast' if o['gpu'] else 'fp32'}, {o['workers']} workers, width {o['width']}"
    other = {f"{c['dataset']} {c['steps']}" for c in cases if c["steps"] != o["steps"]}
    steps = f"{o['steps']}" + (f" ({', '.join(sorted(other))})" if other else "")
    out.table(headers, rows, title=f"training steps ({where}; {steps} timed steps after {o['warmup']}; median of "
                                   f"{reps} repetition(s), range: their min-max)")
    out.table(["model", "data", "batch", "fastpipe / stock", "range", "fastpipe / synthetic", "stock / synthetic",
               "fused chains", "training check"],
              [[c["model"], c["dataset"], f"{c['batch']} x {c['image_size']}px", f"{c['fastpipe_over_stock']:.3f}x",
                _range(c["fastpipe_over_stock_reps"], ".3f", "x"),
                f"{c['rows']['fastpipe']['of_synthetic']:.3f}", f"{c['rows']['stock']['of_synthetic']:.3f}",
                c["rows"]["fastpipe"]["fused_chains"], _check(c)] for c in cases],
              title="ratios (images/s; fastpipe / stock: median of per-repetition ratios, range: their min-max)")
    out.note(f"Training check: does fastpipe train as well as the stock loader? Both start from the same weights "
             f"and see the same records in the same order, each repetition with its own seed for the random "
             f"flips and crops. 'as stock': fastpipe's final loss (median over repetitions) is within the "
             f"tolerance of stock's: the larger of the noise (the widest range of either loader's final losses "
             f"over the repetitions) and {LOSS_AGREES:g}x what stock's loss fell. 'inconclusive': stock's own "
             f"loss did not fall below {LOSS_FALLS:g}x its start (its first steps' loss, or chance, ln 10, where that "
             f"is higher), or by less than the noise, so the case cannot tell a loader that trains from one that "
             f"does not. "
             f"Data wait: the loop getting its next batch ready "
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
    budget = bc.Budget(o["budget_minutes"])
    todo = [prepare_case(m, d, o) for d in datasets for m in args.models.split(",")]
    # Repetitions (each of every case): a fixed count (--reps, --quick, --full), or within the budget:
    # another while the slowest so far still fits, MIN_REPS to FULL_REPS.
    lo, hi = (o["reps"], o["reps"]) if o["reps"] else (MIN_REPS, FULL_REPS)
    times = []
    with out.progress(total=hi, desc="train", unit="rep") as bar:
        while budget.more(times, lo, hi):
            t0 = time.perf_counter()
            for case in todo:
                run_rep(case, o, len(times))
                out.checkpoint({"cases": [{k: v for k, v in c.items() if k != "paths"} for c in todo]})
            times.append(time.perf_counter() - t0)
            bar.update()
    reps = len(times)
    out.note(budget.line(times, "every case"))
    cases = [summarize_case(c, o) for c in todo]
    report(cases, o, out)
    checks = [c["check"]["status"] for c in cases]
    summary = {
        "geomean_fastpipe_over_stock": geomean([c["fastpipe_over_stock"] for c in cases]),
        "geomean_fastpipe_of_synthetic": geomean([c["rows"]["fastpipe"]["of_synthetic"] for c in cases]),
        "geomean_stock_of_synthetic": geomean([c["rows"]["stock"]["of_synthetic"] for c in cases]),
        # True: fastpipe trained as stock did in every case; False: a case FAILED; None: not checked (quick),
        # or no case failed but some were inconclusive (stock did not learn there either).
        "all_train": None if o["quick"] else (False if "FAILED" in checks else
                                              True if all(s == "as stock" for s in checks) else None),
        "reps": reps,
    }
    out.note(f"geomean: fastpipe / stock {summary['geomean_fastpipe_over_stock']:.3f}x, fastpipe / synthetic "
             f"{summary['geomean_fastpipe_of_synthetic']:.3f}, stock / synthetic "
             f"{summary['geomean_stock_of_synthetic']:.3f}")
    options = {k: (str(v) if k == "device" else v) for k, v in o.items()}
    headline = [f"{c['model']} {c['dataset']}: fastpipe {c['fastpipe_over_stock']:.2f}x stock"
                + (f" ({_range(c['fastpipe_over_stock_reps'], '.2f', 'x')} over {len(c['fastpipe_over_stock_reps'])} reps)"
                   if len(c["fastpipe_over_stock_reps"]) > 1 else "")
                + f", {c['rows']['fastpipe']['of_synthetic']:.2f} of the synthetic-data limit (stock "
                f"{c['rows']['stock']['of_synthetic']:.2f}); training check: {_check(c)}" for c in cases]
    return {"options": options, "cases": cases, "summary": summary, "headline": headline}
