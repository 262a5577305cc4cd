"""JPEG decoding on a CUDA loader: in the reader threads (image_decode="host", the default) against nvJPEG
on the GPU (image_decode="device", off by default until this and the GPU tests have run on a GPU), on
the images suite's generated corpus (photo-like JPEGs, 5% large), RandomResizedCrop(224) + flip +
normalise to bf16 NHWC on the device, batch 128, the machine's cores as reader threads.

    python benchmarks/gpu_jpeg_bench.py [--out results.json] [--images 1000]
    python benchmarks/gpu_jpeg_bench.py --smoke     # tiny, on the simulated device: the script runs

Reports images/s per mode (median of the timed epochs), the records each decoded on the device and on the
host, and nvJPEG's backend (hardware: the GPU's JPEG engines).
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
from fastpipe.transforms import RandomResizedCrop  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class _Quiet:
    """What ensure_corpus uses of the harness's Report: its log lines, no progress bars."""

    show_progress = False

    def log(self, *a):
        print(*a, file=sys.stderr)

    def progress(self, iterable=None, **kw):
        return progress_bar(iterable, enabled=False, **kw)


def run_mode(ds, mode, batch, threads, epochs, device, sync):
    t = RandomResizedCrop(224, out_dtype=torch.bfloat16, layout="NHWC", mean=MEAN, std=STD)
    ld = fastpipe.Loader(ds, batch_size=batch, shuffle=True, drop_last=True, num_threads=threads, device=device,
                         transforms={0: t}, image_decode=mode)
    rates = []
    for e in range(epochs + 1):  # the first epoch is the warm-up
        t0, n = time.perf_counter(), 0
        for x, y in ld:
            x.float().sum()  # touch the batch on the device
            n += len(y)
        sync()
        if e:
            rates.append(n / (time.perf_counter() - t0))
    s = ld.stats()
    ld.close()
    return {"images_per_s": statistics.median(rates), "reps": rates,
            "decoded_on_device": s.get("images_decoded_on_device", 0),
            "decoded_on_host": s.get("images_decoded_on_host", 0),
            "decoded_planar": s.get("images_decoded_planar", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--data-dir", default=os.path.join(tempfile.gettempdir(), "fastpipe-jpeg-bench"))
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    threads = len(os.sched_getaffinity(0))
    if args.smoke:
        args.images, args.batch, args.epochs = 40, 8, 1
    c = image_corpus.corpus_paths(args.data_dir, args.images, 0, image_corpus.GRAIN_SIGMA)
    image_corpus.ensure_corpus(c, args.images, 0, image_corpus.GRAIN_SIGMA, threads, _Quiet())
    ds = fastpipe.ImageFolder(c.tree, cache_dir=c.index)
    result = {"images": len(ds), "batch": args.batch, "threads": threads}
    if args.smoke:
        with _device.simulated() as sim:
            for mode in ("host", "device"):
                result[mode] = run_mode(ds, mode, args.batch, threads, args.epochs, "cuda", sim.drain)
    else:
        result["gpu"] = torch.cuda.get_device_name()
        ok, why = fastpipe._ext._C.nvjpeg_status(torch.cuda.current_device(), _device.nvjpeg_library())
        result["nvjpeg"] = why if ok else f"unavailable: {why}"
        for mode in ("host", "device") if ok else ("host",):
            result[mode] = run_mode(ds, mode, args.batch, threads, args.epochs, "cuda", torch.cuda.synchronize)
    print(f"JPEG decode on a CUDA loader ({result['images']} images, batch {args.batch}, {threads} threads; "
          f"nvJPEG: {result.get('nvjpeg', 'simulated')})")
    for mode in ("host", "device"):
        if mode in result:
            r = result[mode]
            print(f"  image_decode={mode:6s} {r['images_per_s']:9.0f} img/s  (decoded on device {r['decoded_on_device']}, "
                  f"on host {r['decoded_on_host']})")
    if "device" in result and "host" in result:
        print(f"  device / host: {result['device']['images_per_s'] / result['host']['images_per_s']:.2f}x")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
