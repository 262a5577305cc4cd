"""Shared by the benchmark suites: statistics, tables, machine facts, progress bars, and the ``Report`` a
suite writes to (printed tables that are also saved as JSON + markdown + PNG plots, with machine facts)."""

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
import time
from typing import Any, Callable, Iterable, Sequence


# --------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------
def _finite(xs: Iterable[float | None]) -> list[float]:
    return [x for x in xs if x is not None and not math.isnan(x)]


def median(xs: Iterable[float | None]) -> float:
    """Median of the values that are not None or NaN (NaN when none is left)."""
    xs = _finite(xs)
    return statistics.median(xs) if xs else float("nan")


def spread_pct(xs: Iterable[float | None]) -> float:
    """(max - min) / median of the repetitions, in percent: how noisy a measurement was."""
    xs = _finite(xs)
    if len(xs) < 2:
        return float("nan")
    m = statistics.median(xs)
    return 100.0 * (max(xs) - min(xs)) / m if m else float("nan")


def ratio(a: float | None, b: float | None) -> float:
    """a / b, NaN when either is missing or NaN or b is 0."""
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return float("nan")
    return a / b


def geomean(xs: Iterable[float]) -> float:
    """Geometric mean (of speedups); NaN for no values."""
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# --------------------------------------------------------------------------------------------------
# Time budgets
# --------------------------------------------------------------------------------------------------
class Budget:
    """A suite's wall-clock budget (``--budget-minutes``), counted from its construction: data generation,
    warm-ups and measurements alike. ``minutes=None`` is no budget (``--full``, ``--quick``, or a count
    the user gave): every loop then runs its full count.

    The suites run a first repetition of everything they compare (ours and the baselines, alternating),
    then another while the slowest repetition so far still fits in what is left (``more``): on a machine
    that gets busier the later repetitions run slower, and the budget still holds. The count never goes
    under ``lo`` (a median and a range need a few), so a budget too small for ``lo`` repetitions is
    overrun, and ``line`` says so."""

    def __init__(self, minutes: float | None):
        if minutes is not None and not minutes > 0:
            raise SystemExit(f"--budget-minutes must be > 0, got {minutes}")
        self.seconds = None if minutes is None else 60.0 * minutes
        self.started = time.perf_counter()
        self._weights: dict[str, float] = {}
        self.chosen: dict[str, int] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed()

    def more(self, times: list[float], lo: int, hi: int, deadline: float | None = None) -> bool:
        """After len(times) repetitions that took ``times`` seconds: run another? Below ``lo``, yes; at
        ``hi``, no; else if the slowest so far fits before ``deadline`` (a ``time.perf_counter`` value;
        default: the end of the budget)."""
        done = len(times)
        if done < min(lo, hi):
            return True
        if done >= hi:
            return False
        if self.seconds is None:
            return True
        end = self.started + self.seconds if deadline is None else deadline
        return time.perf_counter() + max(times) <= end

    def plan(self, weights: dict[str, float]) -> None:
        """The repetition loops a suite will run (``repeat``'s names), each with a weight: roughly what its
        full count costs relative to the others. Each loop then gets its share of what is left when its
        first repetition ends (see ``share``)."""
        self._weights = dict(weights)

    def repeat(self, name: str, lo: int, hi: int):
        """Repetition indices of loop ``name``: 0, then more while the slowest so far fits in the loop's
        share of the budget (time passes between ``next`` calls); ``hi`` of them without a budget. The
        count is recorded in ``chosen[name]``."""
        w = self._weights.pop(name, 1.0)
        times: list[float] = []
        deadline = None
        while True:
            t0 = time.perf_counter()
            yield len(times)
            times.append(time.perf_counter() - t0)
            if deadline is None and self.seconds is not None:  # after the first: its share of what is left
                deadline = time.perf_counter() + self.share(w, w + sum(self._weights.values()))
            if not self.more(times, lo, hi, deadline):
                break
        self.chosen[name] = len(times)

    def share(self, weight: float, weights_left: float) -> float:
        """Seconds for a part weighing ``weight`` of the ``weights_left`` still to run (its own included):
        its share of what is left, so time a part did not use goes to the parts after it."""
        if self.seconds is None:
            return float("inf")
        return max(0.0, self.left()) * weight / weights_left if weights_left > 0 else 0.0

    def line(self, times: list[float], what: str) -> str:
        """One line for the report: the budget, each repetition's time, the count it came to."""
        took = ", ".join(f"{t:.0f}" for t in times)
        if self.seconds is None:
            return f"{len(times)} repetition(s) of {what} ({took} s)"
        over = ("; over budget: fewer would not give a median and a range"
                if self.elapsed() > self.seconds * 1.05 else "")
        return (f"time budget {self.seconds / 60:g} min: {len(times)} repetition(s) of {what} ({took} s; "
                f"{self.elapsed():.0f} s in all, data included){over} "
                "(--budget-minutes, --reps, or --full for the publication run)")


