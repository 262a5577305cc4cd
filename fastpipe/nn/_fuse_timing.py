"""fuse()'s check with example_inputs: every fused site timed against its stock twin on what it receives
in the model; where fusion is not faster, the site computes the stock way."""

import statistics
import time

import torch

from fastpipe.nn.modules import FusedConv2d

# Each fused site is timed against its stock twin in this many paired rounds of about this many seconds
# each, the order alternating (the second of a pair runs on warmer caches).
_SITE_ROUNDS = 9
_SITE_SECONDS = 0.005


def _seconds_per_call(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def keep_stock_where_fusion_loses(model, inputs, report):
    """Runs `model` once on `inputs`, then times every FusedConv2d on what it got against its stock
    twin; sites where fusion is not faster compute the stock way."""
    sites = {name: m for name, m in model.named_modules() if isinstance(m, FusedConv2d)}
    seen = {}

    def capture(name):
        def hook(module, args, kwargs):
            residual = kwargs.get("residual", args[1] if len(args) > 1 else None)
            clone = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
            seen.setdefault(name, (clone(args[0]), clone(residual)))
        return hook

    handles = [m.register_forward_pre_hook(capture(name), with_kwargs=True) for name, m in sites.items()]
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as e:
        raise ValueError(f"example_inputs: the model fails on them ({type(e).__name__}: {e})") from e
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        for name, m in sites.items():
            if name not in seen:
                continue
            x, residual = seen[name]

            def run(fused, m=m, x=x, residual=residual):
                m.fused = fused
                return m(x, residual) if residual is not None else m(x)

            for fused in (True, False, True, False):  # warm-up, and the fused engine's timing
                run(fused)
            once = min(_seconds_per_call(lambda: run(True), 1) for _ in range(3))
            inner = max(1, int(_SITE_SECONDS / max(once, 1e-7)))
            t = {True: [], False: []}
            for r in range(_SITE_ROUNDS):
                for fused in (True, False) if r % 2 else (False, True):
                    t[fused].append(_seconds_per_call(lambda fused=fused: run(fused), inner))
            # A burst of load slows a round, not the median of the per-round ratios.
            ratio = statistics.median(f / s for f, s in zip(t[True], t[False]))
            m.fused = ratio < 1.0
            if not m.fused:
                report.kept.append((name, f"fused {statistics.median(t[True]) * 1e3:.3f} ms vs stock "
                                          f"{statistics.median(t[False]) * 1e3:.3f} ms (x{ratio:.3f}) on input "
                                          f"{list(x.shape)}"))
