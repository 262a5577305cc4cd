"""Issue 41: how many reader threads the default takes where next() reads chunks while it waits, measured
rather than ruled. One build, one process: fastpipe's default against ``num_workers=k`` (k reader threads,
where the batches are read still chosen automatically, as with the default; ``--threads``: num_threads=k,
whose readers always read) on the loader suite's data (``python -m fastpipe.bench loader`` writes it under
benchmarks/data), phase by phase as the suite runs them, in rounds of every configuration in a rotated
order:

- alone: samples/s over one epoch (the tokens: 3000 batches);
- sleeping step: time.sleep for twice a batch's single-thread gather time (the tokens: sleep(0), its floor; the suite's steps),
  the time added over the same steps alone;
- torch step: the batch's every byte summed with torch ops on the intra-op threads, then a spin of twice a
  gather (the suite's torch step), the time added over the same steps alone.

usage: python benchmarks/reader_count_probe.py [--rounds 5] [--workers 1,2] [--threads 1] [--only cifar,imagenet,tokens]
"""

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

import fastpipe
from fastpipe.bench import loader as suite
from fastpipe.bench.baselines import image_baselines, token_baselines
from fastpipe.bench.loader_timing import (WARMUP_BATCHES, block_steps, calibrate_sleep, stepped_pass, timed_pass,
                                          touch_with_torch)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def gather_seconds(spec, files, order):
    """One batch's single-thread gather, the suite's bound (the median over an epoch), as the suite sets
    its step from it."""
    if spec["kind"] == "images":
        gather = image_baselines(files["images"], files["labels"], spec["batch"], order)[1]
    else:
        gather = token_baselines(files["tokens"], spec["block"], spec["batch"], order)[1]
    per_batch = []
    it = gather()
    while len(per_batch) < 400:
        t0 = time.perf_counter()
        if next(it, None) is None:
            break
        per_batch.append(time.perf_counter() - t0)
    return statistics.median(per_batch)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", default="1,2", help="num_workers values to set against the default")
    ap.add_argument("--threads", default="", help="num_threads values too (their reader threads always read)")
    ap.add_argument("--only", default="cifar,imagenet,tokens")
    ap.add_argument("--step", type=float, default=2.0,
                    help="the sleeping step in batch gathers (the suite's 2; under 1: a fast GPU step's host side)")
    args = ap.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; fastpipe {fastpipe.__version__}, "
          f"python {sys.version.split()[0]}")
    for name in args.only.split(","):
        spec = suite.DATASETS[name]
        files = suite.data_files(DATA, name)
        configs = {"default": {}}
        configs.update({f"num_workers={w}": {"num_workers": int(w)} for w in args.workers.split(",") if w})
        configs.update({f"num_threads={t}": {"num_threads": int(t)} for t in args.threads.split(",") if t})
        loaders = {k: suite.make_fastpipe_loader(spec, files, kw.pop("num_threads", None), **kw)
                   for k, kw in configs.items()}
        cap = 3000 if spec["kind"] == "tokens" else None
        step = args.step * gather_seconds(spec, files, np.array(list(loaders["default"].sampler)))
        sleep_arg, sleep_actual = calibrate_sleep(step if spec["kind"] == "images" else 0.0)
        threads = {k: ld.stats()["num_threads"] for k, ld in loaders.items()}
        print(f"\n## {name}: batch {spec['batch']}, step {step * 1e3:.3f} ms; reader threads {threads}")
        rows = {k: {"alone": [], "sleep": [], "torch": []} for k in loaders}
        for ld in loaders.values():  # warm-up: page cache, code paths
            timed_pass(lambda ld=ld: ld, 20, warmup=2)
        batch = next(iter(loaders["default"]))
        batch = tuple(t.clone() for t in batch)
        n = min(400, len(loaders["default"]) - WARMUP_BATCHES - 1)
        # Phase by phase, as the suite runs them: the default's choice of where to read lasts 64 to 512
        # batches, so a pass right after a torch step would start in its torch-step mode.
        for phase in ("alone", "sleep", "torch"):
            for r in range(args.rounds):
                for k in list(loaders)[r % len(loaders):] + list(loaders)[:r % len(loaders)]:
                    ld = loaders[k]
                    if phase == "alone":
                        dt, samples, _, _ = timed_pass(lambda: ld, cap)
                        rows[k]["alone"].append(samples / dt)
                    elif phase == "sleep":
                        p = stepped_pass(lambda: ld, n, batch, sleep_arg, block_steps(sleep_actual))
                        rows[k]["sleep"].append(p.added_pct() / 100)
                    else:
                        p = stepped_pass(lambda: ld, n, batch, step, block_steps(step), busy=True,
                                         consume=touch_with_torch)
                        rows[k]["torch"].append(p.added_pct() / 100)
        print("| configuration | alone samples/s (median, range) | x default | sleeping step added | torch step added |")
        print("|---|---:|---:|---:|---:|")
        base = rows["default"]["alone"]
        for k, v in rows.items():
            ratio = statistics.median(a / b for a, b in zip(v["alone"], base))
            print(f"| {k} ({threads[k]} threads) | {statistics.median(v['alone']):,.0f} "
                  f"({min(v['alone']):,.0f}-{max(v['alone']):,.0f}) | {ratio:.2f}x | "
                  f"{100 * statistics.median(v['sleep']):.1f}% ({100 * min(v['sleep']):.1f}-{100 * max(v['sleep']):.1f}) | "
                  f"{100 * statistics.median(v['torch']):.1f}% ({100 * min(v['torch']):.1f}-{100 * max(v['torch']):.1f}) |")
        for ld in loaders.values():
            ld.close()


if __name__ == "__main__":
    main()
