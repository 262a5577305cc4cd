"""The conv suite: fastpipe's fused convolutions against what a user would write otherwise, in three parts.

layers    FusedConv2d against eager PyTorch and torch.compile, per shape of the issue's list. Eager is
          nn.Conv2d followed by the activation module as torchvision builds these networks (in-place
          ReLU/ReLU6/SiLU, GELU out of place, ``out += residual``), with cudnn.benchmark on; torch.compile
          is the default mode applied to that eager block. For each row the variants run interleaved in
          a rotating order after warm-up (which also makes FusedConv2d time its engines for the shape),
          and the median of the repetitions is kept; speedup = eager time / FusedConv2d time. With
          --runs N the sweep repeats and each row reports the median speedup over the runs. With
          --force-engines each forward engine of the device (validated or not) also runs forced, with
          its speedup over eager and the engines that really ran (an engine declines shapes it does not
          compute); in forward + backward rows the name also forces the backward engine of that name
          (CUDA's depthwise), the rest of the backward runs eager: the figures that validate a new
          engine on a GPU.
overhead  The per-call cost on small calls, where overhead dominates (the CPU, fp32, no_grad): fastpipe's
          op, functional and module against the eager pair a user writes. Each call is timed as the best
          of --rounds rounds of --calls calls, interleaved across the variants. Figures: op <= +1 us,
          functional and module <= +2 us.
models    Whole torchvision models in eval on the CPU (fp32, no_grad): fuse() and fuse(example_inputs)
          against the model as it is (eager) and against folding BatchNorm into the convolutions and
          nothing else (torch.fx.experimental.optimization.fuse), interleaved as above. Figure: fuse()
          >= 1.0x the fold-only rewrite everywhere; the geomean over eager is reported. Needs torchvision.

--quick runs a few rows of each part at small sizes, without torch.compile: a smoke test, not figures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import fastpipe.nn as fnn
from fastpipe.bench import common as bc
from fastpipe.nn.functional import conv2d_act

PARTS = ("layers", "overhead", "models")

Row = collections.namedtuple("Row", "family name cin cout size kernel stride groups activation residual")

# The shapes: (family, label, C_in, C_out, H=W, kernel, stride, groups, activation, residual).
SHAPES = [
    Row("resnet50", "stem 7x7/2 3>64 @224", 3, 64, 224, 7, 2, 1, "relu", False),
    Row("resnet50", "3x3 64>64 @56", 64, 64, 56, 3, 1, 1, "relu", False),
    Row("resnet50", "1x1 64>256 @56 +res", 64, 256, 56, 1, 1, 1, "relu", True),
    Row("resnet50", "3x3 256>256 @14", 256, 256, 14, 3, 1, 1, "relu", False),
    Row("resnet50", "1x1 1024>256 @14", 1024, 256, 14, 1, 1, 1, "relu", False),
    Row("resnet50", "3x3 512>512 @7", 512, 512, 7, 3, 1, 1, "relu", False),
    Row("mobilenetv2", "dw3x3 32 @112", 32, 32, 112, 3, 1, 32, "relu6", False),
    Row("mobilenetv2", "dw3x3 144 @56", 144, 144, 56, 3, 1, 144, "relu6", False),
    Row("mobilenetv2", "dw3x3 192 @28", 192, 192, 28, 3, 1, 192, "relu6", False),
    Row("mobilenetv2", "dw3x3 576 @14", 576, 576, 14, 3, 1, 576, "relu6", False),
    Row("mobilenetv2", "dw3x3 960 @7", 960, 960, 7, 3, 1, 960, "relu6", False),
    Row("mobilenetv2", "dw3x3/2 96 @112", 96, 96, 112, 3, 2, 96, "relu6", False),
    Row("convnext", "dw7x7 96 @56", 96, 96, 56, 7, 1, 96, "gelu", False),
    Row("convnext", "dw7x7 384 @14", 384, 384, 14, 7, 1, 384, "gelu", False),
    Row("convnext", "1x1 96>384 @56", 96, 384, 56, 1, 1, 1, "gelu", False),
    Row("efficientnet", "dw5x5 240 @28", 240, 240, 28, 5, 1, 240, "silu", False),
]
# --quick: one row per family (every activation, the residual), small enough for seconds on 2 cores.
QUICK_ROWS = ("1x1 64>256 @56 +res", "dw3x3 960 @7", "dw7x7 384 @14", "dw5x5 240 @28")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ACTIVATION_MODULES = {
    "relu": lambda: nn.ReLU(inplace=True),
    "relu6": lambda: nn.ReLU6(inplace=True),
    "gelu": nn.GELU,
    "silu": lambda: nn.SiLU(inplace=True),
    "hardswish": nn.Hardswish,
}

# The overhead part's rows: label, C_in, C_out, H=W, kernel, groups, activation.
OVERHEAD_ROWS = [
    ("1x1 conv 16>8 at 1x1 (squeeze-excite)", 16, 8, 1, 1, 1, "relu"),
    ("depthwise 3x3 c=16 at 7x7, hardswish", 16, 16, 7, 3, 16, "hardswish"),
    ("depthwise 3x3 c=576 at 1x1, hardswish", 576, 576, 1, 3, 576, "hardswish"),
]
ACTIVATION_FUNCTIONS = {"relu": F.relu, "hardswish": F.hardswish}

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny"]


def add_arguments(p):
    p.add_argument("--part", default=",".join(PARTS),
                   help=f"comma-separated subset of {','.join(PARTS)} (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batch", nargs="+", type=int,
                   help="batch sizes (default: layers 8 on CPU, 32 128 on CUDA; models 1 8; --quick 2, models 1)")
    p.add_argument("--layout", nargs="+", choices=["nchw", "channels_last"],
                   help="layers and models (default: both; --quick: models nchw only, as each layout re-times "
                        "every site of a model)")
    p.add_argument("--reps", type=int, default=None,
                   help="timed repetitions per row (default: layers 11, models 7; --quick 3)")
    g = p.add_argument_group("layers")
    g.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu; the other parts run on the CPU)")
    g.add_argument("--dtype", nargs="+", choices=list(DTYPES),
                   help="default: fp32 on CPU, bf16 fp16 fp32 on CUDA (--quick: bf16 on CUDA)")
    g.add_argument("--mode", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"],
                   help="forward only (no_grad) and/or forward + backward")
    g.add_argument("--rows", default="", help="only rows whose family or label contains this text")
    g.add_argument("--runs", type=int, default=1, help="repeat the sweep; rows report medians over runs")
    g.add_argument("--force-engines", action="store_true",
                   help="also time each engine of the device forced (unvalidated engines too)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the torch.compile column (default: on, off with --quick)")
    g = p.add_argument_group("overhead")
    g.add_argument("--calls", type=int, default=None, help="calls per round (default 5000, --quick 200)")
    g.add_argument("--rounds", type=int, default=None, help="rounds, the best counts (default 7, --quick 2)")
    g = p.add_argument_group("models")
    g.add_argument("--models", default=None, help=f"comma-separated torchvision models (default: "
                                                  f"{','.join(MODELS)}; --quick resnet18)")
    g.add_argument("--size", type=int, default=None, help="image size (default 224, --quick 32)")


# --------------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------------
def build_blocks(row, device, dtype, layout):
    """(eager, fused) blocks with the same parameters."""

    class Eager(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(row.cin, row.cout, row.kernel, row.stride, row.kernel // 2, groups=row.groups)
            self.act = ACTIVATION_MODULES[row.activation]()

        def forward(self, x, residual=None):
            y = self.conv(x)
            if residual is not None:
                y += residual
            return self.act(y)

    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = fnn.FusedConv2d(row.cin, row.cout, row.kernel, row.stride, row.kernel // 2, groups=row.groups,
                                        activation=row.activation)

        def forward(self, x, residual=None):
            return self.conv(x, residual=residual)

    eager = Eager()
    fused = Fused()
    fused.conv.load_state_dict(eager.conv.state_dict())
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    return (eager.to(device, dtype, memory_format=fmt), fused.to(device, dtype, memory_format=fmt))


class Timer:
    """Seconds per call of fn: CUDA events around a loop on the GPU, perf_counter on the CPU."""

    def __init__(self, device):
        self.cuda = device.startswith("cuda")

    def __call__(self, fn, inner):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner


def rotating(names: list, rep: int) -> list:
    """Repetition rep's order: interleaved, so that drifting load hits all alike, and rotated: on the CPU
    a call's time depends on what the previous one freed (allocator state, page faults)."""
    k = rep % len(names)
    return names[k:] + names[:k]


