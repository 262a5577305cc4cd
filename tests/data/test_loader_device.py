"""The device data path (Loader(device="cuda")) on the simulated device: the whole pipeline's ordering
(copy stream, ready events the consumer waits on, stream-ordered release of slots, host slots refilled
only after their copy) with random delays on every stream, checked byte for byte against numpy.

Batches on the simulation are CPU tensors whose contents the simulated consumer stream owns: the host
reads them after `sim.synchronize(consumer)`, as a program reads a CUDA tensor after its stream's work.
"""

import gc
import warnings

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CropMirrorNormalize

pytestmark = pytest.mark.timeout(120, method="thread")


@pytest.fixture(params=[0, 300], ids=["no-delay", "delays"])
def sim(request):
    with _device.simulated(max_delay_us=request.param, seed=request.param) as s:
        yield s
        s.drain()


def host(fp, sim, batch):
    """The batch as numpy copies, read once the consumer stream's work so far is done."""
    sim.synchronize(sim.consumer_stream())
    return fp.to_np(batch)


def epoch(fp, sim, loader):
    out = []
    for b in loader:
        out.append(host(fp, sim, b))
        del b
    return out


@pytest.mark.parametrize("dtype,rec", [("uint8", (3, 5, 7)), ("float16", (13,)), ("int64", ()), ("bool", (2, 3))])
def test_batches_are_byte_exact(sim, dataset_factory, fp, dtype, rec):
    ds, arrays, _ = dataset_factory(203, {"x": (dtype, rec), "y": ("float32", (3,))})
    ld = fp.loader(ds, 16, shuffle=True, seed=1, device="cuda", num_threads=3)
    assert ld.device == torch.device("cpu")  # the simulation's batches are CPU tensors
    for _ in range(2):
        batches = epoch(fp, sim, ld)
        assert [len(b["idx"]) for b in batches] == [16] * 12 + [11]
        assert sorted(fp.verify(batches, arrays).tolist()) == list(range(203))
    st = ld.stats()
    assert st["device_slots"] == st["prefetch"] + 2 and st["device_arena_bytes"] > 0


def test_same_batches_as_the_cpu_loader(sim, dataset_factory, fp):
    ds, arrays, _ = dataset_factory(157, {"x": ("int16", (5,))})
    for kw in (dict(shuffle=True, seed=4), dict(drop_last=True), dict(rank=1, world_size=3, shuffle=True)):
        cpu = fp.epoch(fp.loader(ds, 10, **kw))
        dev = epoch(fp, sim, fp.loader(ds, 10, device="cuda", **kw))
        assert fp.same_batches(cpu, dev), kw


def test_token_windows_are_widened_on_the_device(sim, tmp_path, rng, fp):
    tokens = rng.integers(0, 65536, size=20_011, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    ds = fastpipe.TokenDataset(str(tmp_path / "t.bin"), 64)
    cpu = fp.epoch(fp.loader(ds, 7, shuffle=True, seed=3))
    dev = epoch(fp, sim, fp.loader(ds, 7, shuffle=True, seed=3, device="cuda"))
    assert fp.same_batches(cpu, dev)
    x, y = dev[0]
    assert x.dtype == np.int64 and x.shape == (7, 64) and (y[:, :-1] == x[:, 1:]).all()


def test_transforms_on_the_device_are_bit_identical_to_the_cpu(sim, tmp_path, rng, fp):
    x = rng.integers(0, 256, size=(45, 12, 10, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    ds = fastpipe.NpyDataset([str(tmp_path / "x.npy")])
    for kw in (dict(crop=(8, 6), random_crop=True, mirror=0.5), dict(out_dtype=torch.bfloat16, layout="NHWC"),
               dict(crop=(5, 5), mirror=1.0, out_dtype=torch.float16), dict(random_crop=True, padding=3, mirror=0.5)):
        t = CropMirrorNormalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), **kw)
        cpu = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=9, transforms={0: t}))
        dev = epoch(fp, sim, fp.loader(ds, 8, shuffle=True, seed=9, transforms={0: t}, device="cuda"))
        assert fp.same_batches(cpu, dev), kw


