"""The images suite: image training input pipelines, fastpipe against DataLoader + torchvision, DALI and FFCV.

On generated corpora of natural-image-like photos (ImageNet-like sizes and file sizes, a few large ones,
10 classes in an ImageFolder tree; also packed with ``fastpipe.write_images``): JPEGs, the same images as
PNGs, and a mixed tree (90% JPEG, 5% PNG, 5% WebP), every loader produces
the same training batches: RandomResizedCrop(S) + horizontal flip + float32 + ImageNet normalisation,
``[B, 3, S, S]`` NCHW float32 and int64 labels, at equal cores (``k`` = the usable CPUs: fastpipe's
``num_threads``, DataLoader's ``num_workers``, DALI's and FFCV's threads). For each output size S
(224; --full also 160) and page-cache state (warm: the files read once first; cold: evicted with
``posix_fadvise(DONTNEED)`` and checked with ``fincore``) it reports images/s, the ratio to
``DataLoader + torchvision v2 on PIL``, CPU seconds per 1,000 images (threads and worker processes),
peak RSS and PSS, and the spread of the repetitions.

Every loader runs in a fresh process of its own (``python -m fastpipe.bench.images --case SPEC``), so
imports, memory and CPU time are its own; a repetition runs all loaders once, in an order rotated each
repetition. A peer that is not installed (``requirements/bench-peers.txt``) is skipped with the reason.
benchmarks/README.md says what every row and column means.

The default run has a time budget (``--budget-minutes``, ``BUDGET_MINUTES["images"]``): corpora of
``BUDGET_IMAGES_PER_MINUTE`` images per budget minute, the headline's size only (``BUDGET_SIZES``), and after
a first repetition over every corpus another while the slowest so far still fits (``MIN_REPS`` to
``FULL_REPS``). ``--full``
is the publication run: ``IMAGES`` images, ``SIZES``, ``FULL_REPS`` repetitions.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

from fastpipe.bench import BUDGET_MINUTES
from fastpipe.bench import common as bc
from fastpipe.bench import image_baselines as ib
from fastpipe.bench.image_measure import (COLD_LIMIT, SAMPLE_INTERVAL, MemorySampler, cpu_seconds, evict,
                                          prepare_cache, source_files)
from fastpipe.bench.image_corpus import (CLASSES, GRAIN_SIGMA, JPEG_QUALITY, KINDS, Corpus, corpus_paths,
                                         ensure_corpus)
from fastpipe.bench.image_report import headline, report, summarize
from fastpipe.bench.image_rows import BASELINE, JPEG_ONLY, LOADERS, RECIPE
from fastpipe.bench.loader_timing import rotated

SIZES = (224, 160)  # --full; the default (budget) run and --quick (a smoke run) the headline's 224 only
BUDGET_SIZES = (224,)
STATES = ("warm", "cold")
BATCH, QUICK_BATCH = 64, 16
IMAGES, QUICK_IMAGES = 3000, 64  # --full, --quick
FULL_REPS = 5  # --full, and the most a budget chooses
MIN_REPS = 2  # the fewest a budget chooses: a median and a range
# The default run's corpus size from its budget: images per budget minute, so that generating the three
# corpora and 3 repetitions of every row at 224 (warm and cold) fit (on the 2-core VM one repetition over
# the three corpora takes ~0.1 s per image plus ~3 s of start-up per process; generation ~0.1 s per image).
BUDGET_IMAGES_PER_MINUTE = 125
BUDGET_MIN_IMAGES = 300
WARMUP_BATCHES = 3  # untimed batches after building a loader (DALI builds, FFCV compiles here)
SEED = 0


# per case process; a hung loader costs no more than this
CASE_TIMEOUT = {"quick": 600, "budget": 600, "full": 3600}


def add_arguments(p):
    p.add_argument("--loaders", default=",".join(LOADERS),
                   help="comma-separated subset of the rows (default: %(default)s)")
    p.add_argument("--corpora", default="jpeg,png,mixed",
                   help="the corpora: jpeg, png (the same images as PNGs), mixed (90%% JPEG, 5%% PNG, 5%% WebP), "
                        "imagenet (JPEGs coded as ImageNet's are: 4:2:0 mostly, some 4:4:4, 4:2:2, grayscale "
                        "and progressive) (default: %(default)s)")
    p.add_argument("--sizes", default=None,
                   help=f"output sizes S (default and --quick {','.join(map(str, BUDGET_SIZES))}; --full "
                        f"{','.join(map(str, SIZES))})")
    p.add_argument("--cache", default=",".join(STATES), help="page-cache states: warm, cold (default: %(default)s)")
    p.add_argument("--reps", type=int, default=None,
                   help=f"repetitions (default: within the time budget, another while the slowest so far fits, "
                        f"{MIN_REPS} to {FULL_REPS}; --full {FULL_REPS}; --quick 1)")
    p.add_argument("--images", type=int, default=None,
                   help=f"images in the generated corpus (default: {BUDGET_IMAGES_PER_MINUTE} per budget minute, "
                        f"{BUDGET_MIN_IMAGES} to {IMAGES}; --full {IMAGES}; --quick {QUICK_IMAGES})")
    p.add_argument("--batch-size", type=int, default=None, help=f"default {BATCH} (--quick {QUICK_BATCH})")
    p.add_argument("--threads", type=int, default=None,
                   help="k: every loader's threads or worker processes (default: the usable CPUs)")
    p.add_argument("--grain", type=float, default=GRAIN_SIGMA,
                   help="sensor grain of the corpus in grey levels (default: %(default)s; sets file sizes)")
    p.add_argument("--seed", type=int, default=SEED, help="seed of the corpus and of the loaders' shuffles")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ensure_beton(c: Corpus, threads: int, facts: dict, out, timeout: float) -> str | None:
    """FFCV's .beton of the tree, written once in a process of its own; None, or why FFCV is skipped."""
    if not os.path.exists(c.beton):
        out.log(f"  writing FFCV's {c.beton} (re-encodes every image at q90) ...")
        res = spawn_case({"action": "write_beton", "tree": c.tree, "beton": c.beton, "threads": threads}, timeout)
        if "error" in res:
            return f"writing the .beton failed: {res['error']}"
        facts["beton_write_seconds"] = res.get("seconds")
    facts["beton_mb"] = os.path.getsize(c.beton) / 1e6
    return None


