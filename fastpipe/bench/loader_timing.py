"""Timing of the loader suite's passes (fastpipe/bench/loader.py): a row's measurements, one timed pass,
the simulated training step, and fastpipe's shared epoch."""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

# Batches every timed pass consumes untimed before its clock starts (worker start-up, pipeline fill).
# The same for every loader; the batches a loader prefetched meanwhile count as timed (<= 2% here).
WARMUP_BATCHES = 3
# A simulated training step after each batch (overlap mode) lasts this many gather times of a batch.
STEP_OVER_GATHER = 2.0
FASTPIPE_SEED = 0
FASTPIPE_EPOCH = 0  # every fastpipe pass is set to this epoch, so all passes (and baselines) share one order


class Case:
    """One row: how to make an epoch's iterator, how many batches a pass times, and its measurements."""

    def __init__(self, key, label, make_iter, kind="baseline", cap=None, note="", probe=None):
        self.key, self.label, self.make_iter, self.kind, self.cap, self.note = key, label, make_iter, kind, cap, note
        self.probe = probe
        self.alone = []    # (seconds, samples, batches, probe delta) per repetition
        self.overlap = []  # (seconds, samples, batches, probe delta) per repetition
        self.busy = []     # the same with a busy step (fastpipe's rows)
        self.busy_run_delay = []  # seconds the training thread waited for a core, per busy repetition
        self.torch = []    # the same with a torch step (fastpipe's rows and the inline peers)
        self.overlap_run_delay = []  # the same per sleeping-step repetition (a late wake-up shows here)
        self.error = None

    def rates(self):
        return [s / t for t, s, _, _ in self.alone if t > 0]


def nsamples(b) -> int:
    if isinstance(b, (tuple, list)):
        b = b[0]
    elif isinstance(b, dict):
        b = next(iter(b.values()))
    return int(b.shape[0])


def timed_pass(make_iter, cap, step: float | None = None, warmup: int = WARMUP_BATCHES, probe=None, busy=False,
               consume=None):
    """Consumes `warmup` batches, then times up to `cap` batches (None: to the end of the epoch).

    With a step (seconds, 0 included) each batch is held while time.sleep(step) stands in for a
    training step that leaves the CPU free (busy=True: spin(step), one that computes on the training
    thread; `consume(batch)` first, if given: touch_with_torch reads every byte with torch's intra-op
    threads). `probe()` (if given) is read just before and after the timed batches; the pass returns its
    difference as a 4th value (fastpipe: seconds the consumer waited)."""
    it = iter(make_iter())
    for _ in range(warmup):
        next(it)
    n = samples = 0
    b = None
    p0 = probe() if probe else None
    t0 = time.perf_counter()
    for b in it:
        samples += nsamples(b)
        n += 1
        if consume is not None:
            consume(b)
        if step is not None:
            spin(step) if busy else time.sleep(step)
        if cap is not None and n >= cap:
            break
    dt = time.perf_counter() - t0
    probed = probe() - p0 if probe else None
    del b
    close = getattr(it, "close", None)
    if close is not None:
        close()
    del it
    return dt, samples, n, probed


def spin(seconds: float) -> None:
    """A training step that computes on the calling thread for `seconds` (a sleeping one leaves its core
    free for the loader's threads)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run_delay() -> float:
    """Seconds the calling thread has been runnable without a core (Linux schedstat); nan elsewhere."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def touch_with_torch(batch) -> None:
    """What a CPU training step does first: reads every byte of the batch with torch ops, on torch's
    intra-op threads (as many as the cores by default), which then compete with a loader's threads."""
    parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (tuple, list)) else [batch]
    for t in parts:
        (t if isinstance(t, torch.Tensor) else torch.from_numpy(np.asarray(t))).sum()


def steps_alone(n: int, batch, step: float, busy=False, consume=None) -> tuple[float, float]:
    """(seconds, seconds waited for a core) of n steps alone: timed_pass's own loop, the same batch again
    from an iterator that costs nothing, so that a loader's row differs from these only by the loader (the
    loop's bookkeeping, ~1 us a batch, is not the loader's: a token window step is ~70 us)."""
    d0 = run_delay()
    seconds = timed_pass(lambda: itertools.repeat(batch), n, step=step, busy=busy, consume=consume)[0]
    return seconds, run_delay() - d0


def pure_steps_median(arg: float, n: int) -> float:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        time.sleep(arg)
        xs.append(time.perf_counter() - t0)
    return float(np.median(xs))


def calibrate_sleep(target: float, n: int = 200) -> tuple[float, float]:
    """The time.sleep() argument whose median duration is `target` (a VM's sleep overshoots by ~0.1 ms).

    Returns (argument, measured median duration). When even time.sleep(0) takes longer than `target`,
    the argument is 0 and the step is longer than asked for (the report says so)."""
    arg, actual = target, target
    for _ in range(4):
        actual = pure_steps_median(arg, n)
        err = actual - target
        if abs(err) <= 0.02 * target:
            break
        arg = max(0.0, arg - err)
        if arg == 0.0:
            actual = pure_steps_median(0.0, n)
            break
    return arg, actual


def rotated(cases: list, r: int) -> list:
    """Repetition r's running order: rotated each time, so drift on a shared machine hits all alike."""
    k = r % len(cases) if cases else 0
    return cases[k:] + cases[:k]


def fastpipe_epoch(loader):
    loader.set_epoch(FASTPIPE_EPOCH)
    return loader


def fastpipe_stats(loader) -> dict:
    result = {}
    for name in ("stats", "io_modes"):
        try:
            v = getattr(loader, name)
            result[name] = v() if callable(v) else v
        except Exception as e:
            result[name] = f"error: {e!r}"
    return result
