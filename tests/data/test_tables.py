"""The loader's tables kept once in C++ (dtypes, io modes, the reader's settings and counters) and exported:
each Python view agrees."""

import inspect
import re

import numpy as np
import pytest
import torch

import fastpipe
from fastpipe._ext import _C
from fastpipe.data import loader, writer


def test_dtypes_are_one_table():
    names = list(_C.DTYPES)
    assert names == ["bool", "uint8", "int8", "int16", "uint16", "int32", "int64", "float16", "float32", "float64"]
    assert writer._SUPPORTED == {np.dtype(n) for n in names}
    # each name reads back as the torch dtype numpy's dtype maps to, through a real file
    for n in names:
        assert hasattr(torch, n), n


def test_every_dtype_round_trips_through_the_loader(tmp_path):
    for n in _C.DTYPES:
        arr = (np.arange(12) % 2).astype(n).reshape(4, 3)
        np.save(tmp_path / f"{n}.npy", arr)
        ds = fastpipe.NpyDataset(str(tmp_path / f"{n}.npy"))
        assert ds.dtypes == [getattr(torch, n)]
        (batch,) = list(fastpipe.Loader(ds, 4))
        assert batch.dtype == getattr(torch, n) and batch.numpy().tobytes() == arr.tobytes()


def test_io_modes_are_one_table(tmp_path):
    assert tuple(loader.IO_MODES) == ("auto", "mmap", "pread", "direct")
    for mode in loader.IO_MODES[1:]:  # every concrete mode is a name the reader reports back
        assert _C._io_policy(mode, 8, 8, 1 << 30) == mode
    np.save(tmp_path / "x.npy", np.zeros((4, 2), np.int16))
    ds = fastpipe.NpyDataset(str(tmp_path / "x.npy"))
    try:
        fastpipe.Loader(ds, 2, io="fast")
    except ValueError as e:
        assert "io must be one of" in str(e) and all(m in str(e) for m in loader.IO_MODES)
    else:
        raise AssertionError("io='fast' was accepted")



def test_reader_settings_are_one_table():
    cfg = _C.ReaderConfig()
    assert set(_C.ReaderConfig.fields) == {"batch_size", "num_threads", "prefetch", "io", "gather", "when_full",
                                           "on_error", "seed"}
    assert _C.ReaderConfig.choices["io"] == loader.IO_MODES
    # The Loader's signature shows the defaults C++ holds (num_threads: the Loader's None is num_workers').
    params = inspect.signature(fastpipe.Loader).parameters
    for name in set(_C.ReaderConfig.fields) & set(params) - {"num_threads"}:
        assert params[name].default == getattr(cfg, name), name
    assert cfg.prefetch is None and "prefetch=None" in repr(cfg)  # automatic: sized from the batch bytes
    for name, options in _C.ReaderConfig.choices.items():
        for option in options:
            assert getattr(_C.ReaderConfig(**{name: option}), name) == option


@pytest.mark.parametrize("setting, value, error, message", [
    ("batch_size", 0, ValueError, "batch_size must be at least 1, got 0"),
    ("batch_size", np.int16(3), None, 3),
    ("num_threads", 1025, ValueError, "num_threads must be at most 1024 (each reader thread"),
    ("prefetch", 2**31 - 2, ValueError, "prefetch must be at most 2147483645"),
    ("prefetch", None, None, None),
    ("seed", 2**64 - 1, None, 2**64 - 1),
    ("seed", 2**64, ValueError, "seed must be at most 18446744073709551615, got 18446744073709551616"),
    ("seed", -(2**70), ValueError, "seed must be at least 0"),
    ("seed", None, TypeError, "seed must be an int, got NoneType None"),
    ("seed", True, TypeError, "seed must be an int, got bool True"),
    ("when_full", "later", ValueError, "when_full must be one of 'allocate', 'error', got 'later'"),
    ("on_error", b"raise", TypeError, "on_error must be one of 'raise', 'replace', got bytes b'raise'"),
    ("gather", "sometimes", ValueError, "gather must be one of 'threads', 'next', 'auto'"),
    ("speed", 1, TypeError, "ReaderConfig has no setting 'speed'"),
])
def test_reader_settings_are_checked_where_they_are_declared(setting, value, error, message):
    if error is None:
        assert getattr(_C.ReaderConfig(**{setting: value}), setting) == message
        return
    with pytest.raises(error) as e:
        _C.ReaderConfig(**{setting: value})
    assert message in str(e.value)
    cfg = _C.ReaderConfig()
    if setting in _C.ReaderConfig.fields:  # setting an attribute checks alike and leaves the old value
        before = getattr(cfg, setting)
        with pytest.raises(error, match=re.escape(message)):
            setattr(cfg, setting, value)
        assert getattr(cfg, setting) == before


def test_every_counter_reaches_stats_under_its_name(dataset_factory, fp):
    ds, _, _ = dataset_factory(40, {"x": ("float32", (3,))})
    with fp.loader(ds, 8) as ld:
        list(ld)
        stats = ld.stats()
    assert set(_C.READER_STATS) <= set(stats)
    assert not set(_C.DEVICE_STATS) - set(_C.READER_STATS) & set(stats), "a CPU loader has no device counters"
    assert stats["batches"] == 5 and stats["replaced"] == [] and stats["images_pillow"] == 0
    with fastpipe.data._device.simulated(max_delay_us=0, seed=1) as sim:
        with fp.loader(ds, 8, device="cuda") as ld:
            for _ in ld:
                sim.synchronize(sim.consumer_stream())
            stats = ld.stats()
    assert set(_C.READER_STATS) | set(_C.DEVICE_STATS) <= set(stats)
    assert stats["device_slots"] == stats["num_slots"] and stats["jpeg_decoder"] is None  # no image decoded


def test_draw_numbers_are_one_disjoint_map():
    ranges = sorted(_C.DRAW_RANGES, key=lambda r: r[1])
    owners = {r[0] for r in ranges}
    assert {"flip", "RandomResizedCrop", "RandomErasing", "augmentation stages", "AugMix"} <= owners
    for (a, first_a, end_a), (b, first_b, end_b) in zip(ranges, ranges[1:]):
        assert first_a < end_a <= first_b, f"{a}'s draws [{first_a}, {end_a}) reach {b}'s from {first_b}"


def test_augmentation_tables_come_from_the_extension():
    from fastpipe import augment

    assert augment.OPS is _C.AUGMENT["ops"] and len(set(augment.OPS)) == len(augment.OPS) > 20
    assert augment.OPS[0] == "Identity" and set(augment.FACTOR_OPS) <= set(augment.OPS)
    kinds = _C.AUGMENT["stage_kinds"]
    assert sorted(kinds.values()) == list(range(1, len(kinds) + 1))
    limit = _C.AUGMENT["max_chains"]
    augment.AugMix(mixture_width=limit, chain_depth=1)
    with pytest.raises(ValueError, match=f"mixture_width must be at most {limit}"):
        augment.AugMix(mixture_width=limit + 1, chain_depth=1)
