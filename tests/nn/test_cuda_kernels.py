"""fastpipe's CUDA kernels on their edge cases (skipped without a GPU): odd sizes for the 16-byte
vector paths, misaligned inputs, many bias-gradient splits, side streams and CUDA graph capture."""

import pytest
import torch
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import ACT_IDS, ACTIVATIONS, CUDA, check_error, eager_activation
from fastpipe import ops
from fastpipe.nn import _activations
from fastpipe.nn.functional import conv2d_act

pytestmark = [pytest.mark.gpu, CUDA]

# (N, C, H, W): NCHW planes with H*W a multiple of 8 or not; NHWC rows with C a multiple of 8 or not;
# few channels over many rows (many splits of the bias reduction).
BACKWARD_SHAPES = [(2, 59, 7, 7), (3, 64, 8, 8), (1, 5, 3, 1), (32, 3, 64, 64), (4, 960, 7, 7)]


@pytest.mark.parametrize("act,act_kwargs", ACTIVATIONS, ids=ACT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
def test_activation_backward_kernel(act, act_kwargs, dtype, layout):
    name, act_args = _activations.resolve(act, act_kwargs)
    eager = lambda t: eager_activation(t, act, act_kwargs)  # noqa: E731
    for shape in BACKWARD_SHAPES:
        z = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=layout)
        g = torch.randn(shape, device="cuda").to(dtype).contiguous(memory_format=layout)
        saved = eager(z) if ops.grad_from_output(name, act_args) else z
        grad_in, grad_bias = torch.ops.fastpipe._conv2d_act_backward(g, saved, name, act_args, True)
        assert grad_in.is_contiguous(memory_format=layout) and grad_bias.dtype == dtype
        # torch's own: autograd through the eager activation at dtype; the reference: the same in float64
        zz = z.detach().requires_grad_()
        eager(zz).backward(g)
        z64 = z.double().requires_grad_()
        eager(z64).backward(g.double())
        check_error(f"grad {shape}", grad_in, z64.grad, zz.grad, dtype)
        check_error(f"bias grad {shape}", grad_bias, z64.grad.sum((0, 2, 3)), zz.grad.float().sum((0, 2, 3)).to(dtype), dtype)
        _, empty = torch.ops.fastpipe._conv2d_act_backward(g, saved, name, act_args, False)
        assert empty.numel() == 0


def test_misaligned_and_strided_operands():
    x = torch.randn(2, 10, 9, 9, device="cuda")
    w = torch.randn(12, 10, 3, 3, device="cuda")
    b = torch.randn(25, device="cuda")[1::2]  # a strided bias
    r = torch.randn(2 * 12 * 9 * 9 + 1, device="cuda")[1:].view(2, 12, 9, 9)  # 4-byte, not 16-byte, aligned
    for engine in fnn.conv_engines("cuda"):
        with fnn.use_conv_engine(engine):
            out = conv2d_act(x, w, b, padding=1, activation="silu", residual=r)
        torch.testing.assert_close(out, F.silu(F.conv2d(x, w, b, padding=1) + r))


def test_side_stream():
    x = torch.randn(4, 16, 20, 20, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    ref = F.gelu(F.conv2d(x, w, padding=1))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), fnn.use_conv_engine("epilogue"):
        torch.cuda._sleep(10_000_000)  # keep the stream busy: a kernel on the wrong stream would race
        out = conv2d_act(x, w, padding=1, activation="gelu")
    torch.cuda.current_stream().wait_stream(stream)
    torch.testing.assert_close(out, ref)


def test_cuda_graph_capture_of_a_new_key():
    x = torch.randn(2, 8, 12, 12, device="cuda")
    w = torch.randn(8, 8, 3, 3, device="cuda")
    fnn.clear_conv_engine_cache()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (cuDNN plans), as torch recommends
        conv2d_act(x, w, padding=1)
    torch.cuda.current_stream().wait_stream(side)
    fnn.clear_conv_engine_cache()
    with torch.cuda.graph(graph):  # this key was never timed: it must not be timed during capture
        out = conv2d_act(x, w, padding=1, activation="hardswish")
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, F.hardswish(F.conv2d(x, w, padding=1)))
    assert fnn.conv_engine_cache() == []
