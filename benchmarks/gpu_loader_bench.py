"""The device data path on a GPU, against what a user has without fastpipe, in one run.

1. Host-to-device bandwidth: ``Loader(device="cuda")`` delivering ImageNet-like uint8 batches, against
   the fair bound: pinned ``copy_(non_blocking=True)`` of the same batch bytes from as many distinct
   pinned buffers into as many device buffers as the loader's arena has slots, in rotation (one buffer
   copied again and again flatters the copy engine); beside it that one-buffer copy, a pageable copy and
   the reader threads' own rate (the same Loader delivering CPU batches).
2. A training step of a small conv net on 224x224 uint8 images under bf16 autocast (channels_last):
   fastpipe ``Loader(device="cuda")`` + ``CropMirrorNormalize`` on the device, against
   ``DataLoader(num_workers=N, pin_memory=True)`` + ``.to(non_blocking=True)`` + normalize on the GPU.
   Reports images/s, the fraction of step time the loop waits for data, and CPU time per batch (this
   process and its worker processes).

    python benchmarks/gpu_loader_bench.py [--out results.json] [--workers 8]
    python benchmarks/gpu_loader_bench.py --smoke     # tiny sizes on the simulated device: the script runs

Figures the issue asks for: loader H2D >= 90% of the fair bound; data wait <= 5% where DataLoader's is
higher; less CPU time per batch than DataLoader.
"""

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import fastpipe  # noqa: E402
from fastpipe.data import _device  # noqa: E402
from fastpipe.transforms import CropMirrorNormalize  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cpu_seconds():
    """User + system CPU seconds of this process and its live children (DataLoader workers)."""
    tick = os.sysconf("SC_CLK_TCK")

    def of(pid):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick

    me = os.getpid()
    total = of(me)
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != me:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                if ppid == me:
                    total += of(pid)
            except (OSError, ValueError, IndexError):
                pass
    return total


