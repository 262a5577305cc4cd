"""Which implementation ("engine") the fused convolution uses, per call key.

Every new key (device, dtype, shapes, layouts, stride/padding/dilation/groups, activation, bias and
residual present, threads, TF32) is timed once on every engine that supports it, eager PyTorch
included (the fastest of 3 to 25 interleaved calls each), and the choice is cached; an engine replaces
eager only when at least 3% faster. The environment variable FASTPIPE_CONV_ENGINE=auto|eager|<name>
overrides the choice (read once, when fastpipe loads; ``use_conv_engine`` changes it at run time); an engine that cannot run a call (e.g. oneDNN on float16 or
bfloat16 where this CPU lacks the instructions torch's oneDNN needs for them) falls back to eager with
one UserWarning naming the engine, the dtype and why; one of another device type falls back silently.
An engine that throws on a key (forced or while being timed) is not tried on that key again: eager
runs, with one warning that carries the error. The profiler shows the engine each call ran as
``fastpipe::conv_engine.<name>``.
"""

import contextlib

import torch

import fastpipe.ops  # noqa: F401  (registers the ops)


__all__ = ["conv_engines", "conv_engine_cache", "clear_conv_engine_cache", "use_conv_engine"]


def conv_engines(device="cpu"):
    """Names of the engines for a device type, eager first (an empty list for a type without kernels)."""
    return list(torch.ops.fastpipe._conv_engines(torch.device(device).type))


def conv_engine_cache():
    """One line per cached key: the call, the engine chosen and each candidate's fastest timed call."""
    return list(torch.ops.fastpipe._conv_engine_cache())


def clear_conv_engine_cache():
    """Forget every choice, failure and warning given; the next call of each key is timed again."""
    torch.ops.fastpipe._conv_engine_clear()


@contextlib.contextmanager
def use_conv_engine(name):
    """Forces engine ``name`` ("auto", "eager" or an engine's) for the block, process-wide, as
    FASTPIPE_CONV_ENGINE does for the whole process."""
    old = torch.ops.fastpipe._conv_engine_force(str(name))
    try:
        yield
    finally:
        torch.ops.fastpipe._conv_engine_force(old)
