"""NpyDataset: columns of records stored as numpy .npy files."""

import os

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data import remote
from fastpipe.data._source import ColumnSource


class NpyDataset(ColumnSource):
    """Records stored as one or more ``.npy`` files (numpy's own format), one record per row.

    Parameters
    ----------
    columns : path, list of paths, or dict of name -> path
        Each file holds an array whose first dimension indexes records; all files must have the same
        first dimension. The structure given is the structure of every batch: one tensor, a tuple of
        tensors, or a dict of tensors, each of shape ``[B, *record_shape]`` in the file's dtype. URLs
        (``s3://``, ``http(s)://``) are fetched into the local cache first.
    storage_options, cache_dir, cache_limit : optional
        For URLs: as :class:`WebDataset`'s (``fetch_stats`` holds the counters).

    Notes
    -----
    Headers are validated on construction (format 1.0-3.0, C order, little-endian, dtypes bool, uint8,
    int8, int16, uint16, int32, int64, float16, float32, float64): a defect raises ValueError naming
    the file. ``ds[i]`` reads one record through numpy and is meant for inspection; the Loader reads
    batches in C++ without touching Python per record.
    """

    def __init__(self, columns, *, storage_options=None, cache_dir=None, cache_limit=None):
        if isinstance(columns, dict):
            self._structure = "dict"
            self._names = list(columns)
            paths = [checks.path(columns[k], f"columns[{k!r}]") for k in self._names]
        elif isinstance(columns, (list, tuple)):
            self._structure = "tuple"
            self._names = None
            paths = [checks.path(p, f"columns[{i}]") for i, p in enumerate(columns)]
        else:
            self._structure = "single"
            self._names = None
            paths = [checks.path(columns, "columns")]
        if not paths:
            raise ValueError("NpyDataset needs at least one column, got an empty collection")
        self.paths, self.fetch_stats = remote.local_paths(paths, storage_options, cache_dir, cache_limit, "NpyDataset")
        self._headers = [_C.read_npy_header(p) for p in self.paths]
        n0 = self._headers[0]["shape"][0]
        for p, h in zip(self.paths[1:], self._headers[1:]):
            if h["shape"][0] != n0:
                raise ValueError(
                    f"columns must have the same number of records: '{self.paths[0]}' has {n0} but '{p}' has "
                    f"{h['shape'][0]}"
                )
        self._len = n0
        self.record_shapes = [tuple(h["shape"][1:]) for h in self._headers]
        self.dtypes = [getattr(torch, h["dtype"]) for h in self._headers]
        self._maps = None

    def __getitem__(self, i):
        i = self._index(i)
        if self._maps is None:
            # Mapped from the header fastpipe validated, so ds[i] and the Loader agree on every file.
            self._maps = [np.memmap(p, dtype=h["descr"], mode="r", offset=h["data_offset"], shape=tuple(h["shape"]))
                          for p, h in zip(self.paths, self._headers)]
        return self._pack([torch.from_numpy(np.array(m[i])) for m in self._maps])

    def __repr__(self):
        cols = ", ".join(f"{os.path.basename(p)}: {str(d).replace('torch.', '')}{list(s)}"
                         for p, d, s in zip(self.paths, self.dtypes, self.record_shapes))
        return f"NpyDataset({self._len} records; {cols})"

    def _columns(self):
        cols = []
        for p, h in zip(self.paths, self._headers):
            n = h["shape"][0]
            record_bytes = h["data_bytes"] // n if n else 0
            cols.append(_C.ColumnSpec(path=p, data_offset=h["data_offset"], record_stride=record_bytes,
                                      record_bytes=record_bytes, num_records=n))
        return cols

    def _with_transforms(self, transforms, seed):
        columns, outputs = self._columns(), self._outputs()
        fields = self._names if self._structure == "dict" else list(range(len(self.paths)))
        for field, transform in transforms.items():
            if field not in fields:
                raise KeyError(f"transforms: {field!r} is not a field of the batches (fields: {fields})")
            k = fields.index(field)
            params, outputs[k] = transform._params(self.dtypes[k], self.record_shapes[k], seed,
                                                   f"transforms[{field!r}] ({self.paths[k]})")
            c = columns[k]
            columns[k] = _C.ColumnSpec(path=c.path, data_offset=c.data_offset, record_stride=c.record_stride,
                                       record_bytes=c.record_bytes, num_records=c.num_records, transform=params)
        return columns, outputs

    def _outputs(self):
        return [(h["dtype"], list(h["shape"][1:])) for h in self._headers]

    @property
    def _reader_pack(self):
        return {"single": "tensor", "tuple": "tuple"}.get(self._structure, "list")

    def _pack(self, tensors):
        if self._structure == "single":
            return tensors[0]
        if self._structure == "tuple":
            return tuple(tensors)
        return dict(zip(self._names, tensors))
