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
import time

import numpy as np
import torch

import fastpipe
from fastpipe.bench import BUDGET_MINUTES
from fastpipe.bench import common as bc
from fastpipe.bench.baselines import image_baselines, token_baselines
from fastpipe.bench.loader_direct import DD_BLOCK, DIRECT_REPS, run_direct
from fastpipe.bench.loader_report import report_dataset, shown_best, summarize
from fastpipe.bench.loader_timing import (FASTPIPE_EPOCH, FASTPIPE_SEED, STEP_OVER_GATHER, WARMUP_BATCHES, Case,
                                          block_steps, calibrate_sleep, fastpipe_epoch, fastpipe_stats, rotated,
                                          stepped_pass, timed_pass, touch_with_torch)

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

SEED_FIXED_ORDER = 1234  # the permutation used when fastpipe's own order is not available
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
WARMUP_FASTPIPE_BATCHES = 40  # a warm-up pass of fastpipe's rows: 2x its largest arena (prefetch 16 + 2 slots)
FULL_REPS = 7
OVERLAP_REPS = 5
MIN_REPS = 3  # the fewest repetitions a time budget chooses for a loop: a median and a range
# What each repetition loop's full count costs, relative to the others (the time budget's shares): passes
# times a rough cost per pass on the 2-core VM (the loader-alone and overlap loops run every loader, the
# busy and torch steps fastpipe's rows and a few gathers, each against its pure steps; a direct pass reads
# the 1.2 GB file from the disk).
LOOP_WEIGHTS = {"alone": FULL_REPS * 12, "overlap": OVERLAP_REPS * 14, "busy": OVERLAP_REPS * 5,
                "torch": OVERLAP_REPS * 8, "direct": DIRECT_REPS * 12}


def add_arguments(p):
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: %(default)s)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"repetitions per measurement (default: up to {FULL_REPS} alone, {OVERLAP_REPS} overlap, "
                        f"{DIRECT_REPS} direct, and at least {MIN_REPS}: another while the slowest so far fits in "
                        f"the loop's share of the time budget; --full all of them; --quick 1)")
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


