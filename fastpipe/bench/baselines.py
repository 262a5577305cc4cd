"""The stock-PyTorch ways of loading the loader suite's data, and the single-thread gather bound.

Every baseline returns materialised copies: numpy fancy indexing, ``np.array()`` and ``.astype()`` always
copy, default_collate stacks into a new tensor, and worker batches are copied into shared memory. Memmaps
are opened lazily so each DataLoader worker maps the file itself. All of them go through the batches of
one shared order (``order``, an array of record indices) with the same batch size.
"""

from __future__ import annotations

import os
import warnings
from typing import Callable, Iterable, NamedTuple

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset


class Baseline(NamedTuple):
    key: str  # the row's key in the JSON
    label: str  # the row's name in the tables
    make_iter: Callable[[], Iterable]  # a fresh iterator over one epoch's batches
    kind: str = "baseline"  # "baseline", "inline" (gathers on the training thread), "bound" / "bound_raw"
    note: str = ""


# --------------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------------
class _Images:
    def __init__(self, images: str, labels: str):
        self.images_path, self.labels_path = images, labels
        self.n = int(np.load(images, mmap_mode="r").shape[0])
        self._img = self._lab = None

    def _open(self):
        if self._img is None:
            self._img = np.load(self.images_path, mmap_mode="r")
            self._lab = np.load(self.labels_path, mmap_mode="r")

    def __len__(self):
        return self.n

    def __getstate__(self):
        return {**self.__dict__, "_img": None, "_lab": None}


class MemmapSampleDataset(_Images, Dataset):
    """Per-sample map-style Dataset over np.memmap rows: record i -> (image, label) tensors (copies)."""

    def __getitem__(self, i):
        self._open()
        return torch.from_numpy(np.array(self._img[i])), torch.from_numpy(np.array(self._lab[i]))


class MemmapBatchDataset(_Images, Dataset):
    """Whole-batch Dataset: a list of indices (from BatchSampler) -> one fancy index per column."""

    def __getitem__(self, idx):
        self._open()
        idx = np.asarray(idx, dtype=np.int64)
        return torch.from_numpy(np.asarray(self._img[idx])), torch.from_numpy(np.asarray(self._lab[idx]))


def token_windows(tok: np.ndarray, block: int) -> np.ndarray:
    """Window i = tokens [i*block, i*block + block + 1): a read-only overlapping view, no copy."""
    n = (len(tok) - 1) // block
    return np.lib.stride_tricks.as_strided(tok, shape=(n, block + 1), strides=(block * tok.itemsize,
                                                                               tok.itemsize), writeable=False)


