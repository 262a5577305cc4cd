"""How well shuffle="blocks" mixes shards written class by class (the worst case), against a full
shuffle: the distinct classes per batch, and a small CPU training run.

The corpus: C classes of learnable 32x32 JPEGs (stripes whose angle and tint tell the class, under noise),
written as WebDataset shards class by class (each shard holds one class's images) and read in blocks of
--block-size bytes (a window of K blocks holds at most K classes). Two measures:

1. Classes per batch: for shuffle_window sizes of a growing fraction of the blocks, the mean distinct
   classes in a batch over an epoch, as a ratio to a full shuffle's (order only: fastpipe.data.order's
   block_order, which the Loader uses, over the blocks' real sample counts).
2. Training: a small CNN trained for E epochs by SGD on fastpipe.Loader batches (RandomResizedCrop), one
   run per seed and order (shuffle=True, shuffle="blocks" with the windows asked for); the accuracy on a
   held-out split read in order. The table gives each order's median and its accuracy difference to the
   full shuffle's, seed by seed.
"""

import argparse
import io
import os
import statistics
import sys
import tarfile
import tempfile

import numpy as np
import torch
from PIL import Image

import fastpipe
from fastpipe.bench import common
from fastpipe.data import order as sample_order

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def picture(rng, c, classes, size=40):
    """Class c's look: stripes at angle c*pi/classes with a class tint, a random phase and frequency,
    and noise."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    angle = np.pi * c / classes
    freq = rng.uniform(0.25, 0.45)
    wave = np.sin(freq * (x * np.cos(angle) + y * np.sin(angle)) + rng.uniform(0, 2 * np.pi))
    tint = np.array([np.cos(2 * np.pi * c / classes), np.sin(2 * np.pi * c / classes), 0.0]) * 0.25
    img = 0.5 + 0.3 * wave[..., None] + tint + rng.normal(0, 0.25, (size, size, 3))
    return (np.clip(img, 0, 1) * 255).astype(np.uint8)


def write_split(folder, rng, classes, per_class, per_shard):
    """Shards of `per_shard` images, class by class: their paths."""
    os.makedirs(folder, exist_ok=True)
    paths, n = [], 0
    for c in range(classes):
        for first in range(0, per_class, per_shard):
            path = os.path.join(folder, f"c{c:03d}-{first:05d}.tar")
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for _ in range(min(per_shard, per_class - first)):
                    buf = io.BytesIO()
                    Image.fromarray(picture(rng, c, classes)).save(buf, format="JPEG", quality=90)
                    for ext, data in (("jpg", buf.getvalue()), ("cls", str(c).encode())):
                        info = tarfile.TarInfo(f"s{n:06d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                    n += 1
            paths.append(path)
    return paths


def classes_per_batch(labels, order, batch):
    full = len(order) // batch * batch
    return float(np.mean([len(np.unique(labels[order[i:i + batch]])) for i in range(0, full, batch)]))


def model(classes):
    def block(cin, cout):
        return [torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU()]

    return torch.nn.Sequential(*block(3, 16), torch.nn.MaxPool2d(2), *block(16, 32), torch.nn.MaxPool2d(2),
                               *block(32, 64), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(64, classes))


def train(train_ds, test_ds, classes, seed, order, args):
    torch.manual_seed(seed)
    net = model(classes)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    crop = fastpipe.transforms.RandomResizedCrop(32, scale=(0.6, 1.0), mean=MEAN, std=STD)
    shuffle = dict(shuffle=True) if order == "full" else dict(shuffle="blocks", shuffle_window=order)
    ld = fastpipe.Loader(train_ds, batch_size=args.batch_size, drop_last=True, seed=seed, num_threads=args.threads,
                         transforms={0: crop}, **shuffle)
    for _ in range(args.epochs):
        for x, y in ld:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
    ld.close()
    net.eval()
    right = total = 0
    center = fastpipe.transforms.CenterCrop(32, mean=MEAN, std=STD)
    with torch.no_grad(), fastpipe.Loader(test_ds, batch_size=256, transforms={0: center}) as test:
        for x, y in test:
            right += int((net(x).argmax(1) == y).sum())
            total += len(y)
    return 100.0 * right / total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--per-class", type=int, default=400)
    p.add_argument("--per-shard", type=int, default=100)
    p.add_argument("--test-per-class", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--windows", default="0.25,0.5,0.75",
                   help="shuffle_window sizes to train with, as fractions of the blocks' bytes")
    p.add_argument("--block-size", default="16MiB",
                   help="the WebDataset's block_size (default: its own, here a block per shard)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    out = common.Report("shuffle_quality", "benchmarks/results", json_path=args.out, options=vars(args))
    torch.set_num_threads(args.threads)
    work = tempfile.mkdtemp(prefix="fastpipe-shuffle-quality-")
    rng = np.random.default_rng(0)
    train_paths = write_split(os.path.join(work, "train"), rng, args.classes, args.per_class, args.per_shard)
    test_paths = write_split(os.path.join(work, "test"), rng, args.classes, args.test_per_class, args.test_per_class)
    train_ds = fastpipe.WebDataset(train_paths, index_cache="off", block_size=args.block_size)
    test_ds = fastpipe.WebDataset(test_paths, index_cache="off")
    labels = np.asarray(train_ds.targets)
    starts, groups, mean_bytes = train_ds._blocks()
    data_bytes = mean_bytes * len(starts)

    rows, mix = [], {}
    full = statistics.mean(classes_per_batch(labels, sample_order.epoch_order(len(labels), shuffle=True, seed=s, epoch=0),
                                             args.batch_size) for s in range(args.seeds))
    for k in sorted({max(1, round(f * len(starts))) for f in np.linspace(0.025, 1.0, 40)}):
        got = statistics.mean(classes_per_batch(labels, sample_order.block_order(starts, len(labels), seed=s, epoch=0, window=k, groups=groups),
                                                args.batch_size) for s in range(args.seeds))
        mix[k] = got / full
        rows.append([k, f"{k / len(starts):.2f}", f"{got:.2f}", f"{got / full:.3f}"])
    out.table(["window (blocks)", "fraction of blocks", "classes per batch", "x full shuffle"], rows,
              title=f"classes per batch, batch {args.batch_size}, {len(train_paths)} shards of {args.per_shard} written "
                    f"class by class ({args.classes} classes), {len(starts)} blocks; full shuffle: {full:.2f}")
    def mix_of(k):  # the window's classes per batch, measured for the windows above or now
        if k not in mix:
            mix[k] = statistics.mean(classes_per_batch(labels, sample_order.block_order(
                starts, len(labels), seed=s, epoch=0, window=k, groups=groups), args.batch_size) for s in range(args.seeds)) / full
        return mix[k]

    enough = min((k for k, r in mix.items() if r >= 0.9), default=None)
    out.log(f"smallest window with >= 90% of a full shuffle's classes per batch: {enough} blocks "
            f"({enough / len(starts):.2f} of them)" if enough else "no window reaches 90%")

    orders = ["full"] + [int(float(f) * data_bytes) + 1 for f in args.windows.split(",")]
    acc = {o: [] for o in orders}
    for seed in range(args.seeds):
        for o in orders:
            acc[o].append(train(train_ds, test_ds, args.classes, seed, o, args))
            out.log(f"seed {seed} {o if o == 'full' else f'blocks, window {o} bytes'}: {acc[o][-1]:.1f}%")
    table = []
    for o in orders:
        k = 0 if o == "full" else min(len(starts), max(1, int(o // mean_bytes)))
        diff = [a - b for a, b in zip(acc[o], acc["full"])]
        table.append(["shuffle=True" if o == "full" else f'"blocks", {k} of {len(starts)} blocks a window',
                      f"{statistics.median(acc[o]):.1f}", " ".join(f"{a:.1f}" for a in acc[o]),
                      "" if o == "full" else f"{statistics.median(diff):+.1f}",
                      "" if o == "full" else f"{mix_of(k):.3f}"])
    out.table(["order", "accuracy % (median)", "per seed", "vs full (median of seed differences)",
               "classes per batch x full"], table,
              title=f"training: {args.epochs} epochs, batch {args.batch_size}, SGD lr {args.lr}, {args.seeds} seeds, "
                    f"test {args.test_per_class} per class read in order")
    out.save({"classes_per_batch_ratio": mix, "full_classes_per_batch": full, "accuracy": {str(k): v for k, v in acc.items()},
              "shards": len(train_paths), "blocks": len(starts), "torch": torch.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
