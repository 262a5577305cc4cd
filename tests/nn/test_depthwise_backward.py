"""The depthwise engine's backward (csrc/kernels/depthwise.h): the input, weight and bias gradients of a
depthwise convolution, chosen per key apart from the forward (eager is aten.convolution_backward).

On the CPU its kernels' code runs as a model, block by block as the GPU runs it (the CPU backward
engine "depthwise", only ever run when forced): every build checks the index arithmetic, the
weight-gradient plan (ranges of positions, streams, partial sums per split) and the dispatch against
float64 autograd on awkward shapes. The gpu-marked tests run the kernels themselves."""

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import poison_cuda_allocations, run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

# (channels, height, width, kernel, stride, padding, dilation): the kernel sizes the backward is built
# for (3, 5, 7), odd channel counts, 1-pixel and odd images, stride 2 with odd sizes, padding beyond
# the dilated reach, dilation 2, and channel counts that take the vectorised NHWC path (8, 16, 24, 40).
SHAPES = [
    (3, 7, 13, 3, (1, 1), (1, 1), (1, 1)),
    (10, 13, 7, 5, (2, 2), (2, 2), (1, 1)),
    (59, 1, 1, 3, (1, 1), (1, 1), (1, 1)),
    (3, 13, 13, 7, (2, 2), (3, 3), (1, 1)),
    (3, 9, 11, 3, (1, 2), (4, 0), (2, 2)),
    (59, 7, 7, 7, (1, 1), (3, 3), (2, 2)),
    (8, 7, 13, 3, (2, 1), (0, 2), (2, 1)),
    (24, 13, 7, 5, (2, 2), (2, 2), (1, 1)),
    (40, 1, 1, 3, (1, 1), (1, 1), (1, 1)),
]
# Enough positions for several weight-gradient ranges in both layouts (the model plans for 132 SMs):
# NCHW 4 x 64 x 64 positions / (128 streams x 32) = 4 ranges; NHWC 32 channels a block, many more.
MULTI_SPLIT = (5, 64, 64, 3, (1, 1), (1, 1), (1, 1))
NEEDS = {"all": (True, True, True), "input": (True, False, False), "weight": (False, True, False),
         "bias+weight": (False, True, True)}


def tensors(shape, batch, dtype, layout, generator, device="cpu"):
    c, h, w, k, *_ = shape
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.randn(batch, c, h, w, generator=generator, device=device).to(dtype).contiguous(memory_format=fmt)
    weight = torch.randn(c, 1, k, k, generator=generator, device=device).to(dtype)
    bias = torch.randn(c, generator=generator, device=device).to(dtype)
    return x, weight, bias