class _Tokens:
    def __init__(self, path: str, block: int):
        self.path, self.block = path, block
        self.n = (os.path.getsize(path) // 2 - 1) // block
        self._tok = self._win = None

    def _open(self):
        if self._tok is None:
            self._tok = np.memmap(self.path, dtype=np.uint16, mode="r")
            self._win = token_windows(self._tok, self.block)

    def __len__(self):
        return self.n

    def __getstate__(self):
        return {**self.__dict__, "_tok": None, "_win": None}


class TokenSampleDataset(_Tokens, Dataset):
    """Per-sample: window i -> (x, y) int64 tensors of length block (astype copies)."""

    def __getitem__(self, i):
        self._open()
        w = self._tok[i * self.block: i * self.block + self.block + 1]
        return torch.from_numpy(w[:-1].astype(np.int64)), torch.from_numpy(w[1:].astype(np.int64))


class TokenBatchDataset(_Tokens, Dataset):
    """Whole-batch: one fancy index on the window view, then int64 x and y (contiguous copies)."""

    def __getitem__(self, idx):
        self._open()
        w = self._win[np.asarray(idx, dtype=np.int64)]
        return torch.from_numpy(w[:, :-1].astype(np.int64)), torch.from_numpy(w[:, 1:].astype(np.int64))


# --------------------------------------------------------------------------------------------------
# The rows
# --------------------------------------------------------------------------------------------------
def batches_of(order: np.ndarray, batch: int) -> list[np.ndarray]:
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def _dataloaders(sample_ds: Dataset, batch_ds: Dataset, order: np.ndarray, batch: int) -> list[Baseline]:
    """DataLoader per-sample (default collate) and whole-batch (BatchSampler), each with 0 and 2 workers."""
    order_list = order.tolist()
    rows = []
    for w in (0, 2):
        dl = DataLoader(sample_ds, batch_size=batch, sampler=order_list, num_workers=w, persistent_workers=w > 0)
        rows.append(Baseline(f"dl_sample_w{w}", f"DataLoader per-sample, workers={w}", (lambda dl=dl: dl)))
    for w in (0, 2):
        dl = DataLoader(batch_ds, batch_size=None, sampler=BatchSampler(order_list, batch, drop_last=False),
                        num_workers=w, persistent_workers=w > 0)
        rows.append(Baseline(f"dl_batch_w{w}", f"DataLoader batch fancy-index, workers={w}", (lambda dl=dl: dl)))
    return rows


_SORTED_NOTE = "in-batch order differs from the sampler's"


def image_baselines(images: str, labels: str, batch: int, order: np.ndarray) -> tuple[list[Baseline], Callable]:
    """The rows for an (images, labels) pair of .npy files; also the bound's iterator factory, whose
    per-batch time sets the overlap mode's simulated step."""
    img = np.load(images, mmap_mode="r")
    lab = np.load(labels, mmap_mode="r")
    idx_batches = batches_of(order, batch)
    rows = _dataloaders(MemmapSampleDataset(images, labels), MemmapBatchDataset(images, labels), order, batch)

    def mm_loop():
        for idx in idx_batches:
            yield torch.from_numpy(np.asarray(img[idx])), torch.from_numpy(np.asarray(lab[idx]))

    def mm_sorted_loop():
        for idx in idx_batches:
            s = np.sort(idx)
            yield torch.from_numpy(np.asarray(img[s])), torch.from_numpy(np.asarray(lab[s]))

    ibuf = np.empty((batch, *img.shape[1:]), img.dtype)
    lbuf = np.empty((batch,), lab.dtype)

    def gather():
        # mode="clip": with out= and the default mode="raise" numpy gathers into a temporary and copies
        # again; clip writes straight into `out` (the indices are valid, so nothing is clipped).
        for idx in idx_batches:
            k = len(idx)
            np.take(img, idx, axis=0, out=ibuf[:k], mode="clip")
            np.take(lab, idx, axis=0, out=lbuf[:k], mode="clip")
            yield ibuf[:k], lbuf[:k]

    with warnings.catch_warnings():  # read-only memory map: the tensors are only read
        warnings.simplefilter("ignore", UserWarning)
        timg, tlab = torch.from_numpy(img), torch.from_numpy(lab)

    def index_select_loop():  # torch's gather, on its intra-op threads (issue 21's fastest peer on small records)
        for idx in idx_batches:
            t = torch.from_numpy(idx)
            yield timg.index_select(0, t), tlab.index_select(0, t)

    rows += [Baseline("index_select", "torch.index_select on a memmap tensor", index_select_loop, "inline"),
             Baseline("mm_index", "memmap index in loop", mm_loop),
             Baseline("mm_sorted", "memmap index, sorted in batch", mm_sorted_loop, note=_SORTED_NOTE),
             Baseline("bound", "bound: 1-thread gather (np.take)", gather, "bound")]
    return rows, gather


def token_baselines(path: str, block: int, batch: int, order: np.ndarray) -> tuple[list[Baseline], Callable]:
    """The rows for a uint16 token file read as (block + 1)-token windows -> int64 (x, y); also the
    bound that does fastpipe's work (gather + widen), whose per-batch time sets the simulated step."""
    tok = np.memmap(path, dtype=np.uint16, mode="r")
    win = token_windows(tok, block)
    nwin = len(win)
    rows_view = tok[: nwin * block].reshape(nwin, block)  # window i without its last token: contiguous records
    idx_batches = batches_of(order, batch)
    rows = _dataloaders(TokenSampleDataset(path, block), TokenBatchDataset(path, block), order, batch)

    def xy(w):
        return torch.from_numpy(w[:, :-1].astype(np.int64)), torch.from_numpy(w[:, 1:].astype(np.int64))

    def mm_loop():
        for idx in idx_batches:
            yield xy(win[idx])

    def mm_sorted_loop():
        for idx in idx_batches:
            yield xy(win[np.sort(idx)])

    def nanogpt_loop():
        # nanoGPT's get_batch(), with the window starts taken from the shared order.
        for idx in idx_batches:
            starts = idx * block
            x = torch.stack([torch.from_numpy(tok[i:i + block].astype(np.int64)) for i in starts])
            y = torch.stack([torch.from_numpy(tok[i + 1:i + 1 + block].astype(np.int64)) for i in starts])
            yield x, y

    rbuf = np.empty((batch, block), np.uint16)
    lbuf = np.empty((batch,), np.uint16)
    xbuf = np.empty((batch, block), np.int64)
    ybuf = np.empty((batch, block), np.int64)

    def gather_raw():
        for idx in idx_batches:
            k = len(idx)
            np.take(rows_view, idx, axis=0, out=rbuf[:k], mode="clip")
            np.take(tok, (idx + 1) * block, out=lbuf[:k], mode="clip")
            yield rbuf[:k], lbuf[:k]

    def gather_widen():
        for r, last in gather_raw():
            k = len(r)
            np.copyto(xbuf[:k], r)
            np.copyto(ybuf[:k, :-1], r[:, 1:])
            ybuf[:k, -1] = last
            yield xbuf[:k], ybuf[:k]

    rows += [Baseline("mm_index", "memmap index in loop", mm_loop),
             Baseline("mm_sorted", "memmap index, sorted in batch", mm_sorted_loop, note=_SORTED_NOTE),
             Baseline("mm_nanogpt", "memmap nanoGPT get_batch (stack)", nanogpt_loop),
             Baseline("bound_raw", "bound: 1-thread gather, uint16 records", gather_raw, "bound_raw"),
             Baseline("bound", "bound: 1-thread gather + widen to int64 x,y", gather_widen, "bound")]
    return rows, gather_widen