# --------------------------------------------------------------------------------------------------
# One dataset: loader alone, then overlap.
# --------------------------------------------------------------------------------------------------
def run_dataset(name, spec, files, args, out, budget):
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
    extra_loaders = []
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
        # The default against one reader thread (issue 21: never slower) and against none (num_threads=0:
        # each batch read in next() on torch's intra-op threads).
        for threads, key in ((1, "fastpipe_1t"), (0, "fastpipe_0t")):
            if args.threads == threads:
                continue
            try:
                other = make_fastpipe_loader(spec, files, threads)
                extra_loaders.append(other)
                cases.insert(len(extra_loaders), Case(key, f"fastpipe.Loader, num_threads={threads}",
                                                      lambda ld=other: fastpipe_epoch(ld), "fastpipe",
                                                      caps.get("fastpipe", caps["default"])))
            except Exception as e:
                out.note(f"fastpipe num_threads={threads} failed: {type(e).__name__}: {e}")
    by_key = {c.key: c for c in cases}

    # Warm-up: short passes of every loader (starts persistent DataLoader workers, touches code paths), twice:
    # the workers forked share the process's pages copy-on-write, and the first write to each page after a
    # fork copies it, the Python objects' and fastpipe's arenas alike. fastpipe's passes are long enough to
    # write every slot of its arena (prefetch + 2): the first timed pass after the forks otherwise took ~400
    # page faults and read at 0.13-0.5x the gather bound on --quick's CIFAR-like data, 4-7 M samples/s later.
    for c in out.progress(cases * 2, desc=f"{name}: warm-up", unit="pass"):
        if c.error is not None:
            continue
        try:
            timed_pass(c.make_iter, WARMUP_FASTPIPE_BATCHES if c.kind == "fastpipe" else 5, warmup=1)
        except Exception as e:
            c.error = f"{type(e).__name__}: {e}"
            out.log(f"  {c.label}: failed in warm-up: {c.error}")
    cases = [c for c in cases if c.error is None] + [c for c in cases if c.error is not None]
    live = [c for c in cases if c.error is None]

    def measure(c: Case, into: list, **step):
        """A pass of c alone, or with `step` (stepped_pass's arguments) against the steps alone."""
        if c.error is not None:
            return
        try:
            into.append(stepped_pass(c.make_iter, c.cap, probe=c.probe, **step) if step else
                        timed_pass(c.make_iter, c.cap, probe=c.probe))
        except Exception as e:  # a failing loader loses its row, the others go on
            c.error = f"{type(e).__name__}: {e}"
            c.alone.clear()
            c.overlap.clear()
            c.busy.clear()
            c.torch.clear()
            out.log(f"  {c.label}: failed: {c.error}")

    # (1) loader alone: repetitions interleaved (rotated order), so drift on a shared machine hits all.
    with out.progress(total=reps * len(live), desc=f"{name}: loader alone", unit="pass") as bar:
        for r in budget.repeat(f"{name} alone", MIN_REPS, reps):
            for c in rotated(live, r):
                measure(c, c.alone)
                bar.update()

    # Gather time of one batch (per-batch median over the bound's passes) sets the simulated step.
    per_batch = []
    for _ in range(max(1, min(3, budget.chosen.get(f"{name} alone", reps)))):
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

    # Where the default read its batches during each kind of step (num_threads unset: its reader threads,
    # or next() while the step keeps the cores busy), and on which cores its readers ran (all, or all
    # but the training thread's while they keep up without it): shares of the batches, from its stats.
    def placement_counters():
        if loader is None or args.threads is not None:
            return None
        s = loader.stats()
        return s["next_batches"], s["spared_batches"], s["batches"]

    def record_placement(kind, before):
        after = placement_counters()
        if before is not None and after is not None and after[2] > before[2]:
            n = after[2] - before[2]
            res.setdefault("default_placement", {})[kind] = {
                "read_in_next": (after[0] - before[0]) / n, "readers_off_step_core": (after[1] - before[1]) / n}

    # (2) overlap: each batch followed by time.sleep(step); compared with as many steps alone, run between
    # the pass's blocks of steps (stepped_pass).
    counters = placement_counters()
    # The steps alone's batch: torch tensors, as every row but the bound's yields (the loop's own bookkeeping
    # on a tensor, b[0].shape[0], costs ~1 us more than on an array after a sleeping step: not a loader's).
    fixed = None if args.no_overlap else tuple(torch.from_numpy(np.array(a)) for a in next(iter(gather())))
    if not args.no_overlap:
        sleeping = dict(batch=fixed, step=sleep_arg, block=block_steps(sleep_actual))
        with out.progress(total=oreps * len(live), desc=f"{name}: overlap", unit="pass") as bar:
            for r in budget.repeat(f"{name} overlap", MIN_REPS, oreps):
                for c in rotated(live, r):
                    measure(c, c.overlap, **sleeping)
                    bar.update()
        record_placement("sleeping", counters)
    # (3) the training-thread delay (issue 21): the same loop where the step computes on the training
    # thread, against the same steps alone. "busy" spins (fastpipe's rows; with the seconds the training
    # thread waited for a core, where a loader that takes its core shows); "torch" first reads every byte
    # of the batch with torch ops on the intra-op threads, as a CPU training step does, which then compete
    # with the loader's threads (fastpipe's rows and the gathers that run on the training thread).
    fp_cases = [c for c in live if c.kind == "fastpipe"]
    inline = [c for c in live if c.key in ("bound", "index_select")]
    res["torch_threads"] = torch.get_num_threads()
    if fp_cases and not args.no_overlap:
        for kind, consume, group in (("busy", None, fp_cases), ("torch", touch_with_torch, fp_cases + inline)):
            counters = placement_counters()
            computing = dict(batch=fixed, step=step, block=block_steps(step), busy=True, consume=consume)
            with out.progress(total=oreps * len(group), desc=f"{name}: {kind} step", unit="pass") as bar:
                for r in budget.repeat(f"{name} {kind}", MIN_REPS, oreps):
                    for c in rotated(group, r):
                        measure(c, getattr(c, kind), **computing)
                        bar.update()
            record_placement(kind, counters)
            passes = [p for c in group for p in getattr(c, kind) if p.batches]
            res[f"{kind}_step_seconds_measured"] = bc.median([p.alone_seconds / p.batches for p in passes])
            res[f"{kind}_step_run_delay_ms"] = bc.median([1e3 * p.alone_run_delay / p.batches for p in passes])

    pure = [p.alone_seconds / p.batches for c in live for p in c.overlap if p.batches]
    pure_step = bc.median(pure) if pure else float("nan")
    res["pure_step_seconds_measured"] = pure_step
    res["step_effective_over_requested"] = bc.ratio(pure_step, step)

    if loader is not None:
        res["fastpipe"].update(fastpipe_stats(loader))

    # Results. Ratios are medians of per-repetition ratios: each repetition runs every loader back to
    # back, so a slow drift in the machine's load cancels out of them.
    def paired_reps(a: Case | None, b: Case | None) -> list[float]:
        if a is None or b is None or not a.alone or not b.alone:
            return []
        return [x / y for x, y in zip(a.rates(), b.rates())]

    def paired(a: Case | None, b: Case | None) -> float:
        return bc.median(paired_reps(a, b))

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
               "fastpipe_over_this_reps": paired_reps(fp_case, c), "this_over_bound_reps": paired_reps(c, bound_case),
               # least-disturbed estimates (noise only slows a pass): best pass of each loader
               "samples_per_s_best": max(rates) if rates else float("nan"),
               "fastpipe_over_this_best": bc.ratio(best(fp_case), best(c)),
               "this_over_bound_best": bc.ratio(best(c), best(bound_case))}
        # each repetition against the steps alone run between its blocks
        for kind in ("overlap", "busy", "torch"):
            passes = [p for p in getattr(c, kind) if p.batches]
            if not passes:
                continue
            added = [p.added_pct() for p in passes]
            row.update({f"{kind}_added_pct": bc.median(added), f"{kind}_added_pct_best": min(added),
                        f"{kind}_added_pct_reps": added,
                        f"{kind}_run_delay_ms_per_step": bc.median([1e3 * p.run_delay / p.batches for p in passes]),
                        f"{kind}_reps": [p._asdict() for p in passes]})
        if c.overlap:
            row["overlap_seconds_per_batch"] = bc.median([p.seconds / p.batches for p in c.overlap if p.batches])
        if c.probe is not None:
            row["consumer_wait_per_batch_ms_alone"] = bc.median([1e3 * w / k for t, s, k, w in c.alone])
            if c.overlap:
                row["consumer_wait_per_batch_ms_overlap"] = bc.median([1e3 * p.probed / p.batches
                                                                      for p in c.overlap if p.batches])
        rows[c.key] = row
    res["loaders"] = rows
    report_dataset(name, res, out)

    del cases, by_key, live, fp_cases
    for ld in (loader, *extra_loaders):
        if ld is not None:
            try:
                ld.close()
            except Exception:
                pass
    gc.collect()
    return res


