"""JPEG training input on a CUDA loader: RandomResizedCrop(224) + flip + normalise to bf16 NHWC, batch 128,
on a corpus coded as ImageNet's JPEGs are (its sizes; 4:2:0 mostly, some 4:4:4, 4:2:2, grayscale and
progressive files: fastpipe.bench.image_corpus, kind "imagenet"). Rows, each in the same run:

- fastpipe, image_decode="host": every core but the loop's decodes in the reader threads, the batch copied;
- fastpipe, image_decode="device": nvJPEG on the GPU (its hardware JPEG engines where it has them), the
  readers handing over the bytes and decoding only what the device is not given;
- fastpipe device_ta: the same with torchvision's reference recipe on top (TrivialAugmentWide +
  RandomErasing(0.1)): what the augmentation kernel costs;
- torchvision: DataLoader workers (one per core) read the files' bytes, torchvision.io.decode_jpeg(list,
  device="cuda") decodes the batch with nvJPEG, then v2.RandomResizedCrop + RandomHorizontalFlip per image
  and Normalize on the GPU, stacked to bf16 NHWC: what a user writes with what the GPU machine has
  installed (DALI's GPU pipeline is not installed there).

    python benchmarks/gpu_jpeg_bench.py [--out results.json] [--images 3000] [--reps 3]
    python benchmarks/gpu_jpeg_bench.py --smoke     # tiny, on the simulated device (torchvision on the CPU)

Per row: images/s (median of the repetitions after a warm-up pass; each repetition >= 20 batches), p50 and
p99 of the time between batches, the CPU cores the process kept busy, the device memory it held, and
for fastpipe the records decoded on the device (into planes: the host's colours) and on the host, and
the reader threads' busy cores. Also nvJPEG's backend and layout.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import fastpipe  # noqa: E402
from fastpipe.bench import image_corpus  # noqa: E402
from fastpipe.bench.common import progress_bar  # noqa: E402
from fastpipe.data import _device  # noqa: E402
from fastpipe.transforms import RandomErasing, RandomResizedCrop, TrivialAugmentWide  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MIN_BATCHES = 20  # per repetition: fewer make the median of a few hundred milliseconds noisy


class _Quiet:
    """What ensure_corpus uses of the harness's Report: its log lines, no progress bars."""

    show_progress = False

    def log(self, *a):
        print(*a, file=sys.stderr)

    def progress(self, iterable=None, **kw):
        return progress_bar(iterable, enabled=False, **kw)


def device_memory_used(device):
    if device != "cuda" or not torch.cuda.is_available():
        return 0
    free, total = torch.cuda.mem_get_info()
    return total - free


def timed_passes(batches, reps, sync, touch, device):
    """Runs reps + 1 passes of batches() (the first a warm-up), touching each batch on the device."""
    base = device_memory_used(device)
    rates, gaps, cores, held = [], [], [], 0
    for r in range(reps + 1):
        n, last = 0, None
        cpu0, t0 = time.process_time(), time.perf_counter()
        for x, y in batches():
            touch(x)
            n += len(y)
            now = time.perf_counter()
            if r and last is not None:
                gaps.append(now - last)
            last = now
        sync()
        wall = time.perf_counter() - t0
        held = max(held, device_memory_used(device) - base)
        if r:
            rates.append(n / wall)
            cores.append((time.process_time() - cpu0) / wall)
    gaps.sort()
    return {"images_per_s": statistics.median(rates), "reps": rates,
            "batch_gap_ms_p50": 1e3 * gaps[len(gaps) // 2] if gaps else float("nan"),
            "batch_gap_ms_p99": 1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] if gaps else float("nan"),
            "cpu_cores": statistics.median(cores), "device_memory_mb": held / 1e6}


def run_fastpipe(ds, mode, batch, reps, device, sync, recipe=False):
    extra = dict(augment=TrivialAugmentWide(), erase=RandomErasing(0.1)) if recipe else {}
    t = RandomResizedCrop(224, out_dtype=torch.bfloat16, layout="NHWC", mean=MEAN, std=STD, **extra)
    ld = fastpipe.Loader(ds, batch_size=batch, shuffle=True, drop_last=True, device=device, transforms={0: t},
                         image_decode=mode)
    r = timed_passes(lambda: ld, reps, sync, lambda x: x.float().sum(), device)
    s = ld.stats()
    ld.close()
    r.update({"decoded_on_device": s.get("images_decoded_on_device", 0),
              "decoded_on_host": s.get("images_decoded_on_host", 0),
              "decoded_planar": s.get("images_decoded_planar", 0),
              "num_threads": s["num_threads"], "reader_cores": s.get("reader_cores")})
    return r


