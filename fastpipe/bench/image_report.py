"""The images suite's summary and report: per corpus, the rows of each output size and page-cache state
(medians over repetitions, each row's ratio to its baseline in the same repetition), the tables, the
plots and the headline lines. The runs themselves are fastpipe/bench/images.py's."""

from __future__ import annotations

import math

from fastpipe.bench import common as bc
from fastpipe.bench.image_measure import COLD_LIMIT
from fastpipe.bench.image_rows import BASELINE, BASELINE_OF, JPEG_ONLY, LOADERS, PLAIN_OF, RECIPE

# --------------------------------------------------------------------------------------------------
def _passes(results: dict, key: str, size: int, state: str) -> list:
    """Per repetition: the pass dict, or None where it is missing."""
    return [r.get("sizes", {}).get(str(size), {}).get("passes", {}).get(state) for r in results["runs"][key]]


def summarize(results: dict, keys: list, sizes: list, states: list) -> dict:
    rows = {}
    for size in sizes:
        for state in states:
            table = {}
            for key in keys:
                base_key = BASELINE_OF.get(key, BASELINE)
                base = _passes(results, base_key, size, state) if base_key in results["runs"] else []
                if key in results["skipped"]:
                    table[key] = {"skipped": results["skipped"][key]}
                    continue
                ps = _passes(results, key, size, state)
                good = [p for p in ps if p]
                if not good:
                    errs = [r.get("sizes", {}).get(str(size), {}).get("error") or r.get("error") or r.get("skipped")
                            for r in results["runs"][key]]
                    table[key] = {"error": next((e for e in errs if e), "no pass completed")}
                    continue
                rates = [p["images_per_s"] for p in good]
                ratios = [p["images_per_s"] / b["images_per_s"] for p, b in zip(ps, base) if p and b]
                cached = [p["cached_at_start"] for p in good if p["cached_at_start"] is not None]
                table[key] = {
                    "images_per_s": bc.median(rates), "images_per_s_best": max(rates),
                    "spread_pct": bc.spread_pct(rates), "x_vs_baseline": bc.median(ratios),
                    "cpu_s_per_1000": bc.median([p["cpu_s_per_1000"] for p in good]),
                    "peak_rss_mib": max(p["peak_rss_mib"] for p in good),
                    "peak_pss_mib": max(p["peak_pss_mib"] for p in good),
                    "cached_at_start": bc.median(cached) if cached else None,
                    "cached_at_start_max": max(cached) if cached else None,
                    "reps": len(good),
                }
            rows[f"{size}_{state}"] = table
    return rows


def pair_ratios(results: dict, a: str, b: str, size: int, state: str) -> list[float]:
    """Per repetition, rate(a) / rate(b) (same repetition: drift cancels)."""
    pa, pb = (_passes(results, k, size, state) if k in results["runs"] else [] for k in (a, b))
    return [x["images_per_s"] / y["images_per_s"] for x, y in zip(pa, pb) if x and y]


def pair_ratio(results: dict, a: str, b: str, size: int, state: str) -> float:
    """Median over repetitions of rate(a) / rate(b)."""
    return bc.median(pair_ratios(results, a, b, size, state))


def _times_range(ratios: list) -> str:
    """A median ratio with the range of the repetitions' ratios beside it: '3.05x (2.90-3.21)'."""
    med = _times(bc.median(ratios))
    return f"{med} ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else med


def _times(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}x"


def _pct(v):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.0f}%"


