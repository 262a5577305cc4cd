"""Loader content, order, threads, io modes, drop_last, batch structure and stats.

Every dataset carries an ``idx`` column (np.arange(N)), so each batch reveals which records it holds;
every other column is compared byte for byte with np.load(path)[idx].
"""

import gc
import os
import warnings

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe.data import _dataloader_args

pytestmark = [pytest.mark.timeout(60), pytest.mark.torch_build]

DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "int64", "float16", "float32", "float64"]
SHAPES = [(), (3,), (3, 5, 7)]


def _expected_sizes(n, b, drop_last):
    sizes = [b] * (n // b)
    if n % b and not drop_last:
        sizes.append(n % b)
    return sizes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rec", SHAPES, ids=["scalar", "3", "3x5x7"])
def test_byte_exact_every_dtype_and_shape(dataset_factory, fp, dtype, rec):
    n, b = 203, 16  # 12 full batches and a partial one of 11
    ds, arrays, _ = dataset_factory(n, {"x": (dtype, rec)})
    ld = fp.loader(ds, b, shuffle=True, seed=1)
    assert len(ld) == 13
    first = next(iter(ld))
    fp.check_batch_tensors(first, arrays)
    del first
    batches = fp.epoch(ld)
    assert [len(x["idx"]) for x in batches] == _expected_sizes(n, b, False)
    idx = fp.verify(batches, arrays)
    assert sorted(idx.tolist()) == list(range(n)), "every record exactly once per epoch"


@pytest.mark.parametrize(
    "dtype,rec",
    [("uint8", (3,)), ("uint8", (13,)), ("int8", (1,)), ("uint16", (3, 3)), ("float16", (13,)), ("bool", (3, 1, 1))],
    ids=["3B", "13B", "1B", "18B", "26B", "bool3B"],
)
@pytest.mark.parametrize("drop_last", [False, True])
def test_odd_record_sizes_odd_n(dataset_factory, fp, dtype, rec, drop_last):
    n, b = 1_003, 32  # 31 full batches + 11
    ds, arrays, _ = dataset_factory(n, {"x": (dtype, rec), "y": ("float64", (2,))})
    ld = fp.loader(ds, b, shuffle=True, seed=7, drop_last=drop_last)
    batches = fp.epoch(ld)
    sizes = _expected_sizes(n, b, drop_last)
    assert len(ld) == len(sizes)
    assert [len(x["idx"]) for x in batches] == sizes
    idx = fp.verify(batches, arrays)
    assert len(set(idx.tolist())) == len(idx), "a record appeared twice in one epoch"
    if drop_last:
        assert len(idx) == (n // b) * b
    else:
        assert sorted(idx.tolist()) == list(range(n))


def test_many_columns_mixed(dataset_factory, fp):
    shapes = [(), (3,), (2, 2), (5,), (1,), (7,), (), (3, 5, 7), (4,), (2,)]
    spec = {f"c{i}_{dt}": (dt, shape) for i, (dt, shape) in enumerate(zip(DTYPES, shapes))}
    ds, arrays, _ = dataset_factory(517, spec)
    batches = fp.epoch(fp.loader(ds, 50, shuffle=True, seed=2))
    idx = fp.verify(batches, arrays)
    assert sorted(idx.tolist()) == list(range(517))


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_records_of_no_bytes(dataset_factory, fp, io):
    """A column of shape (n, 0), which numpy writes and reads, gives (b, 0) batches beside the others."""
    ds, arrays, _ = dataset_factory(61, {"empty": ("float32", (0,)), "x": ("int16", (3,))})
    ld = fp.quiet_loader(ds, 8, shuffle=True, seed=3, io=io)
    assert ld.io_modes[1] == "none", ld.io_modes
    batches = fp.epoch(ld)
    assert [b["empty"].shape for b in batches] == [(len(b["idx"]), 0) for b in batches]
    assert sorted(fp.verify(batches, arrays).tolist()) == list(range(61))


def test_dataset_of_records_with_no_bytes(tmp_path, fp):
    np.save(tmp_path / "e.npy", np.zeros((10, 3, 0), np.uint8))
    ld = fp.loader(fastpipe.NpyDataset(str(tmp_path / "e.npy")), 4)
    assert [tuple(b.shape) for b in ld] == [(4, 3, 0), (4, 3, 0), (2, 3, 0)]
    assert ld.stats()["batches"] == 3 and ld.stats()["bytes_read"] == 0


def test_shuffle_false_is_in_order(dataset_factory, fp):
    n = 1_003
    ds, arrays, _ = dataset_factory(n, {"x": ("int32", (3,))})
    ld = fp.loader(ds, 64)
    for _ in range(2):  # the same on every epoch
        batches = fp.epoch(ld)
        idx = fp.verify(batches, arrays)
        assert idx.tolist() == list(range(n))


def test_batch_size_one_and_larger_than_dataset(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(5, {"x": ("float32", (3,))})
    batches = fp.epoch(fp.loader(ds, 1, shuffle=True, seed=4))
    assert [len(b["idx"]) for b in batches] == [1] * 5
    assert sorted(fp.verify(batches, arrays).tolist()) == list(range(5))
    big = fp.loader(ds, 64, shuffle=True, seed=4)
    assert len(big) == 1
    batches = fp.epoch(big)
    assert [len(b["idx"]) for b in batches] == [5]
    assert sorted(fp.verify(batches, arrays).tolist()) == list(range(5))
    dropped = fp.loader(ds, 64, drop_last=True)
    assert len(dropped) == 0
    assert fp.epoch(dropped) == []


def test_structures(tmp_path, rng, fp):
    n = 30
    paths, arrays = fp.write_columns(tmp_path, n, {"x": ("uint8", (2, 3)), "y": ("int16", ())}, rng)

    single = fp.loader(fastpipe.NpyDataset(paths["x"]), 8)
    got = []
    for b in single:
        assert isinstance(b, torch.Tensor), type(b)
        assert b.dtype == torch.uint8 and tuple(b.shape[1:]) == (2, 3)
        got.append(b.numpy().copy())
        del b
    assert np.concatenate(got).tobytes() == arrays["x"].tobytes()

    tup = fp.loader(fastpipe.NpyDataset([paths["idx"], paths["x"], paths["y"]]), 8, shuffle=True)
    batches = fp.epoch(tup)
    assert all(isinstance(b, tuple) and len(b) == 3 for b in batches)
    idx = fp.verify(fp.tuple_to_dict(batches, ["idx", "x", "y"]), arrays)
    assert sorted(idx.tolist()) == list(range(n))

    one = fp.loader(fastpipe.NpyDataset([paths["idx"]]), 8)
    for b in one:
        assert isinstance(b, tuple) and len(b) == 1, "a list of one path gives 1-tuples"
        del b

    dct = fp.loader(fastpipe.NpyDataset({"y": paths["y"], "idx": paths["idx"], "x": paths["x"]}), 8, shuffle=True)
    for b in dct:
        assert isinstance(b, dict) and list(b) == ["y", "idx", "x"], list(b)
        fp.check_batch_tensors(b, arrays)
        del b


def test_reader_pack_choices_are_checked(tmp_path, rng, fp):
    # The reader packs single and tuple batches itself (no Python per batch); what it is told is checked.
    paths, _ = fp.write_columns(tmp_path, 9, {"x": ("uint8", (2,)), "y": ("int16", ())}, rng)
    loader = fp.loader(fastpipe.NpyDataset([paths["x"], paths["y"]]), 4)
    assert loader._reader_args["pack"] == "tuple"
    with pytest.raises(ValueError, match="pack must be 'tensor', 'tuple' or 'list', got 'dict'"):
        fastpipe._C.BatchReader(**{**loader._reader_args, "pack": "dict"})
    with pytest.raises(ValueError, match="pack='tensor' needs one output, got 2"):
        fastpipe._C.BatchReader(**{**loader._reader_args, "pack": "tensor"})
    listed = fastpipe._C.BatchReader(**{**loader._reader_args, "pack": "list"})
    listed.start(np.arange(9), False, 0)
    batch = listed.next(10.0)
    assert isinstance(batch, list) and len(batch) == 2 and tuple(batch[0].shape) == (4, 2)
    del batch
    listed.close()


def test_next_function_is_next_without_the_dispatcher(tmp_path, rng, fp):
    # The loop's path (EpochIterator) calls next() through a builtin bound to the reader: the same batches,
    # the same exceptions, its argument checked, and the reader kept alive by it (no use after free).
    paths, arrays = fp.write_columns(tmp_path, 10, {"x": ("uint8", (3,))}, rng)
    loader = fp.loader(fastpipe.NpyDataset(paths["x"]), 4)
    reader = loader._reader
    fn = reader.next_function()
    reader.start(np.arange(10), False, 0)
    got = [fn(10.0).numpy().copy() for _ in range(3)]
    assert np.concatenate(got).tobytes() == arrays["x"].tobytes()
    assert fn(10.0) is None  # the end of the pass, as reader.next says
    with pytest.raises(TypeError):
        fn("soon")
    with pytest.raises(TypeError):
        fn()
    reader._hold_reads(True)  # before the pass starts, no batch will be ready: next() times out with the
    reader.start(np.arange(10), False, 0)  # engine's TimeoutError (held after start, a reader could be first)
    with pytest.raises(TimeoutError, match="no batch for 0.2 s"):
        fn(0.2)
    reader._hold_reads(False)
    del loader, reader
    gc.collect()
    with pytest.raises(RuntimeError, match="the Loader is closed"):  # closed by the loader's finalizer
        fn(1.0)


def test_same_batches_whatever_num_threads(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(1_003, {"x": ("float32", (13,)), "y": ("uint8", (3,))})
    runs = {t: fp.epoch(fp.loader(ds, 24, shuffle=True, seed=99, num_threads=t)) for t in (1, 2, 8)}
    fp.verify(runs[1], arrays)
    for t in (2, 8):
        assert fp.same_batches(runs[1], runs[t]), f"num_threads={t} changed the batches"


def test_same_batches_whatever_prefetch(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(300, {"x": ("int64", (5,))})
    runs = [fp.epoch(fp.loader(ds, 7, shuffle=True, seed=5, prefetch=p, num_threads=2)) for p in (1, 2, 6)]
    fp.verify(runs[0], arrays)
    assert fp.same_batches(runs[0], runs[1]) and fp.same_batches(runs[0], runs[2])


@pytest.mark.parametrize("io", ["mmap", "pread", "direct", "auto"])
def test_same_batches_whatever_io_mode(dataset_factory, fp, io):
    ds, arrays, _ = dataset_factory(777, {"x": ("uint8", (13,)), "y": ("float64", (3, 5, 7))})
    ref = fp.epoch(fp.loader(ds, 20, shuffle=True, seed=8, io="pread"))
    ld = fp.quiet_loader(ds, 20, shuffle=True, seed=8, io=io, num_threads=2)
    modes = list(ld.io_modes)
    if io == "direct":  # where the filesystem refuses O_DIRECT, the fallback is buffered reads
        expected = "direct" if fp.o_direct_works(os.path.dirname(ds.paths[0])) else "pread"
    else:
        expected = {"auto": "mmap"}.get(io, io)  # auto: records under 64 KiB are mapped
    assert modes == [expected] * 3, modes
    got = fp.epoch(ld)
    fp.verify(got, arrays)
    assert fp.same_batches(ref, got), f"io={io} ({modes}) changed the batches"


def test_epochs_reshuffle_same_records(dataset_factory, fp):
    n = 400
    ds, arrays, _ = dataset_factory(n, {"x": ("int16", (2,))})
    ld = fp.loader(ds, 32, shuffle=True, seed=3)
    assert ld.epoch == 0
    orders = []
    for e in range(3):
        idx = fp.verify(fp.epoch(ld), arrays)
        assert sorted(idx.tolist()) == list(range(n))
        orders.append(idx.tolist())
        assert ld.epoch == e + 1, "each iter() advances the epoch by one"
    assert orders[0] != list(range(n))
    assert len({tuple(o) for o in orders}) == 3, "epochs gave the same order"


def test_order_is_pure_function_of_seed_and_epoch(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(250, {"x": ("uint8", ())})
    a = fp.loader(ds, 16, shuffle=True, seed=12)
    a_epochs = [fp.batch_idx(fp.epoch(a)) for _ in range(3)]

    b = fp.loader(ds, 16, shuffle=True, seed=12, num_threads=3)
    b.set_epoch(2)
    assert b.epoch == 2
    assert fp.batch_idx(fp.epoch(b)) == a_epochs[2]
    b.set_epoch(0)
    assert fp.batch_idx(fp.epoch(b)) == a_epochs[0]
    assert fp.batch_idx(fp.epoch(b)) == a_epochs[1]

    # set_epoch to the same value twice gives the same order twice
    b.set_epoch(1)
    first = fp.batch_idx(fp.epoch(b))
    b.set_epoch(1)
    assert fp.batch_idx(fp.epoch(b)) == first == a_epochs[1]

    c = fp.loader(ds, 16, shuffle=True, seed=13)
    assert fp.batch_idx(fp.epoch(c)) != a_epochs[0], "a different seed gave the same order"


def test_len_and_batch_counts(dataset_factory, fp):
    ds, _, _ = dataset_factory(101, {})
    for b in (1, 2, 10, 100, 101, 102):
        for drop_last in (False, True):
            ld = fp.loader(ds, b, drop_last=drop_last)
            sizes = _expected_sizes(101, b, drop_last)
            assert len(ld) == len(sizes), (b, drop_last)
            assert [len(x["idx"]) for x in fp.epoch(ld)] == sizes
            ld.close()


def test_stats(dataset_factory, fp):
    n, b = 300, 32
    ds, arrays, _ = dataset_factory(n, {"x": ("float32", (6,))})
    ld = fp.loader(ds, b, shuffle=True, prefetch=3, num_threads=2)
    fp.epoch(ld)
    st = ld.stats()
    print(st)
    for key in ("batches", "bytes_read", "read_gbps", "wait_seconds", "wait_fraction", "wall_seconds",
                "arena_bytes", "num_slots", "slots_leased", "num_threads"):
        assert key in st, f"stats() lacks {key!r}"
    assert st["num_slots"] == 3 + 2
    assert st["num_threads"] == 2
    assert st["batches"] == len(ld)
    assert st["bytes_read"] >= n * (8 + 24)
    record_bytes = 8 + 24
    assert st["arena_bytes"] >= st["num_slots"] * b * record_bytes
    assert 0.0 <= st["wait_fraction"] <= 1.0
    assert st["wait_seconds"] >= 0 and st["wall_seconds"] > 0 and st["read_gbps"] >= 0
    assert st["slots_leased"] == 0
    assert [st[k] for k in ("bytes_fetched", "fetch_requests", "fetch_retries", "cache_hits", "network_seconds")] \
        == [0] * 5  # local data: nothing fetched


def test_tensors_are_views_of_a_fixed_arena(dataset_factory, fp):
    """Batches are zero-copy views into one arena: their storage lies inside a fixed set of slots."""
    ds, arrays, _ = dataset_factory(200, {"x": ("uint8", (10,))})
    ld = fp.loader(ds, 10, shuffle=True, prefetch=1)
    ptrs = set()
    for b in ld:
        ptrs.add(b["x"].data_ptr())
        del b
    assert len(ptrs) <= ld.stats()["num_slots"], f"{len(ptrs)} distinct buffers for {ld.stats()['num_slots']} slots"


def test_batches_are_ordinary_tensors_to_autograd_and_inference_mode(dataset_factory, fp):
    """The tensors next() makes over the arena carry torch's usual keys: gradients flow through them into a
    parameter (compared with float64 numpy), in-place ops on them are allowed, and one taken inside
    torch.inference_mode() is an inference tensor, as torch.from_numpy's would be."""
    ds, arrays, _ = dataset_factory(57, {"x": ("float32", (3,)), "y": ("float64", (2,))})
    ld = fp.loader(ds, 8, shuffle=True, seed=3)
    it = iter(ld)
    b = next(it)
    x, y = b["x"], b["y"]
    idx = b["idx"].numpy()
    assert not x.requires_grad and not x.is_inference() and x._base is None
    assert x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()  # one storage: the slot
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    (x.double() * w).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), arrays["x"][idx].astype(np.float64).sum(0), rtol=1e-12)
    y.mul_(2)
    np.testing.assert_array_equal(y.numpy(), arrays["y"][idx] * 2)
    del b, x, y
    with torch.inference_mode():
        b = next(it)
        assert b["x"].is_inference() and torch.from_numpy(arrays["x"]).is_inference()
        np.testing.assert_array_equal(b["x"].numpy(), arrays["x"][b["idx"].numpy()])


def test_context_manager(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(50, {"x": ("int8", (3,))})
    with fp.loader(ds, 8, shuffle=True) as ld:
        assert isinstance(ld, fastpipe.Loader)
        idx = fp.verify(fp.epoch(ld), arrays)
        assert sorted(idx.tolist()) == list(range(50))
    with pytest.raises(RuntimeError):
        iter(ld).__next__()


def test_pin_memory_is_accepted(dataset_factory, fp, monkeypatch):
    ds, arrays, _ = dataset_factory(40, {"x": ("float32", (4,))})
    if fastpipe.build_info()["cuda_available"]:
        ld = fp.loader(ds, 8, pin_memory=True)
    else:
        # Nothing to pin for: said once per process (the flag reset: another test may have been first).
        monkeypatch.setattr(_dataloader_args, "_warned_unpinned", False)
        with pytest.warns(UserWarning, match="batches are not pinned"):
            ld = fp.loader(ds, 8, pin_memory=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            fp.loader(ds, 8, pin_memory=True).close()
    assert fp.verify(fp.epoch(ld), arrays).tolist() == list(range(40))


@pytest.mark.parametrize("batch,threads,prefetch", [(1, 8, 8), (3, 8, 1), (1, 1, 1), (257, 8, 2)])
def test_many_threads_small_batches(dataset_factory, fp, batch, threads, prefetch):
    n = 1_003
    ds, arrays, _ = dataset_factory(n, {"x": ("uint8", (13,)), "y": ("float32", (3,))})
    ref = fp.epoch(fp.loader(ds, batch, shuffle=True, seed=6, num_threads=1, prefetch=1))
    for _ in range(2):
        ld = fp.loader(ds, batch, shuffle=True, seed=6, num_threads=threads, prefetch=prefetch)
        got = fp.epoch(ld)
        assert fp.same_batches(ref, got)
    assert sorted(fp.verify(got, arrays).tolist()) == list(range(n))


def test_auto_with_small_and_large_records(dataset_factory, fp):
    """Records above and below any small-record threshold in one loader (large: 66 KiB)."""
    ds, arrays, _ = dataset_factory(7, {"small": ("uint8", (5,)), "large": ("uint8", (66 * 1024,))})
    ld = fp.loader(ds, 3, shuffle=True, io="auto", num_threads=2)
    print(ld.io_modes)
    total = 7 * (8 + 5 + 66 * 1024)
    mem = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    expected = ["mmap", "mmap", "mmap" if total <= mem // 2 else "direct"]  # 460 KB: always mapped here
    assert list(ld.io_modes) == expected
    for _ in range(2):
        idx = fp.verify(fp.epoch(ld), arrays)
        assert sorted(idx.tolist()) == list(range(7))


KIB, GIB = 1 << 10, 1 << 30


@pytest.mark.parametrize(
    "io,record,total,mem,mode",
    [
        ("auto", 13, 100 * GIB, 8 * GIB, "mmap"),  # small records: mapped, whatever the size of the data
        ("auto", 64 * KIB - 1, 100 * GIB, 8 * GIB, "mmap"),
        ("auto", 64 * KIB, 4 * GIB, 8 * GIB, "mmap"),  # fits in half the memory: the page cache keeps it
        ("auto", 64 * KIB, 4 * GIB + 1, 8 * GIB, "direct"),  # does not: read around the page cache
        ("auto", 3 << 20, 100 * GIB, 8 * GIB, "direct"),
        ("auto", 3 << 20, 1 * GIB, 0, "direct"),  # no available memory reported
        ("mmap", 3 << 20, 100 * GIB, 8 * GIB, "mmap"),  # an explicit mode is always kept
        ("pread", 13, 1, 8 * GIB, "pread"),
        ("direct", 13, 1, 8 * GIB, "direct"),
    ],
)
def test_io_auto_policy(io, record, total, mem, mode):
    """The reader's read-mode policy on figures no test machine has (records of 64 KiB or more whose
    data exceeds half the available memory are read with O_DIRECT; everything else auto is mapped)."""
    assert fastpipe._C._io_policy(io, record, total, mem) == mode


@pytest.mark.parametrize(
    "cores,direct,decodes,threads",
    [(1, False, False, 2), (2, False, False, 2), (5, False, False, 5), (8, False, False, 8), (64, False, False, 8),
     (1, True, False, 16), (64, True, False, 16),
     # Images: every core but the training loop's, at least 2 (both cores of a 2-core machine read).
     (1, False, True, 2), (2, False, True, 2), (3, False, True, 2), (16, False, True, 15), (64, False, True, 63),
     (8, True, True, 16), (32, True, True, 31)],
)
def test_default_thread_policy(cores, direct, decodes, threads):
    assert fastpipe._C._default_num_threads(cores, direct, decodes) == threads


@pytest.mark.parametrize("batch_bytes,prefetch", [(0, 16), (44, 16), (524288, 16), (524289, 16), (559240, 16),
                                                   (559241, 15), (1052672, 8), (3 << 20, 3), (1 << 23, 2), (1 << 40, 2)])
def test_default_prefetch_policy(batch_bytes, prefetch):
    """About 8 MiB of batches read ahead, 2 to 16 batches."""
    assert fastpipe._C._default_prefetch(batch_bytes) == prefetch


@pytest.mark.parametrize(
    "batch,prefetch,threads,record,decodes,chunk",
    [(512, 6, 2, 3080, False, 340),  # CIFAR-like on 2 cores: 6 chunks in the window, one a batch up to 1 MiB
     (512, 6, 8, 3080, False, 171),  # 18 chunks: 3 a batch
     (513, 6, 8, 3080, False, 171),  # a partial last chunk
     (64, 2, 2, 150536, False, 6),  # ImageNet-like: 3 a batch, up to 1 MiB
     (64, 2, 16, 150536, False, 4),  # O_DIRECT's 16 readers: 17 a batch
     (7, 2, 64, 150536, False, 1),  # more chunks wanted than records
     (32, 16, 2, 2050, False, 32),  # token windows: at least 256 KiB a chunk, at most the batch
     (512, 2, 8, 100, False, 512),  # 100-byte records: 256 KiB is more than the batch
     (4096, 2, 8, 100, False, 2621),  # ... and is what a chunk holds
     (64, 2, 2, 150536, True, 4), (3, 2, 2, 150536, True, 2)],  # images: at most 4 a chunk
)
def test_chunk_policy(batch, prefetch, threads, record, decodes, chunk):
    """Copied records: as few chunks as leave each reader thread and next() two in the read-ahead window,
    each at least 256 KiB (or the batch) and at most 1 MiB; images: at most 4 a chunk."""
    assert fastpipe._C._chunk_records(batch, prefetch, threads, record, decodes) == chunk


def test_default_threads_and_prefetch(dataset_factory, fp):
    """Without num_threads (records that do not decode): the usable cores (2 to 8); without prefetch: about 8 MiB of batches read
    ahead, 2 to 16 batches, so the arena holds prefetch + 2."""
    cores = len(os.sched_getaffinity(0))
    # batch bytes 44 (16: the cap), 1.05 MB (ceil 7.97), 9.4 MB (2: the floor), 682 KB (ceil 12.3)
    for record, batch, prefetch in [((3,), 4, 16), ((1 << 11,), 512, 8), ((1 << 20,), 9, 2), ((333,), 2000, 13)]:
        ds, _, _ = dataset_factory(8, {"x": ("uint8", record)})  # records of idx (8 B) + x
        ld = fp.loader(ds, batch)
        st = ld.stats()
        assert (st["prefetch"], st["num_slots"]) == (prefetch, prefetch + 2), (record, batch, st)
        assert st["num_threads"] == min(8, max(2, cores))
        ld.close()


def test_sampler_index_out_of_range(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(20, {})
    for bad in (20, -1, 1 << 40):
        ld = fp.loader(ds, 4, sampler=[0, 5, bad, 3])
        with pytest.raises(ValueError, match=f"sampler yielded index {bad}, out of range for a dataset of 20"):
            iter(ld)
        assert ld.state_dict()["epoch"] == 0, "a failed iter() must not advance the epoch"
    ok = fp.loader(ds, 4, sampler=[19, 0, 7])
    assert fp.verify(fp.epoch(ok), arrays).tolist() == [19, 0, 7]


@pytest.mark.skipif(fastpipe.build_info()["cuda_available"], reason="a GPU is present: pinning works")
def test_pin_memory_without_a_gpu_warns(dataset_factory, fp, monkeypatch):
    from fastpipe.data import _dataloader_args

    monkeypatch.setattr(_dataloader_args, "_warned_unpinned", False)  # once per process
    ds, arrays, _ = dataset_factory(20, {})
    with pytest.warns(UserWarning, match="not pinned"):
        ld = fp.loader(ds, 8, pin_memory=True)
    assert fp.verify(fp.epoch(ld), arrays).tolist() == list(range(20))


def test_pin_memory_device_is_validated(dataset_factory, fp):
    ds, _, _ = dataset_factory(10, {})
    for good in ("", "cuda", "cuda:0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no GPU: "not pinned"
            fp.loader(ds, 4, pin_memory=True, pin_memory_device=good).close()
    for bad in ("cpu", "mps", "tpu:0"):
        with pytest.raises(ValueError, match=f"pin_memory_device must be '' or a CUDA device, got '{bad}'"):
            fp.loader(ds, 4, pin_memory=True, pin_memory_device=bad)


def test_same_file_in_two_columns(tmp_path, rng, fp):
    paths, arrays = fp.write_columns(tmp_path, 64, {"x": ("int16", (3,))}, rng)
    ds = fastpipe.NpyDataset({"idx": paths["idx"], "x": paths["x"], "x2": paths["x"]})
    arrays = dict(arrays, x2=arrays["x"])
    idx = fp.verify(fp.epoch(fp.loader(ds, 10, shuffle=True)), arrays)
    assert sorted(idx.tolist()) == list(range(64))


def test_two_loaders_on_one_dataset_interleaved(dataset_factory, fp):
    ds, arrays, _ = dataset_factory(500, {"x": ("float64", (4,))})
    a = fp.loader(ds, 16, shuffle=True, seed=1, num_threads=2)
    b = fp.loader(ds, 7, shuffle=True, seed=2, num_threads=2)
    got_a, got_b = [], []
    ia, ib = iter(a), iter(b)
    done_a = done_b = False
    while not (done_a and done_b):
        for it, out, flag in ((ia, got_a, "a"), (ib, got_b, "b")):
            if (flag == "a" and done_a) or (flag == "b" and done_b):
                continue
            try:
                out.append(fp.to_np(next(it)))
            except StopIteration:
                if flag == "a":
                    done_a = True
                else:
                    done_b = True
    assert sorted(fp.verify(got_a, arrays).tolist()) == list(range(500))
    assert sorted(fp.verify(got_b, arrays).tolist()) == list(range(500))
    assert fp.same_batches(got_a, fp.epoch(fp.loader(ds, 16, shuffle=True, seed=1)))


def _runs_order(rng, n, length):
    """An index order made of ascending runs, descending runs, repeats and random jumps (what samplers
    with replacement, or sorted/bucketed samplers, produce)."""
    out = []
    while len(out) < length:
        kind = rng.integers(4)
        start = int(rng.integers(n))
        k = int(rng.integers(1, 40))
        if kind == 0:
            out.extend(range(start, min(n, start + k)))
        elif kind == 1:
            out.extend(range(start, max(-1, start - k), -1))
        elif kind == 2:
            out.extend([start] * min(k, 5))
        else:
            out.extend(rng.integers(0, n, size=k).tolist())
    return out[:length]


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_in_order_runs_and_repeats_every_io_mode(dataset_factory, fp, rng, io):
    """shuffle=False (long sequential runs that readers may merge into one request) and a sampler with
    runs, reversed runs and repeated indices: every batch holds exactly the requested records."""
    n = 1_501
    ds, arrays, _ = dataset_factory(n, {"x": ("uint8", (13,)), "y": ("float16", (3, 3))})
    ld = fp.quiet_loader(ds, 1, io=io, num_threads=3)
    assert fp.verify(fp.take(iter(ld), 150), arrays).tolist() == list(range(150))  # one record per batch
    ld.close()
    for batch in (37, 500):
        ld = fp.quiet_loader(ds, batch, io=io, num_threads=3)
        assert fp.verify(fp.epoch(ld), arrays).tolist() == list(range(n))
        ld.close()
    order = _runs_order(rng, n, 3_000)
    ld = fp.quiet_loader(ds, 37, io=io, num_threads=3, sampler=order)
    assert fp.verify(fp.epoch(ld), arrays).tolist() == order


@pytest.mark.parametrize("io", ["mmap", "pread", "direct"])
def test_token_windows_every_io_mode(tmp_path, rng, fp, io):
    tokens = rng.integers(0, 65536, size=20_000, dtype=np.uint16)
    path = tmp_path / "tok.bin"
    tokens.tofile(path)
    bs = 100
    ds = fastpipe.TokenDataset(str(path), bs)
    for shuffle in (False, True):
        ld = fp.quiet_loader(ds, 16, shuffle=shuffle, io=io, num_threads=2)
        starts = []
        for x, y in ld:
            xn, yn = x.numpy(), y.numpy()
            for r in range(len(xn)):
                s = None
                # windows are identified by content; check against the file at the matching start
                for cand in np.flatnonzero(tokens[: len(ds) * bs : bs] == xn[r, 0]):
                    i = int(cand)
                    if np.array_equal(tokens[i * bs : i * bs + bs], xn[r]):
                        s = i
                        break
                assert s is not None, "x matches no window"
                assert np.array_equal(tokens[s * bs + 1 : s * bs + bs + 1], yn[r])
                starts.append(s)
            del x, y
        if shuffle:
            assert sorted(starts) == list(range(len(ds)))
        else:
            assert starts == list(range(len(ds)))
