"""Timing of the loader suite's passes (fastpipe/bench/loader.py): a row's measurements, one timed pass,
the simulated training step, and fastpipe's shared epoch."""

from __future__ import annotations

import itertools
import math
import time
from typing import NamedTuple

import numpy as np
import torch

# Batches every timed pass consumes untimed before its clock starts (worker start-up, pipeline fill).
# The same for every loader; the batches a loader prefetched meanwhile count as timed (<= 2% here).
WARMUP_BATCHES = 3
# A simulated training step after each batch (overlap mode) lasts this many gather times of a batch.
STEP_OVER_GATHER = 2.0
# A pass with a step alternates blocks of its steps with blocks of the steps alone (stepped_pass), each
# block at least this long and this many steps.
BLOCK_SECONDS = 0.025
MIN_BLOCK_STEPS = 32
FASTPIPE_SEED = 0
FASTPIPE_EPOCH = 0  # every fastpipe pass is set to this epoch, so all passes (and baselines) share one order


class Case:
    """One row: how to make an epoch's iterator, how many batches a pass times, and its measurements."""

    def __init__(self, key, label, make_iter, kind="baseline", cap=None, note="", probe=None):
        self.key, self.label, self.make_iter, self.kind, self.cap, self.note = key, label, make_iter, kind, cap, note
        self.probe = probe
        self.alone = []    # (seconds, samples, batches, probe delta) per repetition
        self.overlap = []  # Stepped, per repetition, with a sleeping step
        self.busy = []     # Stepped with a busy step (fastpipe's rows)
        self.torch = []    # Stepped with a torch step (fastpipe's rows and the inline peers)
        self.error = None

    def rates(self):
        return [s / t for t, s, _, _ in self.alone if t > 0]


def nsamples(b) -> int:
    if isinstance(b, (tuple, list)):
        b = b[0]
    elif isinstance(b, dict):
        b = next(iter(b.values()))
    return int(b.shape[0])


def _steps(it, n: int | None, step: float | None, busy: bool, consume) -> tuple[float, int, int]:
    """(seconds, samples, batches) of up to n batches of iterator `it` (None: to its end), each followed by
    the step: time.sleep(step), or with busy=True spin(step) after consume(batch) (if given)."""
    k = samples = 0
    b = None
    t0 = time.perf_counter()
    for b in it:
        samples += nsamples(b)
        k += 1
        if consume is not None:
            consume(b)
        if step is not None:
            spin(step) if busy else time.sleep(step)
        if n is not None and k >= n:
            break
    dt = time.perf_counter() - t0
    del b
    return dt, samples, k


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
    p0 = probe() if probe else None
    dt, samples, n = _steps(it, cap, step, busy, consume)
    probed = probe() - p0 if probe else None
    _close(it)
    return dt, samples, n, probed


class Stepped(NamedTuple):
    """A pass with a training step after each batch, and as many steps alone run between its blocks."""
    seconds: float
    samples: int
    batches: int
    probed: float | None     # timed_pass's probe over the pass
    alone_seconds: float     # the steps alone
    run_delay: float         # seconds the training thread waited for a core in the pass's steps
    alone_run_delay: float   # ... in the steps alone

    def added_pct(self) -> float:
        """What the loader adds to a step, in % of the step alone."""
        return 100.0 * (self.seconds / self.alone_seconds - 1.0)


def stepped_pass(make_iter, cap, batch, step: float, block: int, busy=False, consume=None, probe=None,
                 warmup: int = WARMUP_BATCHES) -> Stepped:
    """timed_pass with a step, its batches taken in blocks of `block` with as many steps alone after each
    (the same loop over `batch` again, from an iterator that costs nothing): a loader's step and the step
    alone are then measured at the same moments, and the machine's drift (seconds long on a VM, and as
    large as a small step's loader cost) falls on both alike. A loader slower than the step reads ahead
    during the steps alone: by its read-ahead depth over `block` steps it looks better than it is (never
    a loader that keeps up, as fastpipe's rows do)."""
    it = iter(make_iter())
    for _ in range(warmup):
        next(it)
    alone = itertools.repeat(batch)
    seconds = alone_seconds = delay = alone_delay = 0.0
    samples = batches = 0
    p0 = probe() if probe else None
    while cap is None or batches < cap:
        want = block if cap is None else min(block, cap - batches)
        d0 = run_delay()
        dt, s, k = _steps(it, want, step, busy, consume)
        d1 = run_delay()
        seconds, samples, batches, delay = seconds + dt, samples + s, batches + k, delay + d1 - d0
        if k:
            alone_seconds += _steps(alone, k, step, busy, consume)[0]
            alone_delay += run_delay() - d1
        if k < want:  # the epoch ended
            break
    probed = probe() - p0 if probe else None
    _close(it)
    return Stepped(seconds, samples, batches, probed, alone_seconds, delay, alone_delay)


def block_steps(step_seconds: float) -> int:
    """Steps per block of stepped_pass: >= BLOCK_SECONDS of steps, and >= MIN_BLOCK_STEPS."""
    return max(MIN_BLOCK_STEPS, math.ceil(BLOCK_SECONDS / max(step_seconds, 1e-9)))


def _close(it) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


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
