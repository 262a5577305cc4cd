"""Whole torchvision models in eval: fastpipe's fuse() against the model as it is (eager) and against the
free alternative a user already has, folding BatchNorm into the convolutions and nothing else
(torch.fx.experimental.optimization.fuse), in one run.

For each model, batch size and layout the three variants run interleaved in a rotating order after
warm-up (fuse()'s engine timing included in the warm-up), and the median of the repetitions is kept.
Figures: fuse() >= 1.0x the fold-only rewrite everywhere; the geomean over eager is reported.

    python benchmarks/model_bench.py [--models resnet18,mobilenet_v2] [--batch 1 8] [--reps 7]
"""

import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import torch  # noqa: E402

import fastpipe.nn as fnn  # noqa: E402

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny"]


def fold_only(model):
    from torch.fx.experimental.optimization import fuse as fx_fold

    return fx_fold(model)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8])
    p.add_argument("--layout", nargs="+", default=["nchw", "channels_last"])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torchvision

    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    with torch.no_grad():
        for name in args.models.split(","):
            base = getattr(torchvision.models, name)(weights=None).eval()
            for layout in args.layout:
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                eager = base.to(memory_format=fmt)
                folded, fused = fold_only(eager), fnn.fuse(eager)
                for batch in args.batch:
                    x = torch.randn(batch, 3, args.size, args.size).contiguous(memory_format=fmt)
                    measured = fnn.fuse(eager, example_inputs=(x,))
                    variants = {"eager": eager, "fold-only": folded, "fastpipe fuse()": fused,
                                "fuse(example_inputs)": measured}
                    for m in variants.values():  # warm-up: oneDNN primitives, fuse()'s engine timing
                        for _ in range(2):
                            m(x)
                    samples = {k: [] for k in variants}
                    names = list(variants)
                    for rep in range(args.reps):
                        k = rep % len(names)
                        for v in names[k:] + names[:k]:
                            t0 = time.perf_counter()
                            variants[v](x)
                            samples[v].append(time.perf_counter() - t0)
                    ms = {k: 1e3 * statistics.median(s) for k, s in samples.items()}
                    row = {"model": name, "batch": batch, "layout": layout, "ms": ms,
                           "fuse_over_fold": ms["fold-only"] / ms["fastpipe fuse()"],
                           "measured_over_fold": ms["fold-only"] / ms["fuse(example_inputs)"],
                           "measured_over_eager": ms["eager"] / ms["fuse(example_inputs)"],
                           "fold_over_eager": ms["eager"] / ms["fold-only"],
                           "fused_sites": len(measured.fuse_report.fused), "kept_stock": len(measured.fuse_report.kept)}
                    rows.append(row)
                    print(f"{name:18s} b{batch:<2d} {layout:13s} eager {ms['eager']:8.2f} ms  fold {ms['fold-only']:8.2f}  "
                          f"fuse {ms['fastpipe fuse()']:8.2f}  fuse(ex) {ms['fuse(example_inputs)']:8.2f}  "
                          f"fuse/fold {row['fuse_over_fold']:.3f}x  fuse(ex)/fold {row['measured_over_fold']:.3f}x "
                          f"(kept {row['kept_stock']}/{row['fused_sites']})", flush=True)

    def geomean(v):
        return math.exp(sum(math.log(x) for x in v) / len(v))

    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, fp32, eval, no_grad")
    print(f"geomean over eager: fuse(example_inputs) {geomean([r['measured_over_eager'] for r in rows]):.3f}x, "
          f"fold-only {geomean([r['fold_over_eager'] for r in rows]):.3f}x; over fold-only: fuse() "
          f"{geomean([r['fuse_over_fold'] for r in rows]):.3f}x (worst {min(r['fuse_over_fold'] for r in rows):.3f}x), "
          f"fuse(example_inputs) {geomean([r['measured_over_fold'] for r in rows]):.3f}x "
          f"(worst {min(r['measured_over_fold'] for r in rows):.3f}x)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
