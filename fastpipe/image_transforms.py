"""The JPEG records' transforms (re-exported by fastpipe.transforms): ``RandomResizedCrop``, ``CenterCrop`` and
``RandomCrop`` turn the records of :class:`fastpipe.ImageFolder`, :class:`fastpipe.ImageDataset` and
:class:`fastpipe.WebDataset` into fixed-size images in the reader threads (csrc/kernels/image_transform.h), with
the fused augmentations (fastpipe.augment) and ``RandomErasing``."""

import torch

from fastpipe import _checks as checks
from fastpipe import pil_resize
from fastpipe._ext import _C
from fastpipe.augment import FACTOR_OPS, OPS, augment_params

INTERPOLATIONS = _C.IMAGE_CHOICES["interpolation"]
RESIZE_AS = _C.IMAGE_CHOICES["resize_as"]
_IMAGE_OUT_DTYPES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
                     torch.uint8: "uint8"}
_MAX_PADDING = 1 << 16  # a side's padding: past any image, and the padded axis stays far from int overflow


def padding_sides(padding):
    """torchvision's RandomCrop padding (an int, or 1, 2 or 4 of them) as (left, top, right, bottom)."""
    if isinstance(padding, (tuple, list)):
        sides = [checks.integer(v, "padding", low=0, high=_MAX_PADDING) for v in padding]
        if len(sides) not in (1, 2, 4):
            raise ValueError(f"padding must be an int or a sequence of 1, 2 or 4 ints, got {len(sides)} of them")
        if len(sides) == 1:
            sides *= 4
        elif len(sides) == 2:
            sides *= 2
        return tuple(sides)
    return (checks.integer(padding, "padding", low=0, high=_MAX_PADDING),) * 4


def _size_pair(size, name):
    """An int (square) or a (height, width) pair of positive ints."""
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"{name} must be an int or (height, width), got {size!r}")
        return checks.integer(size[0], f"{name}[0]", low=1), checks.integer(size[1], f"{name}[1]", low=1)
    size = checks.integer(size, name, low=1)
    return size, size


def _range(value, name, positive=True):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
        raise TypeError(f"{name} must be a (min, max) pair, got {type(value).__name__} {value!r}")
    lo, hi = (checks.real(v, f"{name}[{i}]", positive=positive) for i, v in enumerate(value))
    if lo > hi:
        raise ValueError(f"{name} must be (min, max) with min <= max, got {tuple(value)}")
    return lo, hi


class RandomErasing:
    """torchvision's ``RandomErasing`` (v1 and v2), fused into the output of a :class:`RandomResizedCrop` or
    :class:`CenterCrop` (``erase=RandomErasing(...)``), where torchvision's recipes apply it: last, after
    ``Normalize``.

    Parameters
    ----------
    p : float
        Probability that a sample's output has a box erased.
    scale : (float, float)
        Range of the box's area as a fraction of the output's.
    ratio : (float, float)
        Range of the box's aspect ratio (height / width), drawn log-uniformly.
    value : float or sequence of 3 floats
        What the box's elements become, in the output's units (after normalisation; torchvision's default
        0). torchvision's ``value="random"`` (per-pixel noise) is not supported.

    Notes
    -----
    Drawn as torchvision's ``get_params`` draws (``p``, then up to 10 tries of area and ratio, the box
    kept when it fits strictly inside the output; none when no try fits), from the hash of (seed, epoch,
    sample) that the crop uses: the same box on the CPU and the GPU, in any run. :meth:`_JpegTransform.erased`
    says which box each sample gets.
    """

    def __init__(self, p=0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0):
        self.p = checks.real(p, "p", low=0.0, high=1.0)
        self.scale = _range(scale, "scale")
        if self.scale[1] > 1:
            raise ValueError(f"scale must be within (0, 1], got {tuple(scale)}")
        self.ratio = _range(ratio, "ratio")
        if isinstance(value, str):
            raise ValueError(f"value={value!r}: fastpipe's RandomErasing takes a number or one per channel "
                             f"(torchvision's per-pixel random noise is not supported)")
        value = checks.per_channel(value, "value")
        if len(value) not in (1, 3):
            raise ValueError(f"value needs 1 or 3 values (RGB), got {len(value)}")
        self.value = value * 3 if len(value) == 1 else value

    def __repr__(self):
        return f"RandomErasing(p={self.p}, scale={self.scale}, ratio={self.ratio}, value={self.value})"


