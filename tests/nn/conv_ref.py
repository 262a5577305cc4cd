"""Shared pieces of the fused-convolution tests: devices, activations, a float64 reference and the
error-versus-error check (ours <= 2 x torch's own error at that dtype + a small atol)."""

import collections
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format
from torch.autograd import profiler

import fastpipe.nn as fnn

# The gpu marker alone skips a case without a GPU (tests/conftest.py), or fails it under FASTPIPE_REQUIRE_GPU=1.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# Activations as users pass them: (name, kwargs), and the eager function that defines each.
ACTIVATIONS = [
    ("identity", {}),
    ("relu", {}),
    ("relu6", {}),
    ("hardtanh", {"min_val": -0.5, "max_val": 1.5}),
    ("leaky_relu", {"negative_slope": 0.1}),
    ("leaky_relu", {"negative_slope": -0.3}),
    ("silu", {}),
    ("gelu", {}),
    ("gelu", {"approximate": "tanh"}),
    ("sigmoid", {}),
    ("tanh", {}),
    ("hardswish", {}),
]
ACT_IDS = [name + "".join(f"-{v}" for v in kw.values()) for name, kw in ACTIVATIONS]

_EAGER = {
    "identity": lambda t: t,
    "relu": F.relu,
    "relu6": F.relu6,
    "hardtanh": F.hardtanh,
    "leaky_relu": F.leaky_relu,
    "silu": F.silu,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "hardswish": F.hardswish,
}

# Which tensor backward keeps (the output or the pre-activation), as the C++ autograd decides.
_GRAD_FROM_OUTPUT = {"identity", "relu", "hardtanh", "sigmoid", "tanh"}


def grad_from_output(name, act_args):
    return name in _GRAD_FROM_OUTPUT or (name == "leaky_relu" and act_args[0] >= 0)


ATOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def eager_activation(t, act, act_kwargs):
    return _EAGER[act](t, **act_kwargs)


def eager_conv_act(x, w, b, stride, padding, dilation, groups, act, act_kwargs, residual=None):
    """What eager PyTorch computes: conv, + residual, activation, each rounded to the input's dtype."""
    y = F.conv2d(x, w, b, stride, padding, dilation, groups)
    if residual is not None:
        y = y + residual
    return eager_activation(y, act, act_kwargs)


def to64(t):
    return None if t is None else t.double()


def check_error(what, ours, ref64, torch_own, dtype):
    """ours and torch_own (both at dtype) against the float64 reference: the error-vs-error rule."""
    err = (ours.double() - ref64).abs().max().item()
    err_torch = (torch_own.double() - ref64).abs().max().item()
    scale = max(1.0, ref64.abs().max().item())
    tol = 2 * err_torch + ATOL[dtype] * scale
    print(f"{what}: error {err:.3g}, torch's own {err_torch:.3g}, allowed {tol:.3g}")
    assert err <= tol, f"{what}: error {err:.3g} > allowed {tol:.3g} (torch's own error {err_torch:.3g})"


