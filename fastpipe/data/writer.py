"""write_npy: converts a map-style dataset into .npy columns that the Loader reads."""

import os
import sys
import time

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data.npy import NpyDataset

_SUPPORTED = {np.dtype(t) for t in _C.DTYPES}  # what NpyDataset reads back


def _fields(item, i):
    """(structure, names, values) of item ``i``: "dict", "tuple" (a tuple or list) or "single"."""
    if isinstance(item, dict):
        names = list(item)
        for k in names:
            if not isinstance(k, str):
                raise TypeError(f"item {i}: dict key {k!r} is a {type(k).__name__}; keys name the files "
                                f"(<key>.npy) and must be strings")
            if k in ("", ".", "..") or "/" in k or "\0" in k or (os.altsep and os.altsep in k):
                raise ValueError(f"item {i}: dict key {k!r} cannot name a file in out_dir (<key>.npy): use a "
                                 f"non-empty key without path separators")
        if not names:
            raise ValueError(f"item {i} is an empty dict: there is no field to write")
        return "dict", names, list(item.values())
    if isinstance(item, (tuple, list)):
        if not item:
            raise ValueError(f"item {i} is an empty {type(item).__name__}: there is no field to write")
        return "tuple", [str(j) for j in range(len(item))], list(item)
    return "single", ["data"], [item]


def _describe(structure, names):
    if structure == "dict":
        return f"a dict with keys {names}"
    if structure == "tuple":
        return f"a tuple (or list) of {len(names)} fields"
    return "a single array (not a tuple or dict)"


def _match(item, i, structure, names):
    """The values of item ``i`` in the order of ``names`` (item 0's fields); ValueError naming the item when
    its fields differ. Dict keys are matched by name, so their order may change between items."""
    item_structure, item_names, item_values = _fields(item, i)
    if item_structure != structure or (structure == "tuple" and item_names != names):
        raise ValueError(f"item {i} is {_describe(item_structure, item_names)} but item 0 is "
                         f"{_describe(structure, names)}: every item must have the same fields")
    if structure == "dict":
        if set(item_names) != set(names):
            missing = [k for k in names if k not in item]
            extra = [k for k in item_names if k not in set(names)]
            raise ValueError(f"item {i} has keys {item_names} but item 0 has {names} (missing {missing}, "
                             f"extra {extra}): every item must have the same keys")
        return [item[k] for k in names]
    return item_values


def _is_number(v):
    return isinstance(v, (bool, int, float, np.number, np.bool_))


