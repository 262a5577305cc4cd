"""fastpipe: fast tensor data loading from local disk, and fused convolution kernels, for PyTorch."""

from fastpipe._ext import build_info
from fastpipe.data import Loader, NpyDataset, TokenDataset, write_npy
from fastpipe.data._device import record_stream
from fastpipe import nn, transforms

__version__ = "0.1.0"
__all__ = ["Loader", "NpyDataset", "TokenDataset", "build_info", "nn", "record_stream", "transforms", "write_npy",
           "__version__"]
