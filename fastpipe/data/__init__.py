"""Datasets on local disk and the Loader that reads them."""

from fastpipe.data.loader import Loader
from fastpipe.data.npy import NpyDataset
from fastpipe.data.tokens import TokenDataset
from fastpipe.data.writer import write_npy

__all__ = ["Loader", "NpyDataset", "TokenDataset", "write_npy"]
