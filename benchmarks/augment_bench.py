"""What each fused augmentation costs, against DataLoader + torchvision v2 running the same one.

    python benchmarks/augment_bench.py --root /tmp/benchdata/images_n3000_seed0_grain14_v1/tree

Over a JPEG ImageFolder tree (the images suite's corpus, or any), RandomResizedCrop(224) + flip + ImageNet
normalisation with each augmentation (none, TrivialAugmentWide nearest and bilinear, AugMix), and the
references' --interpolation bicubic recipe (RandomResizedCrop and TrivialAugmentWide bicubic, and the
bicubic crop alone), and the references' --mixup-alpha/--cutmix-alpha (v2's MixUp or CutMix as their
collate_fn, and the same on the batch in the loop, which fastpipe does without a copy), fastpipe's fused form
(k reader threads) and DataLoader + v2 on PIL (k workers), batch 64, warm page cache. Rounds alternate the rows; each row reads `--images` images after 3 warm-up
batches; medians over `--reps` rounds. Writes a Markdown table (images/s, fastpipe over DataLoader, each
one's cost over its plain row: the crop of the same interpolation without augmentation).
"""

import argparse
import functools
import os
import platform
import statistics
import time

import torch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
AUGMENTS = ("none", "TA nearest", "TA bilinear", "AugMix", "bicubic: none", "bicubic: TA bicubic",
            "MixUp/CutMix collate_fn", "MixUp/CutMix in the loop")
PLAIN = {a: "bicubic: none" if a.startswith("bicubic") else "none" for a in AUGMENTS}


def mixup_cutmix(root):
    """The references' batch transform: v2.RandomChoice of MixUp(alpha 0.2) and CutMix(alpha 1.0)."""
    from torchvision.transforms import v2

    classes = sum(1 for e in os.scandir(root) if e.is_dir())
    return v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=classes), v2.CutMix(alpha=1.0, num_classes=classes)])


def mixing_collate(mix, batch):
    """The references' collate_fn: ``mixup_cutmix(*default_collate(batch))`` (module level: workers pickle it)."""
    return mix(*torch.utils.data.default_collate(batch))


def collate_of(augment, root):
    return functools.partial(mixing_collate, mixup_cutmix(root)) if augment == "MixUp/CutMix collate_fn" else None


def interpolation(augment):
    return "bicubic" if augment.startswith("bicubic") else "bilinear"


def fastpipe_batches(root, augment, threads, seed):
    import fastpipe
    from fastpipe.transforms import AugMix, RandomResizedCrop, TrivialAugmentWide

    fused = {"none": None, "TA nearest": TrivialAugmentWide(),
             "TA bilinear": TrivialAugmentWide(interpolation="bilinear"), "AugMix": AugMix(),
             "bicubic: none": None, "bicubic: TA bicubic": TrivialAugmentWide(interpolation="bicubic")}.get(augment)
    t = RandomResizedCrop(224, mirror=0.5, mean=MEAN, std=STD, augment=fused, interpolation=interpolation(augment))
    extra = {"collate_fn": collate} if (collate := collate_of(augment, root)) else {}
    return fastpipe.Loader(fastpipe.ImageFolder(root), batch_size=64, shuffle=True, num_threads=threads,
                           transforms={0: t}, seed=seed, **extra)


def dataloader_batches(root, augment, threads, seed):
    from torchvision import datasets
    from torchvision.transforms import v2

    step = {"none": [], "TA nearest": [v2.TrivialAugmentWide()],
            "TA bilinear": [v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR)],
            "AugMix": [v2.AugMix()], "bicubic: none": [],
            "bicubic: TA bicubic": [v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BICUBIC)]}.get(augment, [])
    mode = v2.InterpolationMode(interpolation(augment))
    tf = v2.Compose([v2.RandomResizedCrop(224, interpolation=mode, antialias=True), v2.RandomHorizontalFlip(), *step,
                     v2.PILToTensor(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    torch.manual_seed(seed)
    extra = {"collate_fn": collate} if (collate := collate_of(augment, root)) else {}
    return torch.utils.data.DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=64, shuffle=True,
                                       num_workers=threads, **extra)


def rate(make, root, augment, threads, seed, images):
    """Images per second after 3 warm-up batches, every pixel touched."""
    loader = make(root, augment, threads, seed)

    def batches():  # epochs back to back: a small tree holds fewer images than a row reads
        while True:
            yield from loader

    def mixed(source):  # the references' MixUp/CutMix on the batch, in the training loop
        mix = mixup_cutmix(root)
        for x, y in source:
            yield mix(x, y)

    it = mixed(batches()) if augment == "MixUp/CutMix in the loop" else batches()
    for _ in range(3):
        next(it)
    start, seen, checksum = time.perf_counter(), 0, 0.0
    while seen < images:
        x, y = next(it)
        checksum += float(x.sum()) + float(y.sum())
        seen += x.shape[0]
    out = seen / (time.perf_counter() - start)
    del it, loader
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="a JPEG ImageFolder tree")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="reader threads and workers (k)")
    ap.add_argument("--images", type=int, default=1280, help="images timed per row and round")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--augments", default=",".join(AUGMENTS),
                    help=f"comma-separated rows (default: all of {', '.join(AUGMENTS)}); each row's plain row is added")
    args = ap.parse_args()
    chosen = [a for a in AUGMENTS if a in args.augments.split(",") or a in {PLAIN[b] for b in args.augments.split(",")}]
    rows = {(who, a): [] for a in chosen for who in ("fastpipe", "DataLoader + v2")}
    for rep in range(args.reps):
        for (who, augment), rates in rows.items():
            make = fastpipe_batches if who == "fastpipe" else dataloader_batches
            rates.append(rate(make, args.root, augment, args.threads, rep, args.images))
            print(f"round {rep}: {who}, {augment}: {rates[-1]:,.0f} img/s", flush=True)
    med = {key: statistics.median(r) for key, r in rows.items()}
    lines = ["# Augmentation cost: fastpipe against DataLoader + torchvision v2",
             "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; torch {torch.__version__}; "
             f"k = {args.threads}, batch 64, 224x224, {args.images} images per row and round, median of "
             f"{args.reps} alternating rounds; {args.root}; {time.strftime('%Y-%m-%dT%H:%M:%S')}.",
             "",
             "| augmentation | fastpipe img/s | DataLoader + v2 img/s | fastpipe / DataLoader | fastpipe's cost | "
             "DataLoader's cost |",
             "|---|---:|---:|---:|---:|---:|"]
    for a in chosen:
        f, d = med[("fastpipe", a)], med[("DataLoader + v2", a)]
        cost_f = 1 - f / med[("fastpipe", PLAIN[a])]
        cost_d = 1 - d / med[("DataLoader + v2", PLAIN[a])]
        lines.append(f"| {a} | {f:,.0f} | {d:,.0f} | {f / d:.2f}x | {100 * cost_f:.0f}% | {100 * cost_d:.0f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"augment_cpu-{os.cpu_count()}core_{time.strftime('%Y%m%d-%H%M%S')}.md")
    with open(path, "w") as f:
        f.write(text)
    print(f"written to {path}")


if __name__ == "__main__":
    main()
