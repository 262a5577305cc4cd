"""The images suite's competitors: stock PyTorch (DataLoader + torchvision v2, on PIL and on decode_jpeg),
DALI's CPU pipeline and FFCV, each built for one output size as a :class:`Pipeline`.

Every pipeline does the same work as fastpipe's ``RandomResizedCrop(S, mean=MEAN, std=STD)``: a random
crop of 8-100% of the area with aspect ratio 3/4-4/3, resized to S x S, flipped with probability 0.5,
scaled to [0, 1], normalised with ImageNet's mean and std, and yields ``(images float32 [B, 3, S, S]
contiguous NCHW, labels int64 [B])`` batches, ``drop_last``, shuffled, with ``threads`` workers or
threads. The heavy imports happen inside the builders: a case process imports only its own loader's
libraries (torchvision, ``nvidia.dali``, ``ffcv``), so its import time and memory are its own.
"""

from __future__ import annotations

import importlib.util
import mmap
import os
from typing import Callable, Iterator

import numpy as np

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
PEERS_HINT = "pip install -r requirements/bench-peers.txt (or: make bench-peers)"


class Pipeline:
    """One loader at one output size.

    ``epoch()`` returns a fresh iterator over one epoch's batches; ``close_iter(it)`` stops an iterator
    left before its end; ``before_evict()`` lets go of what the loader keeps mapped from its files, so
    that the page cache can drop them (FFCV's memory map); ``close()`` frees the loader.

    ``read_ahead``: the loader keeps files of the next epoch read ahead across an epoch's end (DALI's
    shuffle buffer): a cold pass is then preceded by an untimed cold epoch, so that what it holds was
    read from the disk too, as in steady-state training on data that does not fit the page cache."""

    def __init__(self, epoch: Callable[[], Iterator], batches: int, close: Callable[[], None] | None = None,
                 before_evict: Callable[[], None] | None = None, close_iter: Callable | None = None,
                 info: dict | None = None, read_ahead: bool = False):
        self.epoch = epoch
        self.batches = batches
        self.read_ahead = read_ahead
        self._close = close
        self.before_evict = before_evict or (lambda: None)
        self._close_iter = close_iter
        self.info = dict(info or {})

    def close_iter(self, it) -> None:
        if self._close_iter is not None:
            self._close_iter(it)
            return
        close = getattr(it, "close", None)  # generators; FFCV's EpochIterator
        if close is not None:
            close()

    def close(self) -> None:
        if self._close is not None:
            self._close()


def peer_missing(module: str) -> str | None:
    """Why a peer's module cannot be imported here without importing it (None when it is installed)."""
    try:
        if importlib.util.find_spec(module) is not None:
            return None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        pass
    return f"{module} is not installed ({PEERS_HINT})"


# --------------------------------------------------------------------------------------------------
# DataLoader + torchvision.transforms.v2
# --------------------------------------------------------------------------------------------------
def _dataloader(ds, batch: int, threads: int, seed: int):
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator()
    g.manual_seed(seed)
    return DataLoader(ds, batch_size=batch, shuffle=True, num_workers=threads, persistent_workers=False,
                      pin_memory=False, drop_last=True, generator=g)


def dataloader_pil(root: str, size: int, batch: int, threads: int, seed: int = 0, recipe: bool = False,
                   interpolation: str = "bilinear") -> Pipeline:
    """``DataLoader(num_workers=threads)`` over ``torchvision.datasets.ImageFolder`` (PIL decodes) with
    ``v2.Compose([RandomResizedCrop(S, antialias=True), RandomHorizontalFlip(), PILToTensor(),
    ToDtype(float32, scale=True), Normalize(MEAN, STD)])``: what most training scripts do. ``recipe``:
    torchvision's reference train recipe, ``TrivialAugmentWide`` after the flip (on the PIL image, with the
    references' interpolation: bilinear, or bicubic for their --interpolation bicubic recipes, which pass it to
    the crop too) and ``RandomErasing(0.1)`` last."""
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    mode = v2.InterpolationMode(interpolation)
    augment = [v2.TrivialAugmentWide(interpolation=mode)] if recipe else []
    erase = [v2.RandomErasing(0.1)] if recipe else []
    tf = v2.Compose([v2.RandomResizedCrop(size, interpolation=mode, antialias=True), v2.RandomHorizontalFlip(), *augment,
                     v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD), *erase])
    dl = _dataloader(datasets.ImageFolder(root, transform=tf), batch, threads, seed)
    return Pipeline(lambda: iter(dl), len(dl), close_iter=_drop_dataloader_iter)


def read_decode_jpeg(path: str):
    """torchvision.io: the file's bytes (``read_file``) decoded to a uint8 [3, H, W] tensor by libjpeg-turbo."""
    from torchvision.io import ImageReadMode, decode_jpeg, read_file

    return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)


def dataloader_decode_jpeg(root: str, size: int, batch: int, threads: int, seed: int = 0) -> Pipeline:
    """The same DataLoader with ``torchvision.io.decode_jpeg(read_file(path))`` as the ImageFolder's loader
    and the v2 transforms on uint8 tensors (no PILToTensor)."""
    import torch
    from torchvision import datasets
    from torchvision.transforms import v2

    tf = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip(),
                     v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(root, transform=tf, loader=read_decode_jpeg)
    dl = _dataloader(ds, batch, threads, seed)
    return Pipeline(lambda: iter(dl), len(dl), close_iter=_drop_dataloader_iter)


