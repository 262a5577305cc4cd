"""The loader while the training thread captures a CUDA graph (issue 20, defect 6), on the simulated
device, which follows CUDA's capture rules: under a global-mode capture (torch.cuda.graph's default) a
host wait, allocation or page-locking in any thread in global mode fails and invalidates the capture; an
event recorded on a capturing stream is a node of the graph, which nothing that runs completes, so the
host may not wait for it and running work may not depend on it; a capturing stream may not wait for an
event of running work. Each test fails on the code before the fix: the reader threads' fence waits broke
the capture, next() put its wait into the graph, and a batch dropped during a capture was fenced by an
event of the graph.

Batches are read by copies queued on the consumer stream and compared once the streams drained: a host
wait (sim.synchronize) in the test's own thread would be refused during its capture, as on a GPU.
"""

import gc

import numpy as np
import pytest
import torch

from fastpipe.data import _device

pytestmark = pytest.mark.timeout(120, method="thread")


def read_on(sim, stream, batch, slow_us=0):
    """Queues a copy of the batch on `stream` (after `slow_us` of other work): what the stream will read."""
    if slow_us:
        sim.sleep(stream, slow_us)
    dst = {k: torch.empty_like(v) for k, v in batch.items()}
    for k in batch:
        sim.copy(stream, dst[k], batch[k])
    return dst


def as_numpy(batches):
    return [{k: v.numpy() for k, v in b.items()} for b in batches]


@pytest.mark.parametrize("kind", ["device", "pinned"])
@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_the_readers_leave_a_capture_in_another_stream_valid(dataset_factory, fp, kind, mode):
    """The training thread captures a graph on a side stream while it takes batches: the reader threads
    block on their fences (host waits) all along. Their waits must not count against the capture."""
    ds, arrays, _ = dataset_factory(300, {"x": ("uint8", (40,)), "y": ("int32", (3,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=5))
    kw = dict(device="cuda") if kind == "device" else dict(pin_memory=True)
    with _device.simulated(max_delay_us=100, seed=11) as sim:
        consumer = sim.consumer_stream()
        it = iter(fp.loader(ds, 8, shuffle=True, seed=5, prefetch=1, num_threads=2, **kw))
        seen = [read_on(sim, consumer, next(it))]  # the arena is allocated and pinned before the capture
        side = sim.new_stream()
        sim.begin_capture(side, mode)
        for b in it:
            seen.append(read_on(sim, consumer, b))
            del b
        assert sim.end_capture(side) == ""
        sim.drain()
        assert fp.same_batches(ref, as_numpy(seen))
        assert sim.misuses() == []


@pytest.mark.parametrize("mode", ["global", "relaxed"])
def test_next_during_a_capture_of_the_current_stream_is_refused_and_loses_nothing(dataset_factory, fp, mode):
    ds, arrays, _ = dataset_factory(96, {"x": ("float32", (6,))})
    ref = fp.epoch(fp.loader(ds, 8, seed=1, shuffle=True))
    with _device.simulated(max_delay_us=50, seed=12) as sim:
        consumer = sim.consumer_stream()
        it = iter(fp.loader(ds, 8, seed=1, shuffle=True, device="cuda"))
        seen = [read_on(sim, consumer, next(it))]
        sim.begin_capture(consumer, mode)
        with pytest.raises(RuntimeError, match="capturing a graph: take batches from the Loader outside"):
            next(it)
        assert sim.end_capture(consumer) == ""
        seen += [read_on(sim, consumer, b) for b in it]  # the refused batch comes next, nothing skipped
        sim.drain()
        assert fp.same_batches(ref, as_numpy(seen))
        assert sim.misuses() == []


@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_a_batch_dropped_during_a_capture_is_fenced_when_it_ends(dataset_factory, fp, kind):
    """The consumer stream still has to read a batch (a slow copy queued before the capture) when the
    program drops it inside a capture of that stream. Its slot may be refilled only after that read, and
    the fence cannot be an event of the graph: it is recorded once the capture is over."""
    ds, arrays, _ = dataset_factory(160, {"x": ("uint8", (64,))})
    ref = fp.epoch(fp.loader(ds, 8, shuffle=True, seed=7))
    kw = dict(device="cuda") if kind == "device" else dict(pin_memory=True)
    with _device.simulated(max_delay_us=50, seed=13) as sim:
        consumer = sim.consumer_stream()
        ld = fp.hooks(fp.loader(ds, 8, shuffle=True, seed=7, prefetch=1, **kw), poison=True)
        it = iter(ld)
        seen = []
        for step in range(len(ref)):
            b = next(it)
            seen.append(read_on(sim, consumer, b, slow_us=3000))
            if step % 3 == 1:  # dropped inside a capture (and the readers refill meanwhile)
                sim.begin_capture(consumer)
                del b
                gc.collect()
                assert sim.end_capture(consumer) == ""
            else:
                del b
        sim.drain()
        assert fp.same_batches(ref, as_numpy(seen))
        del it, ld
        gc.collect()
        sim.drain()
        assert sim.misuses() == []


@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_a_loader_closed_inside_a_capture_leaves_it_valid_and_its_memory_allocated(tmp_path, fp, kind):
    """The loader is closed and dropped in the thread that captures a graph, with a batch dropped inside
    the capture too: waiting for its copies there would invalidate the capture, and freeing without the
    wait could free memory still read. The memory is left allocated, reported once on stderr (in a child
    process: the report is made once per process)."""
    np.save(tmp_path / "x.npy", np.arange(256, dtype=np.uint8).reshape(16, 16))
    kw = "device='cuda'" if kind == "device" else "pin_memory=True"
    proc = fp.run_python(f"""
        import gc, fastpipe
        from fastpipe.data import _device
        with _device.simulated() as sim:
            consumer = sim.consumer_stream()
            ld = fastpipe.Loader(fastpipe.NpyDataset({str(tmp_path / "x.npy")!r}), batch_size=4, {kw})
            it = iter(ld)
            b = next(it)
            sim.begin_capture(consumer)
            del b
            ld.close()
            del it, ld
            gc.collect()
            print(repr(sim.end_capture(consumer)))
            sim.drain()
            print(sim.misuses())
        print("END")
    """)
    assert proc.returncode == 0 and proc.stdout.split() == ["''", "[]", "END"], fp.describe_exit(proc)
    assert proc.stderr.count("fastpipe:") == 1 and "captures a graph" in proc.stderr, proc.stderr