def run(args, out) -> dict:
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in PARTS]
    if bad:
        raise SystemExit(f"loader --only: unknown {bad}; choose from {','.join(PARTS)}")
    data_dir = os.path.join(args.data_dir, "quick") if args.quick else args.data_dir
    # The default run has a time budget that decides how many repetitions each loop gets (after its first);
    # --full, --quick or --reps give every loop its count.
    minutes = None if (args.quick or args.full or args.reps) else (args.budget_minutes or BUDGET_MINUTES["loader"])
    budget = bc.Budget(minutes)
    parts = [n for n in ("cifar", "imagenet", "tokens") if n in only]
    budget.plan({f"{n} {loop}": LOOP_WEIGHTS[loop] for n in parts for loop in ("alone", "overlap", "busy", "torch")
                 if loop == "alone" or not args.no_overlap} | ({"direct": LOOP_WEIGHTS["direct"]} if "direct" in only else {}))

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
            results[name] = run_dataset(name, scaled_spec(name, args.quick), files[name], args, out, budget)
    if "direct" in only:
        results["direct"] = run_direct(files["imagenet"], scaled_spec("imagenet", args.quick), args, out, budget)
    if minutes is not None:
        out.note(f"time budget {minutes:g} min (--budget-minutes; --full for the publication run): "
                 f"{budget.elapsed():.0f} s spent; repetitions per loop: "
                 + ", ".join(f"{k} {v}" for k, v in budget.chosen.items()))

    summary = summarize(results)
    out.table(["target", "median", "range", "best pass", "status"],
              [[s["target"], s["shown"], s["range"], shown_best(s), s["status"] + (f" ({s['note']})" if s["note"] else "")]
               for s in summary], align="lrrrl",
              title="Targets (issue 2; this 2-core VM, page-cached"
                    + ("; QUICK run, indicative only" if args.quick else "") + ")")
    out.note("Status uses the medians. 'range': the repetitions' values (min-max; the torch step: fastpipe's added "
             "time minus index_select's, per repetition, whose median is in brackets and decides). 'best pass' compares each loader's least-disturbed pass "
             "(noise only slows a pass).")
    return {
        "settings": {"batch_sizes": {"cifar": CIFAR_BATCH, "imagenet": IMAGENET_BATCH, "tokens": TOKEN_BATCH},
                     "block_size": BLOCK_SIZE, "warmup_batches_per_pass": WARMUP_BATCHES,
                     "step_over_gather": STEP_OVER_GATHER, "caps": QUICK_CAPS if args.quick else FULL_CAPS,
                     "reps": args.reps or ({"alone": 1, "overlap": 1, "direct": 1} if args.quick else
                                           {"alone": FULL_REPS, "overlap": OVERLAP_REPS, "direct": DIRECT_REPS}),
                     "budget_minutes": minutes, "reps_chosen": budget.chosen,
                     "fastpipe_threads": args.threads, "fastpipe_seed": FASTPIPE_SEED, "dd_block": DD_BLOCK},
        "datasets": results,
        "summary": summary,
        "headline": [f"{s['target']}: {s['shown']}" + (f" (range {s['range']})" if s["range"] != "-" else "")
                     + f" {s['status']}" for s in summary if s["status"] != "SKIP"],
    }
