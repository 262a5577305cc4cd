"""A torchvision ``ImageFolder`` given to ``fastpipe.Loader`` as it is: its own sample list read by
:class:`fastpipe.ImageFolder`, and its transform pipeline turned into the fused image transform that does
the same thing (or an error naming the step that has no fused equivalent).

Understood, in torchvision's v1 and v2 spellings: ``Compose``; the presets scripts wrap pipelines in, and
the weights' ``ImageClassification`` (torchvision_presets.py); ``RandomResizedCrop``, ``Resize`` (+
``CenterCrop`` or ``RandomCrop``) and ``Resize((h, w))`` alone, bilinear, bicubic or nearest, with the
kernels of the path the image takes there (PIL's for a PIL image, torch's for a tensor after
``PILToTensor``/``ToImage``); ``CenterCrop``; ``RandomCrop`` (padding with zeros, pad_if_needed; a ``Pad``
of zeros just before it is its padding); ``RandomHorizontalFlip``;
``ToTensor``, ``PILToTensor``, ``ToImage``, ``ToDtype``/``ConvertImageDtype`` to
float32, float16 or bfloat16 (scaled) or uint8; ``Normalize``; the per-sample augmentations
``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment``, ``AugMix``, ``ColorJitter``, ``RandomGrayscale``,
``GaussianBlur`` and ``RandomApply`` of them, on the uint8 image: after the crop and flip, before any float
conversion; ``RandomErasing`` with a value (not "random"), last; v2's ``ToPureTensor`` anywhere.
"""

import torch

from fastpipe.data import torchvision_presets as presets

_SUPPORTED = ("Compose (and presets that only delegate to one), ImageClassification (weights.transforms()), "
              "RandomResizedCrop, Resize + CenterCrop or RandomCrop, Resize((h, w)), CenterCrop, (Pad +) RandomCrop, "
              "RandomHorizontalFlip, "
              "TrivialAugmentWide/RandAugment/AutoAugment/AugMix/ColorJitter/RandomGrayscale/GaussianBlur/RandomApply, "
              "ToTensor, PILToTensor, ToImage, ToDtype/ConvertImageDtype, Normalize, RandomErasing (last), ToPureTensor")
_AUGMENTS = ("TrivialAugmentWide", "RandAugment", "AutoAugment", "AugMix", "ColorJitter", "RandomGrayscale",
             "GaussianBlur", "RandomApply")


def is_torchvision_folder(dataset):
    """Whether ``dataset`` is torchvision's ImageFolder (or DatasetFolder of images)."""
    return any(c.__module__.startswith("torchvision.datasets") and c.__name__ in ("ImageFolder", "DatasetFolder")
               for c in type(dataset).__mro__)


def _flatten(transform):
    """The steps of a Compose (and of Composes in it), in order; other objects as they are."""
    if transform is None:
        return []
    if type(transform).__name__ == "Compose" and presets.is_torchvision(transform):
        return [s for t in transform.transforms for s in _flatten(t)]
    return [transform]


def _refuse(step, why):
    owner = "torchvision's " if presets.is_torchvision(step) else ""
    raise ValueError(f"fastpipe.Loader cannot fuse {owner}{type(step).__name__} into its JPEG decode "
                     f"({why}). It fuses {_SUPPORTED}; use fastpipe.ImageFolder with "
                     f"fastpipe.transforms.RandomResizedCrop/CenterCrop and apply the rest to the batch")


def zero_padding(step, padding):
    """A Pad's or RandomCrop's ``padding`` (torchvision's order: an int, or 1, 2 or 4 of them) as (left, top,
    right, bottom); ValueError (or TypeError) saying why unless it pads with zeros, as the fused crops do."""
    from fastpipe.image_transforms import padding_sides

    fills = []
    for f in step.fill.values() if isinstance(step.fill, dict) else [step.fill]:  # v2: a fill per input type
        fills += f if isinstance(f, (list, tuple)) else [f]
    if step.padding_mode != "constant" or any(f not in (0, None) for f in fills):
        raise ValueError(f"padding_mode={step.padding_mode!r}, fill={step.fill!r}: the fused crop pads with zeros")
    return padding_sides(padding)