def race(sim, ld, consumer_us, stream=None, record=False):
    """Each batch is read by the (slow) consumer stream after the Python code has dropped it, as a model
    queued behind other kernels would; returns what the stream read."""
    consumer = sim.consumer_stream()
    stream = stream or consumer
    seen = []
    for b in ld:
        dst = {k: torch.empty_like(v) for k, v in b.items()}
        if stream != consumer:
            sim.synchronize(consumer)  # the side stream starts after the batch is ready (a wait_stream)
        if record:
            for v in b.values():
                fastpipe.record_stream(v, stream)
        sim.sleep(stream, consumer_us)
        for k in b:
            sim.copy(stream, dst[k], b[k])
        seen.append(dst)
        del b
    sim.drain()
    return [{k: v.numpy() for k, v in d.items()} for d in seen]


def test_release_waits_for_the_consumer_stream(dataset_factory, fp):
    """The batch is dropped at once while the consumer stream is busy: the slot must not be refilled
    before the stream read it. Without the release fence (the canary) the same run reads other batches
    (a whole slot is overwritten, so each batch stays self-consistent: compare with the epoch's order)."""
    ds, arrays, _ = dataset_factory(240, {"x": ("uint8", (64,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=2))
    with _device.simulated(max_delay_us=50, seed=1) as sim:
        ld = fp.loader(ds, 8, shuffle=True, seed=2, prefetch=1, device="cuda")
        got = race(sim, ld, 3000)
        fp.verify(got, arrays)
        assert fp.same_batches(ref, got)
        canary = fp.loader(ds, 8, shuffle=True, seed=2, prefetch=1, device="cuda")
        canary._reader._skip_release_fence(True)
        assert not fp.same_batches(ref, race(sim, canary, 3000)), "the canary raced nothing: the test proves nothing"


def test_record_stream_covers_a_side_stream(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(160, {"x": ("int32", (16,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True))
    with _device.simulated(max_delay_us=50, seed=2) as sim:
        side = sim.new_stream()
        ld = fp.loader(ds, 8, shuffle=True, prefetch=1, device="cuda")
        assert fp.same_batches(ref, race(sim, ld, 3000, stream=side, record=True))
        unrecorded = fp.loader(ds, 8, shuffle=True, prefetch=1, device="cuda")
        # the control: use on a side stream alone is not fenced
        assert not fp.same_batches(ref, race(sim, unrecorded, 3000, stream=side))
    with pytest.raises(RuntimeError, match="not a batch of a fastpipe Loader"):
        fastpipe.record_stream(torch.ones(3), 0)


@pytest.mark.parametrize("threads", [None, 0], ids=["reader-threads", "num_threads=0"])
@pytest.mark.parametrize("side", [False, True], ids=["current-stream", "side-stream+record_stream"])
def test_pinned_batches_are_refilled_after_the_copies_from_them(dataset_factory, fp, side, threads):
    """pin_memory=True on the CPU: `batch.to("cuda", non_blocking=True)` queues a copy that reads the
    pinned slot later; dropping the batch at once must not let a reader (or next() itself, with
    num_threads=0) refill it before that copy ran. The control: without pin_memory nothing is fenced, and
    the same run reads later batches' bytes."""
    ds, arrays, _ = dataset_factory(200, {"x": ("uint8", (48,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=6))
    threads_kw = {} if threads is None else {"num_threads": threads}

    def run(sim, **kw):
        ld = fp.hooks(fp.loader(ds, 8, shuffle=True, seed=6, prefetch=1, **threads_kw, **kw), poison=True)
        stream = sim.new_stream() if side else sim.consumer_stream()
        seen = []
        for b in ld:
            dst = {k: torch.empty_like(v) for k, v in b.items()}
            if side and kw.get("pin_memory"):
                for v in b.values():
                    fastpipe.record_stream(v, stream)
            sim.sleep(stream, 3000)
            for k in b:
                sim.copy(stream, dst[k], b[k])  # the asynchronous host-to-device copy
            seen.append(dst)
            del b
        sim.drain()
        return [{k: v.numpy() for k, v in d.items()} for d in seen]

    with _device.simulated(max_delay_us=50, seed=5) as sim:
        assert fp.same_batches(ref, run(sim, pin_memory=True))
        assert not fp.same_batches(ref, run(sim)), "the control raced nothing: the test proves nothing"
    with pytest.raises(RuntimeError, match="does not pin its memory"):
        fastpipe.record_stream(next(iter(fp.loader(ds, 8)))["x"], 0)


def test_host_slots_are_refilled_only_after_their_copy(dataset_factory, fp):
    """A slow copy stream and poisoned host slots: a reader refilling a slot before the copy out of it
    ran would put 0xA5 (or the next batch) on the device."""
    ds, arrays, _ = dataset_factory(300, {"x": ("uint8", (100,))})
    with _device.simulated(max_delay_us=2000, seed=3) as sim:
        ld = fp.hooks(fp.loader(ds, 10, shuffle=True, prefetch=1, num_threads=3, device="cuda"), poison=True)
        assert sorted(fp.verify(epoch(fp, sim, ld), arrays).tolist()) == list(range(300))


def test_held_batches_never_change_and_overflow_when_every_slot_is_held(sim, dataset_factory, fp):
    ds, arrays, _ = dataset_factory(120, {"x": ("float32", (5,))})
    ld = fp.loader(ds, 10, shuffle=True, prefetch=1, device="cuda")
    with pytest.warns(UserWarning, match="holds every one of the 3 arena slots"):
        held = list(ld)
    got = [host(fp, sim, b) for b in held]
    assert sorted(fp.verify(got, arrays).tolist()) == list(range(120))
    assert ld.stats()["overflow_batches"] >= 12 - 3 - 2  # slots, and the batches issued ahead
    fp.epoch(fp.loader(ds, 10))  # other work meanwhile
    assert fp.same_batches(got, [host(fp, sim, b) for b in held]), "a held batch changed"
    del held
    gc.collect()
    assert ld.stats()["device_slots_leased"] == 0
    strict = fp.loader(ds, 10, prefetch=1, device="cuda", when_full="error")
    it = iter(strict)
    keep = [next(it) for _ in range(3)]
    with pytest.raises(TimeoutError, match="all 3 device slots are held"):
        next(it)
    del keep


def test_overflow_batches_wait_for_the_consumer_stream(dataset_factory, fp):
    """Every slot held: the next batches go to memory that the allocator hands out again as soon as the
    copy stream is past their batch's death (torch's caching allocator, the block allocated on the
    consumer's stream), while the slow consumer stream still reads the previous overflow batch. The copy
    into such memory must wait for the consumer stream's queued work (issue 20, defect 1)."""
    ds, arrays, _ = dataset_factory(200, {"x": ("uint8", (64,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=3))
    with _device.simulated(max_delay_us=50, seed=4) as sim:
        ld = fp.loader(ds, 8, shuffle=True, seed=3, prefetch=1, device="cuda")
        it = iter(ld)
        held = [next(it) for _ in range(3)]  # every device slot
        with pytest.warns(UserWarning, match="holds every one of the 3 arena slots"):
            got = race(sim, it, 3000)
        assert ld.stats()["overflow_batches"] >= len(got) - 2
        assert fp.same_batches(ref[:3], [host(fp, sim, b) for b in held])
        assert fp.same_batches(ref[3:], got)
        del held, it, ld
        gc.collect()
        sim.drain()
        assert sim.misuses() == []


def test_teardown_releases_issued_batches_before_the_copy_stream(dataset_factory, fp):
    """Overflow batches issued ahead and never taken: the pipeline's end must release them (their memory
    is freed after the copy stream's work) before it destroys that stream (issue 20, defect 4)."""
    ds, arrays, _ = dataset_factory(120, {"x": ("uint8", (32,))})
    with _device.simulated(max_delay_us=50, seed=8) as sim:
        ld = fp.loader(ds, 8, prefetch=1, device="cuda")
        it = iter(ld)
        held = [next(it) for _ in range(3)]
        with pytest.warns(UserWarning, match="holds every one"):
            held.append(next(it))  # an overflow batch, and the next ones issued behind it
        del it, ld, held
        gc.collect()
        sim.drain()
        assert sim.misuses() == []


def test_a_batch_whose_copy_fails_still_fences_the_copies_before_it(dataset_factory, fp):
    """The second copy of a batch fails: the first is already queued and reads the host slot later. The
    slot must be fenced all the same, or closing the loader unpins (and frees) the arena under that copy
    (issue 20, defect 5); the simulation reports a copy from memory no longer page-locked."""
    ds, arrays, _ = dataset_factory(64, {"x": ("uint8", (16,)), "y": ("int32", (3,))})
    with _device.simulated(max_delay_us=20000, seed=9) as sim:
        sim._fail("copy", count=1, after=1)
        ld = fp.loader(ds, 8, prefetch=1, device="cuda")
        with pytest.raises(RuntimeError, match="copy_to_device failed"):
            for _ in ld:
                pass
        ld.close()
        del ld
        gc.collect()
        sim.drain()
        assert sim.misuses() == []


def test_every_entry_point_leaves_the_current_device_alone(dataset_factory, fp):
    """The simulated device plays device 1 while the thread's current device is 0: building a loader,
    taking, holding and dropping batches, record_stream, an overflow batch, a pinned CPU loader and close
    must leave the caller's current device as it was (issue 20, defect 2: torch.empty(device="cuda")
    would land on the loader's GPU)."""
    ds, arrays, _ = dataset_factory(48, {"x": ("uint8", (8,))})
    SimDevice = fastpipe._ext._C.SimDevice
    assert SimDevice.current_device() == 0
    with _device.simulated(max_delay_us=50, seed=10) as sim:
        steps = []

        def check(what):
            steps.append((what, SimDevice.current_device()))

        ld = fp.loader(ds, 8, prefetch=1, device="cuda")
        check("Loader()")
        it = iter(ld)
        held = [next(it) for _ in range(3)]
        check("next()")
        fastpipe.record_stream(held[0]["x"], sim.new_stream())
        check("record_stream()")
        with pytest.warns(UserWarning, match="holds every one"):
            held.append(next(it))
        check("next() into overflow")
        del held
        gc.collect()
        check("dropping batches")
        ld.close()
        check("close()")
        pinned = fp.loader(ds, 8, pin_memory=True)
        check("Loader(pin_memory=True)")
        for b in pinned:
            del b
        check("pinned batches")
        pinned.close()
        del ld, pinned
        gc.collect()
        check("destruction")
        sim.drain()
    assert [w for w, current in steps if current != 0] == []


@pytest.mark.parametrize("fails", [("record",), ("synchronize", "free"), ("record", "synchronize", "free")])
def test_device_failures_at_teardown_end_the_process_normally(tmp_path, fp, fails):
    """A sticky device error (a device-side assert in the model) makes every later call fail, also those a
    batch's release, close() and the loader's destruction make: they must report it once and leak, never
    throw out of a destructor (std::terminate) (issue 20, defect 3)."""
    np.save(tmp_path / "x.npy", np.arange(400, dtype=np.int32).reshape(100, 4))
    proc = fp.run_python(f"""
        import gc, fastpipe
        from fastpipe.data import _device
        with _device.simulated(max_delay_us=50) as sim:
            ld = fastpipe.Loader(fastpipe.NpyDataset({str(tmp_path / "x.npy")!r}), batch_size=8, device="cuda",
                                 prefetch=1)
            it = iter(ld)
            held = [next(it) for _ in range(2)]
            for what in {fails!r}:
                sim._fail(what, count=1000)
            del held     # the releases' events
            ld.close()   # waits for the copies in flight
            del it, ld
            gc.collect()  # the arena's release
            pinned = fastpipe.Loader(fastpipe.NpyDataset({str(tmp_path / "x.npy")!r}), batch_size=8,
                                     pin_memory=True)
            try:
                for b in pinned:
                    del b
            except RuntimeError as e:  # a reused slot's fence meets the sticky error: raised, not an abort
                assert "injected by a test" in str(e), e
            del pinned
            gc.collect()
        print("END")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "END", fp.describe_exit(proc)
    assert proc.stderr.count("fastpipe:") == 1 and "failed (simulated device:" in proc.stderr, proc.stderr


def test_record_stream_on_another_devices_stream_is_refused():
    """Recording a batch's release on another device's stream would fail at the release (a destructor):
    refused at once, naming both devices."""
    class Batch:  # what record_stream looks at first: a CUDA tensor's device
        is_cuda = True
        device = torch.device("cuda", 0)

    class OtherDeviceStream:
        device = torch.device("cuda", 1)
        cuda_stream = 0

    with pytest.raises(ValueError, match="the stream is on cuda:1 but the batch is on cuda:0"):
        fastpipe.record_stream(Batch(), OtherDeviceStream())


def test_resume_and_state_on_the_device(sim, dataset_factory, fp):
    ds, arrays, _ = dataset_factory(101, {"x": ("uint8", (9,))})
    ref = epoch(fp, sim, fp.loader(ds, 8, shuffle=True, seed=5, device="cuda"))
    a = fp.loader(ds, 8, shuffle=True, seed=5, device="cuda")
    it = iter(a)
    for _ in range(4):
        next(it)
    b = fp.loader(ds, 8, shuffle=True, seed=5, device="cuda")
    b.load_state_dict(a.state_dict())
    assert fp.same_batches(epoch(fp, sim, b), ref[4:])


def test_abandoned_passes_and_close_with_work_in_flight(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(400, {"x": ("uint8", (32,))})
    with _device.simulated(max_delay_us=1000, seed=4) as sim:
        ld = fp.loader(ds, 16, shuffle=True, device="cuda")
        for _ in range(10):  # break right away while copies are queued
            it = iter(ld)
            first = host(fp, sim, next(it))
            fp.verify([first], arrays)
            del it
        keep = next(iter(ld))
        sim.sleep(sim.consumer_stream(), 20_000)
        ld.close()  # copies and the consumer's work still queued
        assert sorted(fp.verify([host(fp, sim, keep)], arrays).tolist()) == sorted(keep["idx"].tolist())
        del keep, ld
        gc.collect()
        sim.drain()


def test_errors_reach_the_loop_at_their_batch(sim, tmp_path, rng, fp):
    x = rng.integers(0, 256, size=(500, 64), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    ld = fp.loader(fastpipe.NpyDataset(str(tmp_path / "x.npy")), 10, io="pread", device="cuda")
    it = iter(ld)
    good = [host(fp, sim, (next(it),))[0] for _ in range(2)]
    import os

    os.truncate(tmp_path / "x.npy", os.path.getsize(tmp_path / "x.npy") - 400 * 64)
    later = []
    with pytest.raises(OSError, match="x.npy"):
        for b in it:
            later.append(host(fp, sim, (b,))[0])
            del b
    # batches read before the cut (prefetched) or within what is left are right; the error comes first
    got = np.concatenate(good + later) if later else np.concatenate(good)
    assert got.tobytes() == x[: len(got)].tobytes() and len(got) < 500


def test_the_stages_are_named_ranges_in_profiler_traces(sim, tmp_path, rng, fp):
    """A torch.profiler trace of a device pass shows each batch's wait, copies and transform by name."""
    x = rng.integers(0, 256, size=(21, 6, 5, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(21))
    ds = fastpipe.NpyDataset([str(tmp_path / "x.npy"), str(tmp_path / "y.npy")])
    t = CropMirrorNormalize(0.5, 0.25)
    ld = fp.loader(ds, 4, transforms={0: t}, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        batches = epoch(fp, sim, ld)
    names = [e.name for e in prof.events()]
    assert len(batches) == 6
    assert names.count("fastpipe::loader.next") == 7  # the last one finds the end of the pass
    assert names.count("fastpipe::loader.transform") == 6
    assert names.count("fastpipe::loader.copy") >= 12  # each batch's two columns
