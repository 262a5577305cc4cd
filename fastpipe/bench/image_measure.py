"""What the images suite measures in a case process beyond images/s: the page cache state of a loader's
files (evicted, warmed, measured with fincore), and the memory and CPU time of the process and its
children (DataLoader's workers)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

COLD_LIMIT = 0.05  # a cold pass that starts with more of its files cached than this is flagged
SAMPLE_INTERVAL = 0.1  # seconds between memory samples of the process tree


# --------------------------------------------------------------------------------------------------
# The page cache
# --------------------------------------------------------------------------------------------------
def source_files(spec: dict, source: str) -> list[str]:
    if source == "tree":
        files = []
        for dirpath, _, names in os.walk(spec["tree"]):
            files += [os.path.join(dirpath, f) for f in names]
        return sorted(files)
    if source == "packed":
        return sorted(os.path.join(spec["packed"], f) for f in os.listdir(spec["packed"]))
    return [spec["beton"]]


def evict(paths: list[str]) -> None:
    """Drops the files' clean pages from the page cache (pages a process still maps stay)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: list[str]) -> None:
    buf = bytearray(4 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def cached_fraction(paths: list[str], chunk: int = 400) -> float | None:
    """Fraction of the files' bytes in the page cache: ``common.page_cache_fraction``'s fincore query,
    asked for many files per call. None when fincore is missing or fails."""
    if shutil.which("fincore") is None:
        return None
    res = size = 0
    for i in range(0, len(paths), chunk):
        part = paths[i:i + chunk]
        try:
            p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "-o", "RES,SIZE", *part],
                               capture_output=True, text=True, timeout=60)
            rows = [line.split() for line in p.stdout.splitlines() if line.strip()]
            if len(rows) != len(part):
                return None
            res += sum(min(int(r), int(s)) for r, s in rows)  # RES counts whole pages: at most the size
            size += sum(int(s) for _, s in rows)
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    return res / size if size else 1.0


def prepare_cache(paths: list[str], state: str) -> dict:
    t0 = time.perf_counter()
    if state == "cold":
        evict(paths)
        frac = cached_fraction(paths)
        if frac is not None and frac > COLD_LIMIT:  # dirty pages cannot be dropped: write them and retry
            os.sync()
            evict(paths)
            frac = cached_fraction(paths)
    else:
        warm(paths)
        frac = cached_fraction(paths)
    return {"cached_at_start": frac, "prepare_seconds": time.perf_counter() - t0}


# --------------------------------------------------------------------------------------------------
# Memory and CPU of a case process and its children
# --------------------------------------------------------------------------------------------------
def _tree_pids(pid: int) -> list[int]:
    """pid and its descendants (DataLoader's workers), from /proc/<pid>/task/<tid>/children."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # gone meanwhile, or no children files in this kernel
            pass
    return out


def _rss_pss(pid: int) -> tuple[int, int]:
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


class MemorySampler(threading.Thread):
    """Peak RSS and PSS summed over this process and its descendants, sampled every SAMPLE_INTERVAL.

    RSS counts a page shared by forked workers once per process; PSS divides it among them, so the sum
    of PSS is the memory the loader really takes. ``cpu_seconds`` is the sampler's own CPU time (the
    case subtracts it from the process's)."""

    def __init__(self):
        super().__init__(daemon=True)
        self._stop_event = threading.Event()
        self.peak_rss = self.peak_pss = 0
        self.cpu_seconds = 0.0
        self.samples = 0

    def _sample(self):
        rss = pss = 0
        for p in _tree_pids(os.getpid()):
            r, s = _rss_pss(p)
            rss += r
            pss += s
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.samples += 1

    def run(self):
        t0 = time.thread_time()
        self._sample()
        while not self._stop_event.wait(SAMPLE_INTERVAL):
            self._sample()
        self._sample()
        self.cpu_seconds = time.thread_time() - t0

    def stop(self):
        self._stop_event.set()
        self.join()


def cpu_seconds(ru) -> float:
    return ru.ru_utime + ru.ru_stime
