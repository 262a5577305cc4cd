"""Host-side cost of one ``next()`` on a batch that is already read: what the training thread pays per
batch, on the CPU path and on the device path (the simulated device on a machine without a GPU, the
real one where there is one).

Small records and batches, the data in the page cache, a deep prefetch: only calls that found their
batch ready are timed (the reader's ``waits`` counter says which waited). Prints the median and the
10th/90th percentiles in microseconds, with DataLoader's per-batch cost on the same data for scale.
With --sleep each call follows a sleep, as in a loop whose step leaves the core (a GPU step's host side):
what that loop pays is next() on cold caches, and the batch's release (timed too).

    python benchmarks/next_cost_bench.py [--batches 5000] [--device cpu,sim,cuda] [--sleep 0]
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


def timed_calls(loader, batches, sync=None, sleep=None):
    """Per-call times (us) of next() and of the batch's release (its last reference dropped), for the calls
    whose batch was ready. sleep: seconds slept before each call, as a training step that leaves its core
    (a GPU step's host side): the call then runs on cold caches, as it does in such a loop."""
    times, releases = [], []
    it = iter(loader)
    while len(times) < batches:
        waits = loader.stats()["waits"]
        if sleep is not None:
            time.sleep(sleep)
        t0 = time.perf_counter_ns()
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        t1 = time.perf_counter_ns()
        if sync:
            sync()
        t2 = time.perf_counter_ns()
        del b
        t3 = time.perf_counter_ns()
        if loader.stats()["waits"] == waits:
            times.append((t1 - t0) / 1e3)
            releases.append((t3 - t2) / 1e3)
    return times, releases


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


def summary(times, releases=None):
    q = statistics.quantiles(times, n=10)
    row = {"median_us": statistics.median(times), "p10_us": q[0], "p90_us": q[-1], "calls": len(times)}
    if releases:
        row["release_median_us"] = statistics.median(releases)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=5000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cpu,sim" + (",cuda" if fastpipe.build_info()["cuda_available"] else ""))
    p.add_argument("--sleep", type=float, default=None, metavar="SECONDS",
                   help="sleep before each call (0: time.sleep's shortest, ~80 us on a VM): next() on cold caches")
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
                    rows["fastpipe next(), device path (simulated device)"] = summary(*timed_calls(ld, args.batches, sleep=args.sleep))
                    ld.close()
                    sim.drain()
            elif dev == "cuda":
                ld = fastpipe.Loader(ds, device="cuda", **kw)
                rows["fastpipe next(), device path (CUDA)"] = summary(*timed_calls(ld, args.batches, sleep=args.sleep))
                ld.close()
            else:
                ld = fastpipe.Loader(ds, **kw)
                rows["fastpipe next(), CPU path"] = summary(*timed_calls(ld, args.batches, sleep=args.sleep))
                ld.close()
        rows["DataLoader next(), workers=0 (for scale)"] = summary(
            dataloader_calls((torch.from_numpy(x), torch.from_numpy(y)), args.batch_size, args.batches // 5))
    after = "" if args.sleep is None else f", each after time.sleep({args.sleep:g})"
    print(f"host-side cost of next() on a ready batch (batch {args.batch_size} x (64 B + int64), "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores{after})")
    print(f"{'call':52s} {'median us':>10s} {'p10':>8s} {'p90':>8s} {'calls':>7s} {'release us':>11s}")
    for name, r in rows.items():
        release = f"{r['release_median_us']:11.2f}" if "release_median_us" in r else f"{'-':>11s}"
        print(f"{name:52s} {r['median_us']:10.2f} {r['p10_us']:8.2f} {r['p90_us']:8.2f} {r['calls']:7d} {release}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "batch_size": args.batch_size, "cores": os.cpu_count(), "sleep": args.sleep},
                      f, indent=1)


if __name__ == "__main__":
    main()
