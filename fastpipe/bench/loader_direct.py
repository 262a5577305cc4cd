"""The loader suite's direct I/O part: fastpipe io="direct" against `dd iflag=direct` on the ImageNet-like
images file."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import warnings

import numpy as np

import fastpipe
from fastpipe.bench import common as bc
from fastpipe.bench.loader_timing import FASTPIPE_SEED, fastpipe_epoch, fastpipe_stats, nsamples, rotated

DD_BLOCK = 4 << 20
DIRECT_REPS = 5

_DD_RE = re.compile(r"(\d+) bytes .*copied, ([0-9.,e+-]+) s")


def run_dd(path: str, count: int | None):
    cmd = ["dd", f"if={path}", "of=/dev/null", f"bs={DD_BLOCK}", "iflag=direct"]
    if count is not None:
        cmd.append(f"count={count}")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    m = _DD_RE.search(p.stderr)
    if m:
        nbytes, secs = int(m.group(1)), float(m.group(2).replace(",", "."))
    else:
        nbytes, secs = os.path.getsize(path), wall
    return {"bytes": nbytes, "seconds": secs, "wall_seconds": wall, "GBps": nbytes / secs / 1e9,
            "cmd": " ".join(cmd)}


def run_direct(files, spec, args, out, budget=None):
    res = {"file": files["images"], "cmd": None}
    out.heading(f"direct I/O: {files['images']}")
    path = files["images"]
    if shutil.which("dd") is None:
        res["dd_error"] = "dd not found"
    reps = args.reps or (1 if args.quick else DIRECT_REPS)
    n = spec["n"]
    rec = int(np.prod(spec["shape"]))
    dd_runs, fp_runs = [], {"shuffle": [], "sequential": []}
    loaders = {}
    res["fastpipe"] = {}
    for mode, shuffle in (("shuffle", True), ("sequential", False)):
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ld = fastpipe.Loader(fastpipe.NpyDataset(path), batch_size=spec["batch"], shuffle=shuffle,
                                     seed=FASTPIPE_SEED, num_threads=args.threads, io="direct")
                for _ in ld:  # one warm-up epoch (also surfaces the O_DIRECT fallback warning)
                    pass
            modes = ld.io_modes
            res["fastpipe"][mode] = {"warnings": [str(w.message) for w in caught], "io_modes": modes}
            if list(modes) != ["direct"]:
                res["fastpipe"][mode]["invalid"] = f"io_modes {modes}: not direct reads (page cache)"
            elif any("direct" in str(w.message).lower() for w in caught):
                res["fastpipe"][mode]["invalid"] = "O_DIRECT fallback warning: " + str(caught[0].message)
            loaders[mode] = ld
        except Exception as e:
            res["fastpipe"][mode] = {"error": f"{type(e).__name__}: {e}"}
            out.log(f"  fastpipe io='direct' ({mode}) failed: {type(e).__name__}: {e}")
    if "dd_error" not in res:
        try:
            run_dd(path, None)  # warm-up (drive, dd binary)
        except Exception as e:
            res["dd_error"] = str(e)
            out.log(f"  dd failed: {e}")

    # Repetitions interleave dd and fastpipe (rotated order); ratios are medians of per-repetition ratios.
    def fp_pass(mode):
        ld = fastpipe_epoch(loaders[mode])
        t0 = time.perf_counter()
        k = 0
        for b in ld:
            k += nsamples(b)
            del b
        fp_runs[mode].append({"seconds": time.perf_counter() - t0, "samples": k})

    jobs = [lambda: dd_runs.append(run_dd(path, None))] if "dd_error" not in res else []
    jobs += [(lambda m=mode: fp_pass(m)) for mode in loaders]
    with out.progress(total=reps * len(jobs), desc="direct I/O", unit="pass") as bar:
        for r in (budget.repeat("direct", 3, reps) if budget is not None else range(reps)):
            for job in rotated(jobs, r):
                job()
                bar.update()
    dd_each = [d["GBps"] for d in dd_runs]
    dd_gbps = bc.median(dd_each) if dd_runs else float("nan")
    res["dd_runs"] = dd_runs
    res["dd_GBps"] = dd_gbps
    res["dd_GBps_best"] = max(dd_each) if dd_each else None
    res["dd_GBps_spread_pct"] = bc.spread_pct(dd_each)
    res["cmd"] = dd_runs[0]["cmd"] if dd_runs else None
    dd_label = "dd if=FILE of=/dev/null bs=4M iflag=direct (sequential)"
    table = [[dd_label, bc.fmt(dd_gbps, ".3f"), bc.fmt(res["dd_GBps_best"], ".3f"), "1.00x",
              bc.fmt(res["dd_GBps_spread_pct"], ".0f") + "%"]]
    plotted = {dd_label: dd_gbps}
    for mode, ld in loaders.items():
        runs = fp_runs[mode]
        gbps = [x["samples"] * rec / x["seconds"] / 1e9 for x in runs]
        g = bc.median(gbps)
        entry = res["fastpipe"][mode]
        over_reps = [a / b for a, b in zip(gbps, dd_each)]
        over = bc.median(over_reps) if dd_each else float("nan")
        entry.update(runs=runs, GBps=g, GBps_best=max(gbps), GBps_spread_pct=bc.spread_pct(gbps), over_dd=over,
                     over_dd_reps=over_reps,
                     over_dd_best=bc.ratio(max(gbps), res["dd_GBps_best"]))
        entry.update(fastpipe_stats(ld))
        label = f"fastpipe io='direct', shuffle={mode == 'shuffle'}"
        plotted[label] = g
        table.append([label + (" (INVALID: fell back)" if entry.get("invalid") else ""), bc.fmt(g, ".3f"),
                      bc.fmt(max(gbps), ".3f"), bc.fmt(over, ".2f") + "x",
                      bc.fmt(entry["GBps_spread_pct"], ".0f") + "%"])
        ld.close()
    out.table(["reader", "GB/s", "best", "vs dd", "spread"], table,
              title=f"Direct I/O on {os.path.basename(path)} ({n} x {rec} B records; GB/s of record bytes)")
    out.bars("direct", f"Direct I/O on {os.path.basename(path)} (median GB/s of record bytes)",
             {"GB/s": plotted}, "GB/s")
    return res