def _interpolation_value(step):
    mode = step.interpolation
    if isinstance(mode, int):  # PIL's numbers, which torchvision also takes
        from torchvision.transforms.functional import _interpolation_modes_from_int

        mode = _interpolation_modes_from_int(mode)
    return getattr(mode, "value", mode)


def _augment(step):
    """The fastpipe form of one of torchvision's per-sample augmentations."""
    from fastpipe import augment

    name = type(step).__name__
    if name == "ColorJitter":
        return augment.ColorJitter(*(v if v is not None else 0 for v in (step.brightness, step.contrast,
                                                                         step.saturation, step.hue)))
    if name == "RandomGrayscale":
        return augment.RandomGrayscale(step.p)
    if name == "GaussianBlur":
        try:
            return augment.GaussianBlur(tuple(step.kernel_size), tuple(step.sigma))
        except ValueError as e:
            _refuse(step, str(e))
    if name == "RandomApply":
        inner = [s for t in step.transforms for s in _flatten(t)]
        for t in inner:
            if type(t).__name__ not in _AUGMENTS[:-1] or not presets.is_torchvision(t):
                _refuse(step, f"it holds {type(t).__name__}: RandomApply is fused around the augmentations only")
        return augment.RandomApply([_augment(t) for t in inner], p=float(step.p))
    fill = step.fill
    if isinstance(fill, dict):
        _refuse(step, "a fill per input type")
    try:
        if name == "TrivialAugmentWide":
            ours = augment.TrivialAugmentWide(step.num_magnitude_bins, step.interpolation, fill)
        elif name == "RandAugment":
            ours = augment.RandAugment(step.num_ops, step.magnitude, step.num_magnitude_bins, step.interpolation, fill)
        elif name == "AugMix":
            ours = augment.AugMix(step.severity, step.mixture_width, step.chain_depth, step.alpha, step.all_ops,
                                  step.interpolation, fill)
        else:
            ours = augment.AutoAugment(step.policy, step.interpolation, fill)
    except ValueError as e:
        _refuse(step, str(e))
    # v1 blends a bilinear fill in another order (transforms/_functional_tensor.py's _apply_grid_transform).
    ours.v1_fill = not type(step).__module__.startswith("torchvision.transforms.v2")
    return ours


