"""``fastpipe-bench`` / ``python -m fastpipe.bench``: one subcommand per suite, and ``all``."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from fastpipe.bench import BUDGET_MINUTES, SUITES, load_suite
from fastpipe.bench.common import Report

DEFAULT_OUT_DIR = "fastpipe-bench-results"
DEFAULT_DATA_DIR = "fastpipe-bench-data"
_INTERNAL = ("suite", "suites")  # parser bookkeeping, not options of a run


def _common_options(out_file: bool) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("common options")
    g.add_argument("--quick", action="store_true",
                   help="smoke run: small data (under DATA_DIR/quick), few repetitions, well under a minute on "
                        "2 cores; its numbers are not figures")
    g.add_argument("--full", action="store_true",
                   help="the publication run: every suite's full data sizes and repetitions, no time budget "
                        "(on 2 cores the loader, train and images suites take about an hour, the images suite "
                        "alone about 40 minutes)")
    g.add_argument("--budget-minutes", type=float, default=None, metavar="M",
                   help="wall-clock budget of a suite (for `all`: of the suites together, shared in "
                        "proportion to their own defaults): repetitions (and the images suite's corpus size) are "
                        "chosen to fit it, from the time each repetition takes (defaults: loader "
                        f"{BUDGET_MINUTES['loader']:g}, train {BUDGET_MINUTES['train']:g}, images "
                        f"{BUDGET_MINUTES['images']:g} minutes; the other suites have none)")
    g.add_argument("--out-dir", default=DEFAULT_OUT_DIR, metavar="DIR",
                   help="results directory (default: %(default)s)")
    if out_file:
        g.add_argument("--out", default=None, metavar="FILE",
                       help="JSON path, the markdown and plots beside it (default: "
                            "OUT_DIR/<suite>_<tag or hostname>_<date>.json)")
    g.add_argument("--tag", default=None, help="replaces the hostname in the result file names")
    g.add_argument("--data-dir", default=DEFAULT_DATA_DIR, metavar="DIR",
                   help="generated data sets, made once and reused (default: %(default)s)")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (there are none anyway when stderr is not a terminal)")
    return p


def suite_parser(name: str, prog: str) -> argparse.ArgumentParser | None:
    """A suite's parser: the common options and its own; None when this install lacks the suite. Only
    the suites that run are imported, so one suite's import cost or error does not touch the others."""
    module = load_suite(name)
    if module is None:
        return None
    p = argparse.ArgumentParser(prog=prog, description=(module.__doc__ or SUITES[name]).strip(),
                                parents=[_common_options(out_file=True)],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(p)
    return p


def _missing(name: str) -> str:
    return f"the {name} suite is not in this install (fastpipe/bench/{name}.py is missing)"


def run_suite(name: str, args: argparse.Namespace) -> dict:
    """Runs one suite and saves its report; returns the paths written, and the suite's headline (the
    lines of results["headline"], which `all` repeats at the end)."""
    if getattr(args, "quick", False) and getattr(args, "full", False):
        raise SystemExit("--quick and --full exclude each other")
    options = {k: v for k, v in vars(args).items() if k not in _INTERNAL}
    out = Report(name, os.path.abspath(args.out_dir), args.tag, getattr(args, "out", None),
                 show_progress=not args.no_progress, options=options)
    results = load_suite(name).run(args, out)
    files = out.save(results)
    out.log(f"\n{name}: results {files['json']}\n{name}: tables {files['markdown']}"
            + "".join(f"\n{name}: plot {p}" for p in files["plots"]))
    return {**files, "headline": results.get("headline", [])}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    top = argparse.ArgumentParser(
        prog=prog, description="Benchmarks of fastpipe against stock PyTorch. Each suite prints tables and "
        "writes JSON + markdown + PNG plots (with matplotlib), with the machine's facts, to --out-dir.",
        epilog="`%(prog)s SUITE --help` lists a suite's options.")
    sub = top.add_subparsers(dest="suite", required=True, metavar="{" + ",".join([*SUITES, "all"]) + "}")
    for name, summary in SUITES.items():
        sub.add_parser(name, help=summary, add_help=False)  # the suite's own parser reads the rest
    ap = sub.add_parser("all", help=f"runs {', '.join(SUITES)} in this order, each with its default options",
                        parents=[_common_options(out_file=False)])
    ap.add_argument("--suites", default=",".join(SUITES), help="comma-separated subset to run, in this order (default: %(default)s)")
    args, rest = top.parse_known_args(argv)
    if args.suite != "all":
        parser = suite_parser(args.suite, f"{top.prog} {args.suite}")
        if parser is None:
            print(f"{top.prog}: {_missing(args.suite)}", file=sys.stderr)
            return 2
        run_suite(args.suite, parser.parse_args(rest))
        return 0
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")

    names = [s.strip() for s in args.suites.split(",") if s.strip()]
    bad = [s for s in names if s not in SUITES]
    if bad:
        ap.error(f"--suites: unknown {bad}; choose from {','.join(SUITES)}")
    if args.quick and args.full:
        ap.error("--quick and --full exclude each other")
    budgets = {name: BUDGET_MINUTES.get(name) for name in names}
    total = sum(b for b in budgets.values() if b)
    status, headlines = {}, []
    for name in names:
        t0 = time.perf_counter()
        print(f"\n######## {name} ########", flush=True)
        try:
            parser = suite_parser(name, f"{top.prog} {name}")
            if parser is None:
                status[name] = f"skipped: {_missing(name)}"
                print(status[name], flush=True)
                continue
            suite_args = parser.parse_args([])  # the suite's defaults, then the common options given
            for key, value in vars(args).items():
                if key not in _INTERNAL:
                    setattr(suite_args, key, value)
            if args.budget_minutes is not None:  # the total, shared in proportion to the suites' own defaults
                suite_args.budget_minutes = (args.budget_minutes * budgets[name] / total) if budgets[name] else None
            files = run_suite(name, suite_args)
        except Exception:  # one failing suite does not cost the others' results
            traceback.print_exc()
            status[name] = "FAILED (traceback above)"
        else:
            status[name] = f"{time.perf_counter() - t0:.0f} s; {files['markdown']}" + (
                f" and {len(files['plots'])} plot(s) beside it" if files["plots"] else "")
            headlines += [f"  {name:7s} {line}" for line in files["headline"]]
    if headlines:
        print(f"\n{top.prog} all, headline:\n" + "\n".join(headlines))
    print(f"\n{top.prog} all:")
    for name, s in status.items():
        print(f"  {name:7s} {s}")
    return 1 if any(s.startswith("FAILED") for s in status.values()) else 0


def script(path: str, suite: str, **defaults) -> int:
    """main() of the repository's benchmarks/<name>.py: the suite, with its data and results in that
    folder's data/ and results/ and the script's own defaults (e.g. part="models"); same options."""
    here = os.path.dirname(os.path.abspath(path))
    parser = suite_parser(suite, os.path.basename(path))
    parser.set_defaults(data_dir=os.path.join(here, "data"), out_dir=os.path.join(here, "results"), **defaults)
    run_suite(suite, parser.parse_args())
    return 0