# --------------------------------------------------------------------------------------------------
# One case process: a loader at each size, warm-up, then a timed epoch per cache state.
# --------------------------------------------------------------------------------------------------
def check_batch(batch, size: int, b: int, classes: int) -> float:
    """Checks a batch's shapes, dtypes and labels and reads every pixel (their sum, returned)."""
    import torch

    x, y = batch[0], batch[1]
    if tuple(x.shape) != (b, 3, size, size) or x.dtype != torch.float32 or not x.is_contiguous():
        raise AssertionError(f"images: expected contiguous float32 {(b, 3, size, size)}, got {x.dtype} "
                             f"{tuple(x.shape)} contiguous={x.is_contiguous()}")
    if tuple(y.shape) != (b,) or y.dtype != torch.int64:
        raise AssertionError(f"labels: expected int64 {(b,)}, got {y.dtype} {tuple(y.shape)}")
    s = float(x.sum())
    lo, hi = int(y.min()), int(y.max())
    if not math.isfinite(s) or lo < 0 or hi >= classes:
        raise AssertionError(f"pixel sum {s}, labels in [{lo}, {hi}] (expected finite, [0, {classes}))")
    return s


def build_pipeline(key: str, spec: dict, size: int):
    b, k, seed = spec["batch"], spec["threads"], spec["seed"]
    if key in ("fastpipe_folder", "fastpipe_packed", "fastpipe_recipe", "fastpipe_recipe_bicubic"):
        import fastpipe
        from fastpipe.transforms import RandomErasing, RandomResizedCrop, TrivialAugmentWide

        mode = "bicubic" if key == "fastpipe_recipe_bicubic" else "bilinear"
        recipe = (dict(augment=TrivialAugmentWide(interpolation=mode), erase=RandomErasing(0.1), interpolation=mode)
                  if key.startswith("fastpipe_recipe") else {})
        tf = RandomResizedCrop(size, mean=ib.MEAN, std=ib.STD, **recipe)  # mirror=0.5, float32, NCHW
        ds = (fastpipe.ImageDataset(spec["packed"]) if key == "fastpipe_packed"
              else fastpipe.ImageFolder(spec["tree"], cache_dir=spec["index"]))
        ld = fastpipe.Loader(ds, batch_size=b, shuffle=True, seed=seed, num_threads=k, transforms={0: tf},
                             drop_last=True)
        return ib.Pipeline(lambda: iter(ld), len(ld), close=ld.close, info={"io_modes": list(ld.io_modes)})
    if key in ("dl_pil", "dl_pil_recipe", "dl_pil_recipe_bicubic"):
        return ib.dataloader_pil(spec["tree"], size, b, k, seed, recipe=key.startswith("dl_pil_recipe"),
                                 interpolation="bicubic" if key == "dl_pil_recipe_bicubic" else "bilinear")
    if key == "dl_decode_jpeg":
        return ib.dataloader_decode_jpeg(spec["tree"], size, b, k, seed)
    if key == "dali_cpu":
        return ib.dali_cpu(spec["tree"], size, b, k, spec["num_images"], seed)
    if key == "ffcv":
        return ib.ffcv_loader(spec["beton"], size, b, k, seed)
    raise KeyError(key)


