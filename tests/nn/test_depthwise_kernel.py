"""The direct depthwise kernel (csrc/kernels/depthwise.h): its index and boundary arithmetic run on the host
over whole grids (every build), and the kernel itself on a GPU (gpu-marked), against float64 references
on awkward shapes: odd channel counts, 1-pixel and odd images, every kernel size, strides with odd
sizes, padding up to and beyond the kernel, dilation."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import poison_cuda_allocations, run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

# (channels, height, width, kernel, stride, padding, dilation)
SHAPES = [
    (3, 7, 13, (3, 3), (1, 1), (1, 1), (1, 1)),
    (10, 13, 7, (5, 5), (2, 2), (2, 2), (1, 1)),
    (59, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 13, 13, (7, 7), (2, 2), (3, 3), (1, 1)),
    (10, 7, 13, (3, 5), (2, 1), (0, 2), (2, 1)),
    (3, 9, 11, (3, 3), (1, 2), (4, 0), (2, 2)),  # padding beyond the dilated reach: border taps all outside
    (5, 13, 7, (1, 1), (2, 2), (0, 0), (1, 1)),
    (59, 7, 7, (7, 7), (1, 1), (3, 3), (2, 2)),
    (4, 2, 3, (3, 3), (1, 1), (2, 2), (1, 1)),
]


def reference(x, w, b, r, stride, padding, dilation):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride, padding, dilation,
                 groups=x.shape[1])
    return y if r is None else y + r.double()


def inputs(shape, batch, bias, residual, generator, device="cpu", dtype=torch.float32):
    c, h, wd, k, stride, padding, dilation = shape
    x = torch.randn(batch, c, h, wd, generator=generator, device=device)
    w = torch.randn(c, 1, *k, generator=generator, device=device)
    b = torch.randn(c, generator=generator, device=device) if bias else None
    out_shape = reference(x, w, b, None, stride, padding, dilation).shape
    r = torch.randn(out_shape, generator=generator, device=device) if residual else None
    return tuple(None if t is None else t.to(dtype) for t in (x, w, b, r))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_the_index_math_over_whole_grids(shape, channels_last):
    g = torch.Generator().manual_seed(0)
    for bias, residual in itertools.product([False, True], repeat=2):
        x, w, b, r = inputs(shape, 2, bias, residual, g)
        _, _, _, _, stride, padding, dilation = shape
        got = torch.ops.fastpipe._depthwise_host(x, w, b, r, stride, padding, dilation, channels_last)
        want = reference(x, w, b, r, stride, padding, dilation)
        assert got.shape == want.shape
        assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_the_tiled_path_block_by_block(shape):
    """The NCHW shared-memory-tile kernel's decomposition run block by block on the host: every output
    written by exactly one thread (the op checks), each from the right patch elements, zeros outside."""
    g = torch.Generator().manual_seed(3)
    for bias, residual in itertools.product([False, True], repeat=2):
        x, w, b, r = inputs(shape, 2, bias, residual, g)
        _, _, _, _, stride, padding, dilation = shape
        got = torch.ops.fastpipe._depthwise_host(x, w, b, r, stride, padding, dilation, False, 1, True)
        torch.testing.assert_close(got.double(), reference(x, w, b, r, stride, padding, dilation), rtol=1e-5,
                                   atol=1e-5)


def test_the_tiled_path_covers_images_larger_than_a_tile():
    """Several tiles per plane, a partial last tile in both directions, stride 2 and dilation 2."""
    g = torch.Generator().manual_seed(4)
    x, w, b, r = inputs((3, 37, 41, (5, 5), (2, 2), (4, 4), (2, 2)), 2, True, True, g)
    got = torch.ops.fastpipe._depthwise_host(x, w, b, r, (2, 2), (4, 4), (2, 2), False, 1, True)
    torch.testing.assert_close(got.double(), reference(x, w, b, r, (2, 2), (4, 4), (2, 2)), rtol=1e-5, atol=1e-5)


# Channel counts that take the vectorised NHWC path (multiples of 4 float32 or 8 float16/bfloat16 lanes).
VECTOR_SHAPES = [
    (8, 7, 13, (3, 3), (1, 1), (1, 1), (1, 1)),
    (24, 13, 7, (5, 5), (2, 2), (2, 2), (1, 1)),
    (40, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    (16, 9, 11, (3, 3), (1, 2), (4, 0), (2, 2)),
    (8, 2, 3, (7, 7), (2, 1), (3, 6), (1, 2)),
]


@pytest.mark.parametrize("shape", VECTOR_SHAPES, ids=str)
@pytest.mark.parametrize("lanes", [4, 8])
def test_the_vectorised_path_over_whole_grids(shape, lanes):
    """V channels per step (16-byte loads of float32 x 4 or half x 8): the grouping of output elements, the
    per-lane weight and bias offsets and the residual's lanes."""
    g = torch.Generator().manual_seed(1)
    for bias, residual in itertools.product([False, True], repeat=2):
        x, w, b, r = inputs(shape, 2, bias, residual, g)
        _, _, _, _, stride, padding, dilation = shape
        got = torch.ops.fastpipe._depthwise_host(x, w, b, r, stride, padding, dilation, True, lanes)
        want = reference(x, w, b, r, stride, padding, dilation)
        assert got.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_the_vectorised_path_refuses_what_it_cannot_group():
    x, w, _, _ = inputs(SHAPES[0], 1, False, False, torch.Generator().manual_seed(2))  # 3 channels
    with pytest.raises(RuntimeError, match="lanes > 1 needs channels_last and channels a multiple of lanes"):
        torch.ops.fastpipe._depthwise_host(x, w, None, None, (1, 1), (1, 1), (1, 1), True, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES + VECTOR_SHAPES, ids=str)