class _JpegTransform:
    """What RandomResizedCrop and CenterCrop share: the output (dtype, layout, normalisation), the flip,
    the augmentations, RandomErasing and the C++ parameters."""

    _mode = None

    def _init_erase(self, erase, augment):
        if erase is not None and not isinstance(erase, RandomErasing):
            raise TypeError(f"erase must be a fastpipe.transforms.RandomErasing or None, got {type(erase).__name__}")
        self.erase = erase
        self.augment = augment
        self._augment_params = None if augment is None else augment_params(augment, *self.size)

    def _init_output(self, size, mirror, mean, std, out_dtype, layout, dct_scaling, interpolation, resize_as):
        self.size = _size_pair(size, "size")
        interpolation = getattr(interpolation, "value", interpolation)  # torchvision's InterpolationMode
        self.interpolation = checks.choice(interpolation, "interpolation", INTERPOLATIONS)
        self.resize_as = checks.choice(resize_as, "resize_as", RESIZE_AS)
        self.mirror = checks.real(mirror, "mirror", low=0.0, high=1.0)
        if out_dtype not in _IMAGE_OUT_DTYPES:
            raise ValueError(f"out_dtype must be one of {list(_IMAGE_OUT_DTYPES)}, got {out_dtype!r}")
        self.out_dtype = out_dtype
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std, or neither")
        if mean is not None and out_dtype == torch.uint8:
            raise ValueError("out_dtype=torch.uint8 keeps pixel values: mean and std need a float out_dtype")
        self.mean = None if mean is None else checks.per_channel(mean, "mean")
        self.std = None if std is None else checks.per_channel(std, "std", positive=True)
        for name, v in (("mean", self.mean), ("std", self.std)):
            if v is not None and len(v) not in (1, 3):
                raise ValueError(f"{name} needs 1 or 3 values (RGB), got {len(v)}")
        self.layout = checks.choice(layout, "layout", ("NCHW", "NHWC"))
        self.dct_scaling = checks.flag(dct_scaling, "dct_scaling")

    def _scale_shift(self):
        """Per channel (scale, shift) of the stored value v * scale + shift, v the pixel in [0, 255]."""
        if self.mean is None:
            return [1.0 / 255.0] * 3, [0.0] * 3
        mean = self.mean * 3 if len(self.mean) == 1 else self.mean
        std = self.std * 3 if len(self.std) == 1 else self.std
        return [1.0 / (255.0 * s) for s in std], [-m / s for m, s in zip(mean, std)]

    def _image_params(self, seed):
        """The C++ parameters (_C.ImageTransformParams) for a Loader with ``seed``."""
        scale, shift = self._scale_shift()
        area, ratio, resize = self._geometry()
        extra = dict(self._augment_params or {})
        if self.erase is not None:
            extra.update(erase=(self.erase.p, self.erase.scale, self.erase.ratio, self.erase.value))
        return _C.ImageTransformParams(
            mode=self._mode, out_height=self.size[0], out_width=self.size[1], area=area, ratio=ratio,
            resize_short=resize[0], resize_height=resize[1], resize_width=resize[2], mirror=self.mirror,
            out_nhwc=self.layout == "NHWC", out_dtype=_IMAGE_OUT_DTYPES[self.out_dtype], scale=scale, shift=shift,
            seed=int(seed) & ((1 << 64) - 1), max_dct_denom=8 if self.dct_scaling else 1,
            interpolation=self.interpolation, resize_as=self.resize_as,
            pil_vertical_first=self.interpolation == "bicubic" and self.resize_as == "pil" and pil_resize.vertical_first(),
            **self._padding(), **extra)

    def _padding(self):
        """RandomCrop's padding arguments of _C.ImageTransformParams (the other crops have none)."""
        return {}

    def _output(self):
        """(dtype name, shape) of one output image."""
        h, w = self.size
        return _IMAGE_OUT_DTYPES[self.out_dtype], [3, h, w] if self.layout == "NCHW" else [h, w, 3]

    def boxes(self, sizes, index, epoch, seed=0):
        """Where each sample's output comes from, as the Loader draws it.

        Parameters
        ----------
        sizes : ImageFolder, ImageDataset, or sequence of (height, width)
            The stored image sizes (a dataset's ``image_sizes``).
        index : sequence of int
            Sample indices.
        epoch, seed : int
            The epoch, and the Loader's seed.

        Returns
        -------
        list of (top, left, height, width, flipped)
            RandomResizedCrop: the crop box in the stored image, which is then resized to ``size`` (as
            torchvision's ``resized_crop(img, top, left, height, width, size)``) and flipped.
            CenterCrop and RandomCrop: the crop's place in the resized image (negative, or reaching past
            its end, where the crop takes padding).
        """
        sizes = getattr(sizes, "image_sizes", sizes)
        params = self._image_params(seed)
        out = []
        for i in index:
            h, w = (int(v) for v in sizes[int(i)])
            top, left, bh, bw, flip, _ = params.geometry(h, w, int(epoch), int(i))
            out.append((top, left, bh, bw, flip))
        return out

    def erased(self, index, epoch, seed=0):
        """RandomErasing's box in each sample's output, as the Loader draws it: a list of (top, left,
        height, width) per index (height 0: nothing erased), in output pixels (after the flip)."""
        params = self._image_params(seed)
        return [tuple(params.erase_box(int(epoch), int(i))) for i in index]

    def augmented(self, index, epoch, seed=0):
        """The augmentations each sample gets, as the Loader draws them: a list per index of
        ``(op, magnitude)`` in the order applied: the automatic augmentations' ops as torchvision names them
        (e.g. "Rotate") with the magnitude torchvision passes to the op; ColorJitter's, RandomGrayscale's and
        GaussianBlur's by their functional names ("adjust_hue", "rgb_to_grayscale", "gaussian_blur", ...)
        with their factor (GaussianBlur: its sigma)."""
        params = self._image_params(seed)
        return [[(FACTOR_OPS[OPS[op]] if by_factor else OPS[op], m)
                 for op, m, by_factor in params.augment_ops(int(epoch), int(i))] for i in index]

    def __repr__(self):
        extra = ", ".join(f"{k}={v!r}" for k, v in self._repr_fields())
        erase = f", augment={self.augment!r}" if self.augment is not None else ""
        erase += f", erase={self.erase!r}" if self.erase is not None else ""
        return (f"{type(self).__name__}(size={self.size}, {extra}, mirror={self.mirror}, mean={self.mean}, "
                f"std={self.std}, out_dtype={self.out_dtype}, layout={self.layout!r}, dct_scaling={self.dct_scaling}, "
                f"interpolation={self.interpolation!r}, resize_as={self.resize_as!r}{erase})")


