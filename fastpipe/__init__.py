"""fastpipe: fast tensor data loading from local disk, and fused convolution kernels, for PyTorch."""

from fastpipe import nn
from fastpipe._ext import build_info

__version__ = "0.1.0"
__all__ = ["build_info", "nn", "__version__"]