def check_backward(shape, batch, dtype, layout, need, activation, generator, device="cpu", tol=1e-5, poison=False):
    """Forward and backward with FASTPIPE_CONV_ENGINE=depthwise against float64 autograd; asserts which
    backward engine ran. ``poison``: between the forward and the backward, the CUDA memory the gradients
    will get is filled with NaN (an element a kernel skips shows)."""
    _, _, _, _, stride, padding, dilation = shape
    x, weight, bias = tensors(shape, batch, dtype, layout, generator, device)
    leaves = [t.detach().clone().requires_grad_(n) for t, n in zip((x, weight, bias), need, strict=True)]
    ref = [t.detach().double().requires_grad_(n) for t, n in zip((x, weight, bias), need, strict=True)]
    act = {"identity": lambda t: t, "silu": F.silu, "relu": torch.relu}[activation]
    want = act(F.conv2d(ref[0], ref[1], ref[2], stride, padding, dilation, groups=x.shape[1]))
    grad = torch.randn(want.shape, generator=generator, device=device)
    want.backward(grad)

    def step():
        out = conv2d_act(*leaves, stride=stride, padding=padding, dilation=dilation, groups=x.shape[1],
                         activation=activation)
        if poison:
            poison_cuda_allocations(out.shape, x.shape, weight.shape, bias.shape, dtype=dtype)
        out.backward(grad.to(dtype).contiguous(memory_format=torch.channels_last if layout == "nhwc"
                                               else torch.contiguous_format))

    with fnn.use_conv_engine("depthwise"):
        _, ran = run_engines(step, backward=True)
    assert ran == ["depthwise"], ran
    for got, exp, name in zip(leaves, ref, ("input", "weight", "bias"), strict=True):
        if exp.grad is None:
            assert got.grad is None, name
            continue
        assert got.grad is not None and got.grad.dtype == dtype, name
        scale = max(1.0, exp.grad.abs().max().item())
        torch.testing.assert_close(got.grad.double(), exp.grad, rtol=tol, atol=tol * scale, msg=name)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_the_backward_model_against_float64(shape, layout):
    """Every gradient subset, an activation whose backward leaves the bias to the engine (identity) and
    one that does not; two images."""
    g = torch.Generator().manual_seed(0)
    for (need_name, need), activation in itertools.product(NEEDS.items(), ["identity", "silu"]):
        check_backward(shape, 2, torch.float32, layout, need, activation, g)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_the_weight_gradient_adds_several_ranges(layout):
    """Several position ranges per channel (partial sums per split, added afterwards) and, in NHWC, a
    channel block only partly filled (5 of 32 channels)."""
    check_backward(MULTI_SPLIT, 4, torch.float32, layout, NEEDS["all"], "identity", torch.Generator().manual_seed(1),
                   tol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_the_backward_model_in_half_precision(dtype):
    """Vectorised NHWC lanes of 8 for 2-byte dtypes, float accumulation, one rounding at the end."""
    g = torch.Generator().manual_seed(2)
    for shape, layout in itertools.product(SHAPES[6:], ["nchw", "nhwc"]):
        check_backward(shape, 2, dtype, layout, NEEDS["all"], "relu", g, tol=2e-2)


def test_the_backward_choice_is_apart_from_the_forward():
    """The CPU's backward engines are listed on their own. The model is unvalidated, so unforced the
    backward runs eager (aten.convolution_backward) with no key kept: there is nothing timing could pick.
    Timed as if validated, the backward key is chosen on its own, apart from the forward's."""
    assert fnn.conv_engines("cpu", backward=True) == ["eager", "depthwise"]
    assert "depthwise" not in fnn.conv_engines("cpu")
    fnn.clear_conv_engine_cache()
    x, weight, bias = tensors(SHAPES[0], 2, torch.float32, "nchw", torch.Generator().manual_seed(3))
    x.requires_grad_()

    def backward():
        return run_engines(lambda: conv2d_act(x, weight, bias, padding=1, groups=3, activation="relu").sum().backward(),
                           backward=True)[1]

    assert backward() == ["eager"]
    assert not any("backward" in line for line in fnn.conv_engine_cache())
    old = torch.ops.fastpipe._conv_engine_time_unvalidated(True)
    try:
        assert set(backward()) == {"eager", "depthwise"}, "both backward engines are timed"
        cache = fnn.conv_engine_cache()
        assert sum(" backward: input -> " in line for line in cache) == 1, cache
    finally:
        torch.ops.fastpipe._conv_engine_time_unvalidated(old)
    fnn.clear_conv_engine_cache()


@pytest.mark.parametrize("why,shape,dtype", [
    ("built for 3x3, 5x5 and 7x7", (3, 7, 7, 4, (1, 1), (1, 1), (1, 1)), torch.float32),
    ("take float32, float16 and bfloat16 only", SHAPES[0], torch.float64),
])
def test_a_forced_backward_that_cannot_run_falls_back_with_a_warning(why, shape, dtype):
    fnn.clear_conv_engine_cache()
    _, _, _, _, stride, padding, dilation = shape
    x, weight, bias = tensors(shape, 2, dtype, "nchw", torch.Generator().manual_seed(4))
    x.requires_grad_()
    with fnn.use_conv_engine("depthwise"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, ran = run_engines(lambda: conv2d_act(x, weight, bias, stride, padding, dilation, groups=x.shape[1],
                                                    activation="identity").sum().backward(), backward=True)
    assert ran == ["eager"], ran
    messages = [str(w.message) for w in caught if "FASTPIPE_CONV_ENGINE=depthwise" in str(w.message)]
    assert any("cannot run the backward of" in m and why in m for m in messages), messages
    x64 = x.detach().double().requires_grad_()
    want = torch.autograd.grad(F.conv2d(x64, weight.double(), bias.double(), stride, padding, dilation,
                                        groups=x.shape[1]).sum(), x64)[0]
    torch.testing.assert_close(x.grad.double(), want, rtol=1e-5, atol=1e-5)
    fnn.clear_conv_engine_cache()


def test_a_grouped_convolution_that_is_not_depthwise_runs_eager():
    fnn.clear_conv_engine_cache()
    x = torch.randn(2, 6, 9, 9, requires_grad=True)
    weight = torch.randn(6, 2, 3, 3)
    with fnn.use_conv_engine("depthwise"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, ran = run_engines(lambda: conv2d_act(x, weight, None, padding=1, groups=3).sum().backward(), backward=True)
    assert ran == ["eager"], ran
    fnn.clear_conv_engine_cache()


# ---- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + [MULTI_SPLIT], ids=str)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_backward_kernels_on_a_gpu(shape, layout, dtype):
    """Forced (not validated yet): both the forward and the backward depthwise kernels run; the gradients'
    memory poisoned first (NaN shows an element a kernel skipped)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for (need_name, need), activation in itertools.product(NEEDS.items(), ["identity", "silu"]):
        check_backward(shape, 3, dtype, layout, need, activation, g, "cuda", tol, poison=True)
        torch.cuda.synchronize()
