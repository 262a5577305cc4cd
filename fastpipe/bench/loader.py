"""The loader suite (issue 2): fastpipe.Loader against stock PyTorch, page-cached local data.

For each data set, in one run and after a warm-up that puts the files in the page cache, it measures
fastpipe, four stock-PyTorch ways of loading the same records and the single-thread gather bound
(``fastpipe.bench.baselines``), all with the same batch size and the same shuffled order; then the same
loaders with a simulated training step after each batch (overlap); then fastpipe's O_DIRECT path against
``dd iflag=direct``. It prints a table per data set and the issue's targets with PASS/FAIL.
benchmarks/README.md says what every row means.
"""

from __future__ import annotations

import gc
import math
import os
import re
import shutil
import subprocess
import time
import warnings

import numpy as np
import torch

import fastpipe
from fastpipe.bench import common as bc
from fastpipe.bench.baselines import image_baselines, token_baselines

# --------------------------------------------------------------------------------------------------
# Batch sizes: what a training job of each kind really uses (one GPU's share).
# --------------------------------------------------------------------------------------------------
# CIFAR ResNets train with 128-1024 per step; 512 (1.5 MiB of images) is common on one modern GPU.
CIFAR_BATCH = 512
# ImageNet ResNet-50 at 224x224 runs 64-256 per GPU; 64 (9.2 MiB) is the conservative per-GPU share.
IMAGENET_BATCH = 64
# GPT-2-small pretraining (nanoGPT, llm.c) uses 1024-token windows in micro-batches of 8-64 per GPU.
TOKEN_BATCH = 32
BLOCK_SIZE = 1024

# Batches every timed pass consumes untimed before its clock starts (worker start-up, pipeline fill).
# The same for every loader; the batches a loader prefetched meanwhile count as timed (<= 2% here).
WARMUP_BATCHES = 3
# A simulated training step after each batch (overlap mode) lasts this many gather times of a batch.
STEP_OVER_GATHER = 2.0
SEED_FIXED_ORDER = 1234  # the permutation used when fastpipe's own order is not available
FASTPIPE_SEED = 0
FASTPIPE_EPOCH = 0  # every fastpipe pass is set to this epoch, so all passes (and baselines) share one order
DD_BLOCK = 4 << 20

DATASETS = {
    # name: records, record shape, classes, batch size
    "cifar": dict(kind="images", n=200_000, shape=(3, 32, 32), classes=10, batch=CIFAR_BATCH,
                  title="CIFAR-like: 200,000 x uint8 3x32x32 + int64 label"),
    "imagenet": dict(kind="images", n=8_000, shape=(3, 224, 224), classes=1000, batch=IMAGENET_BATCH,
                     title="ImageNet-like: 8,000 x uint8 3x224x224 + int64 label"),
    "tokens": dict(kind="tokens", n_tokens=400_000_000, vocab=50257, batch=TOKEN_BATCH, block=BLOCK_SIZE,
                   title=f"Tokens: 400M x uint16, {BLOCK_SIZE + 1}-token windows -> (x, y) int64"),
}
PARTS = ("cifar", "imagenet", "tokens", "direct")
QUICK_DIVISOR = 10  # --quick: every data set is this many times smaller (its own files under data/quick/)

# How many batches each timed pass measures (None: the whole epoch after the warm-up batches), by
# (dataset, loader). Slow per-sample DataLoaders are measured on a fixed prefix; samples/s stays fair.
FULL_CAPS = {
    "cifar": {"default": None, "dl_sample_w0": 120, "dl_sample_w2": 120, "dl_batch_w2": 150},
    "imagenet": {"default": None, "dl_sample_w0": 60, "dl_sample_w2": 60, "dl_batch_w2": 60},
    "tokens": {"default": 3000, "dl_sample_w0": 400, "dl_sample_w2": 400, "dl_batch_w2": 600, "mm_nanogpt": 600},
}
QUICK_CAPS = {"default": 30}
FULL_REPS = 7
OVERLAP_REPS = 5
DIRECT_REPS = 5


def add_arguments(p):
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: %(default)s)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"repetitions per measurement (default {FULL_REPS} alone, {OVERLAP_REPS} overlap, "
                        f"{DIRECT_REPS} direct; --quick 1)")
    p.add_argument("--threads", type=int, default=None, help="fastpipe num_threads (default: fastpipe's)")
    p.add_argument("--no-overlap", action="store_true", help="skip the overlap mode")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data")


