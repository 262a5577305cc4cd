"""Helpers shared by fastpipe's benchmark scripts: machine facts, robust statistics, tables, JSON.

Nothing here is specific to the loader; a later benchmark (e.g. the fused convolutions) can import it:

    sys.path.insert(0, os.path.dirname(__file__))
    import _bench_common as bc
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
from typing import Any, Iterable, Sequence

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")


def spread_pct(xs: Iterable[float]) -> float:
    """(max - min) / median of the repetitions, in percent: how noisy a measurement was."""
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if len(xs) < 2:
        return float("nan")
    m = statistics.median(xs)
    return 100.0 * (max(xs) - min(xs)) / m if m else float("nan")


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return float("nan")
    return a / b


# --------------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------------
def fmt(x: Any, spec: str = ".3g") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return format(x, spec)
    return str(x)


def fmt_rate(x: float | None) -> str:
    """Samples/s with a thousands separator and no false precision."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A plain-text table. `align` has one char per column: 'l' or 'r' (default: first l, rest r)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    n = len(headers)
    align = align or ("l" + "r" * (n - 1))
    widths = [max(len(r[i]) for r in cells) for i in range(n)]

    def line(r):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


# --------------------------------------------------------------------------------------------------
# Machine facts
# --------------------------------------------------------------------------------------------------
def _run(cmd: Sequence[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except Exception:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def filesystem_of(path: str) -> dict:
    """Filesystem type, device and mount options of the filesystem holding `path`."""
    out = _run(["findmnt", "-n", "-o", "FSTYPE,SOURCE,TARGET,OPTIONS", "-T", path])
    if out:
        parts = out.split(None, 3)
        keys = ["fstype", "source", "mountpoint", "options"]
        return dict(zip(keys, parts))
    fstype = _run(["stat", "-f", "-c", "%T", path])
    return {"fstype": fstype}


def machine_facts(data_dir: str | None = None) -> dict:
    import numpy
    import torch

    facts = {
        "hostname": socket.gethostname(),
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "mem_total_bytes": mem_total_bytes(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "loadavg_start": os.getloadavg(),
    }
    try:
        import fastpipe

        facts["fastpipe"] = fastpipe.__version__
        facts["fastpipe_build_info"] = fastpipe.build_info()
    except Exception as e:  # the benchmark still runs its baselines without fastpipe
        facts["fastpipe"] = None
        facts["fastpipe_error"] = repr(e)
    if data_dir is not None:
        facts["data_dir"] = os.path.abspath(data_dir)
        facts["data_dir_filesystem"] = filesystem_of(data_dir)
    return facts


def page_cache_fraction(path: str) -> float | None:
    """Fraction of `path` resident in the page cache (util-linux `fincore`), or None if unknown."""
    if shutil.which("fincore") is None:
        return None
    out = _run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", path])
    try:
        res, size = (int(v) for v in out.split())
        return res / size if size else 1.0
    except Exception:
        return None


# --------------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------------
def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    if isinstance(o, (set, tuple)):
        return list(o)
    return repr(o)


def _clean(o):
    """NaN/inf are not JSON; write them as null."""
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def result_path(kind: str, tag: str | None = None, directory: str = RESULTS_DIR) -> str:
    """benchmarks/results/<kind>_<hostname-or-tag>_<YYYYmmdd-HHMMSS>.json"""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in (tag or socket.gethostname()))
    return os.path.join(directory, f"{kind}_{name}_{stamp}.json")


def write_json(obj: dict, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(_clean(obj), f, indent=1, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    return path