class _FileBytes(torch.utils.data.Dataset):
    """The files' bytes (as torchvision.io.read_file gives them) and labels."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        import torchvision

        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def _as_list(items):
    return [x for x, _ in items], torch.tensor([y for _, y in items])


def run_torchvision(samples, batch, workers, reps, device, sync):
    import torchvision
    from torchvision.io import ImageReadMode
    from torchvision.transforms import v2

    dl = torch.utils.data.DataLoader(_FileBytes(samples), batch_size=batch, shuffle=True, drop_last=True,
                                     num_workers=workers, collate_fn=_as_list, persistent_workers=workers > 0,
                                     prefetch_factor=4 if workers else None)
    crop = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN, device=device).view(3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(3, 1, 1) * 255

    def batches():
        for data, labels in dl:
            images = torchvision.io.decode_jpeg(data, mode=ImageReadMode.RGB, device=device)
            x = torch.stack([crop(im) for im in images]).float().sub_(mean).div_(std)
            yield x.to(torch.bfloat16).permute(0, 2, 3, 1), labels

    return timed_passes(batches, reps, sync, lambda x: x.float().sum(), device)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rows", default="host,device,device_ta,torchvision",
                    help="a subset of host,device,device_ta (the device with the TrivialAugmentWide + "
                         "RandomErasing(0.1) recipe: the augmentation kernel's cost),torchvision")
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "fastpipe-jpeg-bench"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if args.smoke:
        args.images, args.batch, args.reps = 48, 8, 1
    elif args.images < MIN_BATCHES * args.batch:
        raise SystemExit(f"--images {args.images}: a repetition needs at least {MIN_BATCHES} batches of {args.batch}")
    c = image_corpus.corpus_paths(args.data_dir, args.images, 0, image_corpus.GRAIN_SIGMA, "imagenet")
    facts = image_corpus.ensure_corpus(c, args.images, 0, image_corpus.GRAIN_SIGMA, cores, _Quiet(), "imagenet")
    ds = fastpipe.ImageFolder(c.tree, cache_dir=c.index)
    result = {"images": len(ds), "batch": args.batch, "cores": cores, "jpeg_variants": facts.get("jpeg_variants"),
              "torch": torch.__version__}
    if args.smoke:
        with _device.simulated() as sim:
            for mode in ("host", "device"):
                if mode in rows:
                    result[mode] = run_fastpipe(ds, mode, args.batch, args.reps, "cuda", sim.drain)
            if "device_ta" in rows:
                result["device_ta"] = run_fastpipe(ds, "device", args.batch, args.reps, "cuda", sim.drain, recipe=True)
        if "torchvision" in rows:
            result["torchvision"] = run_torchvision(ds.samples, args.batch, 0, args.reps, "cpu", lambda: None)
    else:
        result["gpu"] = torch.cuda.get_device_name()
        ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
        result["nvjpeg"] = why if ok else f"unavailable: {why}"
        for mode in ("host", "device"):
            if mode in rows and (ok or mode == "host"):
                result[mode] = run_fastpipe(ds, mode, args.batch, args.reps, "cuda", torch.cuda.synchronize)
        if "device_ta" in rows and ok:
            result["device_ta"] = run_fastpipe(ds, "device", args.batch, args.reps, "cuda", torch.cuda.synchronize,
                                               recipe=True)
        if "torchvision" in rows:
            try:
                result["torchvision"] = run_torchvision(ds.samples, args.batch, cores, args.reps, "cuda",
                                                        torch.cuda.synchronize)
            except Exception as e:  # e.g. a file nvJPEG refuses: the row says why
                result["torchvision"] = {"failed": f"{type(e).__name__}: {e}"}
    print(f"JPEG input on a CUDA loader ({result['images']} images {result['jpeg_variants']}, batch {args.batch}, "
          f"{cores} cores; nvJPEG: {result.get('nvjpeg', 'simulated')})")
    for row in ("host", "device", "device_ta", "torchvision"):
        r = result.get(row)
        if r is None:
            continue
        if "failed" in r:
            print(f"  {row:11s} failed: {r['failed']}")
            continue
        extra = (f"  device {r['decoded_on_device']} (planar {r['decoded_planar']}), host {r['decoded_on_host']}, "
                 f"{r['num_threads']} readers" if "decoded_on_device" in r else "")
        print(f"  {row:11s} {r['images_per_s']:9.0f} img/s  gap p50 {r['batch_gap_ms_p50']:6.1f} ms "
              f"p99 {r['batch_gap_ms_p99']:6.1f} ms  CPU {r['cpu_cores']:5.1f} cores  "
              f"device memory {r['device_memory_mb']:7.0f} MB{extra}")
    for a, b in (("device", "host"), ("device", "torchvision"), ("host", "torchvision")):
        if "images_per_s" in result.get(a, {}) and "images_per_s" in result.get(b, {}):
            print(f"  {a} / {b}: {result[a]['images_per_s'] / result[b]['images_per_s']:.2f}x")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
