"""TokenDataset: fixed-length windows over a flat file of token ids (language-model pretraining)."""

import os

import numpy as np
import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.data import remote
from fastpipe.data._source import ColumnSource

_TOKEN_DTYPES = {"uint8": (1, False), "uint16": (2, False), "int16": (2, True), "int32": (4, True),
                 "uint32": (4, False), "int64": (8, True)}


class TokenDataset(ColumnSource):
    """Windows of ``block_size + 1`` tokens from a flat token file, returned as ``(x, y)``.

    Parameters
    ----------
    path : path or URL
        A raw token file (``.bin``, as nanoGPT/llm.c-style preprocessing writes it: tokens back to back,
        no header) or a 1-D ``.npy`` file; at an ``s3://`` or ``http(s)://`` URL, fetched into the local
        cache first (``storage_options``, ``cache_dir``, ``cache_limit`` as :class:`WebDataset`'s;
        ``fetch_stats`` holds the counters).
    block_size : int
        Tokens per sample; each sample reads ``block_size + 1`` tokens.
    dtype : str
        Token type of a raw file: uint8, uint16 (default), int16, int32, uint32 or int64. Ignored for
        ``.npy`` files, whose header gives it.

    Notes
    -----
    Window ``i`` covers tokens ``[i * block_size, i * block_size + block_size + 1)``: consecutive windows
    share one token, so an epoch visits every non-overlapping block of ``block_size`` targets exactly
    once. ``x`` is the first ``block_size`` tokens and ``y`` the last ``block_size``, both int64 (the
    widening happens in the reader threads, not in the training loop).
    """

    _unit = "windows"

    def __init__(self, path, block_size, dtype="uint16", *, storage_options=None, cache_dir=None, cache_limit=None):
        (self.path,), self.fetch_stats = remote.local_paths([checks.path(path, "path")], storage_options, cache_dir,
                                                            cache_limit, "TokenDataset")
        self.block_size = checks.integer(block_size, "block_size", low=1)
        if self.path.endswith(".npy"):
            h = _C.read_npy_header(self.path)
            if len(h["shape"]) != 1:
                raise ValueError(f"'{self.path}': a token file must be 1-D, got shape {h['shape']}")
            if h["dtype"] not in _TOKEN_DTYPES:
                raise ValueError(f"'{self.path}': tokens must be integers, got dtype {h['dtype']}")
            self.dtype = h["dtype"]
            offset, ntokens = h["data_offset"], h["shape"][0]
        else:
            self.dtype = checks.choice(dtype, "dtype", sorted(_TOKEN_DTYPES))
            size = os.stat(self.path).st_size
            itemsize = _TOKEN_DTYPES[dtype][0]
            if size % itemsize:
                raise ValueError(f"'{self.path}' is {size} bytes, not a whole number of {dtype} tokens "
                                 f"({itemsize} bytes each): wrong dtype?")
            offset, ntokens = 0, size // itemsize
        if ntokens < block_size + 1:
            raise ValueError(f"'{self.path}' holds {ntokens} tokens, fewer than one window of block_size + 1 = "
                             f"{block_size + 1}")
        self._offset = offset
        self.num_tokens = ntokens
        self._len = (ntokens - 1) // block_size
        self._tokens = None

    def __getitem__(self, i):
        i = self._index(i)
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self._offset,
                                     shape=(self.num_tokens,))
        w = torch.from_numpy(self._tokens[i * self.block_size: (i + 1) * self.block_size + 1].astype(np.int64))
        return w[:-1], w[1:]

    def __repr__(self):
        return f"TokenDataset({self._len} windows of {self.block_size}+1 {self.dtype} tokens from '{self.path}')"

    def _columns(self):
        itemsize, signed = _TOKEN_DTYPES[self.dtype]
        return [_C.ColumnSpec(path=self.path, data_offset=self._offset, record_stride=self.block_size * itemsize,
                              record_bytes=(self.block_size + 1) * itemsize, num_records=self._len,
                              token_bytes=itemsize, token_signed=signed)]

    def _outputs(self):
        return [("int64", [self.block_size]), ("int64", [self.block_size])]

    _reader_pack = "tuple"

    def _pack(self, tensors):
        return tensors[0], tensors[1]
