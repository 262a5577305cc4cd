"""Host-side cost of one ``next()`` on a batch that is already read: what the training thread pays per
batch, on the CPU path and on the device path (the simulated device on a machine without a GPU, the
real one where there is one).

Small records and batches, the data in the page cache, a deep prefetch: only calls that found their
batch ready are timed (the reader's ``waits`` counter says which waited). Prints the median and the
10th/90th percentiles in microseconds, with DataLoader's per-batch cost on the same data for scale.

    python benchmarks/next_cost_bench.py [--batches 5000] [--device cpu,sim,cuda]
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import fastpipe  # noqa: E402
from fastpipe.data import _device  # noqa: E402


def timed_calls(loader, batches, sync=None):
    """Per-call times (us) of next() for the calls whose batch was ready."""
    times = []
    it = iter(loader)
    while len(times) < batches:
        waits = loader.stats()["waits"]
        t0 = time.perf_counter_ns()
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        t1 = time.perf_counter_ns()
        if sync:
            sync()
        del b
        if loader.stats()["waits"] == waits:
            times.append((t1 - t0) / 1e3)
    return times


def dataloader_calls(ds, batch, batches):
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*ds), batch_size=batch, shuffle=True)
    times = []
    while len(times) < batches:
        it = iter(dl)
        while len(times) < batches:
            t0 = time.perf_counter_ns()
            try:
                b = next(it)
            except StopIteration:
                break
            times.append((time.perf_counter_ns() - t0) / 1e3)
            del b
    return times


def summary(times):
    q = statistics.quantiles(times, n=10)
    return {"median_us": statistics.median(times), "p10_us": q[0], "p90_us": q[-1], "calls": len(times)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=5000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu,sim" + (",cuda" if fastpipe.build_info()["cuda_available"] else ""))
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        x = rng.integers(0, 256, size=(50_000, 64), dtype=np.uint8)
        y = np.arange(50_000, dtype=np.int64)
        np.save(os.path.join(d, "x.npy"), x)
        np.save(os.path.join(d, "y.npy"), y)
        ds = fastpipe.NpyDataset([os.path.join(d, "x.npy"), os.path.join(d, "y.npy")])
        rows = {}
        for dev in args.device.split(","):
            kw = dict(batch_size=args.batch_size, shuffle=True, prefetch=16, timeout=60)
            if dev == "sim":
                with _device.simulated() as sim:
                    ld = fastpipe.Loader(ds, device="cuda", **kw)
                    rows["fastpipe next(), device path (simulated device)"] = summary(timed_calls(ld, args.batches))
                    ld.close()
                    sim.drain()
            elif dev == "cuda":
                ld = fastpipe.Loader(ds, device="cuda", **kw)
                rows["fastpipe next(), device path (CUDA)"] = summary(timed_calls(ld, args.batches))
                ld.close()
            else:
                ld = fastpipe.Loader(ds, **kw)
                rows["fastpipe next(), CPU path"] = summary(timed_calls(ld, args.batches))
                ld.close()
        rows["DataLoader next(), workers=0 (for scale)"] = summary(
            dataloader_calls((torch.from_numpy(x), torch.from_numpy(y)), args.batch_size, args.batches // 5))
    print(f"host-side cost of next() on a ready batch (batch {args.batch_size} x (64 B + int64), "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores)")
    print(f"{'call':52s} {'median us':>10s} {'p10':>8s} {'p90':>8s} {'calls':>7s}")
    for name, r in rows.items():
        print(f"{name:52s} {r['median_us']:10.2f} {r['p10_us']:8.2f} {r['p90_us']:8.2f} {r['calls']:7d}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "batch_size": args.batch_size, "cores": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