# --------------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------------
def fmt(x: Any, spec: str = ".3g") -> str:
    """A number with `spec`; None and NaN as '-'."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, float) else str(x)


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


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """The same table in GitHub markdown."""
    n = len(headers)
    align = align or ("l" + "r" * (n - 1))

    def line(r):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


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
    return platform.processor() or platform.machine() or "unknown"


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
        return dict(zip(["fstype", "source", "mountpoint", "options"], out.split(None, 3)))
    return {"fstype": _run(["stat", "-f", "-c", "%T", path])}


def machine_facts() -> dict:
    """Host, CPU, memory, kernel, library versions, fastpipe's build, the GPU (if any), load average."""
    import numpy
    import torch

    import fastpipe

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
        "torch_cuda": torch.version.cuda,
        "torch_num_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "fastpipe": fastpipe.__version__,
        "fastpipe_build_info": fastpipe.build_info(),
        "gpus": [],
        "loadavg_start": os.getloadavg(),
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            facts["gpus"].append({"name": p.name, "memory_bytes": p.total_memory,
                                  "capability": f"{p.major}.{p.minor}"})
        facts["cudnn"] = torch.backends.cudnn.version()
    return facts


def machine_line(facts: dict) -> str:
    """One line of the facts that decide a result, for tables and plots."""
    gpus = facts.get("gpus") or []
    gpu = f"{len(gpus)}x {gpus[0]['name']}" if gpus else "no GPU"
    mem = (facts.get("mem_total_bytes") or 0) / 2**30
    return (f"{facts['cpu_model']}, {facts['usable_cpus']} CPUs, {mem:.0f} GiB, {gpu}; torch {facts['torch']}, "
            f"fastpipe {facts['fastpipe']}; {facts['hostname']}, {facts['date']}")


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
# JSON
# --------------------------------------------------------------------------------------------------
def _json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, set):
        return sorted(o)
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


def result_path(kind: str, directory: str, tag: str | None = None) -> str:
    """<directory>/<kind>_<hostname-or-tag>_<YYYYmmdd-HHMMSS>.json"""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in (tag or socket.gethostname()))
    return os.path.join(directory, f"{kind}_{name}_{stamp}.json")


def _write_atomic(path: str, write: Callable) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        write(f)
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def write_json(obj: dict, path: str) -> str:
    def write(f):
        json.dump(_clean(obj), f, indent=1, default=_json_default)
        f.write("\n")

    return _write_atomic(path, write)