def measure_row(row, opts, dtype_name, batch, layout, mode, timer):
    device = opts["device"]
    dtype = DTYPES[dtype_name]
    torch.manual_seed(0)
    eager, fused = build_blocks(row, device, dtype, layout)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(batch, row.cin, row.size, row.size, device=device, dtype=dtype).contiguous(memory_format=fmt)
    out_size = (row.size + 2 * (row.kernel // 2) - row.kernel) // row.stride + 1
    res = None
    if row.residual:
        res = torch.randn(batch, row.cout, out_size, out_size, device=device, dtype=dtype).contiguous(memory_format=fmt)
    variants = {"eager": eager, "fused": fused}
    if opts["compile"]:
        variants["compile"] = torch.compile(eager)
    grad = torch.randn(batch, row.cout, out_size, out_size, device=device, dtype=dtype).contiguous(memory_format=fmt)

    def step(model):
        if mode == "fwd":
            def run():
                with torch.no_grad():
                    model(x, res)
        else:
            params = list(model.parameters())
            xg = x.detach().requires_grad_()

            def run():
                for p in params:
                    p.grad = None
                xg.grad = None
                model(xg, res).backward(grad)
        return run

    runs = {name: step(m) for name, m in variants.items()}
    forcing = {}  # variant -> the engine forced while it runs
    if opts["force_engines"]:
        for engine in fnn.conv_engines(device)[1:]:
            runs[f"forced:{engine}"], forcing[f"forced:{engine}"] = runs["fused"], engine

    def timed(name, inner):
        with fnn.use_conv_engine(forcing[name]) if name in forcing else contextlib.nullcontext():
            return timer(runs[name], inner)

    fnn.clear_conv_engine_cache()
    ran = {}
    for name in list(runs):  # warm-up: compilation, cuDNN plans, FusedConv2d's engine timing
        try:
            for _ in range(2):
                timed(name, 1)
        except RuntimeError as e:  # a forced engine that throws fails the call: reported, not timed
            if name not in forcing:
                raise
            ran[forcing.pop(name)] = ["failed: " + str(e).splitlines()[0]]
            del runs[name]
    choices = fnn.conv_engine_cache()
    engines = sorted({line.split(" -> ")[1].split()[0] for line in choices})
    thin = sum("; thin" in line for line in choices)  # choices the next run would re-time
    for name, engine in forcing.items():
        with fnn.use_conv_engine(engine):
            ran[engine] = engines_ran(runs[name])
    # Enough calls per sample that one sample takes >= 1 ms (GPU kernels are short).
    once = timer(runs["eager"], 1)
    inner = max(1, min(200, int(1e-3 / max(once, 1e-7)))) if timer.cuda else 1
    samples = collections.defaultdict(list)
    for rep in range(opts["reps"]):
        for name in rotating(list(runs), rep):
            samples[name].append(timed(name, inner))
    times = {name: bc.median(s) for name, s in samples.items()}
    result = {
        "family": row.family, "row": row.name, "activation": row.activation, "device": device,
        "dtype": dtype_name, "batch": batch, "layout": layout, "mode": mode,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "speedup": times["eager"] / times["fused"],
        "engines": engines, "thin_choices": thin, "choices": len(choices),
    }
    if "compile" in times:
        result["speedup_vs_compile"] = times["compile"] / times["fused"]
        result["compile_speedup"] = times["eager"] / times["compile"]
    if opts["force_engines"]:
        result["forced"] = {engine: {"speedup": times["eager"] / times[f"forced:{engine}"]
                                     if f"forced:{engine}" in times else None, "ran": ran[engine]}
                            for engine in fnn.conv_engines(device)[1:]}
    return result


def engines_ran(fn):
    """The conv engines one call of fn ran, from the profiler events each engine run records: forward
    engines by name, backward ones as "backward:<name>"."""
    names = {"fastpipe::conv_engine.": "", "fastpipe::conv_engine_backward.": "backward:"}
    with torch.autograd.profiler.profile() as prof:
        fn()
    return sorted({tag + e.name[len(prefix):] for e in prof.function_events for prefix, tag in names.items()
                   if e.name.startswith(prefix)})


def _config(r) -> str:
    return f"{r['device']} {r['dtype']} b{r['batch']} {r['layout']} {r['mode']}"


def summarize_layers(rows):
    """Geometric means of the speedups per (config, family), over SiLU/GELU rows and overall."""
    groups = collections.defaultdict(list)
    for r in rows:
        config = _config(r)
        groups[(config, r["family"])].append(r)
        groups[(config, "all")].append(r)
        if r["activation"] in ("silu", "gelu"):
            groups[(config, "silu+gelu")].append(r)
    summary = []
    for (config, family), rs in sorted(groups.items()):
        entry = {"config": config, "family": family, "rows": len(rs), "speedup": bc.geomean(r["speedup"] for r in rs)}
        if all("speedup_vs_compile" in r for r in rs):
            entry["speedup_vs_compile"] = bc.geomean(r["speedup_vs_compile"] for r in rs)
        summary.append(entry)
    return summary


def median_over_runs(runs):
    """One row per (config, shape): median times and median speedups over the runs."""
    keyed = collections.defaultdict(list)
    for run in runs:
        for r in run:
            keyed[(r["device"], r["dtype"], r["batch"], r["layout"], r["mode"], r["row"])].append(r)
    merged = []
    for rs in keyed.values():
        r = dict(rs[0])
        r["ms"] = {k: bc.median(x["ms"][k] for x in rs) for k in rs[0]["ms"]}
        for k in ("speedup", "speedup_vs_compile", "compile_speedup"):
            if k in r:
                r[k] = bc.median(x[k] for x in rs)
                r[k + "_runs"] = [round(x[k], 4) for x in rs]
        r["engines"] = sorted({e for x in rs for e in x["engines"]})
        r["thin_choices"] = max(x["thin_choices"] for x in rs)
        if "forced" in r:
            r["forced"] = {e: {"speedup": bc.median(x["forced"][e]["speedup"] for x in rs),
                               "ran": sorted({n for x in rs for n in x["forced"][e]["ran"]})} for e in r["forced"]}
        merged.append(r)
    return merged


def report_layers(rows, summary, out):
    has_compile = any("compile" in r["ms"] for r in rows)
    headers = ["row", "eager ms", "fused ms"] + (["compile ms"] if has_compile else []) + ["fused/eager"] + (
        ["fused/compile"] if has_compile else []) + ["engine"]
    by_config = collections.defaultdict(list)
    for r in rows:
        by_config[_config(r)].append(r)
    for config, rs in by_config.items():
        table = []
        for r in rs:
            ms = r["ms"]
            table.append([r["row"], bc.fmt(ms["eager"], ".3f"), bc.fmt(ms["fused"], ".3f")]
                         + ([bc.fmt(ms.get("compile"), ".3f")] if has_compile else [])
                         + [bc.fmt(r["speedup"], ".2f") + "x"]
                         + ([bc.fmt(r.get("speedup_vs_compile"), ".2f") + "x"] if has_compile else [])
                         + [",".join(r["engines"]) + (f" ({r['thin_choices']}/{r['choices']} thin)"
                                                       if r["thin_choices"] else "")])
        out.table(headers, table, title=f"layers: {config}", align="l" + "r" * (len(headers) - 2) + "l")
    forced = [r for r in rows if "forced" in r]
    if forced:
        names = list(forced[0]["forced"])
        out.table(["config", "row"] + [f"{n}/eager" for n in names],
                  [[_config(r), r["row"]] + [bc.fmt(f["speedup"], ".2f") + "x" + (
                      "" if n in f["ran"] else f" (ran {','.join(f['ran']) or 'nothing'})")
                      for n, f in r["forced"].items()] for r in forced],
                  title="layers: each engine forced (an engine that declines a row runs eager; fwdbwd: its "
                        "backward engine of the same name where it has one)",
                  align="ll" + "r" * len(names))
    out.table(["config", "family", "rows", "fused/eager", "fused/compile"],
              [[s["config"], s["family"], s["rows"], bc.fmt(s["speedup"], ".2f") + "x",
                bc.fmt(s.get("speedup_vs_compile"), ".2f") + ("x" if "speedup_vs_compile" in s else "")]
               for s in summary], title="layers: geometric mean of the speedups per family", align="llrrr")
    # One plot per (device, dtype, batch): the rows' speedups, a bar per layout and mode.
    plots = collections.defaultdict(dict)
    for r in rows:
        group = f"{r['device'].split(':')[0]}_{r['dtype']}_b{r['batch']}"
        plots[group].setdefault(f"{r['layout']} {r['mode']}", {})[r["row"]] = r["speedup"]
    for group, series in plots.items():
        out.bars(f"layers_{group}", f"FusedConv2d over eager, {group.replace('_', ' ')} (median of repetitions)",
                 series, "speedup (eager time / fused time)", ref=1.0)


def run_layers(opts, out, checkpoint):
    device = opts["device"]
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("conv --device cuda but no CUDA device is available")
    torch.backends.cudnn.benchmark = True
    timer = Timer(device)
    rows = [r for r in SHAPES if opts["rows"].lower() in (r.family + " " + r.name).lower()
            and (not opts["quick"] or opts["rows"] or r.name in QUICK_ROWS)]
    configs = [(d, b, lay, m) for d in opts["dtype"] for b in opts["batch"] for lay in opts["layout"]
               for m in opts["mode"]]
    runs = []
    with out.progress(total=opts["runs"] * len(configs) * len(rows), desc="conv layers", unit="row") as bar:
        for run in range(opts["runs"]):
            results = []
            runs.append(results)
            for dtype, batch, layout, mode in configs:
                for row in rows:
                    r = measure_row(row, opts, dtype, batch, layout, mode, timer)
                    results.append(r)
                    bar.update()
                    out.progress_line(f"[run {run + 1}/{opts['runs']}] {dtype} b{batch} {layout} {mode} "
                                      f"{row.name}: {r['speedup']:.2f}x")
                checkpoint(_layers_result(runs, opts, complete=False))
    result = _layers_result(runs, opts, complete=True)
    report_layers(result["rows"], result["summary"], out)
    return result


def _layers_result(runs, opts, complete):
    merged = median_over_runs(runs)
    return {"complete": complete, "options": {k: opts[k] for k in ("device", "dtype", "batch", "layout", "mode",
                                                                  "reps", "runs", "compile", "rows",
                                                                  "force_engines")},
            "rows": merged, "summary": summarize_layers(merged)}


# --------------------------------------------------------------------------------------------------
# overhead
# --------------------------------------------------------------------------------------------------
def best_us(fn, calls, rounds):
    """Microseconds per call: the best of `rounds` rounds of `calls` calls, after a warm-up."""
    for _ in range(max(100, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls / 1e3)
    return best


def run_overhead(opts, out):
    results = []
    with torch.no_grad():
        for label, cin, cout, size, k, groups, act in out.progress(OVERHEAD_ROWS, desc="conv overhead", unit="row"):
            x = torch.randn(1, cin, size, size)
            pad = k // 2
            fused = fnn.FusedConv2d(cin, cout, k, padding=pad, groups=groups, activation=act)
            stock = nn.Conv2d(cin, cout, k, padding=pad, groups=groups)
            stock.load_state_dict(fused.state_dict())
            act_fn, stock_act = ACTIVATION_FUNCTIONS[act], ACTIVATION_MODULES[act]()
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
            for _ in range(opts["rounds"]):  # interleaved: drifting load hits all alike
                for name, fn in variants.items():
                    times[name] = min(times[name], best_us(fn, opts["calls"], 1))
            e, o, f, m, fu = times.values()
            results.append({"row": label, "us": times,
                            "overhead_us": {"op": o - e, "functional": f - e, "module": fu - m}})
    table = []
    for r in results:
        e, o, f, m, fu = r["us"].values()
        d = r["overhead_us"]
        table.append([r["row"]] + [f"{v:.2f}" for v in (e, o, f, m, fu)]
                     + [f"{d['op']:+.2f}", f"{d['functional']:+.2f}", f"{d['module']:+.2f}"])
    out.table(["call", "eager", "op", "func", "mod", "fused", "op-e", "func-e", "fused-mod"], table,
              title=f"overhead: microseconds per call, fp32, no_grad, {torch.get_num_threads()} threads "
                    "(best of rounds); figures: op <= +1 us, functional and module <= +2 us")
    out.bars("overhead", "Per-call cost, fp32, no_grad (best round)",
             {name: {r["row"]: r["us"][name] for r in results} for name in results[0]["us"]}, "microseconds per call")
    return {"options": {k: opts[k] for k in ("calls", "rounds")}, "threads": torch.get_num_threads(),
            "rows": results}


# --------------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------------
def fold_only(model):
    from torch.fx.experimental.optimization import fuse as fx_fold

    return fx_fold(model)


def run_models(opts, out):
    try:
        import torchvision
    except ImportError:
        out.note("models: skipped, torchvision is not installed")
        return {"skipped": "torchvision is not installed"}
    names = opts["models"].split(",")
    rows = []
    with torch.no_grad(), out.progress(total=len(names) * len(opts["model_layout"]) * len(opts["model_batch"]),
                                       desc="conv models", unit="case") as bar:
        for name in names:
            base = getattr(torchvision.models, name)(weights=None).eval()
            for layout in opts["model_layout"]:
                fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
                eager = base.to(memory_format=fmt)
                folded, fused = fold_only(eager), fnn.fuse(eager)
                for batch in opts["model_batch"]:
                    x = torch.randn(batch, 3, opts["size"], opts["size"]).contiguous(memory_format=fmt)
                    measured = fnn.fuse(eager, example_inputs=(x,))
                    variants = {"eager": eager, "fold-only": folded, "fastpipe fuse()": fused,
                                "fuse(example_inputs)": measured}
                    for m in variants.values():  # warm-up: oneDNN primitives, fuse()'s engine timing
                        for _ in range(2):
                            m(x)
                    samples = {k: [] for k in variants}
                    for rep in range(opts["model_reps"]):
                        for v in rotating(list(variants), rep):
                            t0 = time.perf_counter()
                            variants[v](x)
                            samples[v].append(time.perf_counter() - t0)
                    ms = {k: 1e3 * bc.median(s) for k, s in samples.items()}

                    def paired(base, v):  # the median of per-repetition ratios: a slow spell hits both
                        return bc.median([b / t for b, t in zip(samples[base], samples[v])])

                    row = {"model": name, "batch": batch, "layout": layout, "ms": ms,
                           "fuse_over_fold": paired("fold-only", "fastpipe fuse()"),
                           "measured_over_fold": paired("fold-only", "fuse(example_inputs)"),
                           "measured_over_eager": paired("eager", "fuse(example_inputs)"),
                           "fuse_over_eager": paired("eager", "fastpipe fuse()"),
                           "fold_over_eager": paired("eager", "fold-only"),
                           "fused_sites": len(measured.fuse_report.fused),
                           "kept_stock": len(measured.fuse_report.kept)}
                    rows.append(row)
                    bar.update()
    table = [[f"{r['model']} b{r['batch']} {r['layout']}"] + [bc.fmt(v, ".2f") for v in r["ms"].values()]
             + [f"{r['fuse_over_fold']:.3f}x", f"{r['measured_over_fold']:.3f}x",
                f"{r['kept_stock']}/{r['fused_sites']}"] for r in rows]
    out.table(["model", "eager ms", "fold ms", "fuse ms", "fuse(ex) ms", "fuse/fold", "fuse(ex)/fold", "kept stock"],
              table, title=f"models: fp32, eval, no_grad, {torch.get_num_threads()} threads, "
                           f"{opts['size']}x{opts['size']} (times: medians; ratios: medians of per-repetition "
                           f"ratios)")
    summary = {k: bc.geomean(r[k] for r in rows) for k in
               ("fuse_over_eager", "measured_over_eager", "fold_over_eager", "fuse_over_fold", "measured_over_fold")}
    summary["worst_fuse_over_fold"] = min(r["fuse_over_fold"] for r in rows)
    summary["worst_measured_over_fold"] = min(r["measured_over_fold"] for r in rows)
    out.note(f"geomean over eager: fuse() {summary['fuse_over_eager']:.3f}x, fuse(example_inputs) "
             f"{summary['measured_over_eager']:.3f}x, fold-only "
             f"{summary['fold_over_eager']:.3f}x; over fold-only: fuse() {summary['fuse_over_fold']:.3f}x (worst "
             f"{summary['worst_fuse_over_fold']:.3f}x), fuse(example_inputs) {summary['measured_over_fold']:.3f}x "
             f"(worst {summary['worst_measured_over_fold']:.3f}x)")
    out.bars("models", "Whole models over eager, fp32 eval (median of repetitions)",
             {v: {f"{r['model']} b{r['batch']} {r['layout']}": r["ms"]["eager"] / r["ms"][v] for r in rows}
              for v in ("fold-only", "fastpipe fuse()", "fuse(example_inputs)")},
             "speedup over eager", ref=1.0)
    return {"options": {k: opts[k] for k in ("models", "model_batch", "model_layout", "size", "model_reps")},
            "threads": torch.get_num_threads(), "rows": rows, "summary": summary}


# --------------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------------
def options(args) -> dict:
    """Every part's settings, with the defaults of the full or the quick run filled in."""
    cuda = args.device.startswith("cuda")
    q = args.quick
    return {
        "quick": q, "device": args.device, "rows": args.rows, "mode": args.mode, "runs": args.runs,
        "force_engines": args.force_engines,
        "dtype": args.dtype or (["bf16"] if q and cuda else ["bf16", "fp16", "fp32"] if cuda else ["fp32"]),
        "batch": args.batch or ([32] if q and cuda else [2] if q else [32, 128] if cuda else [8]),
        "layout": args.layout or ["nchw", "channels_last"],
        "model_layout": args.layout or (["nchw"] if q else ["nchw", "channels_last"]),
        "reps": args.reps or (3 if q else 11),
        "compile": (not q) if args.compile is None else args.compile,
        "calls": args.calls or (200 if q else 5000),
        "rounds": args.rounds or (2 if q else 7),
        "models": args.models or ("resnet18" if q else ",".join(MODELS)),
        "model_batch": args.batch or ([1] if q else [1, 8]),
        "size": args.size or (32 if q else 224),
        "model_reps": args.reps or (3 if q else 11),
    }


def run(args, out) -> dict:
    parts = [s.strip() for s in args.part.split(",") if s.strip()]
    bad = [s for s in parts if s not in PARTS]
    if bad:
        raise SystemExit(f"conv --part: unknown {bad}; choose from {','.join(PARTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    opts = options(args)
    results = {}
    out.facts["malloc_keeps_freed_memory"] = not opts["device"].startswith("cuda") and keep_freed_memory()
    for part in parts:
        if part == "layers":
            results["layers"] = run_layers(opts, out, lambda partial: out.checkpoint({**results, "layers": partial}))
        elif part == "overhead":
            results["overhead"] = run_overhead(opts, out)
        else:
            results["models"] = run_models(opts, out)
        out.checkpoint(results)
    return results


def keep_freed_memory():
    """Make glibc's malloc keep freed memory instead of returning it to the OS.

    PyTorch's CPU allocator is plain malloc, and glibc serves blocks this large with mmap and unmaps them
    on free, so each call page-faults its buffers afresh and a call's time depends on what the previous
    call freed. Keeping the heap (as jemalloc or tcmalloc would) takes that out of the comparison.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**30))