class _Fusion:
    """The fused transform being read from a pipeline, one torchvision step at a time."""

    def __init__(self):
        # ("random", size, scale, ratio), ("center", size, resize), or ("random_crop", size, resize, padding,
        # pad_if_needed)
        self.geometry = None
        self.resize = None  # a Resize's size before the CenterCrop or RandomCrop
        self.pad = None  # a Pad's (left, top, right, bottom) waiting for the RandomCrop it pads for
        self.sampling = None  # (interpolation, resize_as) of the resize
        self.mirror = 0.0
        self.dtype = None  # None while the image is a PIL image
        self.mean = self.std = self.erase = None
        self.augmented = []

    def read(self, transform):
        for step in _flatten(transform):
            self.step(step)

    def step(self, step):
        steps = presets.weight_preset_steps(step, image_is_pil=self.dtype is None)
        if steps is not None:
            for s in steps:
                self.step(s)
            return
        if not presets.is_torchvision(step):
            attr, inner = presets.delegated(step)
            if attr is None:
                _refuse(step, f"not a torchvision transform, and {inner}")
            return self.read(inner)
        name = type(step).__name__
        if name == "ToPureTensor":  # v2: a tv_tensors.Image to a plain tensor, as fastpipe's batches are
            return
        if self.pad is not None and name != "RandomCrop":
            _refuse(step, "after a Pad: a Pad is fused as the padding of the RandomCrop that follows it")
        if self.erase is not None:
            _refuse(step, "after RandomErasing: fastpipe erases the finished output, as torchvision's recipes "
                          "place RandomErasing last")
        if self.geometry is None and name == "Resize":
            self.sampling = self._sampling(step)
            if getattr(step, "max_size", None) is not None:
                _refuse(step, "max_size is not supported")
            size = step.size
            if isinstance(size, (list, tuple)) and len(size) == 1:
                size = size[0]
            self.resize = tuple(size) if isinstance(size, (list, tuple)) else int(size)
            if isinstance(self.resize, tuple):  # every image that size already: a CenterCrop may follow
                self.geometry = ("center", self.resize, self.resize)
        elif self.geometry is None and name == "RandomResizedCrop":
            if self.resize is not None:
                _refuse(step, "a Resize before it")
            self.sampling = self._sampling(step)
            self.geometry = ("random", tuple(step.size), tuple(step.scale), tuple(step.ratio))
        elif name == "Pad" and self.geometry in (None, ("center", self.resize, self.resize)) and self.pad is None:
            self.pad = self._zero_padding(step, step.padding)
        elif name in ("CenterCrop", "RandomCrop") and self.geometry in (None, ("center", self.resize, self.resize)):
            if name == "CenterCrop":
                self.geometry = ("center", tuple(step.size), self.resize)
            else:
                self.geometry = ("random_crop", tuple(step.size), self.resize) + self._crop_padding(step)
        elif name == "RandomHorizontalFlip" and not self.augmented:
            self.mirror = float(step.p)
        elif name in _AUGMENTS and self.geometry is not None and self.dtype in (None, torch.uint8):
            self.augmented.append(_augment(step))
        elif name in ("ToTensor",) and self.dtype is None:
            self.dtype, self.scaled = torch.float32, True
        elif name in ("PILToTensor", "ToImage") and self.dtype is None:
            self.dtype, self.scaled = torch.uint8, False
        elif name in ("ToDtype", "ConvertImageDtype") and self.dtype is not None:
            target = step.dtype
            if isinstance(target, dict):
                _refuse(step, "a dtype per input type")
            if target != torch.uint8 and target not in (torch.float32, torch.float16, torch.bfloat16):
                _refuse(step, f"dtype {target}")
            self.scaled = target != torch.uint8 and (name == "ConvertImageDtype" or step.scale or self.scaled)
            if target != torch.uint8 and not self.scaled:
                _refuse(step, "an unscaled float conversion (values 0-255): use scale=True")
            self.dtype = target
        elif name == "Normalize" and self.dtype is not None and self.dtype != torch.uint8 and self.mean is None:
            self.mean, self.std = list(step.mean), list(step.std)
        elif name == "RandomErasing" and self.dtype is not None:
            value = step.value
            if value is None or isinstance(value, str):  # v2 keeps "random" as None
                _refuse(step, "value='random' (per-pixel noise)")
            value = [float(v) for v in value] if isinstance(value, (list, tuple)) else float(value)
            from fastpipe import transforms as ft

            self.erase = ft.RandomErasing(step.p, tuple(step.scale), tuple(step.ratio), value)
        else:
            _refuse(step, "not supported here, or not at this place in the pipeline")

    def _crop_padding(self, step):
        """(padding as (left, top, right, bottom), pad_if_needed) of a RandomCrop, a Pad just before it
        included: zeros of the uint8 image, as the fused crop pads."""
        padding = step.padding or 0
        if type(step).__module__.startswith("torchvision.transforms.v2") and padding:
            left, right, top, bottom = padding  # v2 keeps a RandomCrop's padding parsed, in this order
            padding = (left, top, right, bottom)
        sides = self._zero_padding(step, padding) if padding or step.pad_if_needed else (0, 0, 0, 0)
        if self.pad is not None:
            sides = tuple(a + b for a, b in zip(self.pad, sides))
            self.pad = None
        if self.mirror and sides[0] != sides[2]:
            _refuse(step, "padding unequal left and right after RandomHorizontalFlip: the fused crop flips last")
        return sides, bool(step.pad_if_needed)

    def _zero_padding(self, step, padding):
        """zero_padding() of a step of this pipeline, refused where it cannot be fused."""
        if self.mean is not None:
            _refuse(step, "padding after Normalize: torchvision pads the normalized image, the fused crop pads pixels")
        try:
            return zero_padding(step, padding)
        except (TypeError, ValueError) as e:
            _refuse(step, str(e))

    def _sampling(self, step):
        """(interpolation, resize_as) of a resize step: the kernels of the path the image takes there (a PIL
        image: PIL's; a uint8 tensor: torch's uint8 kernels in v2, its float ones in v1)."""
        mode = _interpolation_value(step)
        if mode not in ("bilinear", "bicubic", "nearest"):
            _refuse(step, f"interpolation={mode!r}: bilinear, bicubic and nearest are fused")
        if self.dtype is None:
            return mode, "pil"  # PIL always antialiases
        if mode != "nearest" and step.antialias is False:
            _refuse(step, "antialias=False: the fused resize is antialiased, as torchvision's default")
        v2 = type(step).__module__.startswith("torchvision.transforms.v2")
        return mode, "torch_uint8" if v2 else "torch_float"

    def transform(self):
        from fastpipe import transforms as ft

        if self.pad is not None:
            raise ValueError("fastpipe.Loader fuses torchvision's Pad only as the padding of a RandomCrop right after "
                             "it; this pipeline has none there")
        if self.geometry is None:
            raise ValueError("fastpipe.Loader needs the torchvision pipeline to make every image the same size "
                             "(RandomResizedCrop, Resize + CenterCrop or RandomCrop, Resize((h, w)), CenterCrop or "
                             "RandomCrop); its images differ in size")
        if self.dtype is None:
            raise ValueError("the torchvision pipeline returns PIL images: end it with ToTensor(), or ToImage() + "
                             "ToDtype(...), for batches of tensors")
        interpolation, resize_as = self.sampling or ("bilinear", "pil")
        common = dict(mean=self.mean, std=self.std, out_dtype=self.dtype, mirror=self.mirror,
                      augment=self.augmented or None, erase=self.erase, interpolation=interpolation,
                      resize_as=resize_as)
        if self.geometry[0] == "random":
            return ft.RandomResizedCrop(self.geometry[1], scale=self.geometry[2], ratio=self.geometry[3], **common)
        if self.geometry[0] == "center":
            return ft.CenterCrop(self.geometry[1], resize=self.geometry[2], **common)
        return ft.RandomCrop(self.geometry[1], resize=self.geometry[2], padding=self.geometry[3],
                             pad_if_needed=self.geometry[4], **common)


def convert_transform(transform):
    """The fused transform (fastpipe.transforms.RandomResizedCrop, CenterCrop or RandomCrop) doing what a
    torchvision pipeline does to a PIL image; ValueError naming the step it cannot fuse."""
    fusion = _Fusion()
    fusion.read(transform)
    return fusion.transform()


def convert_dataset(dataset):
    """fastpipe.ImageFolder reading the same files as torchvision's ``dataset``, with its transform fused."""
    from torchvision.datasets.folder import default_loader

    from fastpipe.data.images import ImageFolder

    if getattr(dataset, "loader", default_loader) is not default_loader:
        raise ValueError("fastpipe.Loader reads torchvision ImageFolders that use the default (PIL) loader; "
                         "this one has a custom loader")
    transform = convert_transform(getattr(dataset, "transform", None))
    # Its own list: whatever its root (relative ones too), extensions, is_valid_file or a subclass's filter.
    return ImageFolder(dataset.root, transform=transform, target_transform=getattr(dataset, "target_transform", None),
                       samples=list(dataset.samples), classes=list(dataset.classes))