def timed_pass(p, files: list[str], state: str, spec: dict, size: int) -> dict:
    """One epoch from iter() to its last batch after the page cache is made warm or cold; the
    consumer checks every batch and reads every pixel. CPU time: this process's threads (less the
    memory sampler's) and the worker processes that ended during the pass."""
    primed = None
    if state == "cold" and p.read_ahead:  # an untimed cold epoch first (see Pipeline.read_ahead)
        p.before_evict()
        evict(files)
        t0 = time.perf_counter()
        it = p.epoch()
        for _ in it:
            pass
        p.close_iter(it)
        del it
        primed = time.perf_counter() - t0
    if state == "cold":
        p.before_evict()
    gc.collect()
    cache = prepare_cache(files, state)
    sampler = MemorySampler()
    sampler.start()
    s0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    it = p.epoch()
    images = batches = 0
    total = 0.0
    for batch in it:
        total += check_batch(batch, size, spec["batch"], spec["classes"])
        images += spec["batch"]
        batches += 1
        del batch
    seconds = time.perf_counter() - t0
    p.close_iter(it)
    del it
    s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.stop()
    if batches != p.batches:
        raise AssertionError(f"an epoch gave {batches} batches, expected {p.batches}")
    cpu_self = cpu_seconds(s1) - cpu_seconds(s0) - sampler.cpu_seconds
    cpu_children = cpu_seconds(c1) - cpu_seconds(c0)
    return {"state": state, "seconds": seconds, "images": images, "batches": batches,
            "images_per_s": images / seconds, "cpu_self_s": cpu_self, "cpu_children_s": cpu_children,
            "cpu_s_per_1000": 1000 * (cpu_self + cpu_children) / images,
            "peak_rss_mib": sampler.peak_rss / 2**20, "peak_pss_mib": sampler.peak_pss / 2**20,
            "memory_samples": sampler.samples, "pixel_sum": total, "primed_seconds": primed, **cache}