# --------------------------------------------------------------------------------------------------
# Data: generated once with numpy in bounded memory, reused while its size and header are right.
# --------------------------------------------------------------------------------------------------
def data_files(data_dir: str, name: str) -> dict:
    if DATASETS[name]["kind"] == "tokens":
        return {"tokens": os.path.join(data_dir, "tokens_uint16.bin")}
    return {"images": os.path.join(data_dir, f"{name}_images.npy"),
            "labels": os.path.join(data_dir, f"{name}_labels.npy")}


def scaled_spec(name: str, quick: bool) -> dict:
    spec = dict(DATASETS[name])
    if quick:
        if spec["kind"] == "tokens":
            spec["n_tokens"] //= QUICK_DIVISOR
        else:
            spec["n"] //= QUICK_DIVISOR
    return spec


def _npy_ok(path: str, shape, dtype) -> bool:
    try:
        mm = np.load(path, mmap_mode="r")
    except Exception:
        return False
    ok = (mm.shape == tuple(shape) and mm.dtype == np.dtype(dtype)
          and os.path.getsize(path) == mm.offset + mm.nbytes)
    del mm
    return ok


def _write_chunks(path: str, total: int, per: int, chunk, nbytes: int, out, header=None) -> None:
    """Writes `total` records (`nbytes` bytes), `per` at a time (chunk(k) returns the next k as an array),
    under a temporary name renamed into place when complete."""
    tmp = path + ".partial"
    with open(tmp, "wb") as f, out.progress(desc=f"generating {os.path.basename(path)}", total=nbytes, unit="B",
                                            unit_scale=True) as bar:
        if header is not None:
            np.lib.format.write_array_header_1_0(f, header)
        for start in range(0, total, per):
            a = chunk(min(per, total - start))
            f.write(a.data)
            bar.update(a.nbytes)
    os.replace(tmp, path)


