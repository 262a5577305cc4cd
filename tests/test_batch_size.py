"""find_batch_size: the size found is the largest that fits, the model is left as it was, errors and
arguments; on CPU under a memory limit, on a GPU against the device's memory and real out-of-memory errors.

The finder's peaks are checked against a measurement of the test's own (torch.profiler's allocation
events) and against what the activations of one more sample must at least take.
"""

import functools
import sys

import pytest
import torch
from torch import nn

import fastpipe

pytestmark = pytest.mark.timeout(120)

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CE = nn.functional.cross_entropy


def make_model(device="cpu", hw=16):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * hw * hw, 10),
    ).to(device)


def sample(batch_size, device="cpu", hw=16):
    return torch.randn(batch_size, 3, hw, hw, device=device), torch.randint(0, 10, (batch_size,), device=device)


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_unchanged(model, before):
    after = model.state_dict()
    assert list(after) == list(before)
    for k, v in before.items():
        assert torch.equal(after[k], v), f"{k} changed"


def measured_peak(model, batch_size):
    """The test's own measurement of a CPU step's peak: model bytes + peak of the allocation events."""
    model.train()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        x, y = sample(batch_size)
        out = model(x)  # held through backward, as in a training loop
        CE(out, y).backward()
        del x, y, out
    model.zero_grad(set_to_none=True)
    held = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return peak + sum(p.numel() * p.element_size() for p in (*model.parameters(), *model.buffers()))


def test_finds_the_largest_size_under_the_limit():
    model = make_model()
    measured_peak(model, 2)  # a first step's one-time allocations are no batch's
    limit = measured_peak(model, 8)
    r = fastpipe.find_batch_size(model, sample, memory_limit=limit, start=4, loss_fn=CE)
    assert r.batch_size == 8
    assert r.peak_bytes == limit and r.free_bytes == 0 and r.limit_bytes == limit
    assert [b for b, _, _ in r.tries] == [4, 8, 16, 12, 10, 9]  # doubling, then bisection
    peaks = dict((b, p) for b, _, p in r.tries)
    assert all(fits == (p <= limit) for _, fits, p in r.tries)
    assert (9, False, peaks[9]) in r.tries
    assert peaks[9] == measured_peak(model, 9)
    # One more sample holds at least its input and the three 8x16x16 float maps saved for backward.
    per_sample = peaks[9] - peaks[8]
    assert 4 * (3 + 3 * 8) * 16 * 16 <= per_sample <= 20 * 4 * (3 + 3 * 8) * 16 * 16
    sizes = sorted(peaks)
    assert all(peaks[a] < peaks[b] for a, b in zip(sizes, sizes[1:])), "peak memory grows with the batch"


def test_max_batch_and_start_not_fitting():
    model = make_model()
    r = fastpipe.find_batch_size(model, sample, memory_limit=1 << 40, start=3, max_batch=5, loss_fn=CE)
    assert r.batch_size == 5 and [b for b, _, _ in r.tries] == [3, 5]
    limit = dict((b, p) for b, _, p in r.tries)[3]
    r = fastpipe.find_batch_size(model, sample, memory_limit=limit, start=5, loss_fn=CE)  # bisects downwards
    assert r.batch_size == 3 and [b for b, _, _ in r.tries] == [5, 2, 3, 4]


def test_model_left_as_it_was():
    model = make_model()
    model[1].eval()  # a frozen BatchNorm stays frozen
    with torch.no_grad():
        model[0].weight.grad = torch.full_like(model[0].weight, 0.5)
    grad = model[0].weight.grad.clone()
    before, params = snapshot(model), list(model.parameters())
    modes = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    sgd = functools.partial(torch.optim.SGD, lr=1.0, momentum=0.9)  # steps move every parameter
    r = fastpipe.find_batch_size(model, sample, optimizer_fn=sgd, memory_limit=1 << 40, max_batch=4, loss_fn=CE)
    assert r.batch_size == 4
    assert_unchanged(model, before)
    assert list(model.parameters()) == params, "the same parameter objects (a user's optimizer holds them)"
    assert [m.training for m in model.modules()] == modes
    assert torch.equal(model[0].weight.grad, grad)
    assert all(p.grad is None for p in params[1:])
    assert torch.equal(torch.get_rng_state(), rng)


def test_optimizer_state_counts():
    model = make_model()
    plain = fastpipe.find_batch_size(model, sample, memory_limit=1 << 40, max_batch=1, loss_fn=CE)
    adam = fastpipe.find_batch_size(model, sample, optimizer_fn=torch.optim.Adam, memory_limit=1 << 40,
                                    max_batch=1, loss_fn=CE)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert adam.peak_bytes >= 4 * param_bytes > plain.peak_bytes  # parameters, gradients and two moments
    assert all(p.grad is None for p in model.parameters())