class RandomResizedCrop(_JpegTransform):
    """torchvision's ``RandomResizedCrop`` + ``RandomHorizontalFlip`` + ``ToDtype`` + ``Normalize``, fused
    into the decode of JPEG records (:class:`fastpipe.ImageFolder`, :class:`fastpipe.ImageDataset`).

    Parameters
    ----------
    size : int or (height, width)
        Output size.
    scale : (float, float)
        Range of the crop's area as a fraction of the image's (torchvision's meaning).
    ratio : (float, float)
        Range of the crop's aspect ratio, width / height, drawn log-uniformly (torchvision's meaning).
    mirror : float
        Probability of a horizontal flip (0.5: torchvision's RandomHorizontalFlip).
    mean, std : float or sequence of 3 floats, optional
        ``(x / 255 - mean) / std`` per channel (e.g. ImageNet's (0.485, 0.456, 0.406), (0.229, 0.224, 0.225));
        None: ``x / 255`` (torchvision's ``ToDtype(torch.float32, scale=True)``).
    out_dtype : torch.float32, torch.float16, torch.bfloat16 or torch.uint8
        uint8 keeps the resized pixels (rounded), to normalise later, e.g. on the GPU (4x less to copy).
    layout : {"NCHW", "NHWC"}
        Of the batch; NHWC is channels_last data in a tensor of shape (N, H, W, 3).
    dct_scaling : bool
        Decode at 1/2, 1/4 or 1/8 of full size (libjpeg's DCT scaling) where the crop is at least that
        many times the output on both sides, then resize the rest of the way: much faster on large
        images, but not the same pixels as torchvision's resize of the full-resolution crop (a mean
        difference of about one level in 255). False: always decode the crop at full resolution.
    augment : an augmentation or a list of them, optional
        torchvision's per-sample augmentations of the resized (and flipped) uint8 image, fused, in order:
        TrivialAugmentWide, RandAugment, AutoAugment, ColorJitter, RandomGrayscale, GaussianBlur, RandomApply
        (fastpipe.augment). The resized image is then rounded to uint8 first, as torchvision's is.
    erase : RandomErasing, optional
        torchvision's RandomErasing of the output, fused (after the normalisation, as in torchvision's
        recipes).
    interpolation : {"bilinear", "bicubic", "nearest"} or torchvision's InterpolationMode
        The resize's filter, antialiased (torchvision's ``antialias=True``; bicubic with PIL's a = -0.5,
        which torch's antialiased bicubic also uses).
    resize_as : {"pil", "torch_uint8", "torch_float"}
        Whose arithmetic the bicubic and nearest resizes reproduce (bilinear is computed in float, within a
        level of all three): "pil", PIL's ``Image.resize`` (torchvision on PIL images, its default path:
        two fixed-point passes, the horizontal one rounded to uint8 first); "torch_uint8", torch's uint8
        kernels on the CPU (torchvision.transforms.v2 on uint8 tensors); "torch_float", torch's float kernels,
        clamped and rounded (torchvision.transforms v1 on tensors, and v2 on the GPU).

    Notes
    -----
    The crop box is drawn as torchvision draws it (10 tries, then the central fallback), from a hash of
    (the Loader's seed, the epoch, the sample index) and the image's stored size, before the image is
    read: runs reproduce and resume exactly, whatever the number of threads. Only the crop's rows and
    columns are decoded. The resize is PIL's antialiased bilinear filter (torchvision's
    ``resize(antialias=True)``), computed in float32. :meth:`boxes` says which box each sample gets.
    """

    _mode = "random_resized"

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), mirror=0.5, mean=None, std=None,
                 out_dtype=torch.float32, layout="NCHW", dct_scaling=True, augment=None, erase=None,
                 interpolation="bilinear", resize_as="pil"):
        self._init_output(size, mirror, mean, std, out_dtype, layout, dct_scaling, interpolation, resize_as)
        self._init_erase(erase, augment)
        self.scale = _range(scale, "scale")
        self.ratio = _range(ratio, "ratio")

    def _geometry(self):
        return self.scale, self.ratio, (0, 0, 0)

    def _repr_fields(self):
        return (("scale", self.scale), ("ratio", self.ratio))


