"""fastpipe's CUDA kernels on their edge cases (skipped without a GPU): misaligned and strided
operands, side streams and CUDA graph capture. The backward kernel's odd sizes are in test_ops.py."""

import pytest
import torch
import torch.nn.functional as F

import fastpipe.nn as fnn
from conv_ref import engines, run_engines
from fastpipe.nn.functional import conv2d_act

pytestmark = [pytest.mark.gpu, pytest.mark.torch_build]

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


@pytest.fixture
def time_unvalidated():
    """The CUDA engines are timed as if validated, so that a new key has candidates to time."""
    old = torch.ops.fastpipe._conv_engine_time_unvalidated(True)
    yield
    torch.ops.fastpipe._conv_engine_time_unvalidated(old)


def test_cuda_graph_capture_of_a_new_key(time_unvalidated):
    """A key first met inside a capture is not timed there (timing synchronizes the stream, which a capture
    forbids: the capture would fail) and not cached; the graph holds the op: every replay computes it for
    the inputs copied into the static input, into an output poisoned before each replay."""
    g = torch.Generator(device="cuda").manual_seed(0)
    static_x = torch.randn(2, 8, 12, 12, device="cuda", generator=g)
    w = torch.randn(8, 8, 3, 3, device="cuda", generator=g)
    call = lambda: conv2d_act(static_x, w, padding=1, activation="hardswish")  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph (cuDNN plans), as torch recommends
        call()
        timed = fnn.conv_engine_cache()
    torch.cuda.current_stream().wait_stream(side)
    assert len(timed) == 1 and " (ms: eager=" in timed[0], f"the key was not timed outside a capture: {timed}"
    fnn.clear_conv_engine_cache()
    graph = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(graph):
            return call()

    out, ran = run_engines(capture)
    assert ran == ["eager"], f"inside the capture the new key must run eager, untimed: {ran}"
    assert fnn.conv_engine_cache() == []
    for _ in range(3):
        x = torch.randn(static_x.shape, device="cuda", generator=g)
        static_x.copy_(x)
        out.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(out, F.hardswish(F.conv2d(x.double(), w.double(), padding=1)).float(),
                                   rtol=1e-4, atol=1e-4)