def measure_case(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)  # the consumer's sums; DataLoader's workers use 1 thread each anyway
    key = spec["loader"]
    files = source_files(spec, LOADERS[key].source)
    res = {"loader": key, "pid": os.getpid(), "sizes": {}, "source_files": len(files),
           "source_bytes": sum(os.path.getsize(f) for f in files)}
    for size in spec["sizes"]:
        entry = res["sizes"][str(size)] = {"passes": {}}
        p = None
        try:
            t0 = time.perf_counter()
            p = build_pipeline(key, spec, size)
            entry["build_s"] = time.perf_counter() - t0
            entry["info"] = p.info
            t0 = time.perf_counter()
            it = p.epoch()
            xs = []
            for j in range(min(spec["warmup"], p.batches)):
                batch = next(it)
                if "first_batch_after_launch_s" not in res:
                    res["first_batch_after_launch_s"] = time.time() - spec["launched"]
                check_batch(batch, size, spec["batch"], spec["classes"])
                x, y = batch[0], batch[1]
                xs.append((float(x.mean()), float(x.std()), float(x.min()), float(x.max()), int(y.min()),
                           int(y.max())))
                del batch, x, y
            p.close_iter(it)
            del it
            entry["warmup_s"] = time.perf_counter() - t0
            entry["warmup_batches"] = len(xs)
            entry["pixels"] = {"mean": float(np.mean([v[0] for v in xs])), "std": float(np.mean([v[1] for v in xs])),
                               "min": min(v[2] for v in xs), "max": max(v[3] for v in xs)}
            entry["labels"] = [min(v[4] for v in xs), max(v[5] for v in xs)]
            entry["torch_threads"] = torch.get_num_threads()
            for state in spec["states"]:
                entry["passes"][state] = timed_pass(p, files, state, spec, size)
        except Exception as e:
            traceback.print_exc()
            entry["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
        finally:
            if p is not None:
                try:
                    p.close()
                except Exception:
                    traceback.print_exc()
            del p
            gc.collect()
    res["ru_maxrss_self_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["ru_maxrss_children_mib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return res


def case_main(argv: list[str]) -> int:
    """``python -m fastpipe.bench.images --case SPEC.json``: runs one case, writes its JSON to spec["result"]."""
    if len(argv) != 2 or argv[0] != "--case":
        print("usage: python -m fastpipe.bench.images --case SPEC.json (run by the images suite)", file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        spec = json.load(f)
    try:
        if spec["action"] == "write_beton":
            res = ib.write_beton(spec["tree"], spec["beton"], spec["threads"])
        else:
            needs = LOADERS[spec["loader"]].needs
            try:
                if needs:
                    __import__(needs)
            except Exception as e:  # installed but broken: a skip with the reason, not a failure
                res = {"skipped": f"import {needs} failed: {type(e).__name__}: {e}"}
            else:
                res = measure_case(spec)
    except Exception as e:
        traceback.print_exc()
        res = {"error": f"{type(e).__name__}: {str(e).strip()[:300]}"}
    bc.write_json(res, spec["result"])
    sys.stdout.flush()
    sys.stderr.flush()
    # DALI's and FFCV's threads and finalizers can make a normal exit slow or noisy; the result is written.
    os._exit(0)


def spawn_case(spec: dict, timeout: float) -> dict:
    """Runs a case in a fresh interpreter (its own session, so a timeout ends its workers too)."""
    with tempfile.TemporaryDirectory(prefix="fastpipe-images-case-") as tmp:
        spec = {**spec, "result": os.path.join(tmp, "result.json"), "launched": time.time()}
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump(spec, f)
        log = os.path.join(tmp, "log.txt")
        with open(log, "w") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "fastpipe.bench.images", "--case",
                                     os.path.join(tmp, "spec.json")], stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        with open(log, errors="replace") as f:
            tail = f.read()[-3000:]
        try:
            with open(spec["result"]) as f:
                res = json.load(f)
        except (OSError, ValueError):
            why = f"timed out after {timeout:.0f} s" if rc is None else f"exited with {rc}"
            lines = [line for line in tail.strip().splitlines() if line.strip()]
            res = {"error": f"the case process {why}" + (f": {lines[-1][:300]}" if lines else "")}
        res["log_tail"] = tail
        return res


def budget_images(minutes: float) -> int:
    """The default run's corpus size for a budget: BUDGET_IMAGES_PER_MINUTE, in hundreds, within
    [BUDGET_MIN_IMAGES, IMAGES]."""
    return int(min(IMAGES, max(BUDGET_MIN_IMAGES, round(minutes * BUDGET_IMAGES_PER_MINUTE / 100) * 100)))


def run(args, out) -> dict:
    quick, full = args.quick, args.full
    keys = [s.strip() for s in args.loaders.split(",") if s.strip()]
    bad = [s for s in keys if s not in LOADERS]
    if bad or not keys:
        raise SystemExit(f"images --loaders: unknown {bad}; choose from {','.join(LOADERS)}")
    kinds = [s.strip() for s in args.corpora.split(",") if s.strip()]
    if not kinds or any(s not in KINDS for s in kinds):
        raise SystemExit(f"images --corpora: a subset of {','.join(KINDS)}, got {args.corpora!r}")
    try:
        sizes = ([int(s) for s in args.sizes.split(",") if s.strip()] if args.sizes else
                 list(SIZES if full else BUDGET_SIZES))
    except ValueError:
        raise SystemExit(f"images --sizes: integers, got {args.sizes!r}") from None
    states = [s.strip() for s in args.cache.split(",") if s.strip()]
    if not sizes or any(s < 8 for s in sizes) or not states or any(s not in STATES for s in states):
        raise SystemExit(f"images: --sizes needs sizes >= 8 and --cache a subset of {','.join(STATES)}")
    minutes = None if quick or full else (args.budget_minutes or BUDGET_MINUTES["images"])
    budget = bc.Budget(minutes)
    n = args.images or (QUICK_IMAGES if quick else IMAGES if full else budget_images(minutes))
    batch = args.batch_size or (QUICK_BATCH if quick else BATCH)
    k = args.threads or usable_cpus()
    reps = args.reps or (1 if quick else FULL_REPS if full else None)  # None: from the budget
    if n < CLASSES or n // batch < 1 or k < 1 or (reps is not None and reps < 1):
        raise SystemExit(f"images: need --images >= {CLASSES} and at least one batch ({n} images, batch {batch})")
    try:
        import PIL.Image  # noqa: F401  (the corpus painter's)
    except ImportError:
        why = ("images suite skipped: its corpus is made with Pillow, which is not installed "
               "(pip install pillow, or fastpipe[bench])")
        out.note(why)
        return {"skipped": why, "headline": [why]}

    mode = "QUICK mode: not figures" if quick else "full run" if full else (
        f"time budget {minutes:g} min (--budget-minutes; --full for the publication run)")
    out.log(f"fastpipe images benchmark — {bc.machine_line(out.facts)}")
    out.note(f"k = {k} threads or workers for every loader, batch {batch}, sizes {sizes}, cache {states}, "
             f"{reps or 'budgeted'} repetition(s), {n} images per corpus ({', '.join(kinds)}); {mode}")
    settings = {"images": n, "batch": batch, "threads": k, "sizes": sizes, "states": states, "corpora": kinds,
                "reps": reps, "warmup": WARMUP_BATCHES if not quick else 2, "seed": args.seed,
                "budget_minutes": minutes, "full": full,
                "baseline": BASELINE, "recipe": RECIPE, "cold_limit": COLD_LIMIT, "sample_interval_s": SAMPLE_INTERVAL,
                "loaders": {key: LOADERS[key]._asdict() for key in keys}}
    results = {"settings": settings, "corpora": {}}
    timeout = CASE_TIMEOUT["quick" if quick else "full" if full else "budget"]

    # Every corpus is made (or found) first; then the repetitions run over all of them, so that the budget
    # can be judged after each.
    prepared = [prepare_corpus(kind, keys, settings, args, out, timeout) for kind in kinds]
    for p in prepared:
        results["corpora"][p["results"]["corpus"]["kind"]] = p["results"]
    total = sum(len(p["active"]) for p in prepared)
    # Repetitions: a fixed count, or within the budget another while the slowest so far still fits.
    lo, hi = (reps, reps) if reps else (MIN_REPS, FULL_REPS)
    times = []
    with out.progress(total=hi * total, desc="images", unit="case") as bar:
        while budget.more(times, lo, hi):
            t0 = time.perf_counter()
            for p in prepared:
                run_rep(p, len(times), reps, timeout, out, bar)
                out.checkpoint(results)
            times.append(time.perf_counter() - t0)
    reps = settings["reps"] = len(times)
    out.note(budget.line(times, "every row on every corpus"))
    for p in prepared:
        finish_corpus(p, keys, out)
    results["headline"] = [line for kind in kinds
                           for line in headline(results["corpora"][kind], sizes, states)]
    return results


def prepare_corpus(kind: str, keys: list, settings: dict, args, out, timeout: float) -> dict:
    """One corpus made (or found) and its peers' availability: what its repetitions need."""
    n, k = settings["images"], settings["threads"]
    data_dir = os.path.join(args.data_dir, "quick") if args.quick else args.data_dir
    facts = out.facts
    c = corpus_paths(data_dir, n, args.seed, args.grain, kind)
    corpus = ensure_corpus(c, n, args.seed, args.grain, k, out, kind)
    corpus["kind"] = kind
    facts["data_dir"] = os.path.dirname(c.dir)
    facts["data_dir_filesystem"] = bc.filesystem_of(c.dir)
    if facts["usable_cpus"] and os.getloadavg()[0] > 0.5 * facts["usable_cpus"]:
        out.note(f"NOTE: load average {os.getloadavg()[0]:.1f} on {facts['usable_cpus']} CPUs before the {kind} "
                 "corpus: other work is running, the numbers will be noisy (see the spread column)")
    skipped = {}
    for key in keys:
        needs = LOADERS[key].needs
        why = (JPEG_ONLY[key] if kind != "jpeg" and key in JPEG_ONLY else None) or (
            ib.peer_missing(needs) if needs else None)
        if why:
            skipped[key] = why
    if "ffcv" in keys and "ffcv" not in skipped:
        why = ensure_beton(c, k, corpus, out, timeout)
        if why:
            skipped["ffcv"] = why
    active = [key for key in keys if key not in skipped]
    results = {"settings": settings, "corpus": corpus, "skipped": skipped, "runs": {key: [] for key in active}}
    spec = {"action": "measure", "tree": c.tree, "packed": c.packed, "beton": c.beton, "index": c.index,
            "num_images": n, "classes": CLASSES, "batch": settings["batch"], "threads": k, "seed": args.seed,
            "warmup": settings["warmup"]}
    return {"kind": kind, "dir": c.dir, "active": active, "spec": spec, "results": results}


def run_rep(p: dict, r: int, reps, timeout: float, out, bar) -> None:
    """Repetition r of every loader on one corpus, in an order rotated each repetition (and the sizes and
    cache states inside each case process too)."""
    kind, results, spec = p["kind"], p["results"], p["spec"]
    skipped, sizes, states = results["skipped"], results["settings"]["sizes"], results["settings"]["states"]
    for key in rotated(p["active"], r):
        if key in skipped:  # its import failed in an earlier repetition
            bar.update()
            continue
        res = spawn_case({**spec, "loader": key, "sizes": rotated(sizes, r), "states": rotated(states, r)}, timeout)
        if "skipped" in res:
            skipped[key] = res["skipped"]
        errors = [f"{s}: {e['error']}" for s, e in res.get("sizes", {}).items() if "error" in e]
        if "error" in res or errors:
            out.progress_line(f"  {LOADERS[key].label}: {res.get('error') or '; '.join(errors)}\n"
                              + res.get("log_tail", "")[-1500:])
        if "error" not in res and not errors:
            res.pop("log_tail", None)  # kept in the JSON only where something went wrong
        results["runs"][key].append(res)
        done = [f"{s} {st} {bc.fmt_rate(q['images_per_s'])}/s" for s, e in res.get("sizes", {}).items()
                for st, q in e.get("passes", {}).items()]
        out.progress_line(f"  {kind} rep {r + 1}/{reps or '?'} {LOADERS[key].label}: {', '.join(done) or 'no pass'}")
        bar.update()


def finish_corpus(p: dict, keys: list, out) -> None:
    """One corpus's facts, skipped rows, summary rows and tables."""
    kind, results = p["kind"], p["results"]
    corpus, skipped, settings = results["corpus"], results["skipped"], results["settings"]
    n, sizes, states = settings["images"], settings["sizes"], settings["states"]
    formats = ", ".join(f"{v} {f}" for f, v in corpus.get("formats", {"JPEG": n}).items())
    out.table(["images", "count", "mean KB", "bits/pixel"],
              [[g, v["count"], bc.fmt(v["mean_kb"], ".1f"), bc.fmt(v["bpp"], ".2f")]
               for g, v in corpus["groups"].items()]
              + [["all", corpus["count"], bc.fmt(corpus["mean_kb"], ".1f"), bc.fmt(corpus["bpp"], ".2f")]],
              title=f"Corpus ({kind}): {n} images ({formats}) in {CLASSES} classes from {corpus['source']} "
                    f"(crops, zoom, flips, colour jitter, sharpening, grain sigma {corpus['grain_sigma']:g}), "
                    f"JPEG q{JPEG_QUALITY} 4:2:0; {corpus['total_mb']:.0f} MB, packed {corpus['packed_mb']:.0f} MB"
                    + (f", FFCV .beton {corpus['beton_mb']:.0f} MB" if "beton_mb" in corpus else ""))
    out.note(f"corpus: {p['dir']} ({out.facts['data_dir_filesystem'].get('fstype')}); mean file "
             f"{corpus['mean_kb_typical']:.0f} KB without the large ones (ImageNet's train images: ~110 KB)")
    for key, why in skipped.items():
        out.note(f"{kind} corpus: skipped {LOADERS[key].label}: {why}")
    for key in list(results["runs"]):
        if key in skipped:
            del results["runs"][key]
    results["rows"] = summarize(results, keys, sizes, states)
    report(results, keys, sizes, states, out)


if __name__ == "__main__":
    sys.exit(case_main(sys.argv[1:]))
