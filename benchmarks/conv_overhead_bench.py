"""Per-call cost of the fused convolution on small calls, where overhead dominates: fastpipe's op,
functional and module against the eager pair a user writes, in one run (fp32, no_grad, the CPU).

Rows are the issue's: a squeeze-excite 1x1 conv at 1x1, depthwise 3x3 at 7x7 and at 1x1 (hardswish).
Each call is timed as the best of 7 rounds of N calls, interleaved across the variants; the table shows
microseconds per call and fastpipe minus eager. Figures: op <= +1 us, functional and module <= +2 us.

    python benchmarks/conv_overhead_bench.py [--calls 5000] [--threads 2] [--out file.json]
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))  # an in-place build works too

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fastpipe.nn as fnn  # noqa: E402
from fastpipe.nn.functional import conv2d_act  # noqa: E402

ACT = {"relu": (F.relu, nn.ReLU), "hardswish": (F.hardswish, nn.Hardswish)}
ROWS = [  # label, C_in, C_out, H=W, kernel, groups, activation
    ("1x1 conv 16>8 at 1x1 (squeeze-excite)", 16, 8, 1, 1, 1, "relu"),
    ("depthwise 3x3 c=16 at 7x7, hardswish", 16, 16, 7, 3, 16, "hardswish"),
    ("depthwise 3x3 c=576 at 1x1, hardswish", 576, 576, 1, 3, 576, "hardswish"),
]


def best_us(fn, calls, rounds):
    for _ in range(max(100, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    with torch.no_grad():
        for label, cin, cout, size, k, groups, act in ROWS:
            x = torch.randn(1, cin, size, size)
            pad = k // 2
            fused = fnn.FusedConv2d(cin, cout, k, padding=pad, groups=groups, activation=act)
            stock = nn.Conv2d(cin, cout, k, padding=pad, groups=groups)
            stock.load_state_dict(fused.state_dict())
            act_fn, act_mod = ACT[act]
            stock_act = act_mod()
            w, b = fused.weight, fused.bias
            op = torch.ops.fastpipe.conv2d_act.default
            variants = {
                "eager F.conv2d + F.act": lambda: act_fn(F.conv2d(x, w, b, 1, pad, 1, groups)),
                "fastpipe torch.ops op": lambda: op(x, w, b, [1, 1], [pad, pad], [1, 1], groups, act, [], None),
                "fastpipe functional": lambda: conv2d_act(x, w, b, padding=pad, groups=groups, activation=act),
                "stock Conv2d + act module": lambda: stock_act(stock(x)),
                "fastpipe FusedConv2d": lambda: fused(x),
            }
            times = {name: float("inf") for name in variants}
            for _ in range(args.rounds):  # interleaved: drifting load hits all alike
                for name, fn in variants.items():
                    times[name] = min(times[name], best_us(fn, args.calls, 1))
            results.append({"row": label, "us": times})
    print(f"per-call cost, fp32, no_grad, {args.threads} threads ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__})")
    print(f"{'call':40s} {'eager':>7s} {'op':>7s} {'func':>7s} {'mod':>7s} {'fused':>7s} "
          f"{'op-e':>6s} {'func-e':>7s} {'fused-mod':>9s}")
    for r in results:
        t = r["us"]
        e, o, f, m, fu = (t["eager F.conv2d + F.act"], t["fastpipe torch.ops op"], t["fastpipe functional"],
                          t["stock Conv2d + act module"], t["fastpipe FusedConv2d"])
        r["overhead_us"] = {"op": o - e, "functional": f - e, "module": fu - m}
        print(f"{r['row']:40s} {e:7.2f} {o:7.2f} {f:7.2f} {m:7.2f} {fu:7.2f} {o - e:+6.2f} {f - e:+7.2f} "
              f"{fu - m:+9.2f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"torch": torch.__version__, "threads": args.threads, "rows": results}, fh, indent=1)


if __name__ == "__main__":
    main()
