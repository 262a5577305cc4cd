"""An image folder's scan at ImageNet's scale: torchvision's listing against fastpipe.ImageFolder's first
scan (the listing and every file's header), the reuse of its index, a rescan after one folder changed
(only the changed files' headers read again) and the scan of torchvision's own sample list (what
fastpipe.Loader does with a torchvision ImageFolder).

    python benchmarks/scan_bench.py [--files 1281167] [--classes 1000] [--dir /tmp/fastpipe-scan-tree]

The tree is ImageNet-shaped (1,000 class folders) of small real JPEGs (an EXIF segment, 64x48 pixels,
~2.5 KB: the scan reads each file's first 4 KiB, so larger files cost no more here), written once and
reused. Before each first scan every file's pages are dropped from the page cache (posix_fadvise
DONTNEED); the directory and inode caches stay warm (dropping those takes root's drop_caches, which a
VM's container refuses): a truly cold disk adds the metadata reads. Medians of --reps.
"""

import argparse
import io
import json
import os
import pathlib
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import fastpipe  # noqa: E402
from fastpipe.bench.image_measure import evict  # noqa: E402


def small_jpeg():
    from PIL import Image

    import numpy as np

    exif = Image.Exif()
    exif[0x010F] = "fastpipe scan bench " * 20  # a maker string: headers with segments before the frame
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(
        out, format="JPEG", quality=90, exif=exif.tobytes())
    return out.getvalue()


def ensure_tree(root, files, classes):
    marker = os.path.join(root, ".complete")
    if os.path.exists(marker) and open(marker).read() == f"{files} {classes}":
        return
    shutil.rmtree(root, ignore_errors=True)
    data = small_jpeg()
    t0 = time.perf_counter()
    for c in range(classes):
        d = os.path.join(root, f"n{c:08d}")
        os.makedirs(d)
        for i in range(c, files, classes):
            with open(os.path.join(d, f"n{c:08d}_{i}.JPEG"), "wb") as f:
                f.write(data)
    os.sync()
    with open(marker, "w") as f:
        f.write(f"{files} {classes}")
    print(f"wrote {files} files in {time.perf_counter() - t0:.0f} s", flush=True)


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1281167)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "fastpipe-scan-tree"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args()
    import torchvision

    ensure_tree(args.dir, args.files, args.classes)
    files = [os.path.join(dp, f) for dp, _, fs in os.walk(args.dir) for f in fs if f.endswith(".JPEG")]
    rows = {k: [] for k in ("torchvision_listing", "fastpipe_first_scan", "fastpipe_index_reused",
                            "fastpipe_rescan_one_folder_changed", "fastpipe_first_scan_of_torchvision_samples")}
    for rep in range(args.reps):
        cache = tempfile.mkdtemp(prefix="fastpipe-scan-cache-")
        try:
            evict(files)
            s, tv = timed(lambda: torchvision.datasets.ImageFolder(args.dir))
            rows["torchvision_listing"].append(s)
            evict(files)
            s, ds = timed(lambda: fastpipe.ImageFolder(args.dir, cache_dir=cache))
            assert len(ds) == args.files and not ds.bad and ds.rescanned
            rows["fastpipe_first_scan"].append(s)
            s, ds = timed(lambda: fastpipe.ImageFolder(args.dir, cache_dir=cache))
            assert not ds.rescanned
            rows["fastpipe_index_reused"].append(s)
            extra = os.path.join(args.dir, "n00000000", f"extra_{rep}.JPEG")
            shutil.copy(files[0], extra)
            try:
                s, ds = timed(lambda: fastpipe.ImageFolder(args.dir, cache_dir=cache))
                assert ds.rescanned and len(ds) == args.files + 1
                rows["fastpipe_rescan_one_folder_changed"].append(s)
            finally:
                os.remove(extra)
            evict(files)
            other = os.path.join(cache, "other")
            s, ds = timed(lambda: fastpipe.ImageFolder(args.dir, samples=tv.samples, classes=tv.classes,
                                                       cache_dir=other))
            assert len(ds) == args.files
            rows["fastpipe_first_scan_of_torchvision_samples"].append(s)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        print(f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items()), flush=True)
    summary = {k: {"median_s": statistics.median(v), "files_per_s": args.files / statistics.median(v),
                   "runs_s": v} for k, v in rows.items()}
    doc = {"machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "fastpipe": fastpipe.__version__, "torchvision": torchvision.__version__},
           "files": args.files, "classes": args.classes, "file_bytes": os.path.getsize(files[0]),
           "reps": args.reps, "results": summary}
    base = summary["torchvision_listing"]["median_s"]
    for k, v in summary.items():
        print(f"{k:45s} {v['median_s']:7.2f} s  {v['files_per_s']:10.0f} files/s  {v['median_s'] / base:5.2f}x "
              f"torchvision's listing")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