class ImageFolderLike(torch.utils.data.Dataset):
    """What a DataLoader user has: one uint8 HWC image per __getitem__ from the same .npy file."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels
        self.mm = None

    def __len__(self):
        return len(np.load(self.labels, mmap_mode="r"))

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = np.load(self.images, mmap_mode="r"), np.load(self.labels, mmap_mode="r")
        img, lab = self.mm
        return torch.from_numpy(np.ascontiguousarray(img[i]).transpose(2, 0, 1).copy()), int(lab[i])


def small_net():
    def block(cin, cout, stride):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    return nn.Sequential(block(3, 32, 2), block(32, 64, 2), block(64, 128, 2), block(128, 256, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 1000))


FAIR_BOUND = "pinned copy_, a buffer per arena slot (fair bound)"


def loader_rate(ds, batch, batches, sync, device="cpu"):
    """(bytes per second, arena slots, bytes per batch) of a Loader delivering `batches` batches after 3
    of warm-up: on `device`, or CPU batches (the reader threads' own rate)."""
    ld = fastpipe.Loader(ds, batch, shuffle=True, device=device, timeout=120)
    it = iter(ld)
    for _ in range(3):
        next(it)
    sync()
    nbytes, t0 = 0, time.perf_counter()
    for _ in range(batches):
        try:
            b = next(it)
        except StopIteration:
            it = iter(ld)
            b = next(it)
        nbytes += sum(v.numel() * v.element_size() for v in b.values())
        del b
    sync()
    rate = nbytes / (time.perf_counter() - t0)
    slots = ld.stats()["num_slots"]
    ld.close()
    return rate, slots, nbytes // batches


def h2d(args, ds, device, sync, batch):
    """Bytes per second: the loader, the readers alone, and pinned (the fair bound, and one buffer) and
    pageable copy loops of the same batch bytes."""
    loader_bps, slots, per = loader_rate(ds, batch, args.h2d_batches, sync, device)
    rows = {"fastpipe.Loader(device='cuda')": loader_bps,
            "readers alone (the Loader's CPU batches)": loader_rate(ds, batch, args.h2d_batches, lambda: None)[0]}
    if torch.cuda.is_available() and not args.smoke:
        cases = ((FAIR_BOUND, True, slots), ("pinned copy_, one buffer copied again", True, 1),
                 ("pageable copy_", False, 1))
        for name, pin, buffers in cases:
            src = [torch.empty(per, dtype=torch.uint8, pin_memory=pin) for _ in range(buffers)]
            dst = [torch.empty(per, dtype=torch.uint8, device="cuda") for _ in range(buffers)]
            for d, s_ in zip(dst, src, strict=True):
                d.copy_(s_, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for k in range(args.h2d_batches):
                dst[k % buffers].copy_(src[k % buffers], non_blocking=True)
            torch.cuda.synchronize()
            rows[name] = per * args.h2d_batches / (time.perf_counter() - t0)
    return rows


def train(args, paths, device, loader_device, sync, which):
    """One configuration: (images/s, wait fraction, CPU ms per batch). The model runs on `device`, the
    fastpipe loader's batches on `loader_device` (the same, but for --smoke's simulated one)."""
    torch.manual_seed(0)
    model = small_net().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    crop = args.crop
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)
    if which == "fastpipe":
        # bf16 NHWC straight from the transform: the model's channels_last input, half the bytes of fp32
        t = CropMirrorNormalize(MEAN, STD, crop=(crop, crop), random_crop=True, mirror=0.5,
                                out_dtype=torch.bfloat16 if device == "cuda" else torch.float32, layout="NHWC")
        ds = fastpipe.NpyDataset({"image": paths[0], "label": paths[1]})
        loader = fastpipe.Loader(ds, args.batch, shuffle=True, drop_last=True, device=loader_device,
                                 transforms={"image": t}, timeout=120)

        def prep(b):
            if args.smoke:
                # The model runs on the CPU here, outside the simulated streams: wait for the batch's copies
                # as a GPU kernel queued on the consumer stream would (else it reads a slot being filled).
                sync()
            return b["image"].permute(0, 3, 1, 2), b["label"]  # NCHW shape, channels_last memory: no copy
    else:
        loader = torch.utils.data.DataLoader(ImageFolderLike(*paths), batch_size=args.batch, shuffle=True,
                                             drop_last=True, num_workers=args.workers, pin_memory=device == "cuda",
                                             persistent_workers=args.workers > 0)

        def prep(b):
            x, y = b
            x = x.to(device, non_blocking=True)[:, :, :crop, :crop]
            x = ((x.float() / 255 - mean) / std).contiguous(memory_format=torch.channels_last)
            return x, y.to(device, non_blocking=True)

    def batches():
        while True:
            yield from loader

    it = batches()
    waits, steps = 0.0, 0
    for i in range(args.warmup + args.steps):
        if i == args.warmup:
            sync()
            t0, c0, waits = time.perf_counter(), cpu_seconds(), 0.0
        w0 = time.perf_counter()
        x, y = prep(next(it))
        waits += time.perf_counter() - w0
        with amp:
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= args.warmup:
            steps += 1
            if steps % 10 == 0:
                sync()  # bounds how far the host runs ahead, as a logging step would
    sync()
    wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    del it
    return {"images_per_s": steps * args.batch / wall, "wait_fraction": waits / wall,
            "cpu_ms_per_batch": 1e3 * cpu / steps, "step_ms": 1e3 * wall / steps}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=4096)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--crop", type=int, default=192)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--h2d-batches", type=int, default=60)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the simulated device (no GPU needed)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.smoke:
        args.images, args.size, args.crop, args.batch, args.steps, args.warmup, args.h2d_batches = 64, 40, 32, 8, 4, 1, 4
        args.workers = min(args.workers, 2)
    elif not torch.cuda.is_available():
        sys.exit("gpu_loader_bench: no CUDA device (use --smoke to check the script on the simulated device)")
    rng = np.random.default_rng(0)
    out = {"torch": torch.__version__, "fastpipe": fastpipe.build_info(), "args": vars(args)}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as d, (_device.simulated() if args.smoke else contextlib.nullcontext()) as sim:
        device = "cpu" if args.smoke else "cuda"
        sync = (lambda: sim.synchronize(sim.consumer_stream())) if args.smoke else torch.cuda.synchronize
        paths = (os.path.join(d, "images.npy"), os.path.join(d, "labels.npy"))
        images = np.lib.format.open_memmap(paths[0], "w+", np.uint8, (args.images, args.size, args.size, 3))
        for s in range(0, args.images, 256):
            images[s:s + 256] = rng.integers(0, 256, size=images[s:s + 256].shape, dtype=np.uint8)
        images.flush()
        del images
        np.save(paths[1], rng.integers(0, 1000, size=args.images, dtype=np.int64))
        os.system(f"cat {paths[0]} > /dev/null")  # page cache: both sides read from memory
        ds = fastpipe.NpyDataset({"image": paths[0], "label": paths[1]})
        loader_device = "cuda"  # the simulation stands in for it under --smoke
        out["h2d_bytes_per_s"] = h2d(args, ds, loader_device, sync, min(64, args.batch))
        out["train"] = {}
        for which in ("DataLoader", "fastpipe"):
            out["train"][which] = train(args, paths, device, loader_device, sync, which)
    h = out["h2d_bytes_per_s"]
    bound = h.get(FAIR_BOUND)
    print(f"H2D, uint8 {args.size}x{args.size}x3 batches of {min(64, args.batch)}" + (" (smoke: simulated)" if args.smoke else ""))
    for name, bps in h.items():
        print(f"  {name:44s} {bps / 1e9:7.2f} GB/s" + (f"  {bps / bound:5.2f}x bound" if bound else ""))
    print(f"training step, small conv net, batch {args.batch}, crop {args.crop}, bf16 autocast, channels_last")
    print(f"  {'loader':12s} {'images/s':>9s} {'step ms':>8s} {'data wait':>9s} {'CPU ms/batch':>12s}")
    for which, r in out["train"].items():
        print(f"  {which:12s} {r['images_per_s']:9.0f} {r['step_ms']:8.2f} {100 * r['wait_fraction']:8.1f}% "
              f"{r['cpu_ms_per_batch']:12.2f}")
    tr = out["train"]
    out["ratios"] = {"fastpipe_over_dataloader_images_per_s": tr["fastpipe"]["images_per_s"] / tr["DataLoader"]["images_per_s"]}
    if bound:
        out["ratios"]["loader_h2d_over_fair_bound"] = h["fastpipe.Loader(device='cuda')"] / bound
    print("  ratios:", {k: round(v, 3) for k, v in out["ratios"].items()})
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
