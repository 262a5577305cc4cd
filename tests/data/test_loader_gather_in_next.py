"""Loader(num_threads=0): no reader threads; next() reads each batch itself, its chunks spread over
torch's intra-op threads (issue 21: a training step whose torch ops keep every core busy loses less to
that than to reader threads competing for the cores). The batches must be exactly the threaded
loader's, whatever the intra-op thread count, with the same errors, replacements and resumption. And
with reader threads, a next() that waits reads chunks itself (issue 41), with the same batches."""

import itertools
import os
import time

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _device
from fastpipe.transforms import CropMirrorNormalize

from jpegs import make_tree, write


@pytest.fixture
def intra_op_threads():
    """Sets torch's intra-op threads for the test, then restores them."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def reader_threads():
    """The thread ids of this process's reader threads (other tests' loaders may still hold some)."""
    tids = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().startswith("fastpipe-rd"):
                    tids.add(tid)
        except OSError:  # ended meanwhile
            pass
    return tids


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_the_same_batches_as_reader_threads(dataset_factory, fp, intra_op_threads, threads, drop_last):
    # 64 KiB records: a batch of 32 is read in 3 chunks (>= 256 KiB each), spread over the workers
    ds, arrays, _ = dataset_factory(397, {"x": ("uint8", (3, 5, 7)), "y": ("float32", (16, 1024))})
    threaded = fp.loader(ds, 32, shuffle=True, seed=5, drop_last=drop_last, num_threads=2)
    want = fp.epoch(threaded)
    threaded.close()
    before = reader_threads()
    intra_op_threads(threads)
    ld = fp.loader(ds, 32, shuffle=True, seed=5, drop_last=drop_last, num_threads=0)
    got = fp.epoch(ld)
    assert fp.same_batches(want, got)
    fp.verify(got, arrays)
    assert ld.stats()["num_threads"] == 0 and not reader_threads() - before  # the loader started none


def test_token_windows_and_transforms(tmp_path, fp, rng, intra_op_threads):
    tokens = rng.integers(0, 50_000, 40_001, dtype=np.uint16)
    tokens.tofile(tmp_path / "t.bin")
    ds = fastpipe.TokenDataset(str(tmp_path / "t.bin"), 63)
    intra_op_threads(2)
    want = fp.epoch(fp.loader(ds, 24, shuffle=True, seed=1, num_threads=2))
    assert fp.same_batches(want, fp.epoch(fp.loader(ds, 24, shuffle=True, seed=1, num_threads=0)))
    x = rng.integers(0, 256, (301, 3, 20, 18), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    images = fastpipe.NpyDataset(str(tmp_path / "x.npy"))
    t = {0: CropMirrorNormalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3), crop=(16, 15), mirror=0.5, in_layout="CHW")}
    want = fp.epoch(fp.loader(images, 17, shuffle=True, seed=2, transforms=t, num_threads=2))
    got = fp.epoch(fp.loader(images, 17, shuffle=True, seed=2, transforms=t, num_threads=0))
    assert fp.same_batches(want, got)


def test_jpegs_with_a_bad_file_raise_or_are_replaced_alike(tmp_path, rng, intra_op_threads):
    paths = make_tree(str(tmp_path / "tree"), rng, [(40, 50), (33, 61), (70, 45), (28, 28), (52, 39)] * 3)
    data = open(paths[4], "rb").read()
    write(paths[4], data[:len(data) * 2 // 3])  # truncated: no end-of-image marker
    folder = fastpipe.ImageFolder(str(tmp_path / "tree"), cache_dir="off")
    t = {0: fastpipe.transforms.RandomResizedCrop(24, dct_scaling=False)}
    intra_op_threads(2)

    def run(threads, on_error):
        ld = fastpipe.Loader(folder, batch_size=4, shuffle=True, seed=7, transforms=t, num_threads=threads,
                             on_error=on_error, timeout=60)
        return [(x.numpy().copy(), y.numpy().copy()) for x, y in ld], ld.stats()

    want, want_stats = run(2, "replace")
    got, got_stats = run(0, "replace")
    assert got_stats["images_replaced"] == want_stats["images_replaced"] == 1
    for (a, la), (b, lb) in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    with pytest.raises(ValueError, match="truncated: no end-of-image marker"):
        run(0, "raise")


def test_held_batches_overflow_or_raise(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(200, {"x": ("int32", (9,))})
    ld = fp.loader(ds, 10, num_threads=0, prefetch=1)  # 3 slots
    with pytest.warns(UserWarning, match="arena slots"):
        held = list(ld)  # every slot held: the rest are read outside the arena
    fp.verify([fp.to_np(b) for b in held], arrays)
    del held
    ld = fp.loader(ds, 10, num_threads=0, prefetch=1, when_full="error")
    it = iter(ld)
    held = [next(it) for _ in range(3)]
    with pytest.raises(TimeoutError, match="all 3 arena slots are held"):
        next(it)
    del held


def test_resumes_exactly(dataset_factory, fp):
    ds, _, _ = dataset_factory(300, {"x": ("uint8", (11,))})
    a = fp.loader(ds, 16, shuffle=True, seed=9, num_threads=0)
    it = iter(a)
    first = [fp.to_np(next(it)) for _ in range(7)]
    b = fp.loader(ds, 16, shuffle=True, seed=9, num_threads=0)
    b.load_state_dict(a.state_dict())
    rest = fp.epoch(b)
    assert fp.same_batches(fp.epoch(fp.loader(ds, 16, shuffle=True, seed=9)), first + rest)


def test_refused_where_batches_go_to_a_device(dataset_factory):
    ds, _, _ = dataset_factory(20, {"x": ("uint8", (4,))})
    with _device.simulated():
        with pytest.raises(ValueError, match="num_threads=0 reads each batch in next"):
            fastpipe.Loader(ds, batch_size=4, device="cuda", num_threads=0)
    with pytest.raises(ValueError, match="num_threads"):
        fastpipe.Loader(ds, batch_size=4, num_threads=-1)


def test_next_reads_chunks_while_it_waits(dataset_factory, fp):
    """With reader threads, a next() that waits for its batch reads the chunks no reader has taken yet
    (stats()["helped_chunks"]) instead of sleeping: the batches stay the readers' exactly, in order, and
    no slot is reused while its batch is held (poisoned slots)."""
    # 4 KiB records: chunks of 64 records, 4 to a batch of 256. One reader cannot keep up with a loop
    # that does nothing, so next() waits with chunks left to take, in every pass.
    ds, arrays, _ = dataset_factory(3001, {"x": ("uint8", (4096,))})
    ref = fp.loader(ds, 256, shuffle=True, seed=3, num_threads=0)
    ld = fp.hooks(fp.loader(ds, 256, shuffle=True, seed=3, num_threads=1, prefetch=8), poison=True)
    for _ in range(3):  # three epochs, three orders
        want = fp.epoch(ref)
        got, held = [], []
        for b in ld:
            got.append(fp.to_np(b))
            held.append((b, got[-1]))
            if len(held) > 3:  # the oldest batch held has kept its bytes while the later ones were read
                old, copy = held.pop(0)
                assert fp.same_batches([copy], [fp.to_np(old)])
        del b, held
        assert fp.same_batches(want, got)
        fp.verify(got, arrays)
    assert ld.stats()["helped_chunks"] > 0, ld.stats()


def test_readers_never_outnumber_the_cores_beside_next(dataset_factory, fp):
    """While next() reads a chunk itself, a reader that would make the threads reading more than the
    cores polls instead (stats()["stepped_back"]): with one reader per core it happens, with one fewer
    never; the batches stay exactly the num_threads=0 loader's either way."""
    cores = len(os.sched_getaffinity(0))
    ds, arrays, _ = dataset_factory(3001, {"x": ("uint8", (4096,))})
    ref = fp.loader(ds, 256, shuffle=True, seed=5, num_threads=0)
    every_core = fp.loader(ds, 256, shuffle=True, seed=5, num_threads=cores)
    spare = fp.loader(ds, 256, shuffle=True, seed=5, num_threads=max(1, cores - 1))
    # Until it has happened (a few epochs on an idle machine; on a loaded one, where the threads seldom
    # run at once, many more): the deadline only bounds a loader that never steps back.
    deadline = time.monotonic() + 60
    for epoch in itertools.count():
        want = fp.epoch(ref)
        assert fp.same_batches(want, fp.epoch(every_core))
        assert fp.same_batches(want, fp.epoch(spare))
        if (every_core.stats()["stepped_back"] > 0 and epoch >= 2) or time.monotonic() > deadline:
            break
    assert every_core.stats()["helped_chunks"] > 0 and every_core.stats()["stepped_back"] > 0, every_core.stats()
    assert spare.stats()["stepped_back"] == 0, spare.stats()
