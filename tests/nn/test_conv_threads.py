"""The fused conv ops called from several threads at once, as CUDA autograd calls them: the backward on a
thread of its own (CUDA's device thread), so one layer's keys are selected from two threads, while the
engine choices are timed, forgotten and cleared meanwhile. Results must equal float64 eager's and
nothing may crash: the keyed path (cache, per-thread recent choices, timing) crashed on an H200, cause
unknown (issue 29), and on the CPU it had only run from one thread at a time."""

import queue
import threading

import pytest
import torch

import fastpipe.nn as fnn
from fastpipe.nn.functional import conv2d_act

pytestmark = pytest.mark.torch_build

# (input, weight, groups): a 3x3, a depthwise and a 1x1 layer, so that each engine family is keyed.
LAYERS = [((2, 8, 9, 11), (8, 8, 3, 3), 1), ((1, 6, 7, 5), (6, 1, 3, 3), 6), ((3, 4, 6, 6), (10, 4, 1, 1), 1)]
ROUNDS = 6
FORWARD_THREADS = 3


def reference(x, w, b, groups):
    """act(conv) and its gradients in float64 eager."""
    x, w, b = (t.detach().double().requires_grad_() for t in (x, w, b))
    y = torch.relu(torch.nn.functional.conv2d(x, w, b, padding=w.shape[-1] // 2, groups=groups))
    return y, (x, w, b)


@pytest.mark.timeout(300)
def test_forward_and_backward_on_other_threads_while_choices_are_forgotten():
    errors, done = [], threading.Event()
    handoff = queue.Queue()

    def guarded(fn):
        def run(*a):
            try:
                fn(*a)
            except BaseException as e:  # reported by the test thread
                errors.append(e)
        return run

    @guarded
    def forward(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(ROUNDS):
            for xs, ws, groups in LAYERS:
                x = torch.randn(xs, generator=g).requires_grad_()
                w = torch.randn(ws, generator=g).requires_grad_()
                b = torch.randn(ws[0], generator=g).requires_grad_()
                y = conv2d_act(x, w, b, padding=ws[-1] // 2, groups=groups, activation="relu")
                ref, _ = reference(x, w, b, groups)
                torch.testing.assert_close(y.double(), ref, atol=1e-4, rtol=1e-4)
                handoff.put((y, x, w, b, groups, torch.randn(y.shape, generator=g)))

    @guarded
    def backward():
        while (item := handoff.get()) is not None:
            y, x, w, b, groups, gy = item
            got = torch.autograd.grad(y, (x, w, b), gy)
            ref, leaves = reference(x, w, b, groups)
            want = torch.autograd.grad(ref, leaves, gy.double())
            for name, a, e in zip(("input", "weight", "bias"), got, want, strict=True):
                torch.testing.assert_close(a.double(), e, atol=1e-3, rtol=1e-4, msg=lambda m: f"{name}: {m}")

    timed = set()  # the keys the churn saw timed before it forgot them: the keyed path ran meanwhile

    @guarded
    def churn():
        k = 0
        while not done.is_set():
            timed.update(line.split(" -> ")[0] for line in fnn.conv_engine_cache() if "timed here" in line)
            (fnn.clear_conv_engine_cache if k % 3 == 0 else fnn.retune)()
            k += 1

    forwards = [threading.Thread(target=forward, args=(s,)) for s in range(FORWARD_THREADS)]
    others = [threading.Thread(target=backward) for _ in range(2)] + [threading.Thread(target=churn)]
    for t in forwards + others:
        t.start()
    for t in forwards:
        t.join()
    done.set()
    for _ in range(2):
        handoff.put(None)
    for t in others:
        t.join()
    if errors:
        raise errors[0]
    assert handoff.empty()
    assert timed, "no engine choice was timed while the threads ran: the keyed path was not exercised"
