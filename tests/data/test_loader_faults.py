"""Faults injected into the reader's file reads (csrc/core/fault.h, armed through a private binding):
transient ones (EINTR, EAGAIN, short reads) change nothing, a lasting one (EIO, or an unreadable mapped
page) reaches the training loop as an OSError naming the file, the record and the offset, and the loader
and the process recover: a new pass, or a new loader, reads the epoch exactly, and no thread or file
descriptor is left behind."""

import contextlib
import errno

import pytest

from fastpipe._ext import _C
from fastpipe.data import _device

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture
def faults():
    """arm(kind, **plan) (core/fault.h's Plan); disarmed after the test whatever happens."""
    yield _C._fault_arm
    _C._fault_disarm()


@pytest.fixture
def io_mode(request, tmp_path, fp):
    if request.param == "direct" and not fp.o_direct_works(tmp_path):
        pytest.skip(f"O_DIRECT does not work on {fp.fs_type(tmp_path)}")
    return request.param


SPEC = {"x": ("float32", (37,)), "y": ("uint8", (5, 3))}


@pytest.mark.parametrize("io_mode", ["pread", "direct"], indirect=True)
@pytest.mark.parametrize("kind", ["eintr", "eagain", "short"])
@pytest.mark.parametrize("seed", [0, 7], ids=["every-3rd", "random"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["sequential", "shuffled"])
def test_transient_faults_change_nothing(dataset_factory, fp, faults, io_mode, kind, seed, shuffle):
    ds, arrays, _ = dataset_factory(203, SPEC)
    ld = fp.loader(ds, 16, shuffle=shuffle, io=io_mode, num_threads=2)
    faults(kind, every=3, seed=seed)
    idx = fp.verify(fp.epoch(ld), arrays)
    assert sorted(idx.tolist()) == list(range(203))
    injected = _C._fault_count()
    print(f"{kind} faults injected and survived: {injected}")
    assert injected >= 3, "the faults were not injected: this test would pass without them"
    ld.close()


@pytest.mark.parametrize("io_mode", ["pread", "direct", "mmap"], indirect=True)
@pytest.mark.parametrize("device", ["cpu", "simulated"])
def test_an_io_error_reaches_the_loop_and_everything_recovers(dataset_factory, fp, faults, io_mode, device):
    ds, arrays, paths = dataset_factory(97, SPEC)
    threads, fds = fp.count_threads(), fp.count_fds()
    # In a function of its own: its locals (batches, the exception's traceback) are gone when it returns.
    _fail_then_recover(fp, faults, ds, arrays, paths, io_mode, device)
    assert fp.wait_until(lambda: fp.count_threads() <= threads), "reader threads were left behind"
    assert fp.wait_until(lambda: fp.count_fds() <= fds), "file descriptors were left open"


def _fail_then_recover(fp, faults, ds, arrays, paths, io_mode, device):
    with _device.simulated(max_delay_us=200, seed=3) if device == "simulated" else contextlib.nullcontext() as sim:
        kw = {"device": "cuda"} if sim is not None else {}

        def host(batch):
            if sim is not None:
                sim.synchronize(sim.consumer_stream())
            return fp.to_np(batch)

        ld = fp.loader(ds, 8, io=io_mode, num_threads=2, **kw)
        faults("eio", path="y.npy", after=2, limit=1)
        got = []
        with pytest.raises(OSError) as caught:
            for b in ld:
                got.append(host(b))
        assert _C._fault_count() == 1
        assert caught.value.errno == errno.EIO, caught.value
        message = str(caught.value)
        assert paths["y"] in message and "record " in message and "offset " in message, message
        assert len(got) < len(ld)  # the failing batch is not delivered; those before it were whole
        fp.verify(got, arrays)
        # The same loader: a new pass reads the whole epoch exactly.
        assert sorted(fp.verify([host(b) for b in ld], arrays).tolist()) == list(range(97))
        fp.finishes(ld.close, "close() after an I/O error")
        # A new loader too.
        fresh = fp.loader(ds, 8, io=io_mode, num_threads=2, **kw)
        assert sorted(fp.verify([host(b) for b in fresh], arrays).tolist()) == list(range(97))
        fresh.close()
        if sim is not None:
            sim.drain()


def test_fault_kinds_are_checked():
    with pytest.raises(ValueError, match="fault kind must be eintr, eagain, short, eio or slow, got 'enospc'"):
        _C._fault_arm("enospc")


@pytest.mark.parametrize("what,call", [("copy", "copy_to_device"), ("launch", "launch")])
@pytest.mark.parametrize("after", [0, 5])
def test_a_failing_device_call_is_an_error_in_the_loop(tmp_path, rng, fp, what, call, after):
    """On the (simulated) device path, a copy or a transform launch that fails raises in the training
    loop at its batch: no hang, no batch with stale bytes, and the loader's next pass is whole again."""
    import numpy as np
    import torch

    from fastpipe.transforms import CropMirrorNormalize

    np.save(tmp_path / "x.npy", rng.integers(0, 256, size=(60, 6, 5, 3), dtype=np.uint8))
    np.save(tmp_path / "idx.npy", np.arange(60))
    import fastpipe

    ds = fastpipe.NpyDataset({"idx": str(tmp_path / "idx.npy"), "x": str(tmp_path / "x.npy")})
    transforms = {"x": CropMirrorNormalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), out_dtype=torch.float32)}
    # The CPU loader runs the same per-element code: its batches are the bit-exact reference.
    want = {int(i): row for b in fp.epoch(fp.loader(ds, 8, transforms=transforms)) for i, row in zip(b["idx"], b["x"], strict=True)}
    threads = fp.count_threads()
    _device_failure(fp, ds, transforms, want, what, call, after)
    assert fp.wait_until(lambda: fp.count_threads() <= threads), "threads were left behind"


def _device_failure(fp, ds, transforms, want, what, call, after):
    def exact(batches):
        for b in batches:
            for i, row in zip(b["idx"], b["x"], strict=True):
                assert row.tobytes() == want[int(i)].tobytes(), f"record {i}: stale or wrong bytes"
        return sorted(int(i) for b in batches for i in b["idx"])

    with _device.simulated(max_delay_us=200, seed=5) as sim:
        def host(batch):
            sim.synchronize(sim.consumer_stream())
            return fp.to_np(batch)

        ld = fp.loader(ds, 8, transforms=transforms, device="cuda")
        sim._fail(what, count=1, after=after)
        got = []
        with pytest.raises(RuntimeError, match=f"simulated device: {call} failed"):
            for b in ld:
                got.append(host(b))
        assert len(got) < len(ld)
        exact(got)
        assert exact([host(b) for b in ld]) == list(range(60))
        fp.finishes(ld.close, "close() after a device failure")
        sim.drain()
