"""fastpipe's CUDA kernels on their edge cases (skipped without a GPU): misaligned and strided
operands, side streams and CUDA graph capture. The backward kernel's odd sizes are in test_ops.py."""

import pytest
import torch
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import CUDA, engines
from fastpipe.nn.functional import conv2d_act

pytestmark = [pytest.mark.gpu, CUDA]

def test_misaligned_and_strided_operands():
    x = torch.randn(2, 10, 9, 9, device="cuda")
    w = torch.randn(12, 10, 3, 3, device="cuda")
    b = torch.randn(25, device="cuda")[1::2]  # a strided bias
    r = torch.randn(2 * 12 * 9 * 9 + 1, device="cuda")[1:].view(2, 12, 9, 9)  # 4-byte, not 16-byte, aligned
    for engine in engines("cuda"):
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