@pytest.mark.parametrize("layout,engine", [("nchw", "depthwise"), ("channels_last", "depthwise"),
                                           ("nchw", "depthwise_tiled")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_kernel_on_a_gpu(shape, layout, engine, dtype):
    """Forced (the engine is not validated yet), every activation, outputs poisoned first."""
    g = torch.Generator(device="cuda").manual_seed(0)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    x, w, b, r = inputs(shape, 3, True, True, g, "cuda", dtype)
    x, r = x.contiguous(memory_format=fmt), r.contiguous(memory_format=fmt)
    _, _, _, _, stride, padding, dilation = shape
    pre = reference(x, w, b, r, stride, padding, dilation)
    tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    for act, fn in [("identity", lambda t: t), ("relu", torch.relu), ("silu", F.silu), ("gelu", F.gelu),
                    ("hardswish", F.hardswish), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh)]:
        poison_cuda_allocations(pre.shape, dtype=dtype)  # an output element the kernel skips shows as NaN
        with fnn.use_conv_engine(engine):
            got, ran = run_engines(lambda: conv2d_act(x, w, b, stride, padding, dilation, groups=x.shape[1],
                                                      activation=act, residual=r))
        assert ran == [engine], (act, ran)
        torch.cuda.synchronize()
        want = fn(pre)
        assert got.is_contiguous(memory_format=fmt), act
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(1.0, want.abs().max().item()))


@pytest.mark.gpu
def test_the_kernel_on_an_unaligned_channels_last_view():
    """A view 4 bytes into its storage cannot take 16-byte loads: the element-wise path computes it."""
    g = torch.Generator(device="cuda").manual_seed(0)
    x, w, b, r = inputs(VECTOR_SHAPES[0], 2, True, True, g, "cuda")
    x = x.contiguous(memory_format=torch.channels_last)
    storage = torch.empty(x.numel() + 1, device="cuda")
    shifted = storage[1:].as_strided(x.shape, x.stride())
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0
    _, _, _, _, stride, padding, dilation = VECTOR_SHAPES[0]
    with fnn.use_conv_engine("depthwise"):
        got = conv2d_act(shifted, w, b, stride, padding, dilation, groups=x.shape[1], activation="relu",
                         residual=r.contiguous(memory_format=torch.channels_last))
    want = torch.relu(reference(x, w, b, r, stride, padding, dilation))
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4 * max(1.0, want.abs().max().item()))