def test_out_of_memory_errors_are_failures():
    model = make_model()

    def oom_above_5(batch_size):
        if batch_size > 5:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return sample(batch_size)

    r = fastpipe.find_batch_size(model, oom_above_5, memory_limit=1 << 40, loss_fn=CE)
    assert r.batch_size == 5
    assert [(b, ok) for b, ok, _ in r.tries] == [(1, True), (2, True), (4, True), (8, False), (6, False), (5, True)]
    assert [p is None for _, _, p in r.tries] == [False, False, False, True, True, False]

    def cpu_oom(batch_size):
        if batch_size > 2:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory")
        return sample(batch_size)

    assert fastpipe.find_batch_size(model, cpu_oom, memory_limit=1 << 40, loss_fn=CE).batch_size == 2


def test_other_errors_propagate_and_model_is_restored():
    model = make_model()
    before = snapshot(model)

    def broken(batch_size):
        if batch_size >= 4:
            raise ValueError("bad batch")
        return sample(batch_size)

    sgd = functools.partial(torch.optim.SGD, lr=1.0)
    with pytest.raises(ValueError, match="bad batch") as info:
        fastpipe.find_batch_size(model, broken, optimizer_fn=sgd, memory_limit=1 << 40, loss_fn=CE)
    if sys.version_info >= (3, 11):
        assert "batch size 4" in " ".join(info.value.__notes__)
    assert_unchanged(model, before)
    assert all(p.grad is None for p in model.parameters())


def test_batch_contract():
    model = make_model()
    r = fastpipe.find_batch_size(model, lambda b: sample(b)[0], memory_limit=1 << 40, max_batch=2)  # inputs only
    assert r.batch_size == 2
    with pytest.raises(TypeError, match="inputs, target"):
        fastpipe.find_batch_size(model, lambda b: (*sample(b), None), memory_limit=1 << 40, max_batch=2)
    with pytest.raises(RuntimeError, match="even batch size 1"):
        fastpipe.find_batch_size(model, sample, memory_limit=1, loss_fn=CE)


@pytest.mark.parametrize("kwargs,name", [
    ({"start": 0}, "start"), ({"start": 2.0}, "start"), ({"max_batch": 0}, "max_batch"),
    ({"start": 8, "max_batch": 4}, "max_batch"), ({"max_memory_fraction": 0}, "max_memory_fraction"),
    ({"max_memory_fraction": 1.5}, "max_memory_fraction"), ({"memory_limit": 0}, "memory_limit"),
    ({"memory_limit": None}, "memory_limit"), ({"device": "meta"}, "device"),
])
def test_bad_arguments(kwargs, name):
    args = {"memory_limit": 1 << 30, **kwargs}
    with pytest.raises(ValueError, match=name):
        fastpipe.find_batch_size(make_model(), sample, **args)


def test_bad_types():
    with pytest.raises(TypeError, match="model"):
        fastpipe.find_batch_size(lambda x: x, sample, memory_limit=1 << 30)
    with pytest.raises(TypeError, match="sample_batch_fn"):
        fastpipe.find_batch_size(make_model(), None, memory_limit=1 << 30)


@pytest.mark.gpu
@CUDA
def test_cuda_limit_and_out_of_memory():
    model = make_model("cuda", hw=64)
    before = snapshot(model)
    cuda_sample = functools.partial(sample, device="cuda", hw=64)
    r = fastpipe.find_batch_size(model, cuda_sample, memory_limit=256 << 20, loss_fn=CE)
    assert r.limit_bytes == 256 << 20
    assert r.batch_size >= 1 and r.peak_bytes <= r.limit_bytes
    assert any(b == r.batch_size + 1 and not ok for b, ok, _ in r.tries)
    assert_unchanged(model, before)

    # The allocator refuses beyond ~1 GiB: real out-of-memory errors, under a limit of the whole device.
    # What stays allocated now (the model, and the cuBLAS and cuDNN workspaces its first tries created:
    # 70 MB on an H200) is the floor the tries must return to.
    torch.cuda.synchronize()
    floor = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total)
    try:
        r = fastpipe.find_batch_size(model, cuda_sample, max_memory_fraction=1.0, loss_fn=CE,
                                     optimizer_fn=torch.optim.Adam)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert r.limit_bytes == total and r.peak_bytes <= 1 << 30
    assert any(p is None for _, _, p in r.tries), "expected real out-of-memory errors"
    assert any(b == r.batch_size + 1 and not ok for b, ok, _ in r.tries)
    assert_unchanged(model, before)
    assert all(p.grad is None for p in model.parameters())
    assert torch.cuda.memory_allocated() <= floor + (1 << 20), ("the tries' memory is freed",
                                                                torch.cuda.memory_allocated(), floor)