# --------------------------------------------------------------------------------------------------
# Progress and the report
# --------------------------------------------------------------------------------------------------
def progress_bar(iterable=None, *, enabled: bool = True, **kw):
    """A tqdm bar on stderr, shown when `enabled` and stderr is a terminal (a disabled tqdm keeps its whole
    API); without tqdm installed, an object with the calls the suites make (iterate, update, with)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar(iterable)
    return tqdm(iterable, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=not (enabled and sys.stderr.isatty()), **kw)


class _NoBar:
    def __init__(self, iterable):
        self._it = iterable

    def __iter__(self):
        return iter(self._it)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n=1):
        pass

    def close(self):
        pass


class Report:
    """Where a suite puts what it shows; ``save`` writes it all under one file stem.

    ``log`` prints only; ``heading``, ``note`` and ``table`` print and also go, in order, into the markdown
    file; ``bars`` records a bar chart drawn into a PNG at ``save`` (when matplotlib is installed);
    ``progress`` wraps an iterable in a progress bar; ``facts`` (the machine facts, a dict the suite may
    add to) heads the JSON, the markdown and every plot.

    Files: ``<stem>.json`` (the suite's results, its options, the facts), ``<stem>.md``, ``<stem>_<plot>.png``;
    the stem is ``json_path`` without ``.json``, or ``<out_dir>/<suite>_<tag or hostname>_<date>``.
    """

    def __init__(self, suite: str, out_dir: str, tag: str | None = None, json_path: str | None = None,
                 show_progress: bool = True, options: dict | None = None):
        self.suite = suite
        self.facts = machine_facts()
        self.options = dict(options or {})
        self.json_path = json_path or result_path(suite, out_dir, tag)
        self.stem = self.json_path[:-5] if self.json_path.endswith(".json") else self.json_path
        self.show_progress = show_progress
        self._md: list[str] = []
        self._plots: dict[str, dict] = {}
        self._plots_skipped = ""  # the note that says why the plots were not drawn
        self._started = time.perf_counter()

    def log(self, *parts) -> None:
        print(*parts, flush=True)

    def heading(self, text: str) -> None:
        self.log(f"\n=== {text} ===")
        self._md.append(f"## {text}")

    def note(self, text: str) -> None:
        self.log(text)
        self._md.append(text.strip())

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None,
              align: str | None = None) -> None:
        if title:
            self.log(f"\n{title}")
            self._md.append(f"**{title}**")
        self.log(format_table(headers, rows, align))
        self._md.append(markdown_table(headers, rows, align))

    def bars(self, name: str, title: str, series: dict[str, dict[str, float]], xlabel: str,
             log_scale: bool = False, ref: float | None = None) -> None:
        """A horizontal bar chart: one group of bars per label, one bar per series (series -> label ->
        value; NaN and None are left out), with a vertical line at `ref` (e.g. 1.0 for a speedup)."""
        self._plots[name] = dict(title=title, series=series, xlabel=xlabel, log_scale=log_scale, ref=ref)

    def progress(self, iterable=None, **kw):
        return progress_bar(iterable, enabled=self.show_progress, **kw)

    def progress_line(self, text: str) -> None:
        """A line on stderr that does not break a progress bar (per-item results of a long sweep)."""
        try:
            from tqdm import tqdm
        except ImportError:
            print(text, file=sys.stderr, flush=True)
        else:
            tqdm.write(text, file=sys.stderr)

    def checkpoint(self, results: dict) -> None:
        """Writes the JSON of what was measured so far (``"complete": false``), so that a run cut short
        by a time limit keeps it; the CLI saves the final results."""
        self.save(results, complete=False)

    def save(self, results: dict, complete: bool = True) -> dict:
        """Writes the JSON (and, when `complete`, the markdown and the plots); returns their paths."""
        self.facts["loadavg_end"] = os.getloadavg()
        seconds = time.perf_counter() - self._started
        files = {"json": self.json_path}
        if complete:
            files["plots"] = self._write_plots()
            files["markdown"] = self._write_markdown(seconds, files["plots"])
        doc = {"suite": self.suite, "complete": complete, "seconds": round(seconds, 1), "argv": sys.argv[1:],
               "options": self.options, "machine": self.facts, "results": results, "files": files}
        write_json(doc, self.json_path)
        return files

    def _write_markdown(self, seconds: float, plots: list[str]) -> str:
        f = self.facts
        given = " ".join(f"{k}={v}" for k, v in self.options.items() if v is not None)
        head = [f"# fastpipe bench: {self.suite}",
                f"{machine_line(f)}. Load average {f['loadavg_start'][0]:.1f} at the start, "
                f"{f['loadavg_end'][0]:.1f} at the end; {seconds:.0f} s. Options: `{given}`."]
        links = [f"![{name}]({os.path.basename(self._plot_path(name))})" for name in self._plots
                 if self._plot_path(name) in plots]  # only the plots written
        skipped = [self._plots_skipped] if self._plots_skipped else []
        text = "\n\n".join(head + self._md + links + skipped) + "\n"
        return _write_atomic(self.stem + ".md", lambda fh: fh.write(text))

    def _plot_path(self, name: str) -> str:
        return f"{self.stem}_{name}.png"

    def _write_plots(self) -> list[str]:
        if not self._plots:
            return []
        try:
            from matplotlib.figure import Figure  # the object API: no pyplot, no global backend state
        except ImportError:
            self._plots_skipped = (f"note: matplotlib is not installed, so no PNG plots were written "
                                   f"({len(self._plots)} skipped; pip install matplotlib, or fastpipe[bench])")
            self.log(self._plots_skipped)
            return []
        os.makedirs(os.path.dirname(os.path.abspath(self.stem)), exist_ok=True)
        return [self._draw(Figure, name, spec) for name, spec in self._plots.items()]

    def _draw(self, Figure, name: str, spec: dict) -> str:
        series = {s: {k: v for k, v in vals.items() if v is not None and not math.isnan(v)}
                  for s, vals in spec["series"].items()}
        labels = list(dict.fromkeys(k for vals in series.values() for k in vals))
        n = max(1, len(series))
        height = 1.6 + 0.22 * len(labels) * n + 0.1 * len(labels)
        fig = Figure(figsize=(10, height), layout="constrained")
        ax = fig.add_subplot()
        bar = 0.8 / n
        for j, (s, vals) in enumerate(series.items()):
            ys = [i + (j - (n - 1) / 2) * bar for i, k in enumerate(labels) if k in vals]
            xs = [vals[k] for k in labels if k in vals]
            bars = ax.barh(ys, xs, height=bar, label=s if n > 1 else None)
            ax.bar_label(bars, labels=[fmt_rate(x) for x in xs], padding=2, fontsize=7)
        if spec["ref"] is not None:
            ax.axvline(spec["ref"], color="0.3", linewidth=1, linestyle="--")
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()  # the first label on top, as in the printed table
        if spec["log_scale"]:
            ax.set_xscale("log")
        ax.set_xlabel(spec["xlabel"])
        ax.set_title(spec["title"], fontsize=10)
        if n > 1:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not on them
        fig.supxlabel(machine_line(self.facts), fontsize=6, color="0.35")
        path = self._plot_path(name)
        fig.savefig(path, dpi=110)
        return path
