"""The loader's tables kept once in C++ (dtypes, io modes) and exported: each Python view agrees."""

import numpy as np
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

