"""fastpipe: fast tensor data loading from local disk, and fused convolution kernels, for PyTorch."""

from fastpipe._ext import build_info
from fastpipe.batch_size import BatchSizeResult, find_batch_size
from fastpipe.data import (ImageDataset, ImageFolder, Loader, NpyDataset, TokenDataset, WebDataset, write_images,
                           write_npy)
from fastpipe.data._device import record_stream
from fastpipe.monitor import Monitor
from fastpipe import nn, transforms

__version__ = "0.1.0"
__all__ = ["BatchSizeResult", "ImageDataset", "ImageFolder", "Loader", "Monitor", "NpyDataset", "TokenDataset",
           "WebDataset", "build_info", "find_batch_size", "nn", "record_stream", "transforms", "write_images", "write_npy",
           "__version__"]
