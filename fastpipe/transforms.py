"""Transforms the Loader fuses into its reads: ``Loader(ds, ..., transforms={"image": CropMirrorNormalize(...)})``.

On the CPU they run in the reader threads as each record lands in the batch; on a CUDA loader, in one
kernel per batch after the copy (the uint8 images cross PCIe, not the floats). Both run the same
per-element code (csrc/cuda/transforms.h), so they give bit-identical results.
"""

import numbers

import torch

from fastpipe import _checks as checks
from fastpipe._ext import _C

__all__ = ["CropMirrorNormalize"]

_OUT_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _per_channel(value, name, positive=False):
    """A finite number, or a non-empty sequence of them (one per channel), as a list of floats."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real) and not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a number or a sequence of numbers, got {type(value).__name__} {value!r}")
    if isinstance(value, numbers.Real):
        value = [value]
    values = [checks.real(v, f"{name}[{i}]", positive=positive) for i, v in enumerate(value)]
    if not values:
        raise ValueError(f"{name} must not be empty")
    return values


class CropMirrorNormalize:
    """Crop, horizontal flip, ``(x / 255 - mean) / std``, dtype and layout in one pass over uint8 images.

    Parameters
    ----------
    mean, std : float or sequence of float
        Per channel (or one value for all), in units of the image scaled to [0, 1], as torchvision's
        ``Normalize`` after ``ToTensor``: e.g. ImageNet's (0.485, 0.456, 0.406), (0.229, 0.224, 0.225).
    crop : None or (height, width)
        The output size; None keeps the whole image. At most the image's size.
    random_crop : bool
        A random crop position per sample and epoch, else the centred crop.
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
                 layout="NCHW", in_layout="HWC"):
        self.mean = _per_channel(mean, "mean")
        self.std = _per_channel(std, "std", positive=True)
        if crop is not None:
            if not isinstance(crop, (tuple, list)) or len(crop) != 2:
                raise TypeError(f"crop must be None or (height, width), got {type(crop).__name__} {crop!r}")
            crop = (checks.integer(crop[0], "crop height", low=1), checks.integer(crop[1], "crop width", low=1))
        self.crop = crop
        self.random_crop = checks.flag(random_crop, "random_crop")
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
                f"layout={self.layout!r}, in_layout={self.in_layout!r})")

    def windows(self, record_shape, index, epoch, seed=0):
        """``[(y0, x0, flipped)]``: where the crop of each sample in ``index`` starts in ``epoch`` of a
        Loader with ``seed``, and whether it is flipped (records of ``record_shape``)."""
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
        if oh > h or ow > w:
            raise ValueError(f"{where}: the crop {oh}x{ow} does not fit in images of {h}x{w}")
        params = _C.CropMirrorNormalizeParams(
            in_height=h, in_width=w, channels=c, in_hwc=self.in_layout == "HWC", out_height=oh, out_width=ow,
            out_nhwc=self.layout == "NHWC", out_dtype=_OUT_DTYPES[self.out_dtype], random_crop=self.random_crop,
            mirror=self.mirror, scale=[1.0 / (255.0 * s) for s in std], shift=[-m / s for m, s in zip(mean, std)],
            seed=int(seed) & ((1 << 64) - 1))
        shape = [c, oh, ow] if self.layout == "NCHW" else [oh, ow, c]
        return params, (_OUT_DTYPES[self.out_dtype], shape)