def _write_npy(path: str, shape, dtype, fill, out, chunk_bytes: int = 64 << 20) -> None:
    """Writes a .npy of `shape` chunk by chunk; fill(n) returns the next n records."""
    dtype = np.dtype(dtype)
    rec_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)}
    _write_chunks(path, shape[0], max(1, chunk_bytes // rec_bytes),
                  lambda k: np.ascontiguousarray(fill(k), dtype=dtype), shape[0] * rec_bytes, out, header)


def ensure_data(data_dir: str, name: str, spec: dict, seed: int, out) -> dict:
    os.makedirs(data_dir, exist_ok=True)
    files = data_files(data_dir, name)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    made = []
    if spec["kind"] == "images":
        n, shape = spec["n"], spec["shape"]
        rec = int(np.prod(shape))
        if not _npy_ok(files["images"], (n, *shape), np.uint8):
            out.log(f"  generating {files['images']} ({n * rec / 1e9:.2f} GB) ...")
            _write_npy(files["images"], (n, *shape), np.uint8,
                       lambda k: np.frombuffer(rng.bytes(k * rec), np.uint8).reshape(k, *shape), out)
            made.append(files["images"])
        if not _npy_ok(files["labels"], (n,), np.int64):
            _write_npy(files["labels"], (n,), np.int64,
                       lambda k: rng.integers(0, spec["classes"], size=k, dtype=np.int64), out)
            made.append(files["labels"])
    else:
        path, n = files["tokens"], spec["n_tokens"]
        if not (os.path.exists(path) and os.path.getsize(path) == n * 2):
            out.log(f"  generating {path} ({n * 2 / 1e9:.2f} GB) ...")
            _write_chunks(path, n, 16 << 20, lambda k: rng.integers(0, spec["vocab"], size=k, dtype=np.uint16),
                          n * 2, out)
            made.append(path)
    if made:
        out.log(f"  generated {len(made)} file(s) in {time.perf_counter() - t0:.1f} s")
    return files


def warm_page_cache(paths) -> dict:
    """Reads every file once (16 MiB at a time) so the runs that follow are page-cached."""
    buf = bytearray(16 << 20)
    mv = memoryview(buf)
    result = {}
    for p in paths:
        t0 = time.perf_counter()
        total = 0
        with open(p, "rb", buffering=0) as f:
            while True:
                k = f.readinto(mv)
                if not k:
                    break
                total += k
        dt = time.perf_counter() - t0
        result[p] = {"bytes": total, "seconds": dt, "resident_after": bc.page_cache_fraction(p)}
    return result


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------
class Case:
    """One row: how to make an epoch's iterator, how many batches a pass times, and its measurements."""

    def __init__(self, key, label, make_iter, kind="baseline", cap=None, note="", probe=None):
        self.key, self.label, self.make_iter, self.kind, self.cap, self.note = key, label, make_iter, kind, cap, note
        self.probe = probe
        self.alone = []    # (seconds, samples, batches, probe delta) per repetition
        self.overlap = []  # (seconds, samples, batches, probe delta) per repetition
        self.error = None

    def rates(self):
        return [s / t for t, s, _, _ in self.alone if t > 0]


def _nsamples(b) -> int:
    if isinstance(b, (tuple, list)):
        b = b[0]
    elif isinstance(b, dict):
        b = next(iter(b.values()))
    return int(b.shape[0])


def timed_pass(make_iter, cap, step: float | None = None, warmup: int = WARMUP_BATCHES, probe=None):
    """Consumes `warmup` batches, then times up to `cap` batches (None: to the end of the epoch).

    With a step (seconds, 0 included) each batch is held while time.sleep(step) stands in for a
    training step that leaves the CPU free. `probe()` (if given) is read just before and after the timed
    batches; the pass returns its difference as a 4th value (fastpipe: seconds the consumer waited)."""
    it = iter(make_iter())
    for _ in range(warmup):
        next(it)
    n = samples = 0
    b = None
    p0 = probe() if probe else None
    t0 = time.perf_counter()
    for b in it:
        samples += _nsamples(b)
        n += 1
        if step is not None:
            time.sleep(step)
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


def pure_steps(step: float, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        time.sleep(step)
    return time.perf_counter() - t0


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


# --------------------------------------------------------------------------------------------------
# fastpipe: its own epoch order, recovered from the records' first 8 bytes, becomes everyone's order.
# --------------------------------------------------------------------------------------------------
def _keys_from_rows(rows_u8: np.ndarray) -> np.ndarray:
    """First 8 bytes of each row as one uint64 key (random data: collisions ~ n^2 / 2^65)."""
    return np.ascontiguousarray(rows_u8[:, :8]).view("<u8").ravel()


def record_keys(spec, files):
    if spec["kind"] == "images":
        img = np.load(files["images"], mmap_mode="r")
        return _keys_from_rows(img.reshape(len(img), -1))
    tok = np.memmap(files["tokens"], dtype=np.uint16, mode="r")
    nwin = (len(tok) - 1) // spec["block"]
    return _keys_from_rows(tok[: nwin * spec["block"]].reshape(nwin, spec["block"])[:, :4].view(np.uint8))


def batch_keys(spec, b) -> np.ndarray:
    if spec["kind"] == "images":
        x = b[0].numpy()
        return _keys_from_rows(x.reshape(len(x), -1))
    x = b[0][:, :4].numpy().astype(np.uint16)
    return _keys_from_rows(np.ascontiguousarray(x).view(np.uint8))


def make_fastpipe_loader(spec, files, threads, **kw):
    if spec["kind"] == "images":
        ds = fastpipe.NpyDataset([files["images"], files["labels"]])
    else:
        ds = fastpipe.TokenDataset(files["tokens"], spec["block"], dtype="uint16")
    return fastpipe.Loader(ds, batch_size=spec["batch"], shuffle=True, seed=FASTPIPE_SEED, num_threads=threads,
                           **kw)


def fastpipe_epoch(loader):
    loader.set_epoch(FASTPIPE_EPOCH)
    return loader


def recover_order(spec, files, loader) -> tuple[np.ndarray | None, dict]:
    """One fastpipe epoch (also a warm-up): the order it produced, checked to be a permutation, and a
    byte-exact comparison of its first two and last batches with numpy."""
    keys = record_keys(spec, files)
    n = len(keys)
    sorter = np.argsort(keys, kind="stable")
    sk = keys[sorter]
    info = {"unique_keys": bool(np.all(sk[1:] != sk[:-1]))}
    parts, kept = [], {}
    nb = None
    t0 = time.perf_counter()
    for k, b in enumerate(fastpipe_epoch(loader)):
        q = batch_keys(spec, b)
        pos = np.clip(np.searchsorted(sk, q), 0, n - 1)
        found = sk[pos] == q
        parts.append(np.where(found, sorter[pos], -1))
        if k < 2:
            kept[k] = tuple(t.clone() for t in b)
        nb = k
        last = b
    info["epoch_seconds"] = time.perf_counter() - t0
    kept[nb] = tuple(t.clone() for t in last)
    del last
    order = np.concatenate(parts)
    info["batches"] = nb + 1
    info["samples"] = int(len(order))
    info["unmatched"] = int((order < 0).sum())
    info["is_permutation"] = bool(len(order) == n and info["unmatched"] == 0 and len(np.unique(order)) == n)
    # byte-exact check of the kept batches
    mismatches = []
    B = spec["batch"]
    for k, bt in kept.items():
        idx = order[k * B: k * B + B]
        if (idx < 0).any():
            mismatches.append(f"batch {k}: records not found")
            continue
        if spec["kind"] == "images":
            img = np.load(files["images"], mmap_mode="r")
            lab = np.load(files["labels"], mmap_mode="r")
            ok = np.array_equal(bt[0].numpy(), img[idx]) and np.array_equal(bt[1].numpy(), lab[idx])
        else:
            blk = spec["block"]
            tok = np.memmap(files["tokens"], dtype=np.uint16, mode="r")
            w = np.stack([tok[i * blk: i * blk + blk + 1] for i in idx]).astype(np.int64)
            ok = (bt[0].dtype == torch.int64 and np.array_equal(bt[0].numpy(), w[:, :-1])
                  and np.array_equal(bt[1].numpy(), w[:, 1:]))
        if not ok:
            mismatches.append(f"batch {k}: content differs from numpy")
    info["byte_exact_checked_batches"] = sorted(kept)
    info["byte_exact_mismatches"] = mismatches
    usable = info["is_permutation"] and info["unique_keys"] and not mismatches
    return (order if usable else None), info


def fastpipe_stats(loader) -> dict:
    result = {}
    for name in ("stats", "io_modes"):
        try:
            v = getattr(loader, name)
            result[name] = v() if callable(v) else v
        except Exception as e:
            result[name] = f"error: {e!r}"
    return result


# --------------------------------------------------------------------------------------------------
# One dataset: loader alone, then overlap.
# --------------------------------------------------------------------------------------------------
def run_dataset(name, spec, files, args, out):
    res = {"title": spec["title"], "spec": {k: v for k, v in spec.items() if k != "title"}, "files": files}
    B = spec["batch"]
    if spec["kind"] == "images":
        n = spec["n"]
        rec_bytes = int(np.prod(spec["shape"])) + 8  # image + int64 label read per sample
        out_bytes = rec_bytes
    else:
        n = (spec["n_tokens"] - 1) // spec["block"]
        rec_bytes = (spec["block"] + 1) * 2          # one uint16 window read per sample
        out_bytes = 2 * spec["block"] * 8            # x and y int64 written per sample
    res.update(samples_per_epoch=n, batch_size=B, batches_per_epoch=math.ceil(n / B),
               bytes_read_per_sample=rec_bytes, bytes_out_per_sample=out_bytes)
    caps = QUICK_CAPS if args.quick else FULL_CAPS[name]
    reps = args.reps or (1 if args.quick else FULL_REPS)
    oreps = args.reps or (1 if args.quick else OVERLAP_REPS)

    out.heading(f"{name}: {spec['title']}; batch {B}, {res['batches_per_epoch']} batches/epoch")
    res["page_cache_warmup"] = warm_page_cache(files.values())
    for p, w in res["page_cache_warmup"].items():
        r = w["resident_after"]
        out.log(f"  page cache: read {os.path.basename(p)} {w['bytes'] / 1e9:.2f} GB at "
                f"{w['bytes'] / w['seconds'] / 1e9:.2f} GB/s; resident {'?' if r is None else f'{100 * r:.0f}%'}")

    # The shared order: fastpipe's own epoch order when it can be recovered, else a fixed permutation.
    loader = None
    res["fastpipe"] = {"error": None}
    order = None
    try:
        loader = make_fastpipe_loader(spec, files, args.threads)
        res["fastpipe"]["len"] = len(loader)
        order, info = recover_order(spec, files, loader)
        res["fastpipe"]["order_check"] = info
        out.note(f"fastpipe epoch: {info['samples']} samples in {info['batches']} batches, permutation: "
                 f"{info['is_permutation']}, byte-exact {info['byte_exact_checked_batches']}: "
                 f"{'ok' if not info['byte_exact_mismatches'] else info['byte_exact_mismatches']}")
    except Exception as e:  # the baselines still run; the fastpipe row and its targets are missing
        res["fastpipe"]["error"] = f"{type(e).__name__}: {e}"
        out.note(f"fastpipe failed: {res['fastpipe']['error']}")
        loader = None
    if order is None:
        order = np.random.default_rng(SEED_FIXED_ORDER).permutation(n)
        res["order"] = f"fixed permutation (numpy default_rng({SEED_FIXED_ORDER}))"
    else:
        res["order"] = f"fastpipe's (seed {FASTPIPE_SEED}, epoch {FASTPIPE_EPOCH})"
    out.note(f"order: {res['order']}")

    if spec["kind"] == "images":
        baselines, gather = image_baselines(files["images"], files["labels"], B, order)
    else:
        baselines, gather = token_baselines(files["tokens"], spec["block"], B, order)
    cases = [Case(b.key, b.label, b.make_iter, b.kind, caps.get(b.key, caps["default"]), b.note)
             for b in baselines]
    if loader is not None:
        def probe():
            try:
                return float(loader.stats()["wait_seconds"])
            except Exception:
                return float("nan")

        label = "fastpipe.Loader (shuffle=True)" if spec["kind"] == "images" else \
            "fastpipe.Loader TokenDataset (shuffle=True)"
        cases.insert(0, Case("fastpipe", label, lambda: fastpipe_epoch(loader), "fastpipe",
                             caps.get("fastpipe", caps["default"]), probe=probe))
    by_key = {c.key: c for c in cases}

    # Warm-up: one short pass of every loader (starts persistent DataLoader workers, touches code paths).
    for c in out.progress(cases, desc=f"{name}: warm-up", unit="loader"):
        try:
            timed_pass(c.make_iter, 5, warmup=1)
        except Exception as e:
            c.error = f"{type(e).__name__}: {e}"
            out.log(f"  {c.label}: failed in warm-up: {c.error}")
    cases = [c for c in cases if c.error is None] + [c for c in cases if c.error is not None]
    live = [c for c in cases if c.error is None]

    def measure(c: Case, into: list, **kw):
        if c.error is not None:
            return
        try:
            into.append(timed_pass(c.make_iter, c.cap, probe=c.probe, **kw))
        except Exception as e:  # a failing loader loses its row, the others go on
            c.error = f"{type(e).__name__}: {e}"
            c.alone.clear()
            c.overlap.clear()
            out.log(f"  {c.label}: failed: {c.error}")

    # (1) loader alone: repetitions interleaved (rotated order), so drift on a shared machine hits all.
    with out.progress(total=reps * len(live), desc=f"{name}: loader alone", unit="pass") as bar:
        for r in range(reps):
            for c in rotated(live, r):
                measure(c, c.alone)
                bar.update()

    # Gather time of one batch (per-batch median over the bound's passes) sets the simulated step.
    per_batch = []
    for _ in range(max(1, min(3, reps))):
        it = gather()
        while True:
            t0 = time.perf_counter()
            if next(it, None) is None:
                break
            per_batch.append(time.perf_counter() - t0)
    gather_s = float(np.median(per_batch))
    step = STEP_OVER_GATHER * gather_s
    res["gather_seconds_per_batch_median"] = gather_s
    res["step_seconds"] = step
    sleep_arg, sleep_actual = calibrate_sleep(step)
    res["sleep_argument_seconds"] = sleep_arg
    res["sleep_calibrated_seconds"] = sleep_actual

    # (2) overlap: each batch followed by time.sleep(step); compared with the same number of pure steps.
    pure = []
    if not args.no_overlap:
        n_pure = min(200, res["batches_per_epoch"])
        with out.progress(total=oreps * len(live), desc=f"{name}: overlap", unit="pass") as bar:
            for r in range(oreps):
                pure.append(pure_steps(sleep_arg, n_pure) / n_pure)
                for c in rotated(live, r):
                    measure(c, c.overlap, step=sleep_arg)
                    bar.update()
                pure.append(pure_steps(sleep_arg, n_pure) / n_pure)
    pure_step = bc.median(pure) if pure else float("nan")
    res["pure_step_seconds_measured"] = pure_step
    res["pure_step_seconds_reps"] = pure
    res["step_effective_over_requested"] = bc.ratio(pure_step, step)

    if loader is not None:
        res["fastpipe"].update(fastpipe_stats(loader))

    # Results. Ratios are medians of per-repetition ratios: each repetition runs every loader back to
    # back, so a slow drift in the machine's load cancels out of them.
    def paired(a: Case | None, b: Case | None) -> float:
        if a is None or b is None or not a.alone or not b.alone:
            return float("nan")
        return bc.median([x / y for x, y in zip(a.rates(), b.rates())])

    def best(a: Case | None) -> float:
        return max(a.rates()) if a is not None and a.alone else float("nan")

    fp_case, bound_case = by_key.get("fastpipe"), by_key.get("bound")
    rows = {}
    for c in cases:
        rates = c.rates()
        rate = bc.median(rates) if rates else float("nan")
        row = {"label": c.label, "kind": c.kind, "note": c.note, "error": c.error,
               "timed_batches_per_pass": c.alone[0][2] if c.alone else None,
               "alone_reps": [{"seconds": t, "samples": s, "batches": k, "consumer_wait_seconds": w}
                              for t, s, k, w in c.alone],
               "samples_per_s": rate, "samples_per_s_spread_pct": bc.spread_pct(rates),
               "read_GBps": rate * rec_bytes / 1e9, "out_GBps": rate * out_bytes / 1e9,
               "fastpipe_over_this": paired(fp_case, c), "this_over_bound": paired(c, bound_case),
               # least-disturbed estimates (noise only slows a pass): best pass of each loader
               "samples_per_s_best": max(rates) if rates else float("nan"),
               "fastpipe_over_this_best": bc.ratio(best(fp_case), best(c)),
               "this_over_bound_best": bc.ratio(best(c), best(bound_case))}
        if c.overlap:
            # each repetition against the mean of the pure-step loops run just before and after it
            added = [100.0 * (t / (k * (pure[2 * r] + pure[2 * r + 1]) / 2) - 1.0)
                     for r, (t, s, k, w) in enumerate(c.overlap)]
            row.update(overlap_reps=[{"seconds": t, "samples": s, "batches": k, "consumer_wait_seconds": w}
                                     for t, s, k, w in c.overlap],
                       overlap_seconds_per_batch=bc.median([t / k for t, s, k, w in c.overlap]),
                       overlap_added_pct=bc.median(added), overlap_added_pct_best=min(added),
                       overlap_added_pct_reps=added)
        if c.probe is not None:
            row["consumer_wait_per_batch_ms_alone"] = bc.median([1e3 * w / k for t, s, k, w in c.alone])
            if c.overlap:
                row["consumer_wait_per_batch_ms_overlap"] = bc.median([1e3 * w / k for t, s, k, w in c.overlap])
        rows[c.key] = row
    res["loaders"] = rows
    report_dataset(name, res, out)

    del cases, by_key, live
    if loader is not None:
        try:
            loader.close()
        except Exception:
            pass
    gc.collect()
    return res


def report_dataset(name, res, out):
    rows = res["loaders"]
    tok = name == "tokens"
    headers = ["loader", "samples/s", "best", "spread", "read GB/s"] + (["out GB/s"] if tok else []) + [
        "fastpipe/this", "this/bound", "timed batches"]
    table = []
    for key, r in rows.items():
        if r["error"]:
            table.append([r["label"], "error: " + r["error"][:60]] + [""] * (len(headers) - 2))
            continue
        table.append([r["label"] + (" *" if r["note"] else ""), bc.fmt_rate(r["samples_per_s"]),
                      bc.fmt_rate(r["samples_per_s_best"]), bc.fmt(r["samples_per_s_spread_pct"], ".0f") + "%",
                      bc.fmt(r["read_GBps"], ".2f")]
                     + ([bc.fmt(r["out_GBps"], ".2f")] if tok else [])
                     + [bc.fmt(r["fastpipe_over_this"], ".2f") + "x", bc.fmt(r["this_over_bound"], ".2f") + "x",
                        r["timed_batches_per_pass"]])
    out.table(headers, table, title=f"{res['title']} — loader alone (samples/s: median of repetitions, best: "
                                    "fastest one, spread: (max-min)/median; ratios: medians of per-repetition "
                                    "ratios)")
    if any(r["note"] for r in rows.values()):
        out.note("Rows marked * : in-batch order differs from the sampler's (sorted for locality)")
    out.bars(f"{name}_alone", f"{res['title']}: loader alone (median of repetitions)",
             {"samples/s": {r["label"]: r["samples_per_s"] for r in rows.values() if not r["error"]}},
             "samples/s (log scale)", log_scale=True)
    if not math.isnan(res.get("pure_step_seconds_measured", float("nan"))):
        step, pure = res["step_seconds"], res["pure_step_seconds_measured"]
        out.note(f"\nOverlap: step = {STEP_OVER_GATHER:g} x gather time of one batch = {1e3 * step:.3f} ms; "
                 f"time.sleep({1e3 * res['sleep_argument_seconds']:.3f} ms) measured {1e3 * pure:.3f} ms per pure step")
        if pure > 1.25 * step:
            out.note(f"NOTE: time.sleep cannot be shorter than ~{1e3 * pure:.2f} ms here: the step is "
                     f"{pure / step:.1f}x the asked-for one, so this overlap test is easier than specified")
        ot = []
        for key, r in rows.items():
            if "overlap_added_pct" in r:
                ot.append([r["label"], bc.fmt(1e3 * r["overlap_seconds_per_batch"], ".3f"),
                           bc.fmt(r["overlap_added_pct"], ".1f") + "%",
                           bc.fmt(r["overlap_added_pct_best"], ".1f") + "%"])
        out.table(["loader", "ms/batch with step", "added over pure steps", "best rep"], ot)
    fpr = rows.get("fastpipe", {})
    if "consumer_wait_per_batch_ms_alone" in fpr:
        out.note(f"fastpipe: the training loop waited for data "
                 f"{bc.fmt(fpr['consumer_wait_per_batch_ms_alone'], '.3f')} ms per batch alone, "
                 f"{bc.fmt(fpr.get('consumer_wait_per_batch_ms_overlap'), '.3f')} ms with the step "
                 "(loader.stats()['wait_seconds'])")


# --------------------------------------------------------------------------------------------------
# Direct I/O: fastpipe io="direct" against `dd iflag=direct` on the ImageNet-like images file.
# --------------------------------------------------------------------------------------------------
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


def run_direct(files, spec, args, out):
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
            k += _nsamples(b)
            del b
        fp_runs[mode].append({"seconds": time.perf_counter() - t0, "samples": k})

    jobs = [lambda: dd_runs.append(run_dd(path, None))] if "dd_error" not in res else []
    jobs += [(lambda m=mode: fp_pass(m)) for mode in loaders]
    with out.progress(total=reps * len(jobs), desc="direct I/O", unit="pass") as bar:
        for r in range(reps):
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
        over = bc.median([a / b for a, b in zip(gbps, dd_each)]) if dd_each else float("nan")
        entry.update(runs=runs, GBps=g, GBps_best=max(gbps), GBps_spread_pct=bc.spread_pct(gbps), over_dd=over,
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


# --------------------------------------------------------------------------------------------------
# Summary of the targets
# --------------------------------------------------------------------------------------------------
def summarize(results) -> list[dict]:
    summary = []

    def loader(ds, key, field):
        try:
            v = results[ds]["loaders"][key][field]
            return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
        except KeyError:
            return None

    def add(target, value, ok, shown, best=None, note=""):
        status = "SKIP" if value is None else ("PASS" if ok(value) else "FAIL")
        summary.append({"target": target, "value": value, "best_rep_value": best, "status": status,
                        "shown": shown if value is not None else "not measured", "note": note})

    def x(v):
        return f"{bc.fmt(v, '.2f')}x"

    def pct(v):
        return f"{bc.fmt(v, '.1f')}%"

    v = loader("cifar", "dl_sample_w2", "fastpipe_over_this")
    bv = loader("cifar", "dl_sample_w2", "fastpipe_over_this_best")
    add(">= 20x DataLoader(num_workers=2, per-sample), CIFAR-like", v, lambda a: a >= 20, x(v), bv)
    for ds, t in (("cifar", 0.7), ("imagenet", 1.0)):
        v = loader(ds, "fastpipe", "this_over_bound")
        bv = loader(ds, "fastpipe", "this_over_bound_best")
        add(f"loader alone >= {t}x single-thread gather bound, {ds}", v, lambda a, t=t: a >= t, x(v), bv)
    for ds in ("cifar", "imagenet", "tokens"):
        v = loader(ds, "fastpipe", "overlap_added_pct")
        bv = loader(ds, "fastpipe", "overlap_added_pct_best")
        note = ""
        eff = results.get(ds, {}).get("step_effective_over_requested")
        if eff is not None and not math.isnan(eff) and eff > 1.25:
            note = f"step {eff:.1f}x longer than asked: time.sleep floor"
        add(f"overlap (step = {STEP_OVER_GATHER:g}x gather): fastpipe adds <= 5%, {ds}", v, lambda a: a <= 5.0,
            pct(v), bv, note)
    d = results.get("direct", {}).get("fastpipe", {})
    for mode in ("shuffle", "sequential"):
        e = d.get(mode, {})
        v = e.get("over_dd")
        v = None if v is None or math.isnan(v) else v
        bv = e.get("over_dd_best")
        add(f"direct I/O >= 80% of dd sequential direct, imagenet, fastpipe {mode}", v, lambda a: a >= 0.8,
            f"{bc.fmt(100 * v if v is not None else None, '.0f')}%", bv)
        if e.get("invalid"):
            summary[-1]["status"] = "INVALID"
            summary[-1]["note"] = e["invalid"]
    return summary


def _shown_best(s):
    b = s["best_rep_value"]
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "-"
    return f"{b:.1f}%" if "adds" in s["target"] else f"{100 * b:.0f}%" if "direct" in s["target"] else f"{b:.2f}x"


def run(args, out) -> dict:
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in PARTS]
    if bad:
        raise SystemExit(f"loader --only: unknown {bad}; choose from {','.join(PARTS)}")
    data_dir = os.path.join(args.data_dir, "quick") if args.quick else args.data_dir

    facts = out.facts
    out.log(f"fastpipe loader benchmark — {bc.machine_line(facts)}; numpy {facts['numpy']}")
    out.note(f"batch sizes: CIFAR {CIFAR_BATCH}, ImageNet {IMAGENET_BATCH}, tokens {TOKEN_BATCH} x {BLOCK_SIZE}"
             f"{'; QUICK mode (1/10 data, 1 rep): not the issue figures' if args.quick else ''}")
    out.log(f"data: {data_dir}")
    needed = {"cifar": ["cifar"], "imagenet": ["imagenet"], "tokens": ["tokens"], "direct": ["imagenet"]}
    files = {}
    for name in dict.fromkeys(n for o in only for n in needed[o]):
        files[name] = ensure_data(data_dir, name, scaled_spec(name, args.quick), args.seed, out)
    facts["data_dir"] = os.path.abspath(data_dir)
    facts["data_dir_filesystem"] = bc.filesystem_of(data_dir)
    load = os.getloadavg()[0]
    if load > 0.5 * (facts["usable_cpus"] or 1):
        out.note(f"NOTE: load average {load:.1f} on {facts['usable_cpus']} CPUs before starting: other work is "
                 "running, the numbers will be noisy (see the spread column)")
    results = {}
    for name in ("cifar", "imagenet", "tokens"):
        if name in only:
            results[name] = run_dataset(name, scaled_spec(name, args.quick), files[name], args, out)
    if "direct" in only:
        results["direct"] = run_direct(files["imagenet"], scaled_spec("imagenet", args.quick), args, out)

    summary = summarize(results)
    out.table(["target", "median", "best pass", "status"],
              [[s["target"], s["shown"], _shown_best(s), s["status"] + (f" ({s['note']})" if s["note"] else "")]
               for s in summary], align="lrrl",
              title="Targets (issue 2; this 2-core VM, page-cached"
                    + ("; QUICK run, indicative only" if args.quick else "") + ")")
    out.note("Status uses the medians. 'best pass' compares each loader's least-disturbed pass "
             "(noise only slows a pass).")
    return {
        "settings": {"batch_sizes": {"cifar": CIFAR_BATCH, "imagenet": IMAGENET_BATCH, "tokens": TOKEN_BATCH},
                     "block_size": BLOCK_SIZE, "warmup_batches_per_pass": WARMUP_BATCHES,
                     "step_over_gather": STEP_OVER_GATHER, "caps": QUICK_CAPS if args.quick else FULL_CAPS,
                     "reps": args.reps or ({"alone": 1, "overlap": 1, "direct": 1} if args.quick else
                                           {"alone": FULL_REPS, "overlap": OVERLAP_REPS, "direct": DIRECT_REPS}),
                     "fastpipe_threads": args.threads, "fastpipe_seed": FASTPIPE_SEED, "dd_block": DD_BLOCK},
        "datasets": results,
        "summary": summary,
        "headline": [f"{s['target']}: {s['shown']} {s['status']}" for s in summary if s["status"] != "SKIP"],
    }
