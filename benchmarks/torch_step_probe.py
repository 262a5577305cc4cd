"""Where a torch training step's time goes beside each loader (issue 41: the loader suite's torch step rows).

The suite's torch step (fastpipe.bench.loader_timing.touch_with_torch, then a spin of 2x one batch's
gather) is timed in three parts per batch: next(), the step's torch ops over the batch, and the spin; medians
over 300 batches, for fastpipe num_threads=0 (each batch gathered in next() on torch's intra-op threads),
fastpipe's default and torch.index_select on the mapped tensor, in rotated rounds. With --after-sleep the
default runs a sleeping pass before each torch pass, as in the suite (its readers read the first batches
of the torch pass until its policy sees the cores busy), and the share of the two passes' batches read in
next() is printed (the sleeping pass's none).

    python benchmarks/torch_step_probe.py [--data-dir benchmarks/data] [--rounds 4] [--after-sleep]

It reads the loader suite's CIFAR-like files (run `python benchmarks/loader_bench.py --only cifar` once).
"""

import argparse
import os
import statistics
import time
import warnings

import numpy as np
import torch

import fastpipe
from fastpipe.bench.loader_timing import spin, touch_with_torch

BATCH = 512


def parts(make_iter, step, n=300, warmup=5):
    """Median us of next(), of the torch ops and of the spin, per batch; and the mean whole step."""
    it = iter(make_iter())
    for _ in range(warmup):
        next(it)
    times = []
    for _ in range(n):
        a = time.perf_counter()
        b = next(it)
        c = time.perf_counter()
        touch_with_torch(b)
        d = time.perf_counter()
        spin(step)
        times.append((c - a, d - c, time.perf_counter() - d))
    del b, it
    cols = list(zip(*times))
    return [1e6 * statistics.median(x) for x in cols], 1e6 * sum(map(sum, times)) / n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data-dir", default=os.path.join(os.path.dirname(__file__), "data"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--step", type=float, default=0.000548, help="the spin, seconds (the suite's: 2x a gather)")
    p.add_argument("--after-sleep", action="store_true")
    a = p.parse_args()
    files = [os.path.join(a.data_dir, f"cifar_{k}.npy") for k in ("images", "labels")]
    img, lab = (np.load(f, mmap_mode="r") for f in files)
    with warnings.catch_warnings():  # read-only memory map: only read
        warnings.simplefilter("ignore", UserWarning)
        timg, tlab = torch.from_numpy(img), torch.from_numpy(lab)
    order = np.random.default_rng(0).permutation(len(img))
    batches = [torch.from_numpy(order[i:i + BATCH]) for i in range(0, len(order), BATCH)]

    def index_select():
        return ((timg.index_select(0, t), tlab.index_select(0, t)) for t in batches)

    def loader(threads):
        return fastpipe.Loader(fastpipe.NpyDataset(files), batch_size=BATCH, shuffle=True, seed=0, num_threads=threads)

    rows = {"fastpipe num_threads=0": loader(0), "fastpipe default": loader(None), "index_select": index_select}
    print(f"torch step parts, us per batch (medians of 300; {torch.get_num_threads()} intra-op threads)")
    for r in range(a.rounds):
        names = list(rows)[r % len(rows):] + list(rows)[:r % len(rows)]
        for name in names:
            src = rows[name]
            if a.after_sleep and name == "fastpipe default":
                s0 = src.stats()
                for _ in src:
                    time.sleep(a.step)
                (nx, tt, sp), whole = parts(lambda: src, a.step, n=len(src) - 6)
                s1 = src.stats()
                share = (s1["next_batches"] - s0["next_batches"]) / max(1, s1["batches"] - s0["batches"])
                extra = f"  (after a sleeping pass: {100 * share:.0f}% of the two passes' batches read in next())"
            else:
                (nx, tt, sp), whole = parts(src if callable(src) and not hasattr(src, "stats") else (lambda: src),
                                            a.step)
                extra = ""
            print(f"round {r}  {name:24s} next {nx:6.1f}  torch ops {tt:6.1f}  spin {sp:6.1f}  mean step {whole:7.1f}{extra}")


if __name__ == "__main__":
    main()
