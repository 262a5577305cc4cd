"""Datasets on local disk (files, packed columns, WebDataset shards) and the Loader that reads them."""

from fastpipe.data.image_writer import write_images
from fastpipe.data.images import ImageDataset, ImageFolder
from fastpipe.data.loader import Loader
from fastpipe.data.npy import NpyDataset
from fastpipe.data.tokens import TokenDataset
from fastpipe.data.webdataset import WebDataset
from fastpipe.data.writer import write_npy

__all__ = ["ImageDataset", "ImageFolder", "Loader", "NpyDataset", "TokenDataset", "WebDataset", "write_images",
           "write_npy"]
