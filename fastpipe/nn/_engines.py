"""Which implementation ("engine") the fused convolution uses, per call key.

Every new key (device, dtype, shapes, layouts, stride/padding/dilation/groups, activation, bias and
residual present, threads, TF32) is timed once on every engine that supports it, eager PyTorch
included (the fastest of 3 to 25 interleaved calls each), and the choice is cached; an engine replaces
eager only when at least 3% faster. The environment variable FASTPIPE_CONV_ENGINE=auto|eager|<name>
overrides the choice (read on every call); an engine that cannot run a call, or belongs to another
device type, falls back to eager.
"""

import contextlib
import os

import torch

import fastpipe.ops  # noqa: F401  (registers the ops)

ENV = "FASTPIPE_CONV_ENGINE"

__all__ = ["conv_engines", "conv_engine_cache", "clear_conv_engine_cache", "use_conv_engine"]


def conv_engines(device="cpu"):
    """Names of the engines for a device type, eager first (an empty list for a type without kernels)."""
    return list(torch.ops.fastpipe._conv_engines(torch.device(device).type))


def conv_engine_cache():
    """One line per cached key: the call, the engine chosen and each candidate's fastest timed call."""
    return list(torch.ops.fastpipe._conv_engine_cache())


def clear_conv_engine_cache():
    """Forget every choice; the next call of each key is timed again."""
    torch.ops.fastpipe._conv_engine_clear()


@contextlib.contextmanager
def use_conv_engine(name):
    """Sets FASTPIPE_CONV_ENGINE to ``name`` ("auto", "eager" or an engine) for the block (process-wide)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = name
    try:
        yield
    finally:
        if old is None:
            del os.environ[ENV]
        else:
            os.environ[ENV] = old