def report(results: dict, keys: list, sizes: list, states: list, out) -> None:
    """The tables and plots of one corpus's results."""
    k = results["settings"]["threads"]
    kind = results["corpus"]["kind"]
    base_label = LOADERS[BASELINE].label
    for size in sizes:
        for state in states:
            table = []
            rows = results["rows"][f"{size}_{state}"]
            marks = set()
            for key in keys:
                r = rows[key]
                label = LOADERS[key].label
                if "skipped" in r:
                    table.append([label, "skipped: " + r["skipped"][:70]] + [""] * 6)
                    continue
                if "error" in r:
                    table.append([label, "error: " + r["error"][:70]] + [""] * 6)
                    continue
                mark = ""
                if state == "cold" and (r["cached_at_start_max"] or 0) > COLD_LIMIT:
                    mark = " *" if key == "dali_cpu" else " !"
                    marks.add(mark)
                table.append([label + mark, bc.fmt_rate(r["images_per_s"]), _times(r["x_vs_baseline"]),
                              bc.fmt(r["cpu_s_per_1000"], ".1f"),
                              bc.fmt(r["peak_rss_mib"], ".0f"), bc.fmt(r["peak_pss_mib"], ".0f"),
                              _pct(r["spread_pct"] / 100), _pct(r["cached_at_start"])])
            out.table(["loader", "images/s", f"x vs {base_label}", "CPU s / 1000 img", "peak RSS MiB",
                       "peak PSS MiB", "spread", "cached at start"], table,
                      title=f"{kind} corpus, {size}x{size}, {state} page cache, k={k}, batch "
                            f"{results['settings']['batch']} (images/s: median of {results['settings']['reps']} "
                            f"repetition(s))")
            if " !" in marks:
                out.note(f"! more than {COLD_LIMIT:.0%} of this loader's files were still cached when a cold pass "
                         "started (pages a process keeps mapped cannot be evicted): its cold figure is flattered")
            if " *" in marks:
                out.note("* DALI's file reader keeps up to initial_fill=1024 samples of the next epoch mapped in its "
                         "shuffle buffer: they stay cached, but were read from the disk during an untimed cold "
                         "epoch just before, as in steady-state training on data that does not fit in memory")
        out.bars(f"images_{size}" if kind == "jpeg" else f"images_{kind}_{size}",
                 f"{kind} corpus, {size}x{size}, k={k}: images/s (median of repetitions)",
                 {state: {LOADERS[key].label: results["rows"][f"{size}_{state}"][key].get("images_per_s")
                          for key in keys} for state in states}, "images/s")
    out.note("Every row yields float32 [B, 3, S, S] NCHW + int64 labels from RandomResizedCrop(S) + flip + "
             f"normalise (the TA recipe rows: {RECIPE}, their 'x vs' against the DataLoader row running the same "
             "recipe); 'x vs' is the median of per-repetition ratios; CPU s includes worker processes and "
             "threads; RSS sums the processes (forked workers share pages, counted once per process), PSS "
             "divides shared pages among them."
             + (" FFCV reads images it re-encoded at q90 "
                f"({results['corpus']['beton_mb']:.0f} MB .beton vs {results['corpus']['total_mb']:.0f} MB of "
                "original JPEGs), not the original files." if "beton_mb" in results["corpus"] else ""))
    st = []
    for key in keys:
        runs = results["runs"].get(key) or []
        firsts = [r.get("first_batch_after_launch_s") for r in runs]
        build = [e.get("build_s") for r in runs for e in r.get("sizes", {}).values()]
        wu = [e.get("warmup_s") for r in runs for e in r.get("sizes", {}).values()]
        if key in results["skipped"] or not any(v is not None for v in firsts):
            continue
        st.append([LOADERS[key].label, bc.fmt(bc.median(firsts), ".1f"), bc.fmt(bc.median(build), ".2f"),
                   bc.fmt(bc.median(wu), ".2f")])
    if st:
        warmup = results["settings"]["warmup"]
        out.table(["loader", "launch to first batch s", "build s", f"warm-up s ({warmup} batches)"],
                  st, title=f"{kind} corpus, start-up (median over processes): interpreter + imports + build + "
                            "first batch; DALI builds and FFCV JIT-compiles in the warm-up")


def headline(results: dict, sizes: list, states: list) -> list[str]:
    """One corpus's headline lines."""
    size = 224 if 224 in sizes else sizes[0]
    state = "warm" if "warm" in states else states[0]
    k = results["settings"]["threads"]
    kind = results["corpus"]["kind"]
    lines = []
    n_reps = results["settings"].get("reps") or 0
    reps = f"; medians of {n_reps} reps, ratio ranges in brackets" if n_reps > 1 else ""
    fp = [key for key in ("fastpipe_folder", "fastpipe_packed") if key in results["runs"]]
    names = {"fastpipe_folder": "ImageFolder", "fastpipe_packed": "packed"}
    for peer, what in ((BASELINE, "DataLoader + v2 (PIL)"), ("dali_cpu", "DALI CPU"), ("ffcv", "FFCV")):
        if not fp:
            break
        if peer in results["skipped"]:
            if peer not in JPEG_ONLY or kind == "jpeg":
                lines.append(f"fastpipe vs {what}, {kind}, {size} {state}: skipped ({results['skipped'][peer]})")
            continue
        if peer not in results["runs"]:
            continue
        parts = [f"{names[key]} {_times_range(pair_ratios(results, key, peer, size, state))}" for key in fp]
        rows = results["rows"][f"{size}_{state}"]
        rates = " and ".join(bc.fmt_rate(rows[key].get("images_per_s")) for key in fp)
        lines.append(f"fastpipe vs {what}, {kind}, {size}x{size} {state}, k={k}: {', '.join(parts)} "
                     f"({rates} vs {bc.fmt_rate(rows[peer].get('images_per_s'))} images/s{reps})")
    for ours, theirs, what, costs in (
            ("fastpipe_recipe", "dl_pil_recipe", "TA recipe", "the augmentations cost (1 - recipe/plain rate)"),
            ("fastpipe_recipe_bicubic", "dl_pil_recipe_bicubic", "TA recipe bicubic",
             "the bicubic crop and augmentations cost (1 - recipe/plain bilinear rate)")):
        if ours not in results["runs"] or theirs not in results["runs"]:
            continue
        cost = ", ".join(f"{LOADERS[key].label.split(',')[0]} {_pct(1 - pair_ratio(results, key, PLAIN_OF[key], size, state))}"
                         for key in (ours, theirs) if PLAIN_OF[key] in results["runs"])
        lines.append(f"fastpipe vs DataLoader + v2 (PIL), {what}, {kind}, {size}x{size} {state}, k={k}: "
                     f"{_times_range(pair_ratios(results, ours, theirs, size, state))}"
                     + (f"; {costs}: {cost}" if cost else ""))
    return lines
