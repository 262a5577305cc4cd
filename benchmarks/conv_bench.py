"""Fused conv + bias + activation: FusedConv2d against eager PyTorch and torch.compile, per shape.

Eager is nn.Conv2d followed by the activation module as torchvision builds these networks (in-place
ReLU/ReLU6/SiLU, GELU out of place, ``out += residual``), with cudnn.benchmark on; torch.compile is the
default mode applied to that eager block. For each row the three run interleaved in a rotating order,
after warm-up (which also makes FusedConv2d time its engines for the shape), and the median of the
repetitions is kept; speedup = eager time / FusedConv2d time. With --runs N the whole sweep repeats and
each row reports the median speedup over the runs.

  python benchmarks/conv_bench.py                         # CPU: batch 8, fp32, NCHW + channels_last
  python benchmarks/conv_bench.py --quick --no-compile    # a short CPU run
  python benchmarks/conv_bench.py --device cuda --batch 32 128 --dtype bf16 fp16 fp32

Writes a JSON file under benchmarks/results/ (see --out) and prints a table with the geometric mean
of the speedups per family.
"""

import argparse
import collections
import datetime
import json
import math
import os
import pathlib
import platform
import statistics
import sys
import time

# An in-place build (setup.py build_ext --inplace) works without installing the package.
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))

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

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def build_blocks(row, device, dtype, layout):
    """(eager, fused) blocks with the same parameters."""
    import torch
    import torch.nn as nn

    import fastpipe.nn as fnn

    act_modules = {
        "relu": lambda: nn.ReLU(inplace=True),
        "relu6": lambda: nn.ReLU6(inplace=True),
        "gelu": nn.GELU,
        "silu": lambda: nn.SiLU(inplace=True),
    }

    class Eager(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(row.cin, row.cout, row.kernel, row.stride, row.kernel // 2, groups=row.groups)
            self.act = act_modules[row.activation]()

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
        import torch

        self.torch = torch
        self.cuda = device.startswith("cuda")

    def __call__(self, fn, inner):
        torch = self.torch
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


def measure_row(row, args, device, dtype_name, batch, layout, mode, timer):
    import torch

    import fastpipe.nn as fnn

    dtype = getattr(torch, DTYPES[dtype_name])
    torch.manual_seed(0)
    eager, fused = build_blocks(row, device, dtype, layout)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x = torch.randn(batch, row.cin, row.size, row.size, device=device, dtype=dtype).contiguous(memory_format=fmt)
    out_size = (row.size + 2 * (row.kernel // 2) - row.kernel) // row.stride + 1
    res = None
    if row.residual:
        res = torch.randn(batch, row.cout, out_size, out_size, device=device, dtype=dtype).contiguous(memory_format=fmt)
    variants = {"eager": eager, "fused": fused}
    if args.compile:
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
    fnn.clear_conv_engine_cache()
    for run in runs.values():  # warm-up: compilation, cuDNN plans, FusedConv2d's engine timing
        for _ in range(2):
            run()
    engines = sorted({line.split(" -> ")[1].split()[0] for line in fnn.conv_engine_cache()})
    # Enough calls per sample that one sample takes >= 1 ms (GPU kernels are short).
    once = timer(runs["eager"], 1)
    inner = max(1, min(200, int(1e-3 / max(once, 1e-7)))) if timer.cuda else 1
    samples = collections.defaultdict(list)
    names = list(runs)
    for rep in range(args.reps):
        # Interleaved, so that drifting load hits all alike, and in a rotating order: on the CPU a call's
        # time depends on what the previous one freed (allocator state, page faults).
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(timer(runs[name], inner))
    times = {name: statistics.median(s) for name, s in samples.items()}
    result = {
        "family": row.family,
        "row": row.name,
        "activation": row.activation,
        "device": device,
        "dtype": dtype_name,
        "batch": batch,
        "layout": layout,
        "mode": mode,
        "ms": {k: v * 1e3 for k, v in times.items()},
        "speedup": times["eager"] / times["fused"],
        "engines": engines,
    }
    if "compile" in times:
        result["speedup_vs_compile"] = times["compile"] / times["fused"]
        result["compile_speedup"] = times["eager"] / times["compile"]
    return result


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(rows):
    """Geometric means of the speedups per (config, family), over SiLU/GELU rows and overall."""
    groups = collections.defaultdict(list)
    for r in rows:
        config = f"{r['device']} {r['dtype']} b{r['batch']} {r['layout']} {r['mode']}"
        groups[(config, r["family"])].append(r)
        groups[(config, "all")].append(r)
        if r["activation"] in ("silu", "gelu"):
            groups[(config, "silu+gelu")].append(r)
    out = []
    for (config, family), rs in sorted(groups.items()):
        entry = {"config": config, "family": family, "rows": len(rs), "speedup": geomean(r["speedup"] for r in rs)}
        if all("speedup_vs_compile" in r for r in rs):
            entry["speedup_vs_compile"] = geomean(r["speedup_vs_compile"] for r in rs)
        out.append(entry)
    return out


def median_over_runs(runs):
    """One row per (config, shape): median times and median speedups over the runs."""
    keyed = collections.defaultdict(list)
    for run in runs:
        for r in run:
            keyed[(r["device"], r["dtype"], r["batch"], r["layout"], r["mode"], r["row"])].append(r)
    merged = []
    for rs in keyed.values():
        r = dict(rs[0])
        r["ms"] = {k: statistics.median(x["ms"][k] for x in rs) for k in rs[0]["ms"]}
        for k in ("speedup", "speedup_vs_compile", "compile_speedup"):
            if k in r:
                r[k] = statistics.median(x[k] for x in rs)
                r[k + "_runs"] = [round(x[k], 4) for x in rs]
        r["engines"] = sorted({e for x in rs for e in x["engines"]})
        merged.append(r)
    return merged


def print_table(rows, summary):
    has_compile = any("compile" in r["ms"] for r in rows)
    config = None
    for r in rows:
        c = f"{r['device']} {r['dtype']} batch {r['batch']} {r['layout']} {r['mode']}"
        if c != config:
            config = c
            print(f"\n== {c}")
            print(f"{'row':24s} {'eager ms':>9s} {'fused ms':>9s}" + (f" {'compile ms':>10s}" if has_compile else "")
                  + f" {'fused/eager':>11s}" + (f" {'fused/compile':>13s}" if has_compile else "") + "  engine")
        ms = r["ms"]
        line = f"{r['row']:24s} {ms['eager']:9.3f} {ms['fused']:9.3f}"
        if has_compile:
            line += f" {ms.get('compile', float('nan')):10.3f}"
        line += f" {r['speedup']:10.2f}x"
        if has_compile:
            line += f" {r.get('speedup_vs_compile', float('nan')):12.2f}x"
        print(line + "  " + ",".join(r["engines"]))
    print("\ngeometric mean of fused/eager (and fused/compile) per family:")
    for s in summary:
        vs = f"  {s['speedup_vs_compile']:.2f}x vs compile" if "speedup_vs_compile" in s else ""
        print(f"  {s['config']:38s} {s['family']:13s} {s['speedup']:.2f}x over {s['rows']} rows{vs}")


def machine_info(device):
    import torch

    import fastpipe

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastpipe": fastpipe.build_info(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        info["cpu"] = names[0] if names else info["cpu"]
    except OSError:
        pass
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    return info


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), help="default: fp32 on CPU, bf16 fp16 fp32 on CUDA")
    p.add_argument("--batch", nargs="+", type=int, help="default: 8 on CPU, 32 128 on CUDA")
    p.add_argument("--layout", nargs="+", choices=["nchw", "channels_last"], default=["nchw", "channels_last"])
    p.add_argument("--mode", nargs="+", choices=["fwd", "fwdbwd"], default=["fwd", "fwdbwd"],
                   help="forward only (no_grad) and/or forward + backward")
    p.add_argument("--rows", default="", help="only rows whose family or label contains this text")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per row (default 11, --quick 5)")
    p.add_argument("--runs", type=int, default=1, help="repeat the sweep; rows report medians over runs")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile column")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--out", help="JSON path (default benchmarks/results/conv_<device>_<time>.json)")
    args = p.parse_args(argv)

    import torch

    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda but no CUDA device is available")
    args.dtype = args.dtype or (["bf16", "fp16", "fp32"] if cuda else ["fp32"])
    args.batch = args.batch or ([32, 128] if cuda else [8])
    args.reps = args.reps or (5 if args.quick else 11)
    torch.backends.cudnn.benchmark = True
    malloc_kept = not cuda and keep_freed_memory()
    timer = Timer(device)
    rows = [r for r in SHAPES if args.rows.lower() in (r.family + " " + r.name).lower()]

    out = pathlib.Path(args.out) if args.out else (
        pathlib.Path(__file__).resolve().parent / "results"
        / f"conv_{device.split(':')[0]}_{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k != "out"}
    machine = machine_info(device)
    machine["malloc_keeps_freed_memory"] = malloc_kept
    started = time.time()
    load_start = os.getloadavg()

    def write(runs, complete):
        # The load average tells how busy the machine was with other work while this ran.
        merged = median_over_runs(runs)
        doc = {"machine": machine, "config": config, "complete": complete,
               "seconds": round(time.time() - started, 1), "loadavg_start": load_start,
               "loadavg_end": os.getloadavg(), "rows": merged, "summary": summarize(merged)}
        out.write_text(json.dumps(doc, indent=1))
        return doc

    runs = []
    for run in range(args.runs):
        results = []
        runs.append(results)
        for dtype in args.dtype:
            for batch in args.batch:
                for layout in args.layout:
                    for mode in args.mode:
                        for row in rows:
                            r = measure_row(row, args, device, dtype, batch, layout, mode, timer)
                            results.append(r)
                            print(f"[run {run + 1}/{args.runs}] {dtype} b{batch} {layout} {mode} {row.name}: "
                                  f"{r['speedup']:.2f}x", file=sys.stderr, flush=True)
                        write(runs, complete=False)  # a run cut short by a time limit keeps what it measured
    doc = write(runs, complete=True)
    print_table(doc["rows"], doc["summary"])
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