def _check_nested(value, where):
    """A list/tuple field must be a (nested) list of numbers, i.e. an array literal; anything else nested
    (tensors, arrays, dicts, strings) would be stacked or flattened silently, so it is refused."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif not _is_number(v):
            kind = "a dict" if isinstance(v, dict) else f"a {type(v).__name__}"
            raise TypeError(f"{where} is a {type(value).__name__} holding {kind}: nested items are not "
                            f"supported (a field may be a tensor, an array, a number or a list of numbers); "
                            f"stack it into one array or make each part a field of its own")


def to_numpy(value, where):
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            raise TypeError(f"{where}: bfloat16 has no .npy representation; convert with .float() first")
        value = value.detach().cpu().resolve_conj().resolve_neg().numpy()
    elif isinstance(value, dict):
        raise TypeError(f"{where} is a dict: nested items are not supported (a field may be a tensor, an "
                        f"array, a number or a list of numbers); flatten it into the item's own keys")
    elif isinstance(value, (list, tuple)):
        _check_nested(value, where)
    try:
        arr = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise ValueError(f"{where}: {type(value).__name__} does not form an array ({e})") from None
    if arr.dtype == object:
        raise TypeError(f"{where}: a {type(value).__name__} is not a tensor, an array or a number (numpy makes "
                        f"an object array of it, e.g. an int beyond int64 or a None)")
    if arr.dtype not in _SUPPORTED:
        raise TypeError(f"{where}: dtype {arr.dtype} is not supported (supported: "
                        f"{', '.join(sorted(str(d) for d in _SUPPORTED))})")
    return arr


def _fsync(path, directory=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    except OSError:
        if not directory:  # some filesystems cannot sync a directory; the files themselves are synced
            raise
    finally:
        os.close(fd)


def _columns(source):
    """(structure, names, arrays) when ``source`` is a dict (str keys) or tuple of equal-length arrays or
    tensors, one per column; else None (a map-style dataset of items)."""
    if isinstance(source, dict) and source and all(isinstance(k, str) for k in source):
        structure, names, values = "dict", list(source), list(source.values())
        _fields(dict.fromkeys(names), 0)  # the keys must name files
    elif isinstance(source, tuple) and source:
        structure, names, values = "tuple", [str(j) for j in range(len(source))], list(source)
    else:
        return None
    for k, v in zip(names, values):
        if not isinstance(v, (torch.Tensor, np.ndarray)) or v.ndim < 1:
            raise TypeError(f"write_npy: a {type(source).__name__} is written as columns, one per "
                            f"{'key' if structure == 'dict' else 'element'}, each a tensor or array of one row per "
                            f"record; column {k!r} is a {type(v).__name__}{' of 0 dimensions' if hasattr(v, 'ndim') else ''}"
                            f" (for a dataset of items, give a list or a map-style dataset)")
    arrays = [to_numpy(v, f"column {k!r}") for k, v in zip(names, values)]
    for k, a in zip(names[1:], arrays[1:]):
        if len(a) != len(arrays[0]):
            raise ValueError(f"write_npy: column {k!r} has {len(a)} rows but column {names[0]!r} has "
                             f"{len(arrays[0])}: every column needs one row per record")
    return structure, names, arrays


def _get(dataset, i):
    try:
        return dataset[i]
    except BaseException as e:
        if hasattr(e, "add_note"):
            e.add_note(f"write_npy: raised by dataset[{i}]")
        raise


class _Progress:
    """tqdm when installed, else a line on stderr every few seconds."""

    def __init__(self, total, enabled, desc="write_npy", unit="records"):
        self._bar = None
        self._enabled = enabled
        self._total = total
        self._done = 0
        self._desc = desc
        self._unit = unit
        self._last = time.monotonic()
        if enabled:
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, unit=unit, desc=desc)
            except ImportError:
                pass

    def update(self, n):
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._enabled and (time.monotonic() - self._last > 2 or self._done == self._total):
            self._last = time.monotonic()
            print(f"{self._desc}: {self._done}/{self._total} {self._unit}", file=sys.stderr, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


def write_npy(dataset, out_dir, *, progress=True, chunk_size=1024):
    """Writes every item of a map-style dataset to ``.npy`` columns and returns their NpyDataset.

    Parameters
    ----------
    dataset : map-style dataset, or a dict or tuple of columns
        ``len(dataset)`` and ``dataset[i]``; items are tensors, numpy arrays or numbers, or tuples or
        dicts of them, with the same fields, shapes and dtypes for every item (dict keys are matched by
        name, in any order). A field may also be a list of numbers (or of such lists), written as one
        array; other nesting (a dict or tuple of tensors inside an item) raises TypeError naming the field.
        Or the columns themselves: ``{"image": x, "label": y}`` or ``(x, y)``, tensors or arrays with one
        row per record (the same number of rows: ValueError naming both otherwise), written as they are.
    out_dir : path
        Created if missing. One file per field: ``data.npy`` for single items, ``0.npy``, ``1.npy``, ...
        for tuples, ``<key>.npy`` for dicts. Files appear complete or not at all: each is written under a
        temporary name (``<name>.npy.partial``), synced, then renamed over any file of the same name. When
        anything fails (a bad item, an exception from the dataset, KeyboardInterrupt) the temporary files
        are removed and existing files are left as they were.
    progress : bool
        Show a progress bar (tqdm when installed).
    chunk_size : int
        Items gathered in memory before each write: memory stays bounded by ``chunk_size`` items.

    Returns
    -------
    NpyDataset
        With the same structure as the items (tensor, tuple or dict).

    Raises
    ------
    ValueError
        An empty dataset, or an item whose fields, shapes or dtypes differ from item 0's (naming the
        item and the field).
    TypeError
        A field of an unsupported type or dtype, or a nested one (naming the item and the field).
    """
    columns = _columns(dataset)
    if columns is None and (isinstance(dataset, (str, bytes, os.PathLike)) or not (
            hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"))):
        raise TypeError(f"dataset must be a map-style dataset (len(dataset) and dataset[i]), or a dict or tuple of "
                        f"columns, got {type(dataset).__name__}")
    out_dir = checks.path(out_dir, "out_dir")
    chunk_size = checks.integer(chunk_size, "chunk_size", low=1)
    progress = checks.flag(progress, "progress")
    if columns is not None:
        structure, names, arrays = columns
        n = len(arrays[0])
        firsts = [a[0] for a in arrays] if n else []

        def chunk(start, stop):
            return [a[start:stop] for a in arrays]
    else:
        n = len(dataset)
    if n == 0:
        raise ValueError("write_npy: the dataset is empty (len(dataset) == 0); nothing was written")
    if columns is None:
        # Item 0 fixes the fields, shapes and dtypes; nothing is created before it is known to be writable.
        structure, names, values = _fields(_get(dataset, 0), 0)
        firsts = [to_numpy(v, f"item 0, field {k!r}") for k, v in zip(names, values)]
        del values

        def chunk(start, stop):
            bufs = [np.empty((stop - start, *a.shape), a.dtype) for a in firsts]
            for i in range(start, stop):
                item_values = _match(_get(dataset, i), i, structure, names)
                for buf, first, k, v in zip(bufs, firsts, names, item_values):
                    a = to_numpy(v, f"item {i}, field {k!r}")
                    if a.shape != first.shape or a.dtype != first.dtype:
                        raise ValueError(f"item {i}, field {k!r}: shape {a.shape} dtype {a.dtype} differs from item "
                                         f"0's shape {first.shape} dtype {first.dtype}")
                    buf[i - start] = a
            return bufs
    paths = [os.path.join(out_dir, f"{k}.npy") for k in names]
    tmp_paths = [p + ".partial" for p in paths]
    for p in paths + tmp_paths:
        if os.path.isdir(p):
            raise IsADirectoryError(f"write_npy: {p!r} is a directory; it cannot be replaced by a .npy file")
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    outs = []
    bar = _Progress(n, progress)
    try:
        for t, a in zip(tmp_paths, firsts):
            outs.append(np.lib.format.open_memmap(t, mode="w+", dtype=a.dtype, shape=(n, *a.shape)))
        for start in range(0, n, chunk_size):
            stop = min(n, start + chunk_size)
            bufs = chunk(start, stop)
            for out, buf in zip(outs, bufs):
                out[start:stop] = buf
            del bufs, out, buf
            bar.update(stop - start)
        for out in outs:
            out.flush()
        outs.clear()
        for t in tmp_paths:
            _fsync(t)
        for t, p in zip(tmp_paths, paths):
            os.replace(t, p)
        _fsync(out_dir, directory=True)
    except BaseException:
        outs.clear()
        for t in tmp_paths:
            try:
                os.remove(t)
            except OSError:  # already gone (or never made); the original error is the one to report
                pass
        if created:
            try:
                os.rmdir(out_dir)  # only when empty: never removes anything but what this call made
            except OSError:
                pass
        raise
    finally:
        bar.close()
    if structure == "single":
        return NpyDataset(paths[0])
    if structure == "tuple":
        return NpyDataset(paths)
    return NpyDataset(dict(zip(names, paths)))