def make_inputs(shape, dtype, device, layout, bias=True, residual=False, seed=0):
    """Random conv inputs: x ~ N(0, 1), weight scaled by 1/sqrt(fan_in), all rounded to dtype.

    layout: "nchw", "channels_last" (input and weight) or "strided" (a non-contiguous input view).
    Returns (x, weight, bias, residual, conv kwargs).
    """
    n, c, h, w_, o, k, stride, padding, dilation, groups = shape
    k = k if isinstance(k, tuple) else (k, k)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w_ * (2 if layout == "strided" else 1), generator=g)
    if layout == "strided":
        x = x[..., ::2]
    fan_in = (c // groups) * k[0] * k[1]
    weight = torch.randn(o, c // groups, *k, generator=g) / fan_in**0.5
    b = 0.5 * torch.randn(o, generator=g) if bias else None
    conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    r = None
    if residual:
        out = F.conv2d(torch.empty(n, c, h, w_, device="meta"), weight.to("meta"), None, **conv)
        r = torch.randn(out.shape, generator=g)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    move = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    x, weight, b, r = move(x), move(weight), move(b), move(r)
    if layout == "channels_last":
        x, weight = x.contiguous(memory_format=fmt), weight.contiguous(memory_format=fmt)
        r = None if r is None else r.contiguous(memory_format=fmt)
    return x, weight, b, r, conv


# ---- poisoned CUDA memory ----------------------------------------------------------------------------
def poison_cuda_allocations(*shapes, dtype, count=4):
    """Fills the free CUDA memory that the next allocations of tensors of ``shapes`` (in ``dtype``) will get
    with NaN, so that an element a kernel never writes shows as NaN instead of a stale value.

    torch's caching allocator serves a request from the best-fitting free block of its pool (requests up to
    1 MiB from the small pool, larger ones from the large pool, sizes rounded to 512 bytes): poison in one
    big block would sit in the large pool, away from small outputs. So the poison is allocated at the
    outputs' own sizes (rounded up as the allocator rounds them: no byte of a block is left unpoisoned),
    ``count`` blocks each (an op may allocate several of a size), after returning the cache's free
    segments to the driver, then filled and freed together; freeing restores the free list, so the op's
    allocations take the same blocks. Checks (without allocating) that the next allocation of
    each size lands in the poison. Without the cache (PYTORCH_NO_CUDA_MEMORY_CACHING, as under
    compute-sanitizer, whose initcheck reports reads of unwritten memory itself) there is nothing to poison."""
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0") not in ("", "0"):
        return
    numels = [math.prod(shape) for shape in shapes]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    es = torch.empty(0, dtype=dtype).element_size()
    whole = lambda n: -(-n * es // 512) * 512 // es  # noqa: E731 (the allocator's block: n rounded to 512 bytes)
    blocks = [torch.full((whole(n),), float("nan"), dtype=dtype, device="cuda") for n in numels for _ in range(count)]
    # Freed, neighbouring blocks merge: the next allocation of a larger size can start in one poisoned
    # block and end in the next, so containment is judged against the union of the blocks.
    poisoned = []
    for lo, hi in sorted((b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in blocks):
        if poisoned and lo <= poisoned[-1][1]:
            poisoned[-1] = (poisoned[-1][0], max(poisoned[-1][1], hi))
        else:
            poisoned.append((lo, hi))
    del blocks
    for n in numels:
        for _ in range(8):
            probe = torch.empty(whole(n), dtype=dtype, device="cuda")  # no kernel: the poison stays as it is
            start, end = probe.data_ptr(), probe.data_ptr() + probe.numel() * probe.element_size()
            if any(lo <= start and end <= hi for lo, hi in poisoned):
                break
            # A free block of this size outside the poison (a gap beside a live tensor, in a segment
            # empty_cache kept) is the one the allocator hands out next: poison it too, and look again.
            probe.fill_(float("nan"))
            poisoned.append((start, end))
        else:
            raise AssertionError(f"the next allocation of {n} x {dtype} is not in the poisoned blocks: "
                                 "the poison would not show")
        del probe
    torch.cuda.synchronize()


# ---- which engine runs -------------------------------------------------------------------------------
ENGINE_EVENT = "fastpipe::conv_engine."  # the profiler label each engine run records
BACKWARD_EVENT = "fastpipe::conv_engine_backward."  # and each backward engine run


def engines(device):
    """The engines of a device type; a device with none fails the test instead of looping zero times."""
    names = fnn.conv_engines(device)
    assert names, f"fastpipe has no conv engines for {device} (built without its kernels?)"
    return names


def run_engines(fn, backward=False):
    """(fn's result, the list of conv engines it ran, in order; with backward=True the backward engines)."""
    prefix = BACKWARD_EVENT if backward else ENGINE_EVENT
    with profiler.profile() as prof:
        out = fn()
    ran = [e.name[len(prefix):] for e in prof.function_events if e.name.startswith(prefix)]
    return out, ran


KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what fastpipe's CUDA kernels take
MAX_KERNEL_ELEMENTS = 2**31 - 1  # they index with 32-bit integers
CPU_ENGINES = {"eager", "onednn"}

# A conv call as the engines' domains see it (conv_call builds one from the operands).
Call = collections.namedtuple(
    "Call", "device c_in c_out kernel stride padding dilation groups channels_last act out_numel")


def conv_call(x, w, conv, act):
    """The Call of conv2d_act(x, w, activation=act, **conv) (conv: stride, padding, dilation, groups)."""
    pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)  # noqa: E731
    cl = lambda t: suggest_memory_format(t) == torch.channels_last  # noqa: E731 (as the op decides)
    out = F.conv2d(x.to("meta"), w.to("meta"), None, **conv)
    return Call(x.device.type, x.shape[1], w.shape[0], tuple(w.shape[2:]), pair(conv.get("stride", 1)),
                pair(conv.get("padding", 0)), pair(conv.get("dilation", 1)), conv.get("groups", 1),
                cl(x) or cl(w), act, out.numel())


def _depthwise_tile_fits(c):
    """The tiled kernel's 16 x 16 output tile reads an input patch held as float in 48 KiB of shared memory."""
    rows = 15 * c.stride[0] + (c.kernel[0] - 1) * c.dilation[0] + 1
    cols = 15 * c.stride[1] + (c.kernel[1] - 1) * c.dilation[1] + 1
    return rows * cols * 4 <= 48 << 10


def module_call(module, x):
    """The Call a FusedConv2d makes for input ``x`` (its padding mode's pad done first, as in forward)."""
    if module._pre_pad is not None:
        x = F.pad(x, module._pre_pad, mode=module._pad_mode)
    conv = dict(stride=module.stride, padding=module._padding, dilation=module.dilation, groups=module.groups)
    return conv_call(x, module.weight, conv, module.activation)


def engine_can_run(engine, dtype, call=None, backward=False):
    """Whether a forced engine runs a call of ``dtype`` on this machine (else eager runs), from the engines'
    documented domains and torch's own capability queries, not from fastpipe's declarations, which this
    checks. ``call`` (conv_call) is needed for the CUDA engines, whose domains depend on the call; without
    it the call is on the CPU. ``backward``: the backward engine of that name. Every engine name of every
    device type has an expectation (test_engines.py checks it against the engine lists)."""
    device = call.device if call is not None else "cpu"
    if engine == "eager":
        return True
    if engine == "onednn":
        return device == "cpu" and (dtype == torch.float32 or (
            dtype == torch.float16 and torch.ops.mkldnn._is_mkldnn_fp16_supported()
        ) or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()))
    if engine not in ("epilogue", "cudnn_fused", "depthwise", "depthwise_tiled", "gemm1x1"):
        raise AssertionError(f"no expectation for engine {engine!r}: add one")
    if dtype not in KERNEL_DTYPES:
        return False
    depthwise = call is not None and call.groups == call.c_in == call.c_out
    if engine == "depthwise" and backward:  # the CPU's backward model and the CUDA kernels alike
        return depthwise and call.kernel in ((3, 3), (5, 5), (7, 7))
    if device != "cuda":  # an engine of another device type: eager, silently
        return False
    assert call is not None, f"the expectation for {engine} needs the call"
    if engine == "epilogue":
        return call.out_numel <= MAX_KERNEL_ELEMENTS
    if engine == "cudnn_fused":
        return call.act == "relu" and torch.backends.cudnn.enabled
    if engine == "depthwise":
        return depthwise
    if engine == "depthwise_tiled":
        return depthwise and not call.channels_last and _depthwise_tile_fits(call)
    return (call.kernel == (1, 1) and call.stride == (1, 1) and call.padding == (0, 0) and call.groups == 1
            and call.channels_last and call.out_numel <= MAX_KERNEL_ELEMENTS)  # gemm1x1


def expected_engine(engine, dtype, call=None):
    return engine if engine_can_run(engine, dtype, call) else "eager"
