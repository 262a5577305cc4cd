"""Transforms the Loader fuses into its reads: ``Loader(ds, ..., transforms={"image": CropMirrorNormalize(...)})``.

- ``CropMirrorNormalize`` works on fixed-size uint8 images (``.npy`` columns). On the CPU it runs in the
  reader threads as each record lands in the batch; on a CUDA loader, in one kernel per batch after the
  copy (the uint8 images cross PCIe, not the floats). Both run the same per-element code
  (csrc/kernels/transforms.h), so they give bit-identical results.
- ``RandomResizedCrop``, ``CenterCrop`` and ``RandomCrop`` (defined in fastpipe/image_transforms.py) turn
  JPEG records (:class:`fastpipe.ImageFolder`, :class:`fastpipe.ImageDataset`) into fixed-size images: the
  crop is drawn from the stored image size, only the rows and columns it needs are decoded (in the reader
  threads, without the GIL), then one pass resizes (antialiased, as torchvision's ``resize(antialias=True)``),
  flips, normalises and writes the batch.
"""

import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C
from fastpipe.augment import (AugMix, AutoAugment, ColorJitter, GaussianBlur, RandAugment, RandomApply,
                              RandomGrayscale, TrivialAugmentWide)
from fastpipe.image_transforms import CenterCrop, RandomCrop, RandomErasing, RandomResizedCrop

__all__ = ["AugMix", "AutoAugment", "CenterCrop", "ColorJitter", "CropMirrorNormalize", "GaussianBlur", "RandAugment",
           "RandomApply", "RandomCrop", "RandomErasing", "RandomGrayscale", "RandomResizedCrop", "TrivialAugmentWide"]

_OUT_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


class CropMirrorNormalize:
    """Crop, horizontal flip, ``(x / 255 - mean) / std``, dtype and layout in one pass over uint8 images.

    Parameters
    ----------
    mean, std : float or sequence of float
        Per channel (or one value for all), in units of the image scaled to [0, 1], as torchvision's
        ``Normalize`` after ``ToTensor``: e.g. ImageNet's (0.485, 0.456, 0.406), (0.229, 0.224, 0.225).
    crop : None or (height, width)
        The output size; None keeps the image's size. At most the image's size plus twice ``padding``.
    random_crop : bool
        A random crop position per sample and epoch, else the centred crop.
    padding : int
        Zero pixels around the image before the crop (0 after the normalisation is ``-mean / std``), as
        torchvision's ``RandomCrop(size, padding=padding)``: CIFAR's ``RandomCrop(32, padding=4)`` is
        ``random_crop=True, padding=4`` on 32x32 images.
    mirror : float
        Probability of a horizontal flip per sample and epoch (0: never, 1: always).
    out_dtype : torch.float32, torch.float16 or torch.bfloat16
    layout : {"NCHW", "NHWC"}
        Of the batch. NHWC is ``channels_last`` data in a tensor of shape (N, H, W, C).
    in_layout : {"HWC", "CHW"}
        Of each stored record: (H, W, C) as images are usually stored, or (C, H, W).

    Notes
    -----
    The random choices come from a counter-based hash of (the Loader's seed, the epoch, the sample's
    index in the dataset): a run reproduces exactly, resumes exactly, and gives the same batches
    whatever the number of reader threads. :meth:`windows` says which crop and flip samples get.
    """

    def __init__(self, mean, std, crop=None, random_crop=False, mirror=0.0, out_dtype=torch.float32,
                 layout="NCHW", in_layout="HWC", padding=0):
        self.mean = checks.per_channel(mean, "mean")
        self.std = checks.per_channel(std, "std", positive=True)
        if crop is not None:
            if not isinstance(crop, (tuple, list)) or len(crop) != 2:
                raise TypeError(f"crop must be None or (height, width), got {type(crop).__name__} {crop!r}")
            crop = (checks.integer(crop[0], "crop height", low=1), checks.integer(crop[1], "crop width", low=1))
        self.crop = crop
        self.random_crop = checks.flag(random_crop, "random_crop")
        self.padding = checks.integer(padding, "padding", low=0)
        self.mirror = checks.real(mirror, "mirror", low=0.0, high=1.0)
        if out_dtype not in _OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {list(_OUT_DTYPES)}, got {out_dtype!r}")
        self.out_dtype = out_dtype
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if in_layout not in ("HWC", "CHW"):
            raise ValueError(f"in_layout must be 'HWC' or 'CHW', got {in_layout!r}")
        self.layout = layout
        self.in_layout = in_layout

    def __repr__(self):
        return (f"CropMirrorNormalize(mean={self.mean}, std={self.std}, crop={self.crop}, "
                f"random_crop={self.random_crop}, mirror={self.mirror}, out_dtype={self.out_dtype}, "
                f"layout={self.layout!r}, in_layout={self.in_layout!r}, padding={self.padding})")

    def windows(self, record_shape, index, epoch, seed=0):
        """``[(y0, x0, flipped)]``: where the crop of each sample in ``index`` starts in ``epoch`` of a
        Loader with ``seed`` (in the image: negative in the padding), and whether it is flipped (records of
        ``record_shape``)."""
        params, _ = self._params(torch.uint8, record_shape, seed, "windows")
        return params.windows([int(i) for i in index], int(epoch))

    def _params(self, dtype, record_shape, seed, where):
        """The C++ parameters for records of `dtype` and `record_shape`, and the output's (dtype, shape)."""
        if dtype != torch.uint8:
            raise TypeError(f"{where}: CropMirrorNormalize takes uint8 images, the column is {dtype}")
        if len(record_shape) != 3:
            raise ValueError(f"{where}: CropMirrorNormalize takes images of 3 dimensions ({self.in_layout}), "
                             f"the records have shape {tuple(record_shape)}")
        if self.in_layout == "HWC":
            h, w, c = record_shape
        else:
            c, h, w = record_shape
        mean, std = self.mean, self.std
        if len(mean) == 1:
            mean = mean * c
        if len(std) == 1:
            std = std * c
        if len(mean) != c or len(std) != c:
            raise ValueError(f"{where}: images have {c} channels but mean has {len(self.mean)} values and std "
                             f"{len(self.std)}")
        oh, ow = self.crop if self.crop is not None else (h, w)
        if oh > h + 2 * self.padding or ow > w + 2 * self.padding:
            padded = f" padded by {self.padding}" if self.padding else ""
            raise ValueError(f"{where}: the crop {oh}x{ow} does not fit in images of {h}x{w}{padded}")
        params = _C.CropMirrorNormalizeParams(
            in_height=h, in_width=w, channels=c, in_hwc=self.in_layout == "HWC", out_height=oh, out_width=ow,
            out_nhwc=self.layout == "NHWC", out_dtype=_OUT_DTYPES[self.out_dtype], random_crop=self.random_crop,
            mirror=self.mirror, scale=[1.0 / (255.0 * s) for s in std], shift=[-m / s for m, s in zip(mean, std)],
            seed=int(seed) & ((1 << 64) - 1), pad=self.padding)
        shape = [c, oh, ow] if self.layout == "NCHW" else [oh, ow, c]
        return params, (_OUT_DTYPES[self.out_dtype], shape)