class CenterCrop(_JpegTransform):
    """torchvision's ``Resize(resize)`` + ``CenterCrop(size)`` + ``ToDtype`` + ``Normalize`` for evaluation,
    fused into the decode of JPEG records.

    Parameters
    ----------
    size : int or (height, width)
        Output size (the crop).
    resize : int, (height, width) or None
        First resize the image: an int makes its shorter side that long (torchvision's ``Resize(256)``),
        a pair resizes to exactly that size, None crops the image as it is (zero padding where the crop
        is larger, as torchvision's CenterCrop pads).
    mean, std, out_dtype, layout, dct_scaling, mirror, augment, erase, interpolation, resize_as
        As :class:`RandomResizedCrop`'s (``mirror`` defaults to 0 here).

    Notes
    -----
    ImageNet's evaluation transform is ``CenterCrop(224, resize=256, mean=..., std=...)``.
    """

    _mode = "center"

    def __init__(self, size, resize=None, mean=None, std=None, out_dtype=torch.float32, layout="NCHW",
                 dct_scaling=True, mirror=0.0, augment=None, erase=None, interpolation="bilinear", resize_as="pil"):
        self._init_output(size, mirror, mean, std, out_dtype, layout, dct_scaling, interpolation, resize_as)
        self._init_erase(erase, augment)
        if resize is None:
            self.resize = None
        elif isinstance(resize, (tuple, list)):
            self.resize = _size_pair(resize, "resize")
        else:
            self.resize = checks.integer(resize, "resize", low=1)

    def _geometry(self):
        if self.resize is None:
            resize = (0, 0, 0)
        elif isinstance(self.resize, tuple):
            resize = (0, self.resize[0], self.resize[1])
        else:
            resize = (self.resize, 0, 0)
        return (1.0, 1.0), (1.0, 1.0), resize

    def _repr_fields(self):
        return (("resize", self.resize),)