def _drop_dataloader_iter(it) -> None:
    # A multi-worker iterator stops and joins its workers when it is collected (no close() method).
    shutdown = getattr(it, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


# --------------------------------------------------------------------------------------------------
# DALI's CPU pipeline
# --------------------------------------------------------------------------------------------------
def dali_cpu(root: str, size: int, batch: int, threads: int, num_images: int, seed: int = 0) -> Pipeline:
    """NVIDIA DALI without a GPU (``device_id=None``): ``readers.file`` (shuffled) ->
    ``decoders.image_random_crop`` (libjpeg-turbo, decodes only the crop's region) -> ``resize`` to S x S
    (antialiased linear) -> ``crop_mirror_normalize`` (float, CHW, a coin-flip mirror). Outputs are
    copied into torch tensors with ``feed_ndarray``, as DALI's PyTorch iterator does, so the consumer
    reads the same bytes as from the other loaders. A pass is ``num_images // batch`` batches
    (``pipe.run()`` runs on across epochs by itself)."""
    import torch
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=seed)
    def pipe_fn():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=size, resize_y=size)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip())
        return images, labels

    pipe = pipe_fn()
    pipe.build()
    batches = num_images // batch

    def epoch():
        for _ in range(batches):
            images, labels = pipe.run()
            x = torch.empty((batch, 3, size, size), dtype=torch.float32)
            feed_ndarray(images.as_tensor(), x)
            y = torch.from_numpy(np.asarray(labels.as_tensor()).reshape(-1).astype(np.int64))
            yield x, y

    def close():
        nonlocal pipe
        del pipe

    # readers.file's shuffle buffer (initial_fill=1024 samples, memory-mapped by default) reads on into
    # the next epoch: read_ahead makes the suite run an untimed cold epoch before a timed cold one.
    return Pipeline(epoch, batches, close=close, info={"reader_epoch_size": int(pipe.epoch_size("Reader"))},
                    read_ahead=True)


# --------------------------------------------------------------------------------------------------
# FFCV
# --------------------------------------------------------------------------------------------------
def write_beton(root: str, path: str, workers: int) -> dict:
    """FFCV's dataset file from ``torchvision.datasets.ImageFolder(root)``: ``RGBImageField(write_mode="jpg",
    jpeg_quality=90)`` (FFCV cannot keep the original bytes: it decodes and re-encodes every image with
    OpenCV) and ``IntField`` labels. Written under a temporary name and renamed when complete."""
    import time

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision import datasets

    tmp = path + ".partial"
    t0 = time.perf_counter()
    writer = DatasetWriter(tmp, {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                           num_workers=workers)
    writer.from_indexed_dataset(datasets.ImageFolder(root))
    os.replace(tmp, path)
    return {"seconds": time.perf_counter() - t0, "bytes": os.path.getsize(path)}


def ffcv_loader(beton: str, size: int, batch: int, threads: int, seed: int = 0) -> Pipeline:
    """``ffcv.loader.Loader(beton, num_workers=threads, order=RANDOM, os_cache=True, drop_last=True)`` with
    ``[RandomResizedCropRGBImageDecoder((S, S)), RandomHorizontalFlip(), NormalizeImage(mean*255, std*255,
    float32), ToTensor(), ToTorchImage(channels_last=False)]``. NormalizeImage comes before ToTensor: on
    the CPU its numba kernel works on the numpy batch (after ToTensor FFCV's graph builder never returns).
    Its batches are buffers it reuses; the first epoch JIT-compiles the pipeline (the untimed warm-up).
    FFCV sets torch's thread count to ``threads`` for the whole process."""
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    mean = np.array(MEAN) * 255
    std = np.array(STD) * 255
    loader = Loader(beton, batch_size=batch, num_workers=threads, order=OrderOption.RANDOM, os_cache=True,
                    drop_last=True, seed=seed,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((size, size)), RandomHorizontalFlip(),
                                         NormalizeImage(mean, std, np.float32), ToTensor(),
                                         ToTorchImage(channels_last=False)],
                               "label": [IntDecoder(), ToTensor(), Squeeze()]})

    def before_evict():
        # os_cache=True maps the whole file once and keeps the mapping: mapped pages cannot be dropped
        # from the page cache. MADV_DONTNEED unmaps them from this process (they fault back in from the
        # file on the next read), so that posix_fadvise(DONTNEED) can then evict them.
        mm = getattr(getattr(getattr(loader, "memory_manager", None), "context", None), "mmap", None)
        raw = getattr(mm, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise"):
            raw.madvise(mmap.MADV_DONTNEED)

    def close_iter(it):
        # close() only sets a flag, seen when the iterator's thread finds its queue full: without the
        # join the abandoned thread keeps decoding during the next (timed) epoch.
        it.close()
        it.join(timeout=60)

    return Pipeline(lambda: iter(loader), len(loader), before_evict=before_evict, close_iter=close_iter)
