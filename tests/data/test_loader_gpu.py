"""Loader features on a real GPU (skipped cleanly without one): the device path against numpy and the
CPU path, the release fence behind a busy stream, held batches, memory that stays flat, DLPack, and
pin_memory's fence. The same ordering logic runs without a GPU in test_loader_device.py."""

import gc
import os

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.transforms import CropMirrorNormalize

needs_gpu = pytest.mark.skipif(not fastpipe.build_info()["cuda_available"],
                               reason="needs a CUDA device and fastpipe built with CUDA")
pytestmark = [pytest.mark.gpu, needs_gpu, pytest.mark.timeout(120, method="thread")]


def test_batches_are_byte_exact_on_the_gpu(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(1_003, {"x": ("uint8", (3, 17, 5)), "y": ("float16", (7,)), "z": ("int64", ())})
    for device in ("cuda", "cuda:0", torch.device("cuda", 0)):
        ld = fp.loader(ds, 32, shuffle=True, seed=1, device=device)
        batches = []
        for b in ld:
            assert all(v.is_cuda and v.device.index == 0 for v in b.values())
            batches.append(fp.to_np(b))
        assert sorted(fp.verify(batches, arrays).tolist()) == list(range(1_003))
        assert fp.same_batches(batches, fp.epoch(fp.loader(ds, 32, shuffle=True, seed=1)))


def test_token_windows_on_the_gpu(tmp_path, rng, fp):
    tokens = rng.integers(0, 50_257, size=100_001, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    ds = fastpipe.TokenDataset(str(tmp_path / "t.bin"), 256)
    cpu = fp.epoch(fp.loader(ds, 16, shuffle=True, seed=2))
    gpu = [fp.to_np(b) for b in fp.loader(ds, 16, shuffle=True, seed=2, device="cuda")]
    assert fp.same_batches(cpu, gpu)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("padding", [0, 4])
def test_transforms_on_the_gpu_are_bit_identical_to_the_cpu(tmp_path, rng, fp, out_dtype, layout, padding):
    x = rng.integers(0, 256, size=(77, 40, 37, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    ds = fastpipe.NpyDataset([str(tmp_path / "x.npy")])
    t = CropMirrorNormalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), crop=(32, 29), random_crop=True,
                            mirror=0.5, out_dtype=out_dtype, layout=layout, padding=padding)
    cpu = fp.epoch(fp.loader(ds, 16, shuffle=True, seed=3, transforms={0: t}))
    gpu = [fp.to_np(b) for b in fp.loader(ds, 16, shuffle=True, seed=3, transforms={0: t}, device="cuda")]
    assert fp.same_batches(cpu, gpu)
    # and the CPU path against float64 (tests/test_transforms.py checks it in depth): one batch here
    first = next(iter(fp.loader(ds, 16, shuffle=True, seed=3, transforms={0: t}, device="cuda")))[0]
    assert first.dtype == out_dtype and first.is_cuda


def test_release_waits_for_a_busy_stream(dataset_factory, fp):
    """Each batch is cloned by work queued behind a long kernel, and dropped at once: the slot must not
    be refilled before the clone ran. The canary (no release fence) must read other batches."""
    ds, arrays, _ = dataset_factory(2_000, {"x": ("uint8", (4_096,))})
    ref = fp.epoch(fp.loader(ds, 64, shuffle=True, seed=4))

    def run(canary):
        ld = fp.hooks(fp.loader(ds, 64, shuffle=True, seed=4, prefetch=1, device="cuda"), poison=True)
        if canary:
            ld._reader._skip_release_fence(True)
        side = torch.cuda.Stream()
        seen = []
        for b in ld:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for v in b.values():
                    fastpipe.record_stream(v, side)
                torch.cuda._sleep(2_000_000)  # ~1 ms: the batch is read long after it was dropped
                seen.append({k: v.clone() for k, v in b.items()})
            del b
        torch.cuda.synchronize()
        return [fp.to_np(s) for s in seen]

    got = run(False)
    fp.verify(got, arrays)
    assert fp.same_batches(ref, got)
    if os.environ.get("FASTPIPE_UNDER_SANITIZER"):
        return  # compute-sanitizer serialises the streams: the canary's race cannot happen there
    assert not fp.same_batches(ref, run(True)), "the canary raced nothing: the test proves nothing"


def test_held_batches_never_change_and_memory_stays_flat(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(500, {"x": ("float32", (64,))})
    ld = fp.loader(ds, 25, shuffle=True, prefetch=2, device="cuda")
    with pytest.warns(UserWarning, match="holds every one of the 4 arena slots"):
        held = list(ld)
    snap = [fp.to_np(b) for b in held]
    assert sorted(fp.verify(snap, arrays).tolist()) == list(range(500))
    for _ in range(3):
        fp.epoch(fp.loader(ds, 25, device="cuda"))
    assert fp.same_batches(snap, [fp.to_np(b) for b in held])
    del held
    gc.collect()
    torch.cuda.synchronize()
    arena, allocated = ld.stats()["device_arena_bytes"], torch.cuda.memory_allocated()
    for _ in range(20):
        for b in ld:
            del b
    torch.cuda.synchronize()
    assert ld.stats()["device_arena_bytes"] == arena
    assert torch.cuda.memory_allocated() <= allocated, "torch's memory grew over 20 epochs"
    assert ld.stats()["device_slots_leased"] == 0


def test_when_full_error_raises_at_once_on_the_gpu(dataset_factory, fp):
    ds, _, _ = dataset_factory(100, {"x": ("uint8", (16,))})
    it = iter(fp.loader(ds, 10, prefetch=1, device="cuda", when_full="error"))
    keep = [next(it) for _ in range(3)]
    with pytest.raises(TimeoutError, match="all 3 device slots are held"):
        next(it)
    del keep


def test_dlpack_consumers_take_batches_without_a_copy(dataset_factory, fp):
    cupy = pytest.importorskip("cupy")
    ds, arrays, _ = dataset_factory(64, {"x": ("int32", (8,))})
    b = next(iter(fp.loader(ds, 16, device="cuda")))
    c = cupy.from_dlpack(b["x"])
    assert c.data.ptr == b["x"].data_ptr()
    torch.cuda.synchronize()
    assert (cupy.asnumpy(c) == arrays["x"][b["idx"].cpu().numpy()]).all()


def test_pin_memory_release_waits_for_queued_copies(tmp_path, fp):
    """Each copy is queued behind a long kernel and its host batch dropped at once: the slot must not be
    refilled before the copy ran (stream-ordered release), or the device sees the next batch's bytes."""
    x = np.random.default_rng().integers(0, 256, size=(997, 3, 17, 5), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    ds = fastpipe.NpyDataset(str(tmp_path / "x.npy"))
    loader = fp.hooks(fastpipe.Loader(ds, batch_size=32, shuffle=True, pin_memory=True), poison=True)
    got = []
    for b in loader:
        assert b.is_pinned()
        torch.cuda._sleep(2_000_000)  # keeps the stream busy so the copy runs long after the release
        got.append(b.to("cuda", non_blocking=True))
        del b
    torch.cuda.synchronize()
    rows = torch.cat(got).cpu().numpy().reshape(len(x), -1)
    assert sorted(map(bytes, rows)) == sorted(map(bytes, x.reshape(len(x), -1)))


def test_pin_memory_on_a_side_stream_with_record_stream(tmp_path, fp):
    x = np.random.default_rng().integers(0, 256, size=(640, 256), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    loader = fp.hooks(fastpipe.Loader(fastpipe.NpyDataset(str(tmp_path / "x.npy")), 32, pin_memory=True,
                                      prefetch=1), poison=True)
    side = torch.cuda.Stream()
    got = []
    for b in loader:
        with torch.cuda.stream(side):
            fastpipe.record_stream(b, side)
            torch.cuda._sleep(2_000_000)
            got.append(b.to("cuda", non_blocking=True))
        del b
    torch.cuda.synchronize()
    assert torch.cat(got).cpu().numpy().tobytes() == x.tobytes()


@pytest.mark.parametrize("kind", ["device", "pinned"])
def test_graphs_captured_between_batches_stay_valid(dataset_factory, fp, kind):
    """The training thread captures CUDA graphs (global mode, torch.cuda.graph's default) right after it
    takes a batch, while the reader threads refill the slots it freed and block on their fences: no
    capture may fail, and each replay computes what the same kernels compute eagerly (issue 20, defect 6;
    test_loader_capture.py plays it on the simulated device)."""
    ds, arrays, _ = dataset_factory(1_500, {"x": ("float32", (512,))})
    kw = dict(device="cuda") if kind == "device" else dict(pin_memory=True)
    ld = fp.loader(ds, 32, shuffle=True, seed=3, prefetch=2, num_threads=2, drop_last=True, **kw)
    static_x = torch.zeros(32, 512, device="cuda")

    def steps(x):  # long enough for the readers to work during the capture; keeps every input apart
        for k in range(200):
            x = x + 1.0 if k % 2 else -x
        return x

    captures = 0
    for step, b in enumerate(ld):
        static_x.copy_(b["x"].to("cuda", non_blocking=True))
        del b
        if step % 3:
            continue
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = steps(static_x)
        g.replay()
        # Bit for bit (the data is random bits: NaN and infinities included), replay against eager.
        assert torch.equal(out.view(torch.int32), steps(static_x.clone()).view(torch.int32))
        captures += 1
    assert captures >= 10


def test_next_inside_a_capture_is_refused_and_loses_no_batch(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(200, {"x": ("int32", (8,))})
    it = iter(fp.loader(ds, 16, device="cuda"))
    seen = [fp.to_np(next(it))]
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="capturing a graph: take batches from the Loader outside"):
        with torch.cuda.graph(g):
            next(it)
    seen += [fp.to_np(b) for b in it]
    assert sorted(fp.verify(seen, arrays).tolist()) == list(range(200))
