"""What a sleeping training step pays after it wakes, beside a loader's reader threads (issue 21).

The loop of the loader suite's sleeping step: time.sleep(step), then a fixed piece of Python work that
touches no batch (60 dict inserts), then next() and the release of the batch. It times the work,
next()+release and the whole step, medians of 150 steps, for no loader, and 1 reader thread and 2 either
kept off the training thread's core (the default while they keep up: csrc/core/reader_placement.h) or
on every core, at three step lengths; one line per step length. The work shows whether the training
thread itself runs slower after the readers ran, whatever it does; no loader is its reference.

    python benchmarks/after_sleep_probe.py [--data-dir benchmarks/data] [--reps 2]

It reads the loader suite's CIFAR-like files (run `python benchmarks/loader_bench.py --only cifar` once).
"""

import argparse
import os
import time

import numpy as np

import fastpipe


def work():
    x = {}
    for i in range(60):
        x[i] = str(i)
    return len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.path.join(os.path.dirname(__file__), "data"))
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    d = args.data_dir
    ds = fastpipe.NpyDataset([f"{d}/cifar_images.npy", f"{d}/cifar_labels.npy"])
    loaders = {}
    for t in (1, 2):
        for where, force in (("kept off", 1), ("every core", 0)):
            ld = fastpipe.Loader(ds, batch_size=512, shuffle=True, num_threads=t)
            ld._reader._force_spare_core(force)
            loaders[f"{t} reader{'s' * (t > 1)}, {where}"] = ld
    for step in (0.000378, 0.001, 0.003):
        res = {}
        for _ in range(args.reps):
            for name in ("no loader", *loaders):
                it = iter(loaders[name]) if name in loaders else None
                for _ in range(5 if it else 0):
                    next(it)
                w, nx, st = [], [], []
                t_prev = time.perf_counter()
                for _ in range(150):
                    time.sleep(step)
                    t0 = time.perf_counter()
                    work()
                    t1 = time.perf_counter()
                    if it is not None:
                        b = next(it, None)
                        del b
                    t2 = time.perf_counter()
                    w.append(t1 - t0)
                    nx.append(t2 - t1)
                    st.append(t2 - t_prev)
                    t_prev = t2
                del it
                res.setdefault(name, []).append((np.median(w), np.median(nx), np.median(st)))
        alone = np.median([r[2] for r in res["no loader"]])
        cells = [f"{name}: work {1e6 * np.median([r[0] for r in v]):.1f} us, next+release "
                 f"{1e6 * np.median([r[1] for r in v]):.1f} us, step +{100 * (np.median([r[2] for r in v]) / alone - 1):.1f}%"
                 for name, v in res.items()]
        print(f"step {1e3 * step:.3f} ms\n  " + "\n  ".join(cells), flush=True)
    for ld in loaders.values():
        ld.close()


if __name__ == "__main__":
    main()
