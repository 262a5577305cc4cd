"""write_npy: converts a map-style dataset into .npy columns that the Loader reads."""

import os
import sys
import time

import numpy as np
import torch

from fastpipe.data.npy import NpyDataset

_SUPPORTED = {np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "uint16", "int32", "int64", "float16",
                                    "float32", "float64")}


def _fields(item):
    """(structure, names, values) of one dataset item."""
    if isinstance(item, dict):
        return "dict", list(item), list(item.values())
    if isinstance(item, (tuple, list)):
        return "tuple", [str(i) for i in range(len(item))], list(item)
    return "single", ["data"], [item]


def _to_numpy(value, where):
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            raise TypeError(f"{where}: bfloat16 has no .npy representation; convert with .float() first")
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    if arr.dtype not in _SUPPORTED:
        raise TypeError(f"{where}: dtype {arr.dtype} is not supported (supported: "
                        f"{', '.join(sorted(str(d) for d in _SUPPORTED))})")
    return arr


class _Progress:
    """tqdm when installed, else a line on stderr every few seconds."""

    def __init__(self, total, enabled):
        self._bar = None
        self._enabled = enabled
        self._total = total
        self._done = 0
        self._last = time.monotonic()
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit="rec", desc="write_npy")
            except ImportError:
                pass

    def update(self, n):
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._enabled and (time.monotonic() - self._last > 2 or self._done == self._total):
            self._last = time.monotonic()
            print(f"write_npy: {self._done}/{self._total} records", file=sys.stderr, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def write_npy(dataset, out_dir, *, progress=True, chunk_size=1024):
    """Writes every item of a map-style dataset to ``.npy`` columns and returns their NpyDataset.

    Parameters
    ----------
    dataset : map-style dataset
        ``len(dataset)`` and ``dataset[i]``; items are tensors, numpy arrays or numbers, or tuples or
        dicts of them, with the same shapes and dtypes for every item.
    out_dir : path
        Created if missing. One file per field: ``data.npy`` for single items, ``0.npy``, ``1.npy``, ...
        for tuples, ``<key>.npy`` for dicts. Files appear complete or not at all (written under a
        temporary name, then renamed).
    progress : bool
        Show a progress bar (tqdm when installed).
    chunk_size : int
        Items gathered in memory before each write: memory stays bounded by ``chunk_size`` items.

    Returns
    -------
    NpyDataset
        With the same structure as the items (tensor, tuple or dict).
    """
    n = len(dataset)
    if n == 0:
        raise ValueError("write_npy: the dataset is empty")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    os.makedirs(out_dir, exist_ok=True)
    structure, names, values = _fields(dataset[0])
    firsts = [_to_numpy(v, f"item 0, field {k!r}") for k, v in zip(names, values)]
    paths = [os.path.join(out_dir, f"{k}.npy") for k in names]
    tmp_paths = [p + ".partial" for p in paths]
    outs = [np.lib.format.open_memmap(t, mode="w+", dtype=a.dtype, shape=(n, *a.shape))
            for t, a in zip(tmp_paths, firsts)]
    bar = _Progress(n, progress)
    try:
        for start in range(0, n, chunk_size):
            stop = min(n, start + chunk_size)
            bufs = [np.empty((stop - start, *a.shape), a.dtype) for a in firsts]
            for i in range(start, stop):
                item_structure, item_names, item_values = _fields(dataset[i])
                if item_structure != structure or item_names != names:
                    raise ValueError(f"item {i} has fields {item_names} ({item_structure}) but item 0 has {names} "
                                     f"({structure})")
                for buf, first, k, v in zip(bufs, firsts, names, item_values):
                    a = _to_numpy(v, f"item {i}, field {k!r}")
                    if a.shape != first.shape or a.dtype != first.dtype:
                        raise ValueError(f"item {i}, field {k!r}: shape {a.shape} dtype {a.dtype} differs from item "
                                         f"0's shape {first.shape} dtype {first.dtype}")
                    buf[i - start] = a
            for out, buf in zip(outs, bufs):
                out[start:stop] = buf
            bar.update(stop - start)
        for out in outs:
            out.flush()
    except BaseException:
        del outs
        for t in tmp_paths:
            if os.path.exists(t):
                os.remove(t)
        raise
    finally:
        bar.close()
    del outs
    for t, p in zip(tmp_paths, paths):
        os.replace(t, p)
    if structure == "single":
        return NpyDataset(paths[0])
    if structure == "tuple":
        return NpyDataset(paths)
    return NpyDataset(dict(zip(names, paths)))