class RandomCrop(CenterCrop):
    """torchvision's ``Resize(resize)`` + ``RandomCrop(size, padding, pad_if_needed)`` (+ flip, ``ToDtype``,
    ``Normalize``), fused into the decode of image records: as :class:`CenterCrop`, with the crop's top and
    left drawn uniformly in the resized image with its padding (from the Loader's seed, the epoch and the
    sample, as every draw).

    Parameters
    ----------
    size, resize, mean, std, out_dtype, layout, dct_scaling, augment, erase, interpolation, resize_as
        As :class:`CenterCrop`'s.
    mirror : float
        Probability of a horizontal flip (default 0.5, as :class:`RandomResizedCrop`'s).
    padding : int or sequence of int
        Zero pixels around the (resized) image before the crop, as torchvision's: one int on every side,
        (left/right, top/bottom), or (left, top, right, bottom). CIFAR's recipe on 32x32 images is
        ``RandomCrop(32, padding=4)``.
    pad_if_needed : bool
        An axis of the padded image shorter than the crop is padded on both sides by the difference, as
        torchvision's.

    Notes
    -----
    Where the crop is larger than the padded image it is padded as CenterCrop pads (torchvision's
    RandomCrop raises there). Padding is black (0) before ``Normalize``, as torchvision pads the image.
    :meth:`boxes` says where each sample's crop lies.
    """

    _mode = "random"

    def __init__(self, size, resize=None, mean=None, std=None, out_dtype=torch.float32, layout="NCHW",
                 dct_scaling=True, mirror=0.5, augment=None, erase=None, interpolation="bilinear", resize_as="pil",
                 padding=0, pad_if_needed=False):
        super().__init__(size, resize, mean=mean, std=std, out_dtype=out_dtype, layout=layout,
                         dct_scaling=dct_scaling, mirror=mirror, augment=augment, erase=erase,
                         interpolation=interpolation, resize_as=resize_as)
        self.padding = padding_sides(padding)
        self.pad_if_needed = checks.flag(pad_if_needed, "pad_if_needed")

    def _padding(self):
        left, top, right, bottom = self.padding
        return dict(pad=(top, left, bottom, right), pad_if_needed=self.pad_if_needed)

    def _repr_fields(self):
        return super()._repr_fields() + (("padding", self.padding), ("pad_if_needed", self.pad_if_needed))
